#!/usr/bin/env bash
# The paper's ablation grid (Table 3 and the lenience ablation) on GRPO: each cell is a flag, not a code path.
#   bash scripts/ablation_grid.sh --actor.model_name_or_path MODEL --data.prompt_dataset DATA ...
# Add --reuse.dry_run to print every cell's resolved configuration without training.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cells=(
  "off"
  "spec 1.2214027582"   # e^0.2
  "spec 1.6487212707"   # e^0.5
  "spec 2.2255409285"   # e^0.8
  "spec 2.7182818285"   # e^1.0
  "spec 7.3890560989"   # e^2.0
  "exact 1"
  "full 1"
  "random 1"
  "delayed 1.6487212707"
)
for cell in "${cells[@]}"; do
  read -r policy lenience <<<"$cell"
  name="${policy}${lenience:+_l$lenience}"
  echo "=== $name ==="
  REUSE=$policy bash scripts/launch.sh grpo --lenience "${lenience:-1}" \
    --ckpt.path "ckpt/ablation/$name" --logger.wandb.run_name "specrl_$name" "$@"
done
