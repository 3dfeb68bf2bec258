"""The vLLM edge (`integration.vllm.edge`): our requests' SamplingParams, and vLLM's answers parsed into the core's
types, on made-up answers and on the session's engine. Those marked vllm_wheel run again under vLLM 0.33's and 0.34's
own SamplingParams (scripts/test_vllm034.sh)."""

from types import SimpleNamespace

import numpy as np
import pytest

from specrl_openrlhf.request_path.scoring_messages import ScoringRequest
from tests.helpers import score

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402

from specrl_openrlhf.integration.vllm import edge  # noqa: E402
from specrl_openrlhf.integration.vllm.edge import continuation_params, scoring_answer, scoring_params  # noqa: E402


@pytest.mark.vllm_wheel
def test_the_edge_never_reads_what_vllm_left_in_positions_the_cache_served():
    """`scoring_answer` parses vLLM's prompt log-probs for the core: entries of positions the prefix cache served hold
    whatever vLLM left there (here a token that is not the draft's); they stay NaN, and so does a token the engine gave
    no entry for. The tokens asked to follow come by id; the top-k rows (rules that redraw) rank 1 first."""
    lp = lambda value, rank=1: SimpleNamespace(logprob=value, rank=rank)  # noqa: E731
    garbage = {987654321: lp(1e-38)}
    request = ScoringRequest([1, 2, 3, 4, 5, 6, 7, 8, 9], 0, 5, True, (10,), top_k=2)  # prompt 1-4 + draft 5-9
    entries = [None] + [garbage] * 6 + [{8: lp(-0.25), 3: lp(-0.1)}, {}]  # 6 cached; no entry for the last token
    output = SimpleNamespace(
        prompt_logprobs=entries,
        num_cached_tokens=6,
        outputs=[SimpleNamespace(logprobs=[{10: lp(-2.0), 11: lp(-1.0)}])],
    )
    answer = scoring_answer(request, output)
    assert answer.cached == 6 and answer.computed_from == 3 and answer.follows == {10: -2.0}
    assert np.isnan(answer.logprobs[:3]).all() and answer.logprobs[3] == np.float32(-0.25)
    assert np.isnan(answer.logprobs[4])
    assert answer.top[0][3].tolist() == [3, 8] and (answer.top[0][:3] == -1).all()
    uncached = scoring_answer(ScoringRequest(request.token_ids, 0, 5, False), output)
    assert uncached.cached == 0 and uncached.computed_from == 0 and answer.top is not None and uncached.top is None


@pytest.mark.engine
def test_prompt_logprobs_read_from_the_prefix_cache_match_uncached_ones(async_engine):
    """vLLM has had bugs in prompt logprobs with prefix caching (its issue 8268): check the combination we rely on.
    Positions after the cached tokens, and a token asked to follow the prompt, equal an uncached scoring exactly."""
    engine, runner = async_engine
    prompt = [3 + i % 90 for i in range(70)]
    shared = [10 + i % 40 for i in range(30)]
    first, second = prompt + shared + [50] * 10, prompt + shared + [60] * 10
    reference = {tuple(seq): score(async_engine, seq[:1], seq[1:]) for seq in (first, second)}  # [i]: token i + 1
    runner.run(engine.reset_prefix_cache())

    def run(request):
        return runner.run(edge.engine_generate(engine)(request.token_ids, scoring_params(request)))

    probe = run(ScoringRequest(prompt, 0, 0, True, (10, 7)))
    assert edge.next_logprobs(probe)[10].logprob == reference[tuple(first)][69]  # token 70 = shared[0]
    run(ScoringRequest(first, 0, 40, True))
    out = run(ScoringRequest(second, 0, 40, True))
    assert out.num_cached_tokens == 96  # three whole blocks of the first request
    computed = [out.prompt_logprobs[i][second[i]].logprob for i in range(out.num_cached_tokens + 1, len(second))]
    assert computed == reference[tuple(second)][out.num_cached_tokens : len(second) - 1]


@pytest.mark.vllm_wheel
def test_continuations_leave_detokenizing_to_the_caller_unless_stop_strings_need_it():
    """Decoding every top-k token of every position cost `lossless` more than its log-probs (docs/benchmarks.md)."""
    plain = continuation_params(SamplingParams(max_tokens=64, logprobs=0), 40, 24, top_k=20)
    assert plain.detokenize is False and plain.logprobs == 20 and plain.max_tokens == 40
    with_stop = continuation_params(SamplingParams(max_tokens=64, stop=["\n\n"]), 40, 24)
    assert with_stop.detokenize is True and with_stop.stop == ["\n\n"]


@pytest.mark.vllm_wheel
def test_our_requests_are_read_once_they_finish():
    """A streamed (CUMULATIVE) output copies every token so far at each step; we read only the final one."""
    user = SamplingParams(max_tokens=64, logprobs=0)
    assert user.output_kind == RequestOutputKind.CUMULATIVE
    assert continuation_params(user, 40, 24).output_kind == RequestOutputKind.FINAL_ONLY
    assert user.output_kind == RequestOutputKind.CUMULATIVE  # the caller's params are left alone
    request = ScoringRequest([1, 2, 3], 0, 2, True, (4,))
    assert scoring_params(request).output_kind == RequestOutputKind.FINAL_ONLY


@pytest.mark.vllm_wheel
def test_our_exclusions_travel_in_params_vllm_takes_and_our_processor_validates():
    from specrl_openrlhf.integration.vllm.exclude import EXCLUDE_FIRST_TOKEN, ExcludeFirstToken

    user = SamplingParams(max_tokens=64, extra_args={"user": 1})
    own = continuation_params(user, 40, 24, excluded=(5, 7))
    assert own.extra_args == {"user": 1, EXCLUDE_FIRST_TOKEN: [5, 7]} and user.extra_args == {"user": 1}
    biased = edge.excluding_params(user, 24, (5, 7))
    assert biased.max_tokens == 1 and biased.logit_bias == {5: edge.EXCLUDING_BIAS, 7: edge.EXCLUDING_BIAS}
    probe = edge.exclusion_probe_params(5)
    for params in (own, biased, probe):
        ExcludeFirstToken.validate_params(params)
    assert probe.extra_args == {EXCLUDE_FIRST_TOKEN: [5]} and probe.logprob_token_ids == [5]
