"""Our vLLM plugin (`integration.vllm.plugin`): vLLM loads it in its processes; it registers our V2 speculator where
vLLM has the registry (0.34) and installs the V1 CPU fixes where vLLM has that sampler; what can't apply steps aside
with one warning, never an exception; `SPECRL_SAMPLER_FIX=0` leaves the sampler alone.

Marked vllm_wheel: `scripts/test_vllm034.sh` runs them again under vLLM 0.33's and 0.34's own modules."""

import logging
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

CHECK = (
    "from vllm.plugins import load_general_plugins; load_general_plugins(); "
    "from specrl_openrlhf.integration.vllm.v1 import cpu_fix, sampler_fix; "
    "print(cpu_fix.installed(), sampler_fix.installed())"
)


REGISTERED = """
from vllm.plugins import load_general_plugins, load_plugins_by_group
assert "specrl_openrlhf" in load_plugins_by_group("vllm.general_plugins")
load_general_plugins()
from specrl_openrlhf.integration.vllm.v2 import registration
if registration.registry() is None:
    print("REGISTERED", None)
else:
    from vllm.v1.worker.gpu.spec_decode import speculator_config
    print("REGISTERED", speculator_config._CUSTOM_CONFIGS)
"""


@pytest.mark.vllm_wheel
def test_vllm_loads_it_and_it_registers_our_speculator_by_name_where_vllm_has_the_registry():
    """In a process of its own, as vLLM loads it: on vLLM >= 0.34 our method is in vLLM's own registry, its config
    named by qualified name (imported only when an engine asks for it); elsewhere nothing is registered, silently."""
    from specrl_openrlhf.integration.vllm import versions
    from specrl_openrlhf.policies.builtin import HISTORY_SPECULATOR, HISTORY_SPECULATOR_CONFIG

    done = subprocess.run([sys.executable, "-c", REGISTERED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    registered = done.stdout.split("REGISTERED ", 1)[1].strip()
    if versions.runner_of(versions.installed()) == "v2":
        assert registered == repr({HISTORY_SPECULATOR: HISTORY_SPECULATOR_CONFIG})
    else:
        assert registered == "None"
    assert "steps aside" not in done.stderr and "not registered" not in done.stderr


@pytest.mark.vllm_wheel
def test_what_cant_apply_steps_aside_with_one_warning(monkeypatch, caplog):
    """The V1 CPU fixes on a vLLM without the V1 sampler (asked for with SPECRL_SAMPLER_FIX=1), and a registration
    that fails: one warning each, and `register` returns."""
    from specrl_openrlhf.integration.vllm import plugin, versions
    from specrl_openrlhf.integration.vllm.v2 import registration

    def broken():
        raise RuntimeError("registry changed")

    monkeypatch.setenv("SPECRL_SAMPLER_FIX", "0")
    monkeypatch.setattr(registration, "register", broken)
    monkeypatch.setattr(plugin, "install_v1_fixes", lambda: None)  # the fixes' own tests install them
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        plugin.register()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "speculative method 'specrl_history' not registered"
    ]
    if versions.runner_of(versions.installed()) == "v1":
        return
    monkeypatch.undo()
    monkeypatch.setenv("SPECRL_SAMPLER_FIX", "1")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        plugin.register()
    assert len(caplog.records) == 1 and "the CPU fixes" in caplog.text and "step aside" in caplog.text
    assert plugin.installed() == (False, False)


def fixes_after_vllm_loads_its_plugins(**env) -> str:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.engine
def test_vllm_loads_the_fixes_in_its_engine_process(async_engine):
    """The shared engine's core process, where the model runs, has both fixes: vLLM loaded our plugin there."""
    from specrl_openrlhf.integration.vllm import plugin
    from specrl_openrlhf.integration.vllm.v1 import cpu_fix

    if not cpu_fix.needed():
        pytest.skip("the CPU fixes apply to vLLM's CPU platform")
    engine, runner = async_engine
    assert [tuple(answer) for answer in runner.run(engine.collective_rpc(plugin.installed))] == [(True, True)]


@pytest.mark.slow  # a process of its own loading vLLM; tests/integration/vllm/v1/test_sampler_fix.py covers the switch
def test_the_switch_turns_the_sampler_fix_off():
    from specrl_openrlhf.integration.vllm.v1 import cpu_fix

    if not cpu_fix.needed():
        pytest.skip("the CPU fixes apply to vLLM's CPU platform")
    assert fixes_after_vllm_loads_its_plugins(SPECRL_SAMPLER_FIX="0") == ["True", "False"]
