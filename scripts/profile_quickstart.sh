#!/usr/bin/env bash
# Profile the quickstart's rollout actors (off, spec@1.65, lossless) with py-spy while a short quickstart trains:
#   pip install py-spy && bash scripts/profile_quickstart.sh /tmp/profile
#   python scripts/profile_summary.py /tmp/profile/quickstart1.txt specrl_openrlhf "EngineCore.step"
# One raw (collapsed) stack file per actor, engine core included: off.txt, quickstart0.txt (the first reuse run,
# spec@1.65) and quickstart1.txt (lossless). Nothing else should run meanwhile (2 cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source .venv/bin/activate
OUT=${1:?usage: profile_quickstart.sh OUT_DIR}
SECONDS_RECORDED=${SECONDS_RECORDED:-100}
mkdir -p "$OUT"
python -m specrl_openrlhf.miniature.quickstart --epochs 2 --train-size 256 --held-out-size 32 \
  --out "$OUT/qs" > "$OUT/qs.log" 2>&1 &
QS=$!
until grep -q "engines up" "$OUT/qs.log" 2>/dev/null; do sleep 2; kill -0 $QS 2>/dev/null || exit 1; done
sleep 5
for pid in $(pgrep -f "ray::CPURolloutActor"); do
  run=$(tr '\0' '\n' < "/proc/$pid/environ" | grep "^SPECRL_OPENRLHF_RUN=" | cut -d= -f2 || true)
  py-spy record --pid "$pid" --subprocesses --rate 40 --format raw --nonblocking \
    -o "$OUT/${run:-off}.txt" --duration "$SECONDS_RECORDED" > /dev/null 2>&1 &
done
wait $QS
grep -a "^RESULT" "$OUT/qs.log"
