"""`python -m specrl_openrlhf.cli.train_ppo_ray`, and OpenRLHF's own command, as users run them: OpenRLHF's module
runs as it is (its parser, its validation, its `train`), with our argument group. OpenRLHF's example launch scripts
dry-run with our two flags; bad input fails before Ray starts with one usage line and the error; tracebacks name
OpenRLHF's own lines; without our flags OpenRLHF runs untouched.

OpenRLHF's module imports flash-attn, which needs CUDA: tests/stubs stands in for it on CPU (see its README)."""

import concurrent.futures
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import traceback
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.openrlhf
pytest.importorskip("openrlhf")

from specrl_openrlhf.integration.openrlhf import cli as openrlhf_cli  # noqa: E402
from specrl_openrlhf.integration.openrlhf import seams as openrlhf_seams  # noqa: E402

OURS = ["--rollout_reuse", "spec", "--lenience", "1.65"]
OURS_MODULE, OPENRLHF_MODULE = "specrl_openrlhf.cli.train_ppo_ray", "openrlhf.cli.train_ppo_ray"
EXAMPLES = json.loads((Path(__file__).parents[2] / "data" / "openrlhf_examples.json").read_text())["examples"]
# What the examples (written for 0.11.0) spell differently in the installed 0.11.2.
RENAMED = {
    "--algo.advantage.is_correction_enable": ["--algo.advantage.is_correction_level", "token"],
    "--algo.advantage.is_correction_type": ["--algo.advantage.is_correction_mode"],  # icepop = a token mask
}
VALUES = {"icepop": "mask"}
# what the command says of the 4 engines of train_dapo_ray_hybrid_engine
ENGINE_SIZE = "each of the 4 vLLM engine(s) OpenRLHF builds schedules at most 128 rows (max_num_seqs, vLLM's default)"


def run_in_process(args):
    """Our command, in this process (OpenRLHF's module is imported once per session, not once per case)."""
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            openrlhf_seams.main(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())


def run_openrlhf(args, env=None, timeout=120):
    """OpenRLHF's own command in a fresh process (our .pth hook decides whether to step in)."""
    return subprocess.run(
        [sys.executable, "-m", OPENRLHF_MODULE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def port_to_0112(args, agent_file):
    out = []
    for arg in args:
        arg = agent_file if arg.endswith("agent_func.py") else VALUES.get(arg, arg)
        out += RENAMED.get(arg, [arg])
    return out


@pytest.fixture
def agent_file(tmp_path):
    path = tmp_path / "agent_func.py"
    path.write_text("from openrlhf.utils.agent import SingleTurnAgentExecutor as AgentExecutor\n")
    return str(path)


def resolved(result) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout[result.stdout.index("{") :])


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_openrlhfs_example_launch_scripts_dry_run_with_our_flags(name, agent_file):
    args = port_to_0112(EXAMPLES[name], agent_file)
    plan = resolved(run_in_process(args + OURS + ["--reuse.dry_run"]))
    assert plan["policy"] == "spec(lenience=1.65)"
    engines, openrlhf = plan["engines"], plan["openrlhf_args"]
    assert engines["agent_func_path"].endswith("agent_entry.py")  # what the engines get: our executor...
    assert openrlhf["vllm"]["num_engines"] == int(args[args.index("--vllm.num_engines") + 1])
    if "--train.agent_func_path" in args:  # ...around the user's agent, whose rewards stay its own
        assert engines["inner_agent_func_path"] == agent_file and openrlhf["reward"]["remote_url"] == ["agent"]
    elif "--reward.remote_url" in args:  # ...around OpenRLHF's executor with the user's reward function
        assert engines["remote_url"] == [args[args.index("--reward.remote_url") + 1]]
    else:  # ...or with no reward URL: the reward model keeps scoring, as OpenRLHF set it up
        assert engines["remote_url"] is None and openrlhf["reward"]["model_name_or_path"]
        assert openrlhf["train"]["agent_func_path"] is None  # set only after OpenRLHF's validation, in train()


def test_the_literal_command_takes_our_flags_and_gives_lossless_engines_our_proposer():
    """OpenRLHF's own command (a fresh process: our .pth hook steps in) takes our flags. `--rollout_reuse lossless`
    verifies in the engine: the engines OpenRLHF starts get our proposer (the dry run prints their arguments), and the
    command module's `create_vllm_engines` is our stand-in around OpenRLHF's; a rule on the request path (`spec`,
    whose lenience the same parser reads) leaves it alone. The command says each engine's size, vLLM's defaults here,
    and warns that 128 rows x (1 + 16) draft tokens are over their 2,048-token budget."""
    from specrl_openrlhf.policies.builtin import HISTORY_PROPOSER as PROPOSER

    args = port_to_0112(EXAMPLES["train_dapo_ray_hybrid_engine"], "")
    literal = run_openrlhf(args + ["--rollout_reuse", "lossless", "--reuse.dry_run"])
    plan = resolved(literal)
    # the size of the engines OpenRLHF builds: vLLM's defaults (tests/integration/vllm/test_engine_defaults.py), too
    # small a budget for lossless's k = 16 drafts in every row, which the command says with the fix
    assert f"{ENGINE_SIZE} and 2048 tokens a step (max_num_batched_tokens, vLLM's default)" in literal.stderr
    # the DAPO example sets --vllm.enforce_eager, which OpenRLHF hands its engines: the size line says so
    eager = "tokens a step (max_num_batched_tokens, vLLM's default), without CUDA graphs (--vllm.enforce_eager)"
    assert "--vllm.enforce_eager" in args and eager in literal.stderr
    warning = "warning: --rollout_reuse lossless drafts up to k = 16 tokens a row: a full step of 128 rows x (1 + 16)"
    assert f"{warning} = 2176 tokens is over the engine's budget of 2048" in literal.stderr
    assert "so our proposer drafts at most 1920 tokens a full step in all (the likeliest slots)" in literal.stderr
    assert (
        "Fix: --vllm.max_num_batched_tokens 2176 (or more), or fewer rows: --vllm.max_num_seqs 120" in literal.stderr
    )
    extra = plan["engines"]["engine_kwargs"]
    assert not {"max_num_seqs", "max_num_batched_tokens"} & set(extra)  # vLLM's defaults: nothing passed
    assert extra["speculative_config"]["model"] == PROPOSER and extra["speculative_config"]["method"] == "custom_class"
    assert extra["per_request_spec_decode_metrics"] == "detailed" and extra["scheduling_policy"] == "priority"
    spec = resolved(run_in_process(args + OURS + ["--reuse.dry_run"]))
    assert spec["policy"] == "spec(lenience=1.65)" and spec["engines"]["samples_per_visit"] == 8
    assert spec["engines"]["engine_kwargs"] == {}

    def upstream_create(*args, **kwargs):
        return "engines"

    for rule, params, wrapped in (
        ("lossless", {}, True),
        ("spec", {}, False),
        ("lossless", {"verify": "requests"}, False),
    ):
        module = {"train": lambda a: None, "create_vllm_engines": upstream_create}
        openrlhf_cli.take_over_names(openrlhf_cli.ReuseConfig(policy=rule, params=params), module)
        assert (module["create_vllm_engines"] is not upstream_create) == wrapped, (rule, params)
        assert getattr(module["create_vllm_engines"], "__wrapped__", upstream_create) is upstream_create


def test_the_literal_command_passes_our_engine_size_to_every_engine_and_warns_only_where_drafts_dont_fit():
    """`--vllm.max_num_batched_tokens 4096` (our flag: OpenRLHF has none) on OpenRLHF's own command: the command says
    each engine's size, the value reaches every engine's arguments, and 128 rows x (1 + 16) = 2,176 tokens fit, so
    nothing is warned (without it, the test above sees the warning)."""
    args = port_to_0112(EXAMPLES["train_dapo_ray_hybrid_engine"], "") + ["--rollout_reuse", "lossless"]
    wide = run_openrlhf(args + ["--vllm.max_num_batched_tokens", "4096", "--reuse.dry_run"])
    assert f"{ENGINE_SIZE} and 4096 tokens a step (--vllm.max_num_batched_tokens)" in wide.stderr
    assert "warning: --rollout_reuse lossless drafts" not in wide.stderr
    plan = resolved(wide)
    extra = plan["engines"]["engine_kwargs"]
    assert extra["max_num_batched_tokens"] == 4096 and "max_num_seqs" not in extra
    assert extra["speculative_config"]["num_speculative_tokens"] == 16
    assert plan["reuse"]["max_num_batched_tokens"] == 4096
    assert "max_num_batched_tokens" not in plan["openrlhf_args"]["vllm"]  # ours, not OpenRLHF's


def test_the_literal_command_dry_runs_with_async_training_and_partial_rollouts():
    """OpenRLHF's async training with partial rollouts (`--train.async_enable --train.partial_rollout_enable`: its
    engines are paused with `pause_generation(mode="keep")` around every weight update) on OpenRLHF's own command, with
    `lossless` (its engines keep our proposer, which drafts on for the requests resumed after each update:
    tests/integration/vllm/v1/test_proposer.py) and with `spec` at lenience 1.65 (the request path, whose kept prefix
    may have been verified against the weights before an update: docs/usage.md, "Async training and partial
    rollouts")."""
    from specrl_openrlhf.policies.builtin import HISTORY_PROPOSER, HISTORY_SPECULATOR

    args = BASE + ["--train.async_enable", "--train.partial_rollout_enable", "--reuse.dry_run"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two processes side by side: each mostly imports
        lossless, spec = pool.map(run_openrlhf, [args + ["--rollout_reuse", "lossless"], args + OURS])
    for result, policy in ((lossless, "lossless(draft='tree'"), (spec, "spec(lenience=1.65)")):
        plan = resolved(result)
        train = plan["openrlhf_args"]["train"]
        assert plan["policy"].startswith(policy) and train["async_enable"] and train["partial_rollout_enable"]
    config = resolved(lossless)["engines"]["engine_kwargs"]["speculative_config"]
    assert config.get("model", config["method"]) in (HISTORY_PROPOSER, HISTORY_SPECULATOR)  # V1's or V2's
    assert resolved(spec)["engines"]["engine_kwargs"] == {}


@pytest.mark.parametrize(
    "args, warned",
    [
        (["--rollout_reuse", "lossless"], True),
        (["--rollout_reuse", "lossless", "--vllm.max_num_seqs", "120"], False),  # 120 x 17 = 2040
        (["--rollout_reuse", "lossless", "--reuse.params", '{"num_speculative_tokens": 15}'], False),  # 128 x 16
        (["--rollout_reuse", "lossless", "--vllm.max_num_seqs", "256", "--vllm.max_num_batched_tokens", "4096"], True),
        (["--rollout_reuse", "lossless", "--reuse.params", '{"verify": "requests"}'], False),  # no drafts in engine
        (["--rollout_reuse", "ngram"], False),  # vLLM's n-gram proposer: k = 8
        (["--rollout_reuse", "spec"], False),  # the request path
    ],
)
def test_the_draft_budget_is_warned_for_rules_verified_in_the_engine_only(args, warned):
    result = run_in_process(BASE + args + ["--reuse.dry_run"])
    assert result.returncode == 0, result.stderr
    assert ("tokens is over the engine's budget" in result.stderr) == warned, result.stderr


def test_a_peers_drafts_past_the_budget_are_said_to_be_cut_by_vllm():
    """vLLM's suffix decoding at k = 16 drafts past the budget too: vLLM cuts its drafts, where ours fit the budget."""
    peer = [
        "--rollout_reuse",
        "suffix",
        "--reuse.params",
        '{"speculative_config": {"method": "suffix", "num_speculative_tokens": 16}}',
        "--reuse.dry_run",
    ]
    result = run_in_process(BASE + peer)
    assert result.returncode == 0, result.stderr
    assert "so vLLM cuts the drafts of the rows it schedules last" in result.stderr, result.stderr


def test_the_size_line_says_whether_the_engines_capture_cuda_graphs_as_openrlhfs_flag_sets_them():
    """OpenRLHF hands its `--vllm.enforce_eager` to every engine (`create_vllm_engines(..., enforce_eager, ...)`): the
    size line reads that flag, on or off."""
    graphs = run_in_process(BASE + ["--rollout_reuse", "ngram", "--reuse.dry_run"])
    eager = run_in_process(BASE + ["--rollout_reuse", "ngram", "--vllm.enforce_eager", "--reuse.dry_run"])
    assert graphs.returncode == eager.returncode == 0, graphs.stderr + eager.stderr
    assert "tokens a step (max_num_batched_tokens, vLLM's default), with CUDA graphs (no --vllm.enforce_eager)" in (
        graphs.stderr
    )
    assert "without CUDA graphs (--vllm.enforce_eager)" in eager.stderr
    assert resolved(eager)["openrlhf_args"]["vllm"]["enforce_eager"] is True  # what OpenRLHF gives its engines


def test_our_engine_size_reaches_openrlhfs_engines_without_a_rule(monkeypatch):
    """`--vllm.max_num_seqs` alone (`off`: stock OpenRLHF otherwise) still reaches every engine OpenRLHF builds: the
    command module's `create_vllm_engines` is our stand-in, whose engines' arguments get it."""
    plan = resolved(run_in_process(BASE + ["--vllm.max_num_seqs", "64", "--reuse.dry_run"]))
    assert plan["policy"] == "off()" and plan["engines"] == {"engine_kwargs": {"max_num_seqs": 64}}
    assert "max_num_seqs" not in plan["openrlhf_args"]["vllm"]  # ours, not OpenRLHF's
    from specrl_openrlhf.integration.openrlhf import engines

    wrapped = []
    monkeypatch.setattr(engines, "with_engine_kwargs", lambda create, extra: wrapped.append(extra) or create)
    module = {"train": lambda a: None, "create_vllm_engines": lambda *a, **kw: "engines"}
    openrlhf_cli.take_over_names(openrlhf_cli.ReuseConfig(max_num_seqs=64), module)
    openrlhf_kwargs = {"model": "m", "max_model_len": 2048}
    assert [extra(dict(openrlhf_kwargs)) for extra in wrapped] == [{**openrlhf_kwargs, "max_num_seqs": 64}]
    openrlhf_cli.take_over_names(openrlhf_cli.ReuseConfig(), module)
    assert len(wrapped) == 1  # `off` without our engine size: OpenRLHF's own create_vllm_engines


def test_the_peers_engines_get_vllms_speculation_and_our_executor():
    """`--rollout_reuse ngram` (vLLM's own speculation, a peer) reuses nothing, yet the run is ours: the engines
    OpenRLHF starts get the rule's speculative config with vLLM's per-request acceptance counts, and our executor,
    which logs them per sample as `reuse/` metrics (test_engines). `off` leaves OpenRLHF's engines alone."""
    args = port_to_0112(EXAMPLES["train_dapo_ray_hybrid_engine"], "")
    engines = resolved(run_in_process(args + ["--rollout_reuse", "ngram", "--reuse.dry_run"]))["engines"]
    assert engines["agent_func_path"] == openrlhf_cli.AGENT_ENTRY
    extra = engines["engine_kwargs"]
    assert extra["speculative_config"]["method"] == "ngram" and extra["per_request_spec_decode_metrics"] == "detailed"

    def upstream_create(*args, **kwargs):
        return "engines"

    for rule, wrapped in (("ngram", True), ("vllm", True), ("off", False)):
        module = {"train": lambda a: None, "create_vllm_engines": upstream_create}
        openrlhf_cli.take_over_names(openrlhf_cli.ReuseConfig(policy=rule), module)
        assert (module["create_vllm_engines"] is not upstream_create) == wrapped, rule


def test_examples_as_written_get_openrlhfs_own_error_in_two_lines(agent_file):
    result = run_in_process(EXAMPLES["train_ppo_ray_hybrid_engine"] + OURS)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"usage: python -m {OURS_MODULE} [OpenRLHF flags]")
    assert "error: unrecognized arguments: --algo.advantage.is_correction_enable" in lines[1]


def test_the_request_path_without_vllms_prefix_cache_is_warned_with_the_flag_that_turns_it_on():
    """OpenRLHF's examples leave the prefix cache off; the request path reads it (the engine path does not need it)."""
    args = port_to_0112(EXAMPLES["train_dapo_ray_hybrid_engine"], "") + ["--reuse.dry_run"]
    warned = "add --vllm.enable_prefix_caching"
    assert warned in run_in_process(args + OURS).stderr
    assert warned not in run_in_process(args + OURS + ["--vllm.enable_prefix_caching"]).stderr
    assert warned not in run_in_process(args + ["--rollout_reuse", "lossless"]).stderr


def test_off_is_stock():
    plan = resolved(run_in_process(port_to_0112(EXAMPLES["train_ppo_with_reward_fn"], "") + ["--reuse.dry_run"]))
    assert plan["policy"] == "off()" and "engines" not in plan


def test_help_lists_openrlhfs_and_our_flags():
    result = run_in_process(["--help"])
    assert result.returncode == 0 and result.stdout.startswith(f"usage: python -m {OURS_MODULE} ")
    for flag in ["--actor.model_name_or_path", "--vllm.num_engines", "--rollout_reuse", "--reuse.params"]:
        assert flag in result.stdout
    openrlhfs, ours = result.stdout.split("speculative rollouts (specrl-openrlhf)")
    for flag in ["--vllm.max_num_seqs", "--vllm.max_num_batched_tokens"]:  # OpenRLHF 0.11.2 has neither
        assert flag in ours and flag not in openrlhfs


BASE = ["--actor.model_name_or_path", "m", "--vllm.num_engines", "1", "--reward.remote_url", "r.py"]


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("eager", [False, True])
def test_the_command_names_the_engine_the_installed_vllm_runs_and_its_engines_get_it(eager):
    """The start-up line names the path the installed vLLM takes, and the engines' arguments follow it: vLLM <= 0.33,
    our V1 `custom_class` proposer; vLLM 0.34, our V2 speculator with adaptive verification, off under
    `--vllm.enforce_eager` (no CUDA graphs). scripts/test_vllm034.sh runs it under vLLM 0.33's and 0.34's modules."""
    from specrl_openrlhf.integration.vllm import versions
    from specrl_openrlhf.policies.builtin import HISTORY_SPECULATOR

    version = versions.installed()
    result = run_in_process(
        BASE + ["--rollout_reuse", "lossless", "--reuse.dry_run"] + ["--vllm.enforce_eager"] * eager
    )
    extra = resolved(result)["engines"]["engine_kwargs"]
    config = extra["speculative_config"]
    assert "enforce_eager" not in extra  # OpenRLHF's own argument: ours are what the dry run shows
    if versions.runner_of(version) == "v1":
        line = f"[specrl-openrlhf] lossless: vLLM {version}, V1 custom_class proposer, host paid serially"
        assert line in result.stderr and config["method"] == "custom_class"
        return
    adaptive = "off (--vllm.enforce_eager: no CUDA graphs)" if eager else "on"
    line = f"lossless: vLLM {version}, V2 speculator {HISTORY_SPECULATOR}, adaptive verification {adaptive}"
    assert f"[specrl-openrlhf] {line}" in result.stderr
    assert config["method"] == HISTORY_SPECULATOR and config["enable_adaptive_verification"] is not eager
    assert set(config["speculator_options"]) == {"history_mb", "min_match", "shared", "lookup"}


# a setting the other runner's vLLM cannot run: the V2 runner's on vLLM <= 0.33, the V1 runner's on vLLM 0.34
SUFFIX = ["--rollout_reuse", "suffix", "--reuse.params"]
CANNOT_RUN = {
    "v1": [
        (SUFFIX + ['{"speculative_config": {"method": "suffix", "suffix_decoding_corpus_tokens": 4096}}'], "0.34's"),
        (SUFFIX + ['{"speculative_config": {"method": "suffix", "enable_adaptive_verification": true}}'], "0.34's"),
    ],
    "v2": [
        (
            ["--rollout_reuse", "vllm", "--reuse.params", '{"speculative_config": {"method": "custom_class"}}'],
            "'custom_class' is the V1 runner's, which vLLM 0.34",
        ),
        (SUFFIX + ['{"speculative_config": {"method": "suffix", "suffix_decoding_min_token_prob": 0.2}}'], "V1 suff"),
        (
            SUFFIX
            + ['{"speculative_config": {"method": "suffix", "enable_adaptive_verification": true}}']
            + ["--vllm.enforce_eager"],
            "which --vllm.enforce_eager: no CUDA graphs rules out",
        ),
    ],
}


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("case", range(3))
def test_a_setting_the_installed_vllm_cannot_run_is_a_usage_error_before_ray(case):
    from specrl_openrlhf.integration.vllm import versions

    cases = CANNOT_RUN[versions.runner_of(versions.installed())]
    if case >= len(cases):
        pytest.skip("fewer cases for this runner")
    args, message = cases[case]
    result = run_in_process(BASE + args + ["--reuse.dry_run"])
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines[-2].startswith("usage: ") and message in lines[-1], result.stderr
    assert "Started a local Ray instance" not in result.stderr


@pytest.mark.slow  # a longer variant: the module's other error tests run the same parser in-process
def test_the_console_script_names_itself_in_errors():
    script = Path(sys.executable).parent / "specrl-train-ppo-ray"
    if not script.is_file():
        pytest.skip("the package is not installed with its console script")
    result = subprocess.run(
        [str(script), *BASE, "--rollout_reuse", "spce"], capture_output=True, text=True, timeout=120
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines[0].startswith("usage: specrl-train-ppo-ray [OpenRLHF flags]"), lines
    assert "Did you mean 'spec'?" in lines[1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rollout_reuse", "spce"], "--rollout_reuse: unknown reuse policy 'spce'. Did you mean 'spec'?"),
        (["--rollout_reuse", "spec", "--lenience", "0"], "lenience must be > 0, got 0.0"),
        (["--rollout_reuse", "spec", "--lenience", "nan"], "lenience must be > 0, got nan"),
        (["--rollout_reuse", "spec", "--lenience", "abc"], "argument --lenience: invalid float value: 'abc'"),
        (["--rollout_reuse", "exact", "--lenience", "2"], "'exact' takes no lenience; drop --lenience"),
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
        (["--rollout_reuse", "rule.py"], "rule.py: the class name is missing; write path/to/rule.py:ClassName"),
        (["--rollout_reuse", f"{Path(__file__)}:Nope"], "has no 'Nope'"),
        (["--rollout_reuse", "lossless", "--reuse.params", '{"history": 3}'], "history must be one of 1, 2, got 3"),
        (
            ["--rollout_reuse", "lossless", "--reuse.params", '{"cost_curve": "/nope/h200.json"}'],
            "/nope/h200.json: no such step curve file",
        ),
        (["--rollout_reuse", "spec", "--reuse.trace_dir", "/proc/specrl"], "--reuse.trace_dir /proc/specrl: not a"),
        (["--vllm.max_num_seqs", "0"], "--vllm.max_num_seqs must be a positive integer, got 0"),
        (
            ["--vllm.max_num_batched_tokens", "lots"],
            "argument --vllm.max_num_batched_tokens: invalid int value: 'lots'",
        ),
        (
            ["--rollout_reuse", "lossless", "--vllm.max_num_seqs", "256", "--vllm.max_num_batched_tokens", "128"],
            "--vllm.max_num_batched_tokens 128 is below --vllm.max_num_seqs 256",
        ),
    ],
)
def test_bad_input_fails_before_ray_with_one_usage_line_and_the_fix(args, message):
    result = run_in_process(BASE + args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("usage: ") and message in lines[1], lines
    assert "Started a local Ray instance" not in result.stderr


@pytest.mark.slow  # a longer variant: a whole OpenRLHF launch to read one traceback
def test_tracebacks_name_openrlhfs_own_lines(agent_file):
    """An error raised by OpenRLHF's validation shows OpenRLHF's file and the very line that raised it."""
    args = BASE + ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "1"] + OURS
    with pytest.raises(AssertionError, match="requires n_samples_per_prompt > 1") as info:
        openrlhf_seams.main(args)
    frames = [f for f in traceback.extract_tb(info.tb) if f.filename.endswith("openrlhf/cli/train_ppo_ray.py")]
    assert frames and all(f.filename.startswith(str(Path(sys.modules["openrlhf"].__file__).parent)) for f in frames)
    source = Path(frames[-1].filename).read_text().splitlines()
    assert "n_samples_per_prompt > 1" in "\n".join(source[frames[-1].lineno - 1 : frames[-1].lineno + 2])
    literal = run_openrlhf(args)  # OpenRLHF's own command through the .pth hook
    assert literal.returncode == 1 and "line 2, in <module>" not in literal.stderr
    assert f'openrlhf/cli/train_ppo_ray.py", line {frames[-1].lineno}, in <module>' in literal.stderr


def test_without_our_flags_openrlhfs_command_is_untouched():
    """Without our flags (or with SPECRL_OPENRLHF_HOOK=0) OpenRLHF's module runs as if we were not installed: the
    same output as with the hook off. Here: OpenRLHF's own error for a flag it does not know."""

    def output(result):  # DeepSpeed's import-time warnings carry the time
        return result.returncode, re.sub(r"\[\d{4}-\d\d-\d\d [\d:,]+\]", "[time]", result.stdout + result.stderr)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two processes side by side: each mostly imports
        stock, hooked = pool.map(run_openrlhf, [BASE + ["--not_a_flag"]] * 2, [{"SPECRL_OPENRLHF_HOOK": "0"}, None])
    assert output(hooked) == output(stock)
    assert stock.returncode == 2 and "unrecognized arguments: --not_a_flag" in stock.stderr


@pytest.mark.slow  # a longer variant: tests/test_hook.py checks the switch without starting OpenRLHF's module
def test_with_the_hook_switched_off_openrlhf_never_sees_our_flags():
    switched_off = run_openrlhf(BASE + ["--rollout_reuse", "spec"], env={"SPECRL_OPENRLHF_HOOK": "0"})
    assert "unrecognized arguments: --rollout_reuse spec" in switched_off.stderr  # OpenRLHF never saw our group


@pytest.mark.parametrize("rule", ["spec", "ngram", "off"])
def test_train_with_reuse_starts_ray_and_hands_the_engines_our_executor(rule, monkeypatch, tmp_path):
    """After OpenRLHF's validation: Ray starts with OpenRLHF's env vars and our worker setup hook, the run's reuse
    actors start, the engines get our executor through `--train.agent_func_path`, and OpenRLHF's `train` runs with
    the user's reward settings as they were. So for a peer (`ngram`: vLLM speculates, our executor logs what it
    accepted); `off` is OpenRLHF's `train` as it is, and the command module keeps its own names."""
    import ray

    from specrl_openrlhf.integration.openrlhf import draft_store
    from specrl_openrlhf.integration.openrlhf.eval import WORKER_SETUP_HOOK

    calls = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(("init", kwargs)))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(draft_store, "start_reuse", lambda settings, config, **kw: calls.append(("reuse", settings)))
    idle = types.SimpleNamespace(start=lambda: None, stopped=threading.Event())
    monkeypatch.setattr(openrlhf_cli, "CheckpointWatcher", lambda *a: idle)
    ns = types.SimpleNamespace
    args = ns(
        rollout_reuse=rule,
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
            params={},
        ),
        ckpt=ns(load_enable=False, path=str(tmp_path)),
        rollout=ns(batch_size=8, n_samples_per_prompt=4, temperature=1.0, top_p=1.0),
        reward=ns(remote_url=["r.py"]),
        train=ns(agent_func_path=None),
        vllm=ns(num_engines=1, max_num_seqs=None, max_num_batched_tokens=None),
    )
    built = []
    build = openrlhf_cli.ReuseConfig.build_policy
    monkeypatch.setattr(openrlhf_cli.ReuseConfig, "build_policy", lambda self: built.append(1) or build(self))
    takes_over = openrlhf_cli.after_parse(None, args)  # what the command module gets: our train, or nothing
    assert (takes_over is None) == (rule == "off")

    def upstream_train(a):
        calls.append(("train", a.train.agent_func_path, a.reward.remote_url))

    if takes_over is None:
        openrlhf_cli.train_with_reuse(args, upstream_train)
    else:
        module = {"train": upstream_train}
        takes_over(module)
        module["train"](args)
        assert len(built) == 1  # the rule is built once for the run, its plugins loaded once
    if rule == "off":
        assert calls == [("train", None, ["r.py"])]
        return
    (_, init), (_, settings), train = calls
    assert init["runtime_env"]["worker_process_setup_hook"] == WORKER_SETUP_HOOK
    assert set(init["runtime_env"]["env_vars"]) == {
        "TOKENIZERS_PARALLELISM",
        "NCCL_DEBUG",
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS",
    }
    assert settings["remote_url"] == ["r.py"] and settings["samples_per_visit"] == 4
    assert train == ("train", openrlhf_cli.AGENT_ENTRY, ["r.py"])


@pytest.mark.slow  # a launch script's dry run in a process of its own (the module's other tests parse the same flags)
@pytest.mark.parametrize("reuse, policy", [("spec", "spec(lenience=1.6487212707)"), ("exact", "exact()")])
def test_a_paper_preset_launches_with_its_lenience_for_lenient_rules_only(reuse, policy):
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(
        ["bash", "scripts/launch.sh", "grpo", "--actor.model_name_or_path", "m", "--reuse.dry_run"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "REUSE": reuse, "PATH": path},
    )
    plan = resolved(result)
    assert plan["policy"] == policy and plan["openrlhf_args"]["rollout"]["batch_size"] == 1024
    assert plan["openrlhf_args"]["algo"]["advantage"]["estimator"] == "group_norm"
    if reuse == "spec":
        assert plan["engines"]["remote_url"][0].endswith("rewards/math_verify_reward.py")
