"""Our vLLM plugin (entry point `vllm.general_plugins`): what every process vLLM starts needs of ours.

vLLM calls `register` in each of its processes (front end, engine core, workers) before it builds an engine's
workers, so what it does reaches every engine in an environment where this package is installed, OpenRLHF's
included, with no engine argument:
- on vLLM >= 0.34, our V2 speculator's registration (`v2.registration`: `lossless` as a registered method);
- on vLLM <= 0.33, the CPU fixes of the V1 rejection sampler, for every speculative method (ours, n-gram, suffix):
  `v1.cpu_fix` (vLLM's CPU expand kernel leaves draft rows' temperatures uninitialised: CPU without Triton) and
  `v1.sampler_fix` (the recovered-token noise, drawn only for requests with drafts; `auto`: CPU). A stock engine
  never runs the rejection sampler, so it is untouched. vLLM >= 0.34 has no V1 sampler: where a fix was wanted there
  (the CPU platform, or `SPECRL_SAMPLER_FIX=1`), `register` says once that it steps aside.
`VLLM_PLUGINS` (vLLM's allow-list of plugin names) can leave this one out; our V1 proposer then installs the fixes
from its constructor, and vLLM >= 0.34 does not know our speculator's method.

`register` never raises: what can't be done logs a warning and leaves vLLM as it is.
"""

from __future__ import annotations

import logging

from . import versions

logger = logging.getLogger(__name__)


def register() -> None:
    try:
        runner = versions.runner_of(versions.installed())
    except Exception as error:  # an engine must start whatever happens here
        logger.warning("specrl-openrlhf's vLLM plugin steps aside (%s: %s)", type(error).__name__, error)
        return
    register_speculator()
    if runner == "v1":
        install_v1_fixes()
    else:
        step_aside_v1_fixes()


def register_speculator() -> None:
    """Our V2 speculator's method in vLLM's registry, where vLLM has one (a warning where it fails)."""
    from .v2 import registration

    try:
        registration.register()
    except Exception as error:
        logger.warning(
            "speculative method %r not registered (%s: %s): lossless verified in the engine can't start here",
            registration.HISTORY_SPECULATOR,
            type(error).__name__,
            error,
        )


def install_v1_fixes() -> None:
    from .v1 import cpu_fix, sampler_fix

    for fix in (cpu_fix, sampler_fix):
        try:
            fix.install()
        except Exception as error:
            logger.warning("%s not installed (%s: %s): vLLM runs as it is", fix.__name__, type(error).__name__, error)


def step_aside_v1_fixes() -> None:
    """On a vLLM without the V1 rejection sampler: one warning where a fix would have been wanted, else nothing."""
    from .v1 import cpu_fix, sampler_fix

    try:
        wanted = cpu_fix.needed() or sampler_fix.wanted()
    except Exception:  # the platform can't be read here: nobody asked for the fixes
        wanted = False
    if wanted:
        logger.warning(
            "vLLM %s has no V1 rejection sampler: the CPU fixes %s and %s step aside (vLLM runs as it is)",
            versions.installed(),
            cpu_fix.__name__,
            sampler_fix.__name__,
        )


def installed(worker=None) -> tuple[bool, bool]:
    """Whether each fix runs in this process (the CPU fix, the sampler fix); `collective_rpc` entry too."""
    from .v1 import cpu_fix, sampler_fix

    if versions.runner_of(versions.installed()) != "v1":
        return False, False
    return cpu_fix.installed(), sampler_fix.installed()
