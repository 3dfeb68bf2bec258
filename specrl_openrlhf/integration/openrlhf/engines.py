"""OpenRLHF's rollout engines with engine arguments of ours: the one workaround for a missing seam in engine creation.

`lossless` verified in the engine needs `speculative_config` (our proposer) in each vLLM engine. OpenRLHF 0.11.2's
`create_vllm_engines` builds every `RolloutRayActor`'s engine arguments itself and takes none from its caller, and
`RolloutRayActor` hands whatever it gets to `vllm.AsyncEngineArgs`. `with_engine_kwargs(create, extra)` returns a
stand-in for `create_vllm_engines` that calls OpenRLHF's own function, with the name `RolloutRayActor` in OpenRLHF's
module bound, for that call only, to a subclass whose constructor passes its arguments through `extra` (a function:
OpenRLHF's engine arguments in, with ours added). Placement, bundles, sleep mode and
everything else stay OpenRLHF's. The stand-in goes into the command module's namespace, beside our `train`
(`seams`); nothing else in the process sees it. docs/upstream.md proposes the seam (`engine_kwargs`, or a
`--vllm.engine_kwargs` flag) that would retire this module.
"""

from __future__ import annotations

import functools
import threading

_swap = threading.Lock()  # two calls at once must not restore each other's class


def actor_class_with(extra):
    """OpenRLHF's `RolloutRayActor` whose engine arguments go through `extra` (OpenRLHF's in, ours out)."""
    import ray
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    class RolloutRayActorWithExtras(RolloutRayActor.__ray_actor_class__):
        async def __init__(self, *args, **kwargs):
            await super().__init__(*args, **extra(kwargs))

    return ray.remote(RolloutRayActorWithExtras)


def with_engine_kwargs(create, extra):
    """`create_vllm_engines` (OpenRLHF's, passed as `create`) whose engines' arguments go through `extra`."""

    @functools.wraps(create)
    def create_vllm_engines(*args, **kwargs):
        from openrlhf.trainer.ray import vllm_engine

        with _swap:
            original = vllm_engine.RolloutRayActor
            vllm_engine.RolloutRayActor = actor_class_with(extra)
            try:
                return create(*args, **kwargs)
            finally:
                vllm_engine.RolloutRayActor = original

    return create_vllm_engines
