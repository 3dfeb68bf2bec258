#!/usr/bin/env bash
# The main job on an embedded default: speculative rollouts of a tiny local model over several visits,
# with the weights changing between visits, printing a per-visit reuse table. Extra flags go to the demo
# (for example --policy exact, --lenience 2.0, --visits 6).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install.sh
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-ERROR} TOKENIZERS_PARALLELISM=false
python -m specrl_openrlhf.integration.cpu.demo "$@"
