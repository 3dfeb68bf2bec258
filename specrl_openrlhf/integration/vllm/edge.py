"""The vLLM edge: the SamplingParams of our requests, vLLM's answers parsed into the core's types, engine limits.

Nothing past this module reads a vLLM type: a scoring answer becomes a `request_path.scoring_messages.ScoringAnswer`, a
generation a `Completion`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

from ...cache import prompt_key
from ...policies import ReusePolicy
from ...policies.sampling import check_sampling
from ...request_path.scoring_messages import ScoringAnswer, ScoringRequest
from . import histories
from .exclude import EXCLUDE_FIRST_TOKEN

SUPPORTED_LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
EXCLUDING_BIAS = -100.0  # vLLM clamps logit_bias to [-100, 100]: e^-100 leaves the token a relative weight of 4e-44
# Our requests are read when they finish: vLLM then builds no output per step (the default, CUMULATIVE, copies every
# token so far into a new output at each step; docs/benchmarks.md, 'bench_rollout')
FINAL = RequestOutputKind.FINAL_ONLY


@dataclass(frozen=True)
class Completion:
    """A finished generation, as the core reads it."""

    token_ids: list[int]
    logprobs: list[float] | None  # of each sampled token; None when the request asked for none
    finish_reason: str
    cached_tokens: int  # prompt tokens served from vLLM's prefix cache
    top: tuple[np.ndarray, np.ndarray] | None = None  # ([n, k] ids, [n, k] logprobs) of each token's top-k
    accepted_per_step: tuple[int, ...] = ()  # verified in the engine: draft tokens accepted at each verifying step
    drafted_per_step: tuple[int, ...] = ()  # and drafted


def engine_limits(model_config, tokenizer) -> tuple[int, int]:
    """(largest prompt token id the engine accepts, context length), by vLLM's own validation rule: an id is
    valid up to max(tokenizer.max_token_id, model vocab size - 1)."""
    mode = str(getattr(model_config, "logprobs_mode", "raw_logprobs"))
    if mode.split(".")[-1].lower() not in SUPPORTED_LOGPROBS_MODES:
        raise ValueError(
            f"vLLM logprobs_mode={mode} returns logits, not logprobs; drafts need raw_logprobs or processed_logprobs"
        )
    tokenizer_max = getattr(tokenizer, "max_token_id", None)
    if tokenizer_max is None:
        tokenizer_max = max(tokenizer.get_vocab().values())
    return max(int(tokenizer_max), model_config.get_vocab_size() - 1), int(model_config.max_model_len)


def stop_token_ids(model_config, tokenizer) -> set[int]:
    """The tokens that end a response on this engine: the tokenizer's EOS and the model's generation config's."""
    ids = {tokenizer.eos_token_id} if getattr(tokenizer, "eos_token_id", None) is not None else set()
    eos = getattr(getattr(model_config, "hf_config", None), "eos_token_id", None)
    ids |= set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())
    return {int(i) for i in ids}


def processed_logprobs(model_config) -> bool:
    """Whether the engine reports processed log-probs (`logprobs_mode="processed_logprobs"`)."""
    return str(getattr(model_config, "logprobs_mode", "")).endswith("processed_logprobs")


def check_sampling_params(policy: ReusePolicy, params: SamplingParams) -> None:
    check_sampling(  # its warnings were given at start-up (the command knows the engine's logprobs mode)
        policy,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        logit_bias=params.logit_bias,
    )


# ---- scoring requests ---------------------------------------------------------------------------------------------


def scoring_params(request: ScoringRequest) -> SamplingParams:
    """The SamplingParams of a `ScoringRequest`: the prompt logprobs of prompt + draft (with each position's top-k
    for rules that redraw rejected positions), and of the tokens asked to follow it. Reading the prefix cache saves
    recomputing what an earlier request computed (the prompt, earlier chunks); vLLM then leaves those positions
    without logprobs."""
    return SamplingParams(
        max_tokens=1,
        prompt_logprobs=request.top_k,
        detokenize=False,
        output_kind=FINAL,
        skip_reading_prefix_cache=not request.read_cache,
        logprob_token_ids=list(request.next_token_ids) or None,
    )


def next_logprobs(request_output) -> dict | None:
    """{token_id: Logprob} of the generated position: the tokens a request asked to score after its prompt."""
    logprobs = request_output.outputs[0].logprobs
    return logprobs[0] if logprobs else None


def scoring_answer(request: ScoringRequest, request_output) -> ScoringAnswer:
    """vLLM's answer to a scoring request, parsed into the core's `ScoringAnswer`. Entry `P + i` of
    `prompt_logprobs` ({token_id: Logprob}, entry 0 None) holds log p_curr(draft[i]); a request that read the prefix
    cache gets uninitialised entries for the positions the cache served (`num_cached_tokens`), which are never read:
    they stay NaN, and `computed_from` says where computed ones start."""
    top_k = request.top_k
    cached = int(request_output.num_cached_tokens or 0) if request.read_cache else 0
    offset = len(request.token_ids) - request.end  # the prompt's length: token_ids = prompt + draft[:end]
    first = max(request.start, cached + 1 - offset)
    count = request.end - request.start
    values = np.full(count, np.nan, np.float32)
    top = (np.full((count, top_k), -1, np.int32), np.full((count, top_k), -np.inf, np.float32)) if top_k else None
    for position in range(first, request.end):
        entries = request_output.prompt_logprobs[offset + position]
        entry = entries.get(int(request.token_ids[offset + position])) if entries else None
        values[position - request.start] = math.nan if entry is None else entry.logprob
        if top is not None:
            top[0][position - request.start], top[1][position - request.start] = top_k_of(entries, top_k)
    follows = {}
    if request.next_token_ids and (following := next_logprobs(request_output)):
        follows = {t: float(following[t].logprob) for t in request.next_token_ids if t in following}
    return ScoringAnswer(values, follows, cached, first, top)


def top_k_of(entries, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k likeliest tokens of one position from vLLM's {token_id: Logprob} (rank 1 first); -1 and -inf pad a
    position that lists fewer. vLLM adds the position's own token when it is not among them: it is left out."""
    ranked = sorted(
        ((getattr(lp, "rank", None) or math.inf, token, lp.logprob) for token, lp in entries.items()),
        key=lambda item: (item[0], -item[2]),
    )[:k]
    ids = np.full(k, -1, np.int32)
    logprobs = np.full(k, -np.inf, np.float32)
    for i, (_, token, logprob) in enumerate(ranked):
        ids[i], logprobs[i] = token, logprob
    return ids, logprobs


# ---- generation ---------------------------------------------------------------------------------------------------


def continuation_params(
    params: SamplingParams,
    max_tokens: int,
    verified: int,
    sample_index: int = 0,
    top_k: int = 0,
    excluded: tuple[int, ...] = (),
    logprobs: bool = True,
) -> SamplingParams:
    """The user's params for one continuation after `verified` reused tokens: n=1, the remaining budget, the
    remaining minimum length, the output once it finishes (FINAL_ONLY), and with `logprobs` the sampled tokens'
    log-probs (drafts keep them; `top_k` per token for rules that redraw). `excluded`: tokens the first step must not
    sample (the `vllm.exclude` plugin reads them). Without stop strings vLLM does not detokenize: the caller decodes
    the whole response once. A shallow copy: every field we change is assigned, never mutated, and vLLM copies the
    params it is given before it changes them (`SamplingParams.clone`'s deep copy cost more per sample than the rest of
    our path)."""
    out = copy.copy(params)
    if excluded:
        out.extra_args = {**(params.extra_args or {}), EXCLUDE_FIRST_TOKEN: [int(t) for t in excluded]}
    out.n = 1
    out.output_kind = FINAL
    out.max_tokens = max_tokens
    out.min_tokens = max(0, (params.min_tokens or 0) - verified)
    if logprobs:
        out.logprobs = max(params.logprobs or 0, top_k)
    if not out.stop:  # the text is decoded once from the assembled ids; vLLM would also decode every top-k token
        out.detokenize = False
    if params.seed is not None:  # n separate requests with one seed would all sample the same tokens
        out.seed = params.seed + sample_index
    return out


def excluding_params(params: SamplingParams, verified: int, excluded: tuple[int, ...]) -> SamplingParams:
    """One token with `excluded` biased away: the redraw of a rejected position on an engine without our plugin."""
    out = continuation_params(params, 1, verified)
    out.logit_bias = {token: EXCLUDING_BIAS for token in excluded}
    return out


def exclusion_probe_params(token: int) -> SamplingParams:
    """One token with `token` banned by our plugin, asking for its log-prob: -inf where the plugin runs."""
    return SamplingParams(
        max_tokens=1,
        detokenize=False,
        output_kind=FINAL,
        extra_args={EXCLUDE_FIRST_TOKEN: [int(token)]},
        logprob_token_ids=[int(token)],
    )


def completion_of(request_output, top_k: int = 0) -> Completion:
    """A finished generation's `Completion` (with `top_k`, each token's top-k too)."""
    completion = request_output.outputs[0]
    token_ids = list(completion.token_ids)
    entries = completion.logprobs or []
    logprobs = [entry[token].logprob for token, entry in zip(token_ids, entries)]
    if len(logprobs) != len(token_ids):
        logprobs = None
    top = None
    if top_k and logprobs is not None:
        rows = [top_k_of(entry, top_k) for entry in entries]
        shape = (len(rows), top_k)
        top = (
            np.stack([r[0] for r in rows]) if rows else np.zeros(shape, np.int32),
            np.stack([r[1] for r in rows]) if rows else np.zeros(shape, np.float32),
        )
    metrics = getattr(completion, "spec_decode_metrics", None)  # None: an engine that verifies no drafts
    return Completion(
        token_ids,
        logprobs,
        completion.finish_reason or "length",
        int(request_output.num_cached_tokens or 0),
        top,
        tuple(getattr(metrics, "per_step_accepted", None) or ()),
        tuple(getattr(metrics, "per_step_drafted", None) or ()),
    )


def engine_generate(engine):
    """Adapt a vLLM `AsyncLLM` to `async generate(prompt_token_ids, params, priority=0) -> final RequestOutput`. Each
    request's id carries its prompt's digest (`histories.request_id`): our V2 speculator finds the prompt's history by
    it."""

    async def generate(prompt_token_ids, params, priority: int = 0):
        final, request = None, histories.request_id(prompt_key(list(prompt_token_ids)))
        async for output in engine.generate(
            TokensPrompt(prompt_token_ids=prompt_token_ids), params, request_id=request, priority=priority
        ):
            final = output
        return final

    return generate
