#!/usr/bin/env bash
# GPU smoke test of the literal command: python -m openrlhf.cli.train_ppo_ray on one GPU with a tiny model built here,
# two steps each of off, spec, lossless and suffix (where its tree is installed); a line per rule and one RESULT line,
# exit 1 naming a rule that fell back or kept nothing. Run it in the environment that runs OpenRLHF (docs/install.md).
# Without CUDA it dry-runs every command and stops before training; --cpu then runs its CPU twin (the test suite does).
#   bash scripts/gpu_smoke.sh [--out DIR] [--cpu]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-ERROR} TOKENIZERS_PARALLELISM=false
exec python -m specrl_openrlhf.miniature.gpu_smoke "$@"
