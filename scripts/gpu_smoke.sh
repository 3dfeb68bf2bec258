#!/usr/bin/env bash
# GPU smoke test of the literal command: python -m openrlhf.cli.train_ppo_ray on one GPU with a tiny model built here,
# two steps with --rollout_reuse off and then spec; prints one RESULT line. Run it in the environment that runs
# OpenRLHF (docs/install.md). Without CUDA it builds everything, dry-runs both commands and stops before training.
#   bash scripts/gpu_smoke.sh [--out DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-ERROR} TOKENIZERS_PARALLELISM=false
exec python -m specrl_openrlhf.miniature.gpu_smoke "$@"
