"""vLLM's rejection sampler draws recovered-token noise only for the requests that have drafts (vllm 0.29, 0.32).

Terminology (vLLM's): a *recovered token* is what a rejected draft position is resampled from (p without the draft
token, for a model-free proposal); it is drawn with one row of exponential noise per request, `q`, and the kernel
takes argmax p / q over the position's vocabulary.

vLLM's `sample_recovered_tokens` (`vllm/v1/sample/rejection_sampler.py`) fills a [requests, vocab] tensor with
exponential noise and takes its reciprocal at every step it runs, for every request of the batch, drafts or not:
  - vLLM 0.32 sends every step of a speculative engine through the rejection sampler, so it runs even when no request
    has a draft (+57% on a 49k vocabulary at 24 requests against stock, with nothing drafted);
  - vLLM 0.29 runs it only in steps where some request drafted, for all of the batch's requests.
Only the rows of requests with drafts are ever read: a request without drafts owns no draft position. So
`sample_recovered_tokens` here returns at once when no request has a draft, and otherwise draws noise only for the
requests that have drafts: a seeded request from its own generator exactly as vLLM does (the same values), the others
from the global generator (fresh draws of the same law). Nothing else changes, so the law of the outputs does not:
the engine χ² tests run with it, and a seeded batch with nothing drafted gives stock's tokens.

It is the change to propose upstream (docs/upstream.md). `install()` rebinds the module global that
`rejection_sample` calls, in the process that runs the sampler (our vLLM plugin does it in every engine process).
`SPECRL_SAMPLER_FIX` decides: unset or "auto" installs it on the CPU platform, where our tests ran it; "1" also on
other platforms (GPU builds have not run its tests yet); "0" nowhere.
"""

from __future__ import annotations

import inspect
import logging
import os

import torch

logger = logging.getLogger(__name__)

SWITCH = "SPECRL_SAMPLER_FIX"
SUPPORTED = ((0, 29), (0, 32))  # vLLM minor versions whose sampler this replaces (the ones tested)
PARAMETERS = (
    "max_spec_len",
    "num_draft_tokens",
    "cu_num_draft_tokens",
    "draft_token_ids",
    "draft_probs",
    "target_probs",
    "sampling_metadata",
    "device",
    "use_fp64_gumbel",
)
_ORIGINAL: dict[str, object] = {}


def sample_recovered_tokens(
    max_spec_len: int,
    num_draft_tokens: list[int],  # [B] draft tokens per request (host)
    cu_num_draft_tokens: torch.Tensor,  # [B] int32, cumulative
    draft_token_ids: torch.Tensor,  # [N] flattened drafts, N = sum(num_draft_tokens)
    draft_probs: torch.Tensor | None,  # [N, V] or None (a model-free proposal)
    target_probs: torch.Tensor,  # [N, V]
    sampling_metadata,
    device: torch.device,
    use_fp64_gumbel: bool = False,
) -> torch.Tensor:
    """vLLM's `sample_recovered_tokens`, with noise drawn only for the requests that have drafts. Returns [N]."""
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    recovered = torch.empty_like(draft_token_ids)  # [N]
    if recovered.numel() == 0:  # no request has a draft: nothing is read, nothing is drawn
        return recovered
    drafted = [i for i, n in enumerate(num_draft_tokens) if n > 0]
    vocab_size = target_probs.shape[-1]
    dtype = torch.float64 if use_fp64_gumbel else torch.float32
    q = torch.empty((len(drafted), vocab_size), dtype=dtype, device=device)  # [R, V]
    generators = sampling_metadata.generators
    if any(i not in generators for i in drafted):
        q.exponential_()
    for row, i in enumerate(drafted):
        generator = generators.get(i)
        if generator is not None:  # as vLLM draws it: one [V] row from the request's own generator
            q[row].exponential_(generator=generator)
    if len(drafted) == len(num_draft_tokens):
        inv_q = q.reciprocal()  # [B, V]
    else:  # [B, V], written only where a request has draft positions: the kernel reads no other row
        inv_q = torch.empty((len(num_draft_tokens), vocab_size), dtype=dtype, device=device)
        inv_q[torch.tensor(drafted, device=device)] = q.reciprocal()
    launch = (recovered, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, inv_q)
    if hasattr(rejection_sampler, "_sample_recovered_tokens"):  # 0.32: the dispatcher (a platform's kernel inside)
        rejection_sampler._sample_recovered_tokens(*launch, max_spec_len=max_spec_len)
    else:  # 0.29: the kernel as bound when called (the CPU model runner rebinds it at start-up)
        grid = (len(num_draft_tokens), max_spec_len)
        rejection_sampler.sample_recovered_tokens_kernel[grid](
            *launch,
            vocab_size,
            8192,  # vLLM's BLOCK_SIZE
            NO_DRAFT_PROBS=draft_probs is None,
            USE_FP64_GUMBEL=use_fp64_gumbel,
        )
    return recovered


def wanted() -> bool:
    """Whether `SPECRL_SAMPLER_FIX` and the platform ask for it here."""
    switch = os.environ.get(SWITCH, "auto").strip().lower()
    if switch in ("0", "off", "false", "no"):
        return False
    if switch in ("1", "on", "true", "yes"):
        return True
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def supported() -> str | None:
    """Why vLLM's sampler can't be replaced here (None if it can): its version, or the function's signature."""
    import vllm
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    version = tuple(int(part) for part in vllm.__version__.split(".")[:2] if part.isdigit())
    if version not in SUPPORTED:
        return f"vLLM {vllm.__version__} (tested: {', '.join('.'.join(map(str, v)) for v in SUPPORTED)})"
    original = _ORIGINAL.get("function", rejection_sampler.sample_recovered_tokens)
    if tuple(inspect.signature(original).parameters) != PARAMETERS:
        return "vLLM's sample_recovered_tokens has another signature"
    return None


def install() -> bool:
    """Replace vLLM's `sample_recovered_tokens` in this process where it is wanted and supported. Returns whether
    ours runs here."""
    if not wanted():
        return False
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    if rejection_sampler.sample_recovered_tokens is sample_recovered_tokens:
        return True
    reason = supported()
    if reason is not None:
        logger.warning("vLLM's recovered-token noise is left as it is: %s", reason)
        return False
    _ORIGINAL.setdefault("function", rejection_sampler.sample_recovered_tokens)
    rejection_sampler.sample_recovered_tokens = sample_recovered_tokens
    logger.info("vLLM's rejection sampler draws noise only for requests with drafts (%s=0 turns it off)", SWITCH)
    return True


def installed() -> bool:
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    return rejection_sampler.sample_recovered_tokens is sample_recovered_tokens


def uninstall() -> bool:
    """Put vLLM's own function back."""
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    if "function" not in _ORIGINAL:
        return False
    rejection_sampler.sample_recovered_tokens = _ORIGINAL["function"]
    return True
