"""`bash scripts/gpu_smoke.sh`: the literal command on one GPU with a tiny model, two steps, `off` then `spec`.

It builds a tiny model and a prompt file here (no model hub), runs
`python -m openrlhf.cli.train_ppo_ray ... --rollout_reuse off|spec` for two steps over the same 8 prompts (so the
second step has drafts), reads each run's TensorBoard logs with the report, and prints one line:

    RESULT gpu=<name> off_steps=2 spec_steps=2 spec_draft_hit_rate=... spec_reused_tokens=... off_rollout_s=...

Without CUDA it goes as far as it can: it builds the model and data, dry-runs both commands through OpenRLHF's own
parser and validation (`--reuse.dry_run`), then stops before training, which needs CUDA (DeepSpeed, NCCL), and
says so on its RESULT line (`gpu=none stopped=before_training`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from ..analysis import report
from .task import TaskConfig, splits
from .tiny_model import build_tiny_model

REWARD_FILE = Path(__file__).resolve().parents[1] / "rewards" / "math_verify_reward.py"
POLICIES = ("off", "spec")


def flags(model: Path, data: Path, out: Path, policy: str) -> list[str]:
    """The OpenRLHF flags of a 2-step GRPO run on one GPU (8 prompts x 4 samples per step, 2 episodes)."""
    return [
        *("--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(data)),
        *("--data.input_key", "prompt", "--data.label_key", "answer", "--reward.remote_url", str(REWARD_FILE)),
        *("--ref.num_nodes", "1", "--ref.num_gpus_per_node", "1", "--actor.num_nodes", "1"),
        *("--actor.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1"),
        *("--train.colocate_all", "--vllm.gpu_memory_utilization", "0.3", "--vllm.enable_prefix_caching"),
        *("--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0"),
        *("--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "32"),
        *("--train.micro_batch_size", "8", "--rollout.micro_batch_size", "8", "--data.max_samples", "8"),
        *("--train.max_epochs", "1", "--train.num_episodes", "2", "--data.max_len", "256"),
        *("--rollout.max_new_tokens", "64", "--rollout.temperature", "1.0", "--rollout.top_p", "1.0"),
        *("--actor.adam.lr", "1e-5", "--ds.zero_stage", "0", "--ckpt.save_steps", "-1", "--eval.steps", "-1"),
        *("--ckpt.path", str(out / policy / "ckpt"), "--ckpt.output_dir", str(out / policy / "final")),
        *("--logger.tensorboard_dir", str(out / "tb"), "--logger.wandb.run_name", policy),
        *("--rollout_reuse", policy),
    ]


def prepare(out: Path) -> tuple[Path, Path]:
    """A tiny model (head_dim 64, as vLLM wants) and 8 of the quickstart's problems as a JSONL prompt file."""
    model = build_tiny_model(out / "model", hidden_size=128, num_layers=2)
    data = out / "prompts.jsonl"
    train, _ = splits(TaskConfig(train_size=8, held_out_size=8, seed=0))
    data.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in train))
    return model, data


def run(command: list[str], log: Path) -> int:
    with open(log, "w") as f:
        return subprocess.call(command, stdout=f, stderr=subprocess.STDOUT)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bash scripts/gpu_smoke.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gpu_smoke", help="output folder (default: runs/gpu_smoke)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model, data = prepare(out)
    openrlhf = [sys.executable, "-m", "openrlhf.cli.train_ppo_ray"]
    for policy in POLICIES:  # OpenRLHF's parser and validation, with ours: fails fast on any flag
        (out / policy).mkdir(exist_ok=True)
        if run([*openrlhf, *flags(model, data, out, policy), "--reuse.dry_run"], out / policy / "dry_run.log"):
            print(f"[gpu_smoke] the {policy} command does not parse: see {out / policy / 'dry_run.log'}")
            return 1
    print(f"[gpu_smoke] model, prompts and both commands ready in {out}")
    import torch

    if not torch.cuda.is_available():
        print("[gpu_smoke] no CUDA device: OpenRLHF's training (DeepSpeed, NCCL weight sync) stops here")
        print(f"RESULT gpu=none stopped=before_training dry_runs=ok out={out}")
        return 0
    for policy in POLICIES:
        print(f"[gpu_smoke] training {policy} for 2 steps (log: {out / policy / 'train.log'})")
        if run([*openrlhf, *flags(model, data, out, policy)], out / policy / "train.log"):
            print(f"[gpu_smoke] {policy} failed: see {out / policy / 'train.log'}")
            return 1
    runs = {run.name: run for run in report.discover(out / "tb")}
    off, spec = runs["off"], runs["spec"]
    hit_rate = spec.total("drafts_found") / max(spec.total("samples"), 1.0)
    print(
        f"RESULT gpu={torch.cuda.get_device_name(0).replace(' ', '_')} off_steps={len(off.steps)} "
        f"spec_steps={len(spec.steps)} spec_draft_hit_rate={hit_rate:.2f} "
        f"spec_reused_tokens={spec.total('reused_tokens'):.0f} off_rollout_s={off.total('rollout_s'):.1f} "
        f"spec_rollout_s={spec.total('rollout_s'):.1f} out={out}"
    )
    return 0 if len(off.steps) == len(spec.steps) == 2 and spec.total("reused_tokens") > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
