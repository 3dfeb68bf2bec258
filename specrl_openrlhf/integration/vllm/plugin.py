"""Our vLLM plugin (entry point `vllm.general_plugins`): the CPU fixes, in every process vLLM starts.

vLLM calls `register` in each of its processes before it builds an engine's workers, so the fixes reach every
speculative method (ours, n-gram, suffix) and every engine in an environment where this package is installed,
OpenRLHF's included, with no engine argument. Each does nothing where it does not apply:
- `cpu_fix`: vLLM's CPU expand kernel, which leaves draft rows' temperatures uninitialised (CPU without Triton);
- `sampler_fix`: the rejection sampler's recovered-token noise, drawn only for requests with drafts (`auto`: CPU).
A stock engine never runs the rejection sampler, so it is untouched. `VLLM_PLUGINS` (vLLM's allow-list of plugin
names) can leave this one out; our proposer then installs the fixes from its constructor.

`register` never raises: a fix that can't be installed logs a warning and leaves vLLM as it is.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def register() -> None:
    from .v1 import cpu_fix, sampler_fix

    for fix in (cpu_fix, sampler_fix):
        try:
            fix.install()
        except Exception as error:  # an engine must start whatever happens here
            logger.warning("%s not installed (%s: %s): vLLM runs as it is", fix.__name__, type(error).__name__, error)


def installed(worker=None) -> tuple[bool, bool]:
    """Whether each fix runs in this process (the CPU fix, the sampler fix); `collective_rpc` entry too."""
    from .v1 import cpu_fix, sampler_fix

    return cpu_fix.installed(), sampler_fix.installed()
