"""`bash scripts/gpu_smoke.sh`: every kind of rule for two steps on one GPU, with the literal command and a tiny model.

It builds a tiny model and a prompt file here (no model hub), then runs
`python -m openrlhf.cli.train_ppo_ray ... --rollout_reuse RULE` for two steps over the same 8 prompts (so the second
step has drafts) for each kind of rule: `off` (stock), `spec` (the request path), `lossless` (verified in the engine
by our proposer) and `suffix` (vLLM's own speculation; where arctic-inference's suffix tree is installed). It reads
each run's TensorBoard logs and prints a line per rule (steps, the share of the response tokens kept from drafts,
rollout time) and one RESULT line. A rule that drafts but kept nothing, fell back to stock generation, or ran a step
short fails the script, naming the rule and what happened: a silent fallback to stock is the failure it looks for.

Without CUDA it builds the model and data, dry-runs every command through OpenRLHF's own parser and validation
(`--reuse.dry_run`), then stops before training (`RESULT gpu=none stopped=before_training`). `--cpu` goes on with its
CPU twin: the same rules for two steps each on CPU engines, through OpenRLHF's rollout actors on Ray and the
quickstart's trainer (`bash scripts/quickstart.sh --grid smoke`), checked the same way, `lossless` drafting every slot
as its budget does on a GPU (on a CPU, where a drafted token costs what a decoded one does, it may rightly draft
nothing); the test suite runs it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..analysis import run_readers
from .task import TaskConfig, splits
from .tiny_model import build_tiny_model

REWARD_FILE = Path(__file__).resolve().parents[1] / "rewards" / "math_verify_reward.py"
RULES = ("off", "spec", "lossless", "suffix")
STEPS = 2
FLASH_ATTN_HINT = (
    "[gpu_smoke] OpenRLHF's module imports flash-attn, which needs CUDA: install openrlhf[vllm] on a GPU node; on a "
    "CPU machine, from a clone of this repository, PYTHONPATH=tests/stubs stands in for it (tests/stubs/README.md)"
)
PROMPTS, SAMPLES = 8, 4
SUMMED = ("decoded_tokens", "reused_tokens", "fallbacks", "rollout_s")  # a run's totals, as `RuleRun` holds them


@dataclass(frozen=True)
class RuleRun:
    """What one rule's run did, summed over its steps."""

    rule: str
    steps: int
    decoded: float
    reused: float
    fallbacks: float
    rollout_s: float

    @classmethod
    def of(cls, rule: str, steps: int, total) -> RuleRun:
        """From `total(key)`, a metric summed over the run's steps."""
        return cls(rule, steps, *(float(total(key)) for key in SUMMED))

    @property
    def kept(self) -> float:
        return self.reused / max(self.reused + self.decoded, 1.0)


def suffix_installed() -> bool:
    try:
        return importlib.util.find_spec("arctic_inference.suffix_decoding") is not None
    except ModuleNotFoundError:
        return False


def rules_here() -> tuple[str, ...]:
    return RULES if suffix_installed() else tuple(r for r in RULES if r != "suffix")


def flags(model: Path, data: Path, out: Path, policy: str) -> list[str]:
    """The OpenRLHF flags of a 2-step GRPO run on one GPU (8 prompts x 4 samples per step, 2 episodes)."""
    return [
        *("--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(data)),
        *("--data.input_key", "prompt", "--data.label_key", "answer", "--reward.remote_url", str(REWARD_FILE)),
        *("--ref.num_nodes", "1", "--ref.num_gpus_per_node", "1", "--actor.num_nodes", "1"),
        *("--actor.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1"),
        *("--train.colocate_all", "--vllm.gpu_memory_utilization", "0.3", "--vllm.enable_prefix_caching"),
        *("--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0"),
        *("--rollout.batch_size", str(PROMPTS), "--rollout.n_samples_per_prompt", str(SAMPLES)),
        *("--train.batch_size", str(PROMPTS * SAMPLES), "--train.micro_batch_size", "8"),
        *("--rollout.micro_batch_size", "8", "--data.max_samples", str(PROMPTS)),
        *("--train.max_epochs", "1", "--train.num_episodes", str(STEPS), "--data.max_len", "256"),
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
    train, _ = splits(TaskConfig(train_size=PROMPTS, held_out_size=8, seed=0))
    data.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in train))
    return model, data


def run(command: list[str], log: Path) -> int:
    with open(log, "w") as f:
        return subprocess.call(command, stdout=f, stderr=subprocess.STDOUT)


def check(runs: list[RuleRun]) -> list[str]:
    """What went wrong, one line each (empty: every rule ran its steps, and every rule that drafts kept drafts)."""
    problems = []
    for r in runs:
        if r.steps != STEPS:
            problems.append(f"{r.rule} ran {r.steps} steps, not {STEPS}")
        if r.fallbacks:
            problems.append(f"{r.rule} fell back to stock generation for {r.fallbacks:.0f} samples (see its log)")
        if r.rule != "off" and r.reused <= 0:
            problems.append(f"{r.rule} kept no draft token: it ran as stock (is its proposer or plugin installed?)")
        if r.rule == "off" and r.reused > 0:
            problems.append(f"off reused {r.reused:.0f} tokens: stock generation must reuse nothing")
    return problems


def report_runs(device: str, runs: list[RuleRun], out: Path) -> int:
    """A line per rule, the problems, and the RESULT line; 0 when there are none."""
    for r in runs:
        print(
            f"[gpu_smoke] {r.rule:<9} steps={r.steps} kept={r.kept:6.1%} reused={r.reused:.0f} "
            f"decoded={r.decoded:.0f} fallbacks={r.fallbacks:.0f} rollout_s={r.rollout_s:.1f}"
        )
    problems = check(runs)
    for problem in problems:
        print(f"[gpu_smoke] FAILED: {problem}")
    print(
        f"RESULT gpu={device} rules={','.join(r.rule for r in runs)} "
        + "".join(f"steps[{r.rule}]={r.steps} kept[{r.rule}]={r.kept:.3f} " for r in runs)
        + f"ok={int(not problems)} out={out}"
    )
    return 1 if problems else 0


def gpu_runs(out: Path, rules: tuple[str, ...]) -> list[RuleRun]:
    """Each rule's run, from its TensorBoard logs."""
    series = {s.name: s for s in run_readers.discover(out / "tb")}
    return [
        RuleRun.of(rule, len(series[rule].steps), series[rule].total)
        if rule in series
        else RuleRun(rule, 0, 0.0, 0.0, 0.0, 0.0)
        for rule in rules
    ]


def cpu_twin(out: Path, rules: tuple[str, ...]) -> list[RuleRun] | None:
    """The CPU twin: the quickstart's smoke grid (the same rules beside `off`, two steps of 8 prompts x 4 samples on
    CPU engines through OpenRLHF's rollout actors); None where it failed."""
    command = [
        *(sys.executable, "-m", "specrl_openrlhf.miniature.quickstart", "--grid", "smoke"),
        *("--rollout-batch", str(PROMPTS), "--samples", str(SAMPLES), "--held-out-size", "8", "--out", str(out)),
    ]
    out.mkdir(parents=True, exist_ok=True)
    if run(command, out / "quickstart.log"):
        return None
    metrics = json.loads((out / "metrics.json").read_text())
    runs = []
    for rule in rules:
        name = next(r["name"] for r in metrics["runs"] if r["policy"] == rule)
        steps = [row for row in metrics["rows"] if row["kind"] == "step" and row["run"] == name]
        runs.append(RuleRun.of(rule, len(steps), lambda key, steps=steps: sum(row.get(key) or 0.0 for row in steps)))
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bash scripts/gpu_smoke.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gpu_smoke", help="output folder (default: runs/gpu_smoke)")
    parser.add_argument(
        "--cpu", action="store_true", help="without CUDA, go on with the CPU twin (the same rules on CPU engines)"
    )
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rules = rules_here()
    if "suffix" not in rules:
        print("[gpu_smoke] suffix left out: arctic-inference's suffix tree is not installed (docs/install.md)")
    model, data = prepare(out)
    openrlhf = [sys.executable, "-m", "openrlhf.cli.train_ppo_ray"]
    for policy in rules:  # OpenRLHF's parser and validation, with ours: fails fast on any flag
        (out / policy).mkdir(exist_ok=True)
        if run([*openrlhf, *flags(model, data, out, policy), "--reuse.dry_run"], out / policy / "dry_run.log"):
            print(f"[gpu_smoke] the {policy} command does not parse: see {out / policy / 'dry_run.log'}")
            if "No module named 'flash_attn'" in (out / policy / "dry_run.log").read_text():
                print(FLASH_ATTN_HINT)
            return 1
    print(f"[gpu_smoke] model, prompts and the commands of {', '.join(rules)} ready in {out}")
    import torch

    if not torch.cuda.is_available():
        if not args.cpu:
            print("[gpu_smoke] no CUDA device: OpenRLHF's training (DeepSpeed, NCCL weight sync) stops here")
            print(f"RESULT gpu=none stopped=before_training dry_runs=ok out={out}")
            return 0
        from .engine import machine

        print(f"[gpu_smoke] no CUDA device: the CPU twin, {STEPS} steps of each rule on {machine()}")
        if "suffix" not in rules:
            print("[gpu_smoke] FAILED: the CPU twin runs suffix too: bash scripts/install.sh builds its tree")
            return 1
        runs = cpu_twin(out / "cpu", rules)
        if runs is None:
            print(f"[gpu_smoke] FAILED: the CPU twin did not finish: see {out / 'cpu' / 'quickstart.log'}")
            return 1
        return report_runs("cpu", runs, out)
    for policy in rules:
        print(f"[gpu_smoke] training {policy} for {STEPS} steps (log: {out / policy / 'train.log'})")
        if run([*openrlhf, *flags(model, data, out, policy)], out / policy / "train.log"):
            print(f"[gpu_smoke] FAILED: {policy} did not finish: see {out / policy / 'train.log'}")
            return 1
    return report_runs(torch.cuda.get_device_name(0).replace(" ", "_"), gpu_runs(out, rules), out)


if __name__ == "__main__":
    sys.exit(main())
