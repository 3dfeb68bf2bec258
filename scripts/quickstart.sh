#!/usr/bin/env bash
# The main job: GRPO on CPU with stock rollouts, spec (ℓ = 1.65) and lossless, side by side, on a tiny model
# warm-started on a local math task (seed 0's ships with the package; others are built and cached on first use).
# Prints a table per epoch, writes metrics.csv/json and plots to --out (default runs/quickstart), and ends with one
# RESULT line.
#   bash scripts/quickstart.sh [--rollout_reuse exact] [--lenience 2.0] [--epochs 6] [--seeds 0,1,2] [--out DIR]
#   bash scripts/quickstart.sh --grid drift --seeds 0,1,2   # the staleness ablation (also: lenience, frontier, tree)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install.sh
# TQDM_DISABLE: OpenRLHF's per-batch bars (the quickstart shows its own); read when tqdm is imported
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-ERROR} TOKENIZERS_PARALLELISM=false TQDM_DISABLE=${TQDM_DISABLE:-1}
python -m specrl_openrlhf.miniature.quickstart "$@"
