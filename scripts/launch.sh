#!/usr/bin/env bash
# Single-node 8-GPU SPEC-RL training with a paper preset:
#   bash scripts/launch.sh grpo --actor.model_name_or_path Qwen/Qwen3-1.7B-Base \
#        --data.prompt_dataset DATA --data.input_key prompt --data.label_key answer --ckpt.path ckpt/grpo
# The reward is the shipped math-verify reward_func. REUSE picks the rule (default spec); the preset's paper lenience
# goes to the lenient rules (spec, anchored, delayed): give any other rule that takes one its --lenience yourself. Any later
# flag overrides the preset (argparse keeps the last value): REUSE=off gives the baseline, --lenience 2.0 another ℓ.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
algo=${1:?usage: bash scripts/launch.sh grpo|ppo|dapo [OpenRLHF and specrl flags...]}
shift
[ -f "configs/$algo.args" ] || { echo "no preset configs/$algo.args (have: grpo ppo dapo)" >&2; exit 2; }
flags() { grep -v '^\s*#' "$1" | grep -v -- '^--lenience' | xargs; }
reuse=${REUSE:-spec}
lenience=()
case "$reuse" in
  spec|anchored|delayed) lenience=(--lenience "$(grep -- '^--lenience' "configs/$algo.args" | awk '{print $2}')") ;;
esac
# shellcheck disable=SC2046
exec python -m specrl_openrlhf.cli.train_ppo_ray \
  $(flags configs/common.args) $(flags configs/node_8gpu.args) $(flags "configs/$algo.args") \
  --reward.remote_url "$PWD/specrl_openrlhf/rewards/math_verify_reward.py" \
  --rollout_reuse "$reuse" "${lenience[@]}" "$@"
