"""`python -m specrl_openrlhf.cli.train_ppo_ray` as a user runs it: --help, dry runs and bad input.

The flag sets below follow OpenRLHF's own example launch scripts (examples/scripts in its repository, written
for 0.11.0) for PPO, GRPO (group_norm) and REINFORCE++ (reinforce_baseline, with an agent), with our two flags
added. Every case must fail or exit before Ray starts.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray
pytest.importorskip("openrlhf")

from specrl_openrlhf.integration import openrlhf_cli  # noqa: E402

OURS = ["--rollout_reuse", "spec", "--lenience", "1.65"]

PPO_EXAMPLE = (
    "--ref.num_nodes 1 --ref.num_gpus_per_node 8 --reward.num_nodes 1 --reward.num_gpus_per_node 8 "
    "--critic.num_nodes 1 --critic.num_gpus_per_node 8 --actor.num_nodes 1 --actor.num_gpus_per_node 8 "
    "--vllm.num_engines 4 --vllm.tensor_parallel_size 2 --train.colocate_all --vllm.gpu_memory_utilization 0.5 "
    "--actor.model_name_or_path OpenRLHF/Llama-3-8b-sft-mixture "
    "--reward.model_name_or_path OpenRLHF/Llama-3-8b-rm-700k "
    "--ckpt.output_dir /tmp/final --ckpt.path /tmp/ckpt --ckpt.save_hf --train.batch_size 128 "
    "--rollout.batch_size 1024 "
    "--rollout.n_samples_per_prompt 1 --train.max_epochs 1 --data.max_len 2048 --data.max_samples 100000 "
    "--ds.zero_stage 3 --ds.param_dtype bf16 --actor.adam.lr 5e-7 --critic.adam.lr 9e-6 --algo.kl.init_coef 0.01 "
    "--data.prompt_dataset OpenRLHF/prompt-collection-v0.1 --data.input_key context_messages "
    "--data.apply_chat_template --reward.normalize_enable --actor.gradient_checkpointing_enable --ds.packing_samples "
    "--vllm.sync_backend nccl --vllm.enforce_eager --vllm.enable_sleep --ds.enable_sleep --train.dynamic_batch_enable "
    "--train.max_tokens_per_gpu 16384 --algo.advantage.is_correction_enable"
).split()

GRPO_EXAMPLE = (
    "--ref.num_nodes 1 --ref.num_gpus_per_node 8 --actor.num_nodes 1 --actor.num_gpus_per_node 8 "
    "--vllm.num_engines 4 --vllm.tensor_parallel_size 2 --train.colocate_all --vllm.gpu_memory_utilization 0.6 "
    "--algo.kl.init_coef 1e-3 --algo.advantage.gamma 1.0 --algo.kl.use_loss --algo.kl.estimator k3 "
    "--algo.advantage.estimator group_norm --algo.dynamic_filtering_enable --algo.dynamic_filtering_range 0 1 "
    "--actor.eps_clip_low_high 0.2 0.27 --actor.model_name_or_path OpenRLHF/Llama-3-8b-sft-mixture "
    "--reward.remote_url /openrlhf/examples/python/reward_func.py --ckpt.output_dir /tmp/final --ckpt.path /tmp/ckpt "
    "--ckpt.save_steps 20 --ckpt.save_hf --train.micro_batch_size 8 --train.batch_size 128 "
    "--rollout.micro_batch_size 16 --rollout.batch_size 128 --rollout.n_samples_per_prompt 8 --train.max_epochs 1 "
    "--data.max_len 2048 --data.max_samples 20000 --ds.zero_stage 3 --ds.param_dtype bf16 --actor.adam.lr 5e-7 "
    "--data.prompt_dataset OpenRLHF/prompt-collection-v0.1 --data.input_key context_messages "
    "--data.apply_chat_template --actor.gradient_checkpointing_enable --ds.packing_samples --vllm.sync_backend nccl "
    "--vllm.enforce_eager --vllm.enable_sleep --ds.enable_sleep --algo.advantage.is_correction_enable"
).split()

REINFORCE_EXAMPLE = (
    "--actor.model_name_or_path Qwen/Qwen3-4B-Thinking-2507 --ckpt.load_enable --ckpt.output_dir /tmp/exp "
    "--ckpt.path /tmp/exp/ckpt --ckpt.save_hf --ckpt.max_num 3 --ckpt.save_steps 10 --train.agent_func_path AGENT "
    "--data.prompt_dataset zhuzilin/dapo-math-17k --data.input_key prompt --data.label_key label --data.max_len 74240 "
    "--rollout.max_new_tokens 64000 --data.apply_chat_template --ds.packing_samples --rollout.batch_size 128 "
    "--rollout.n_samples_per_prompt 8 --train.batch_size 1024 --algo.dynamic_filtering_enable "
    "--algo.dynamic_filtering_range 0.0 1.0 --train.dynamic_batch_enable --train.max_tokens_per_gpu 16192 "
    "--rollout.max_tokens_per_gpu 32768 --train.micro_batch_size 1 --rollout.micro_batch_size 8 "
    "--data.max_samples 128000 --train.max_epochs 1 --train.num_episodes 1 "
    "--ref.num_nodes 1 --ref.num_gpus_per_node 4 "
    "--actor.num_nodes 1 --actor.num_gpus_per_node 4 --vllm.num_engines 2 --vllm.tensor_parallel_size 2 "
    "--vllm.gpu_memory_utilization 0.7 --train.colocate_all --ds.enable_sleep --vllm.sync_backend nccl "
    "--vllm.enforce_eager --ds.zero_stage 3 --actor.gradient_checkpointing_enable --ds.ring_attn_size 2 "
    "--ds.ring_attn_head_stride 2 --ds.param_dtype bf16 --algo.advantage.estimator reinforce_baseline "
    "--actor.adam.lr 5e-7 --actor.entropy_coef 0.0 --algo.kl.init_coef 1e-5 --algo.kl.use_loss --algo.kl.estimator k2 "
    "--algo.advantage.is_correction_enable --algo.advantage.is_correction_type icepop --logger.logging_steps 1"
).split()

# What each 0.11.0 example spells differently in the installed 0.11.2.
RENAMED = {"--algo.advantage.is_correction_enable": ["--algo.advantage.is_correction_level", "token"]}
REMOVED_WITH_VALUE = {"--algo.advantage.is_correction_type"}


OURS_MODULE, OPENRLHF_MODULE = "specrl_openrlhf.cli.train_ppo_ray", "openrlhf.cli.train_ppo_ray"


def cli(args, timeout=120, module=OURS_MODULE, env=None):
    """Run a command as the user types it; `module=OPENRLHF_MODULE` is OpenRLHF's own, reached by our .pth hook.
    Our own command runs in this process (the same code, without paying for OpenRLHF's imports on every call)."""
    if module == OURS_MODULE and env is None:
        return run_in_process(args)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


def run_in_process(args):
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            openrlhf_cli.main(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())


def port_to_0112(args):
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in RENAMED:
            out += RENAMED[arg]
        elif arg in REMOVED_WITH_VALUE:
            skip = True
        else:
            out.append(arg)
    return out


@pytest.fixture
def agent_file(tmp_path):
    path = tmp_path / "agent_func.py"
    path.write_text("from openrlhf.utils.agent import SingleTurnAgentExecutor as AgentExecutor\n")
    return str(path)


def examples(agent_file):
    return {
        "ppo": PPO_EXAMPLE,
        "grpo": GRPO_EXAMPLE,
        "reinforce++": [agent_file if a == "AGENT" else a for a in REINFORCE_EXAMPLE],
    }


@pytest.mark.parametrize("name", ["ppo", "grpo", "reinforce++"])
def test_examples_as_written_get_openrlhfs_own_error(name, agent_file):
    result = cli(examples(agent_file)[name] + OURS)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert "error: unrecognized arguments: --algo.advantage.is_correction_enable" in last
    assert "reuse" not in last and "lenience" not in last


@pytest.mark.parametrize(
    "name, module",
    [("ppo", OURS_MODULE), ("grpo", OURS_MODULE), ("reinforce++", OURS_MODULE), ("grpo", OPENRLHF_MODULE)],
)
def test_examples_ported_to_0112_dry_run(name, module, agent_file):
    args = port_to_0112(examples(agent_file)[name])
    result = cli(args + OURS + ["--reuse.dry_run"], module=module)
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout[result.stdout.index("{") :])
    assert resolved["policy"] == "spec(lenience=1.65)"
    assert resolved["engines"]["agent_func_path"].endswith("agent_entry.py")
    openrlhf = resolved["openrlhf_args"]
    assert openrlhf["algo"]["advantage"]["is_correction_level"] == "token"
    assert openrlhf["vllm"]["num_engines"] == int(args[args.index("--vllm.num_engines") + 1])
    if name == "reinforce++":  # the user's agent composes: it runs inside ours, rewards stay its own
        assert resolved["engines"]["inner_agent_func_path"] == agent_file
        assert openrlhf["reward"]["remote_url"] == ["agent"]
    if name == "grpo":
        assert resolved["engines"]["remote_url"] == ["/openrlhf/examples/python/reward_func.py"]
        assert resolved["engines"]["samples_per_visit"] == 8


def test_off_is_stock():
    result = cli(port_to_0112(GRPO_EXAMPLE) + ["--reuse.dry_run"])
    resolved = json.loads(result.stdout[result.stdout.index("{") :])
    assert resolved["policy"] == "off()" and "engines" not in resolved


@pytest.mark.parametrize(
    "module, prog", [(OURS_MODULE, f"python -m {OURS_MODULE}"), (OPENRLHF_MODULE, "train_ppo_ray.py")]
)
def test_help_lists_openrlhf_and_our_flags(module, prog):
    result = cli(["--help"], module=module)
    assert result.returncode == 0 and result.stdout.startswith(f"usage: {prog} ")
    for flag in [
        "--actor.model_name_or_path",
        "--vllm.num_engines",
        "--rollout_reuse",
        "--lenience",
        "--reuse.dry_run",
    ]:
        assert flag in result.stdout


BASE = ["--actor.model_name_or_path", "m", "--vllm.num_engines", "1", "--reward.remote_url", "r.py"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rollout_reuse", "spce"], "--rollout_reuse: unknown reuse policy 'spce'. Did you mean 'spec'?"),
        (["--rollout_reuse", "spec", "--lenience", "0"], "lenience must be > 0, got 0.0"),
        (["--rollout_reuse", "spec", "--lenience", "nan"], "lenience must be > 0, got nan"),
        (["--rollout_reuse", "spec", "--lenience", "abc"], "argument --lenience: invalid float value: 'abc'"),
        (["--rollout_reuse", "spec", "--reuse.plugin", "/nope/rule.py"], "--reuse.plugin /nope/rule.py: no such file"),
        (["--rollout_reuse", "spec", "--rollout.temperature", "0.7"], "sampling uses temperature=0.7"),
        (["--rollout_reuse", "exact", "--rollout.top_p", "0.9"], "top_p=0.9"),
        (["--rollout_reuse", "spec", "--vllm.num_engines", "0"], "set --vllm.num_engines to 1 or more"),
        (["--rollout_reuse", "spec", "--train.agent_func_path", "/nope/agent.py"], "/nope/agent.py: no such file"),
        (["--rollout_reuse", "spec", "--reuse.logprobs", "mine"], "invalid choice: 'mine'"),
        (["--rollout_reuse", "spec", "--reuse.cache_max_gb", "-1"], "--reuse.cache_max_gb must be a positive number"),
        (["--rollout_reuse", "spec", "--reuse.params", "{x"], "argument --reuse.params: not JSON"),
        (["--rollout_reuse", "spec", "--reuse.params", '{"floor": 1}'], "'spec' takes no parameter floor"),
        (["--rollout_reuse", "spec", "--reuse.scoring", "fast"], "invalid choice: 'fast'"),
        (["--rollout_reuse", "/nope/rule.py:Rule"], "--rollout_reuse /nope/rule.py:Rule: no such file"),
        (["--rollout_reuse", f"{Path(__file__)}:Nope"], "has no 'Nope'"),
    ],
)
def test_bad_input_fails_before_ray_with_the_flag_and_fix(args, message):
    result = cli(BASE + args, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Started a local Ray instance" not in result.stderr


def test_plugin_policy_and_temperature_free_policies(tmp_path):
    result = cli(BASE + ["--rollout_reuse", "random", "--rollout.temperature", "0.7", "--reuse.dry_run"])
    assert result.returncode == 0, result.stderr
    plugin = "policies/prefix_cap.py"
    result = cli(BASE + ["--rollout_reuse", "prefix_cap", "--reuse.plugin", plugin, "--reuse.dry_run"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout[result.stdout.index("{") :])["policy"].startswith("prefix_cap(")
    rule = [
        "--rollout_reuse",
        "policies/adaptive_lenience.py:AdaptiveLenience",
        "--reuse.params",
        '{"target_kept": 0.9}',
    ]
    result = cli(BASE + rule + ["--reuse.dry_run"])
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout[result.stdout.index("{") :])
    assert resolved["policy"].startswith("AdaptiveLenience(target_kept=0.9, ")
    assert json.loads(resolved["engines"]["reuse_config"])["params"] == {"target_kept": 0.9}  # what engines rebuild


@pytest.mark.parametrize(
    "algo, lenience, checks",
    [
        ("grpo", 1.6487212707, {("algo", "advantage", "estimator"): "group_norm", ("algo", "kl", "init_coef"): 1e-4}),
        ("ppo", 1.3498588076, {("algo", "advantage", "estimator"): "gae", ("critic", "adam", "lr"): 1e-5}),
        ("dapo", 1.1618342427, {("actor", "eps_clip_low_high"): [0.2, 0.28], ("algo", "kl", "init_coef"): 0.0}),
    ],
)
def test_paper_presets_resolve_with_the_installed_openrlhf(algo, lenience, checks):
    result = subprocess.run(
        ["bash", "scripts/launch.sh", algo, "--actor.model_name_or_path", "m", "--reuse.dry_run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout[result.stdout.index("{") :])
    args = resolved["openrlhf_args"]
    assert resolved["policy"] == f"spec(lenience={lenience})"
    assert args["rollout"]["batch_size"] == 1024 and args["rollout"]["n_samples_per_prompt"] == 8
    assert args["rollout"]["max_new_tokens"] == 4096 and args["actor"]["adam"]["lr"] == 5e-7
    assert resolved["engines"]["remote_url"][0].endswith("rewards/math_verify_reward.py")
    for path, expected in checks.items():
        value = args
        for part in path:
            value = value[part]
        assert value == expected


def test_openrlhf_module_refuses_a_bad_lenience_before_ray():
    result = cli(BASE + ["--rollout_reuse", "spec", "--lenience", "-1"], timeout=60, module=OPENRLHF_MODULE)
    assert result.returncode == 2 and "train_ppo_ray.py: error: " in result.stderr
    assert "lenience must be > 0, got -1.0" in result.stderr and "Started a local Ray instance" not in result.stderr


@pytest.mark.parametrize("args", [BASE, ["--not_a_flag"], BASE + ["--rollout_reuse", "spec"]])
def test_openrlhf_module_without_our_flags_or_with_the_hook_off_is_stock(args):
    """Without our flags (or with SPECRL_OPENRLHF_HOOK=0) OpenRLHF's module runs as if we were not installed: the
    same output, byte for byte, as with the hook off. On CPU that is its import error (it needs flash-attn)."""
    stock = cli(args, timeout=60, module=OPENRLHF_MODULE, env={"SPECRL_OPENRLHF_HOOK": "0"})
    if "--rollout_reuse" in args:
        assert "rollout_reuse" not in stock.stderr  # the switch works: OpenRLHF never saw our parser
    else:
        hooked = cli(args, timeout=60, module=OPENRLHF_MODULE)
        assert (hooked.returncode, hooked.stdout, hooked.stderr) == (stock.returncode, stock.stdout, stock.stderr)
    assert stock.returncode != 0


def test_train_with_reuse_starts_ray_with_the_eval_marking_hook(monkeypatch):
    """OpenRLHF's train() calls ray.init with its runtime env; ours adds the worker setup hook and nothing else."""
    from specrl_openrlhf.integration.openrlhf_eval import WORKER_SETUP_HOOK

    calls = []

    def fake_init(*args, runtime_env=None, **kwargs):
        calls.append(runtime_env)

    fake_ray = types.SimpleNamespace(init=fake_init, is_initialized=lambda: False)
    upstream = types.ModuleType(OPENRLHF_MODULE)
    upstream.ray, upstream.create_vllm_engines = fake_ray, None
    upstream.train = lambda args: upstream.ray.init(runtime_env={"env_vars": {"NCCL_DEBUG": "WARN"}})
    monkeypatch.setitem(sys.modules, OPENRLHF_MODULE, upstream)
    ns = types.SimpleNamespace
    args = ns(
        rollout_reuse="spec",
        lenience=None,
        reuse=ns(
            seed=0,
            logprobs="auto",
            cache_max_gb=1.0,
            cache_shards=1,
            cache_dir=None,
            plugin=[],
            dry_run=False,
            checkpoint_poll_s=10.0,
            trace_dir=None,
            update_every=None,
            scoring="chunked",
        ),
        ckpt=ns(load_enable=False, path="/nonexistent"),
        rollout=ns(batch_size=8, n_samples_per_prompt=4, temperature=1.0, top_p=1.0),
        reward=ns(remote_url=None),
        train=ns(agent_func_path=None),
    )
    openrlhf_cli.train_with_reuse(args)
    assert calls == [{"env_vars": {"NCCL_DEBUG": "WARN"}, "worker_process_setup_hook": WORKER_SETUP_HOOK}]
    assert fake_ray.init is fake_init  # restored
