"""Our vLLM plugin (`integration.vllm.plugin`): vLLM loads it in its processes, and `SPECRL_SAMPLER_FIX=0` leaves
the sampler alone."""

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
