"""Which engine the installed vLLM runs (`vllm.versions`): the version rule matches what each vLLM has, every module
of the package imports under it, and a setting its engine cannot run is refused before any engine starts, naming
the setting and the fix.

Marked vllm_wheel (the checks of the installed vLLM): `scripts/test_vllm034.sh` runs them again under vLLM 0.33's and
0.34's own modules; the others take the version as an argument."""

import importlib.util
import os
import subprocess
import sys
import types

import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.integration.vllm import versions
from specrl_openrlhf.policies.base import EngineTarget
from specrl_openrlhf.policies.builtin import HISTORY_PROPOSER, HISTORY_SPECULATOR
from specrl_openrlhf.policies.speculative import SpeculativeConfigError

WALK = """
import importlib, pkgutil, specrl_openrlhf
failed = []
for module in pkgutil.walk_packages(specrl_openrlhf.__path__, "specrl_openrlhf."):
    try:
        importlib.import_module(module.name)
    except BaseException as error:
        failed.append(f"{module.name}: {type(error).__name__}: {error}")
print("FAILED", failed)
"""


@pytest.mark.vllm_wheel
def test_every_module_of_the_package_imports_under_the_installed_vllm():
    vllm = pytest.importorskip("vllm")
    done = subprocess.run(
        [sys.executable, "-c", WALK], capture_output=True, text=True, timeout=600, env={**os.environ}, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "FAILED []", (vllm.__version__, done.stdout[-3000:])


@pytest.mark.vllm_wheel
def test_the_installed_vllm_has_the_engine_its_version_picks():
    """vLLM <= 0.33: the V1 runner's `custom_class` proposer hook; >= 0.34: the V2 speculator registry, and no V1
    runner (the version, not a feature probe, chooses: this holds the two together)."""
    pytest.importorskip("vllm")
    has = lambda module: importlib.util.find_spec(module) is not None  # noqa: E731
    custom_class = has("vllm.v1.spec_decode.custom_class_proposer")
    registry = has("vllm.v1.worker.gpu.spec_decode.speculator_config")
    runner = versions.runner_of(versions.installed())
    assert (runner, custom_class) in (("v1", True), ("v2", False)), versions.installed()
    if runner == "v2":
        assert registry


@pytest.mark.parametrize(
    "version, parsed, runner",
    [
        ("0.29.0", (0, 29, 0), "v1"),
        ("0.32.0+cpu", (0, 32, 0), "v1"),
        ("0.33.1", (0, 33, 1), "v1"),
        ("0.34.0", (0, 34, 0), "v2"),
        ("0.35.0.dev12+g1234", (0, 35, 0), "v2"),
        ("1.0", (1, 0, 0), "v2"),
    ],
)
def test_the_version_picks_the_runner(version, parsed, runner):
    assert versions.parse(version) == parsed and versions.runner_of(version) == runner


def test_adaptive_verification_is_on_only_where_the_engine_has_full_cuda_graphs():
    eager = {"enforce_eager": True}
    assert versions.adaptive_blockers({}) == [] and versions.adaptive_blockers({"enforce_eager": False}) == []
    assert versions.adaptive_blockers(eager, {"enforce_eager": "--vllm.enforce_eager"}) == [
        "--vllm.enforce_eager: no CUDA graphs"
    ]
    assert versions.adaptive_blockers({"enable_lora": True, "pipeline_parallel_size": 2}) == [
        "enable_lora: LoRA",
        "pipeline_parallel_size 2: pipeline parallelism",
    ]
    assert versions.adaptive_blockers({"compilation_config": {"cudagraph_mode": "PIECEWISE"}})
    assert not versions.adaptive_blockers({"compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}})
    assert versions.engine_path({}, version="0.34.0").target == EngineTarget(runner="v2", adaptive_verification=True)
    assert versions.engine_path(eager, version="0.34.0").target == EngineTarget(runner="v2")
    assert versions.engine_path({}, version="0.29.0").target == EngineTarget(runner="v1")  # V1 has none
    with pytest.raises(ValueError, match="runner='v2'"):
        EngineTarget(runner="v1", adaptive_verification=True)


def test_lossless_gets_the_v1_proposer_or_the_v2_speculator_with_its_options():
    lossless = sr.make("lossless", history_mb=256, min_match=3, shared=False)
    v1 = lossless.engine_arguments(versions.engine_path({}, version="0.32.0").target)["speculative_config"]
    assert v1 == {"method": "custom_class", "model": HISTORY_PROPOSER, "num_speculative_tokens": 16}
    for kwargs, adaptive in (({}, True), ({"enforce_eager": True}, False)):
        target = versions.engine_path(kwargs, version="0.34.0").target
        v2 = lossless.engine_arguments(target)["speculative_config"]
        assert v2 == {
            "method": HISTORY_SPECULATOR,
            "num_speculative_tokens": 16 if adaptive else 4,  # k where vLLM sizes rows; else `fixed_tokens`
            "speculator_options": {"history_mb": 256, "min_match": 3, "shared": False, "lookup": True},
            "enable_adaptive_verification": adaptive,
        }
    assert sr.make("lossless", verify="requests").engine_arguments(target) == {}


def test_the_peers_take_each_runners_defaults():
    v1, v2 = EngineTarget(), EngineTarget(runner="v2", adaptive_verification=True)
    suffix = sr.make("suffix")
    assert suffix.engine_arguments(v1)["speculative_config"] == {"method": "suffix", "num_speculative_tokens": 24}
    assert suffix.engine_arguments(v2)["speculative_config"] == {
        "method": "suffix",
        "num_speculative_tokens": 8,  # vLLM 0.34's GPU suffix speculator verifies every slot: min(8, depth)
        "enable_adaptive_verification": True,
    }
    given = sr.make("suffix", speculative_config={"method": "suffix", "num_speculative_tokens": 12})
    assert given.engine_arguments(EngineTarget(runner="v2"))["speculative_config"]["num_speculative_tokens"] == 12
    ngram = sr.make("ngram")
    assert ngram.engine_arguments(v2) == ngram.engine_arguments(v1)  # no confidences: never adaptive


@pytest.mark.parametrize(
    "rule, config, version, kwargs, message",
    [
        ("vllm", {"method": "custom_class", "model": "x.Y"}, "0.34.0", {}, "'custom_class' is the V1 runner's"),
        ("suffix", {"method": "suffix", "suffix_decoding_min_token_prob": 0.2}, "0.34.0", {}, "V1 suffix decoding's"),
        ("suffix", {"method": "suffix", "enable_adaptive_verification": True}, "0.29.0", {}, "vLLM >= 0.34's"),
        ("suffix", {"method": "suffix", "suffix_decoding_corpus_tokens": 4096}, "0.32.0", {}, "install vLLM 0.34"),
        ("vllm", {"method": "eagle", "speculator_options": {"a": 1}}, "0.33.0", {}, "speculator_options is vLLM >="),
        (
            "suffix",
            {"method": "suffix", "enable_adaptive_verification": True},
            "0.34.0",
            {"enforce_eager": True},
            "--vllm.enforce_eager: no CUDA graphs",
        ),
        (
            "vllm",
            {"method": "dspark", "model": "x", "enable_adaptive_verification": True},
            "0.34.0",
            {"enable_lora": True},
            "enable_lora: LoRA",
        ),
    ],
)
def test_a_setting_the_installed_vllm_cannot_run_is_refused_naming_it(rule, config, version, kwargs, message):
    policy = sr.make(rule, speculative_config=config)
    path = versions.engine_path(kwargs, {"enforce_eager": "--vllm.enforce_eager"}, version=version)
    with pytest.raises(SpeculativeConfigError, match=message) as raised:
        versions.check_settings(policy, path)
    assert f"--rollout_reuse {rule}: speculative_config" in str(raised.value)


@pytest.mark.parametrize("version", ["0.29.0", "0.32.0", "0.33.0", "0.34.0"])
def test_what_each_engine_runs_passes_and_the_start_up_line_names_the_path(version):
    eager = {"enforce_eager": True}
    flags = {"enforce_eager": "--vllm.enforce_eager"}
    lines = {}
    for rule in ("lossless", "suffix", "ngram"):
        for kwargs in ({}, eager):
            path = versions.engine_path(kwargs, flags, version=version)
            versions.check_settings(sr.make(rule), path)
            lines[rule, bool(kwargs)] = path.line(sr.make(rule))
    if version != "0.34.0":
        assert lines["lossless", False] == f"lossless: vLLM {version}, V1 custom_class proposer, host paid serially"
        assert lines["suffix", True].startswith(f"suffix: vLLM {version}, V1 suffix decoding")
        on_v2_where_triton_runs = version != "0.29.0"  # 0.29 runs every engine of our environment on V1
        assert ("V2 runner's on the GPU" in lines["ngram", False]) == on_v2_where_triton_runs
        return
    speculator = f"lossless: vLLM 0.34.0, V2 speculator {HISTORY_SPECULATOR}, adaptive verification"
    assert lines["lossless", False] == f"{speculator} on"
    assert lines["lossless", True] == f"{speculator} off (--vllm.enforce_eager: no CUDA graphs)"
    assert lines["suffix", False] == "suffix: vLLM 0.34.0, V2 SuffixSpeculator (GPU), adaptive verification on"
    assert lines["ngram", True].endswith("every row verifies k draft tokens")
    assert sr.make("spec").engine_arguments(path.target) == {} and path.line(sr.make("spec")) is None


@pytest.mark.parametrize("wanted, version", [("v1", "0.34.0"), ("v2", "0.32.0")])
def test_a_rule_that_names_a_runner_the_installed_vllm_lacks_is_refused(wanted, version):
    """A peer priced on one runner (its `engine` parameter, for the simulator) on a vLLM that runs the other."""
    suffix = sr.make("suffix")
    priced = types.SimpleNamespace(
        name="suffix", params=types.SimpleNamespace(engine=wanted), engine_arguments=suffix.engine_arguments
    )
    with pytest.raises(SpeculativeConfigError, match=f"engine={wanted} is the {wanted.upper()} runner"):
        versions.check_settings(priced, versions.engine_path({}, version=version))
    priced.params.engine = "auto"
    versions.check_settings(priced, versions.engine_path({}, version=version))
