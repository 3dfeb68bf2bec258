"""Engine-independent steps of a speculative rollout (SPEC-RL Algorithm 1).

For each sample: take a draft, truncate it to what the engine can take, let the policy cut it (one vectorised
call per batch, scored logprobs from the current weights when the policy needs them), continue generation from
prompt + verified prefix, and assemble verified prefix + continuation. The engine adapters in
`specrl_openrlhf.integration` drive these steps over vLLM's batched `LLM` and its async engine.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .adaptive import FeedbackBuffer
from .cache import Draft
from .metrics import ReuseStats
from .policies import DraftBatch, ReusePolicy
from .policies.base import lenient_acceptance_logprob
from .trace import TraceWriter, uniforms_for

logger = logging.getLogger(__name__)

REUSED_LOGPROBS = ("auto", "scored", "draft")


class UnsupportedSamplingError(ValueError):
    """Sampling settings under which p_prev and p_curr would describe different distributions."""


def check_sampling(policy: ReusePolicy, **settings) -> None:
    """Fail unless the scored (always raw) logprobs describe the distribution samples are drawn from.

    vLLM's prompt logprobs, which scoring uses, are raw: temperature 1, no top-p/top-k/min-p, no penalties. A
    lenient ratio between a raw p_curr and a tempered or truncated p_prev is meaningless, so policies that score
    drafts need plain sampling. Policies that do not score (random, full, off) accept any settings.
    Keyword arguments are SamplingParams fields (temperature, top_p, top_k, min_p and the penalties).
    """
    if not policy.needs_scores:
        return
    plain = {
        "temperature": (1.0,),
        "top_p": (1.0, None),
        "top_k": (0, -1, None),
        "min_p": (0.0, None),
        "repetition_penalty": (1.0, None),
        "presence_penalty": (0.0, None),
        "frequency_penalty": (0.0, None),
    }
    bad = {k: v for k, v in settings.items() if k in plain and v not in plain[k]}
    if bad:
        names = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise UnsupportedSamplingError(
            f"reuse policy {policy.name!r} scores drafts with vLLM prompt logprobs, which are always raw "
            f"(temperature 1, no top-p/top-k/min-p/penalties), but sampling uses {names}. Sample with "
            f"temperature 1.0, top_p 1.0 and top_k -1 (the paper's setting, --rollout.temperature 1.0 "
            f"--rollout.top_p 1.0), or pick a policy that does not score drafts (random, full, off)."
        )


@dataclass
class SampleOutput:
    """One generated sample: verified prefix + continuation."""

    token_ids: list[int]
    logprobs: list[float] | None  # per response token; None if the caller did not ask for logprobs
    finish_reason: str
    verified_prefix_len: int = 0
    stats: ReuseStats = field(default_factory=ReuseStats)
    draft_id: tuple[int, int] | None = None  # (visit, index) of the draft it started from, None without one


@dataclass
class Sample:
    """State of one sample through the speculative rollout."""

    prompt_ids: list[int]
    max_tokens: int
    draft: Draft | None = None  # already truncated to what this visit can use
    draft_ended: bool = False  # the (untruncated) draft ended by a stop condition (EOS or stop string)
    scored: np.ndarray | None = None  # [L] float32 current-policy logprobs of the draft tokens
    uniforms: np.ndarray | None = None  # [L] float64
    entropy: tuple[int, ...] = ()  # what the uniforms were drawn from (traces store it)
    cut: int = 0
    stats: ReuseStats = field(default_factory=ReuseStats)

    @property
    def draft_len(self) -> int:
        return 0 if self.draft is None else len(self.draft)


class SpeculativePlanner:
    """The decisions of a speculative rollout, free of any engine.

    Args:
        policy: the reuse policy.
        seed: seeds the per-sample uniforms, together with the prompt and the draft's visit, so that runs are
            reproducible while every visit draws fresh randomness.
        reused_logprobs: which logprobs reused tokens report: "scored" (current policy), "draft" (the draft's
            own) or "auto" (scored when the policy scores drafts, else the draft's).
        max_token_id: largest token id the engine accepts in a prompt; drafts are cut before the first id
            outside [0, max_token_id].
        max_model_len: the engine's context length; a scoring request (prompt + draft + 1) must fit in it.
        trace: where to record every cut draft (`--reuse.trace_dir`), or None.
    """

    def __init__(
        self,
        policy: ReusePolicy,
        *,
        seed: int = 0,
        reused_logprobs: str = "auto",
        max_token_id: int | None = None,
        max_model_len: int | None = None,
        trace: TraceWriter | None = None,
    ):
        if reused_logprobs not in REUSED_LOGPROBS:
            raise ValueError(f"reused_logprobs must be one of {REUSED_LOGPROBS}, got {reused_logprobs!r}")
        self.policy = policy
        self.seed = int(seed)
        self.max_token_id = max_token_id
        self.max_model_len = max_model_len
        if reused_logprobs == "auto":
            reused_logprobs = "scored" if policy.needs_scores else "draft"
        self.reused_logprobs = reused_logprobs
        self.scores_drafts = policy.needs_scores or reused_logprobs == "scored"
        self.trace = trace
        self.feedback = FeedbackBuffer()  # a stateful rule's reports, until the rollout sends them on

    # ---- step 1: drafts -----------------------------------------------------------------------------------------

    def new_sample(self, prompt_ids, max_tokens: int, draft: Draft | None, key: bytes = b"") -> Sample:
        """Wrap a request and its draft, truncating the draft to the budget, the context and the vocabulary."""
        sample = Sample(prompt_ids=list(prompt_ids), max_tokens=int(max_tokens))
        sample.stats.samples = 1
        if draft is None or len(draft) == 0 or self.policy.draft_age == 0:
            return sample
        limit = min(len(draft), sample.max_tokens)
        if self.max_model_len is not None:
            limit = min(limit, self.max_model_len - len(sample.prompt_ids) - 1)
        tokens = draft.token_ids[: max(limit, 0)]
        if self.max_token_id is not None:
            invalid = np.flatnonzero((tokens < 0) | (tokens > self.max_token_id))
            if len(invalid):
                sample.stats.invalid_drafts = 1
                tokens = tokens[: invalid[0]]
        if len(tokens) == 0:
            return sample
        sample.draft_ended = len(tokens) == len(draft) and draft.finish_reason == "stop"
        sample.draft = Draft(tokens, draft.logprobs[: len(tokens)], draft.finish_reason, draft.visit, draft.index)
        sample.stats.drafts_found = 1
        sample.stats.draft_tokens = len(tokens)
        sample.entropy = (self.seed, int.from_bytes(key[:8] or b"\0", "little"), draft.visit, draft.index, len(tokens))
        sample.uniforms = uniforms_for(sample.entropy, len(tokens))
        return sample

    # ---- step 2: scoring ----------------------------------------------------------------------------------------

    def scoring_prompt(self, sample: Sample) -> list[int] | None:
        """Token ids to score (prompt + draft, with max_tokens=1 and prompt_logprobs=0), or None."""
        if sample.draft is None or not self.scores_drafts:
            return None
        return sample.prompt_ids + sample.draft.token_ids.tolist()

    @staticmethod
    def scored_from_prompt_logprobs(sample: Sample, prompt_logprobs) -> np.ndarray:
        """Pick each draft token's logprob out of vLLM's `prompt_logprobs` (index i: {token_id: Logprob})."""
        start = len(sample.prompt_ids)
        return np.array(
            [prompt_logprobs[start + i][token].logprob for i, token in enumerate(sample.draft.token_ids.tolist())],
            dtype=np.float32,
        )

    # ---- step 3: the policy cuts --------------------------------------------------------------------------------

    def decide(self, samples: list[Sample]) -> None:
        """One vectorised policy call for every sample that has a draft; sets `cut` and the scoring stats."""
        drafted = [s for s in samples if s.draft is not None]
        if not drafted:
            return
        width = max(s.draft_len for s in drafted)
        lengths = np.array([s.draft_len for s in drafted], dtype=np.int64)  # [B]
        draft_lp = np.zeros((len(drafted), width), dtype=np.float32)  # [B, T]
        uniforms = np.zeros((len(drafted), width), dtype=np.float64)  # [B, T]
        scored = np.zeros((len(drafted), width), dtype=np.float32) if self.policy.needs_scores else None  # [B, T]
        for row, s in enumerate(drafted):
            draft_lp[row, : s.draft_len] = s.draft.logprobs
            uniforms[row, : s.draft_len] = s.uniforms
            if scored is not None:
                if s.scored is None:
                    raise RuntimeError("policy needs scores but a draft was not scored")
                scored[row, : s.draft_len] = s.scored
        lengths, draft_lp, uniforms = torch.from_numpy(lengths), torch.from_numpy(draft_lp), torch.from_numpy(uniforms)
        scored = None if scored is None else torch.from_numpy(scored)
        batch = DraftBatch(draft_logprobs=draft_lp, scored_logprobs=scored, lengths=lengths, uniforms=uniforms)
        cuts = self.policy.cut(batch)
        if cuts.shape != lengths.shape:
            raise ValueError(f"policy {self.policy.name!r} returned cuts of shape {tuple(cuts.shape)}, want [B]")
        cuts = torch.minimum(cuts.long().clamp(min=0), lengths)  # a plugin must never overrun a draft
        if self.policy.keeps_state:
            self.feedback.add(self.policy.feedback(batch, cuts), len(drafted))
        lenience = self.policy.lenience
        for row, s in enumerate(drafted):
            s.cut = int(cuts[row])
            s.stats.reused_tokens = s.cut
            if lenience is not None and math.isfinite(lenience):
                s.stats.lenience_sum = lenience
            if s.scored is not None:
                log_ratio = s.scored.astype(np.float64) - s.draft.logprobs.astype(np.float64)
                s.stats.scored_tokens = s.draft_len
                s.stats.log_ratio_sum = float(log_ratio.sum())
                accept = lenient_acceptance_logprob(torch.from_numpy(log_ratio), torch.zeros(1), lenience or 1.0)
                s.stats.acceptance_sum = float(torch.exp(accept).sum())
            if self.trace is not None:
                self.trace.record(
                    draft_logprobs=s.draft.logprobs,
                    scored_logprobs=s.scored,
                    budget=s.max_tokens,
                    draft_ended=s.draft_ended,
                    finish=s.draft.finish_reason,
                    entropy=s.entropy,
                    cut=s.cut,
                    lenience=lenience,
                )

    # ---- step 4: continuation -----------------------------------------------------------------------------------

    def continuation(self, sample: Sample) -> tuple[list[int], int] | None:
        """(prompt + verified prefix, remaining token budget), or None when the verified prefix is complete."""
        if sample.draft is not None and sample.cut == sample.draft_len and sample.draft_ended:
            return None
        remaining = sample.max_tokens - sample.cut
        if remaining <= 0:
            return None
        prefix = sample.draft.token_ids[: sample.cut].tolist() if sample.cut else []
        return sample.prompt_ids + prefix, remaining

    # ---- step 5: assembly ---------------------------------------------------------------------------------------

    def assemble(
        self,
        sample: Sample,
        new_token_ids=(),
        new_logprobs=None,
        finish_reason: str | None = None,
        *,
        want_logprobs: bool = True,
    ) -> tuple[SampleOutput, Draft]:
        """Verified prefix + continuation, and the draft to store for the next visit.

        `finish_reason` is the continuation's; it is derived from the draft when nothing was generated.
        """
        cut = sample.cut
        new_token_ids = list(new_token_ids)
        if sample.draft is not None and cut:
            prefix_ids = sample.draft.token_ids[:cut].tolist()
            stored_prefix_lp = sample.scored[:cut] if sample.scored is not None else sample.draft.logprobs[:cut]
            reported_prefix_lp = sample.draft.logprobs[:cut] if self.reused_logprobs == "draft" else stored_prefix_lp
        else:
            prefix_ids, stored_prefix_lp = [], np.zeros(0, np.float32)
            reported_prefix_lp = stored_prefix_lp
        if new_logprobs is None:
            new_logprobs = [math.nan] * len(new_token_ids)
        if len(new_logprobs) != len(new_token_ids):
            raise ValueError(f"continuation has {len(new_token_ids)} tokens but {len(new_logprobs)} logprobs")
        if finish_reason is None:  # nothing generated
            finish_reason = "stop" if (sample.draft_ended and cut == sample.draft_len) else "length"
        token_ids = prefix_ids + new_token_ids
        new_lp = np.asarray(new_logprobs, dtype=np.float32)
        next_draft = Draft(np.asarray(token_ids, np.int32), np.concatenate([stored_prefix_lp, new_lp]), finish_reason)
        sample.stats.decoded_tokens = len(new_token_ids)
        sample.stats.fully_reused = int(sample.draft is not None and not new_token_ids)
        reported = np.concatenate([reported_prefix_lp, new_lp]).tolist() if want_logprobs else None
        draft_id = None if sample.draft is None else (sample.draft.visit, sample.draft.index)
        output = SampleOutput(token_ids, reported, finish_reason, cut, sample.stats, draft_id)
        return output, next_draft
