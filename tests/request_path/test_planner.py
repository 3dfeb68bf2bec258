import math

import numpy as np
import pytest
import torch

from specrl_openrlhf import (
    Draft,
    ReusePolicy,
    SpeculativePlanner,
    UnsupportedSamplingError,
    check_sampling,
    make,
)
from specrl_openrlhf.request_path.chunking import CutForecast
from specrl_openrlhf.request_path.planner import ContinuationRequest
from specrl_openrlhf.request_path.scoring_messages import ScoringAnswer, ScoringRequest
from tests.helpers import draft


def test_truncates_to_budget_context_and_vocabulary():
    planner = SpeculativePlanner(make("full"), max_token_id=99, max_model_len=20)
    assert planner.new_sample([1] * 5, 3, draft([5, 6, 7, 8])).draft.token_ids.tolist() == [5, 6, 7]
    assert planner.new_sample([1] * 15, 10, draft([5] * 10)).draft_len == 4  # 15 + 4 + 1 = 20
    oov = planner.new_sample([1], 10, draft([5, 6, 120, 7]))
    assert oov.draft.token_ids.tolist() == [5, 6] and oov.stats.invalid_drafts == 1 and not oov.draft_ended
    negative = planner.new_sample([1], 10, draft([-3, 6]))
    assert negative.draft is None and negative.stats.invalid_drafts == 1


def test_full_eos_draft_needs_no_generation():
    planner = SpeculativePlanner(make("full"))
    sample = planner.new_sample([1, 2], 10, draft([5, 6, 2], [-0.5, -0.25, -0.125]))
    planner.decide([sample])
    assert sample.cut == 3 and planner.continuation(sample) is None
    output, next_draft = planner.assemble(sample)
    assert output.token_ids == [5, 6, 2] and output.finish_reason == "stop" and output.stats.decoded_tokens == 0
    assert output.logprobs == [-0.5, -0.25, -0.125]  # random/full report the draft's logprobs by default
    assert output.stats.fully_reused == 1 and next_draft.token_ids.tolist() == [5, 6, 2]


def test_draft_at_length_limit_is_complete_and_longer_budget_continues():
    planner = SpeculativePlanner(make("full"))
    at_limit = planner.new_sample([1], 3, draft([5, 6, 7, 8], finish="length"))
    planner.decide([at_limit])
    assert planner.continuation(at_limit) is None
    assert planner.assemble(at_limit)[0].finish_reason == "length"
    short = planner.new_sample([1], 10, draft([5, 6], finish="length"))  # budget grew since
    planner.decide([short])
    assert planner.continuation(short) == ([1, 5, 6], 8)


def test_partial_reuse_assembly_with_scored_logprobs():
    planner = SpeculativePlanner(make("exact"), seed=3)
    sample = planner.new_sample([1, 2], 6, draft([5, 6, 7, 2], [-1.0, -1.0, -1.0, -1.0]), b"k" * 16)
    sample.scored = np.array([-1.0, -1.0, -50.0, -1.0], np.float32)  # token 2 is implausible now
    planner.decide([sample])
    assert sample.cut == 2
    assert planner.continuation(sample) == ([1, 2, 5, 6], 4)
    output, next_draft = planner.assemble(sample, [9, 2], [-0.3, -0.4], "stop")
    assert output.token_ids == [5, 6, 9, 2] and output.finish_reason == "stop"
    assert output.logprobs == pytest.approx([-1.0, -1.0, -0.3, -0.4])
    assert output.stats.reused_tokens == 2 and output.stats.decoded_tokens == 2 and output.stats.scored_tokens == 4
    assert output.stats.log_ratio_sum == pytest.approx(-49.0)
    assert next_draft.logprobs.tolist() == pytest.approx([-1.0, -1.0, -0.3, -0.4])


def test_reported_logprobs_option():
    scored = np.array([-2.0, -2.0], np.float32)
    outputs = {}
    for choice in ["scored", "draft"]:
        planner = SpeculativePlanner(make("spec", lenience=math.inf), reused_logprobs=choice)
        sample = planner.new_sample([1], 2, draft([5, 6], [-1.0, -1.0], "length"))
        sample.scored = scored
        planner.decide([sample])
        outputs[choice], stored = planner.assemble(sample)
        assert stored.logprobs.tolist() == [-2.0, -2.0]  # the cache keeps current-policy logprobs either way
    assert outputs["scored"].logprobs == [-2.0, -2.0] and outputs["draft"].logprobs == [-1.0, -1.0]


def test_no_draft_is_plain_generation():
    planner = SpeculativePlanner(make("spec"))
    sample = planner.new_sample([1, 2], 5, None)
    planner.decide([sample])
    assert planner.scorer.next_scoring(sample) is None and planner.continuation(sample) == ([1, 2], 5)


def test_uniforms_are_reproducible_and_fresh_per_visit():
    planner = SpeculativePlanner(make("spec"), seed=11)
    d = draft([5] * 50)
    a = planner.new_sample([1], 60, d, b"x" * 16).uniforms
    b = planner.new_sample([1], 60, d, b"x" * 16).uniforms
    later = planner.new_sample([1], 60, Draft(d.token_ids, d.logprobs, "stop", visit=1), b"x" * 16).uniforms
    other_seed = SpeculativePlanner(make("spec"), seed=12).new_sample([1], 60, d, b"x" * 16).uniforms
    assert np.array_equal(a, b) and not np.array_equal(a, later) and not np.array_equal(a, other_seed)


class Overrun(ReusePolicy):
    needs_scores = False

    def cut(self, batch):
        return batch.lengths + 5


def test_a_rule_that_overruns_its_drafts_is_an_error_naming_it():
    planner = SpeculativePlanner(make("full"))
    planner.policy = Overrun()
    sample = planner.new_sample([1], 10, draft([5, 6]))
    with pytest.raises(ValueError, match=r"rule Overrun\(\) returned cuts outside \[0, draft length\]"):
        planner.decide([sample])


@pytest.mark.parametrize(
    "settings",
    [{"temperature": 0.7}, {"top_p": 0.9}, {"top_k": 20}, {"min_p": 0.1}, {"repetition_penalty": 1.1}],
)
def test_unsupported_sampling_fails_clearly(settings):
    with pytest.raises(UnsupportedSamplingError, match="temperature 1.0"):
        check_sampling(make("spec"), **settings)
    check_sampling(make("random"), **settings)  # no scoring, no constraint
    check_sampling(make("spec"), temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0)


def test_verified_in_the_engine_samples_as_asked_but_refuses_what_vllm_ignores_under_speculation():
    """vLLM verifies with the request's temperature, top-p and top-k (tests/integration/vllm/test_proposer.py: exact at
    0.7); under speculative decoding it ignores min-p and logit bias, and penalties are not tested with drafts."""
    assert check_sampling(make("lossless"), temperature=0.7, top_p=0.9, top_k=20, min_p=0.0, logit_bias=None) == []
    for bad in ({"min_p": 0.1}, {"logit_bias": {3: -5.0}}, {"presence_penalty": 0.5}):
        with pytest.raises(UnsupportedSamplingError, match="verify='requests'"):
            check_sampling(make("lossless"), **bad)
    with pytest.raises(UnsupportedSamplingError, match="temperature 1.0"):
        check_sampling(make("lossless", verify="requests"), temperature=0.7)


# ---- scoring in chunks, reading the prefix cache -------------------------------------------------------------------


class FakeEngine:
    """Answers scoring requests as vLLM does with prefix caching: whole blocks computed by an earlier request are
    read from the cache (never the last token), and their positions come back without logprobs."""

    def __init__(self, p_curr: dict, block: int = 4):
        self.p_curr, self.block = p_curr, block  # p_curr: token tuple (prompt + draft prefix) -> logprob of its end
        self.cached: set[tuple] = set()
        self.computed = 0

    def score(self, request) -> ScoringAnswer:
        """The answer as the integration edge parses it: p_curr of the positions computed, NaN where the cache
        served them."""
        tokens = tuple(request.token_ids)
        hit = 0
        if request.read_cache:
            while hit + self.block < len(tokens) and tokens[: hit + self.block] in self.cached:
                hit += self.block
        self.cached.update(tokens[:b] for b in range(self.block, len(tokens) + 1, self.block))
        self.computed += len(tokens) - hit
        offset = len(tokens) - request.end
        first = max(request.start, hit + 1 - offset)
        values = np.full(request.end - request.start, np.nan, np.float32)
        for position in range(first, request.end):
            values[position - request.start] = self.p_curr.get(tokens[: offset + position + 1], -0.1)
        follows = {t: self.p_curr.get(tokens + (t,), -0.1) for t in request.next_token_ids}
        return ScoringAnswer(values, follows, hit, first)


def drive(planner, samples, engine, groups):
    """The driver's loop: each group's visit round (its prompt probe beside its samples' first requests), then rounds
    until every draft is cut; then assembly (which takes the scored tokens' stats), without continuations."""
    scorer = planner.scorer
    planner.decide(samples)
    for group in groups:
        for requests in scorer.visit_rounds(group):
            assert sum(r.sample is None for r in requests) == 1  # one probe, the rest the samples' own
            for request in requests:
                scorer.take_visit_scores(group, request, engine.score(request))
    planner.decide(samples)
    while requests := [(s, r) for s in samples if (r := scorer.next_scoring(s)) is not None]:
        gaps = [(s, scorer.take_scores(s, r, engine.score(r))) for s, r in requests]
        for sample, missing in gaps:
            missing = scorer.recover_scores(sample, missing, next(g for g in groups if sample in g))
            for retry in scorer.rescoring(sample, missing) if len(missing) else ():
                assert not len(scorer.take_scores(sample, retry, engine.score(retry)))
        planner.decide(samples)
    for sample in samples:
        planner.assemble(sample)


def visit_of(planner, prompt, drafts, p_curr_of, key=b"v" * 16):
    samples = [planner.new_sample(prompt, 400, d, key) for d in drafts]
    p_curr = {}
    for d in drafts:
        for i in range(len(d)):
            seq = tuple(prompt) + tuple(d.token_ids[: i + 1].tolist())
            p_curr[seq] = p_curr_of(seq)
    return samples, p_curr


@pytest.mark.parametrize("drift", [0.01, 0.3, 2.0])
def test_chunked_scoring_makes_the_same_cuts_as_one_shot(drift):
    rng = np.random.default_rng(0)
    prompt = list(range(10, 74))  # 64 tokens: whole blocks
    shared = rng.integers(3, 90, 20).tolist()  # the drafts' common beginning
    drafts = []
    for j in range(8):
        tokens = shared + rng.integers(3, 90, int(rng.integers(0, 200))).tolist()
        drafts.append(
            Draft(np.array(tokens, np.int32), rng.uniform(-2, 0, len(tokens)).astype(np.float32), "stop", 0, j)
        )
    p_curr_rng = np.random.default_rng(1)
    table = {}

    def p_curr_of(seq):  # a fixed p_curr per context, drifting from p_prev by about `drift` nats
        if seq not in table:
            table[seq] = -float(p_curr_rng.exponential(drift)) - 1.0
        return table[seq]

    cuts, engines = {}, {}
    for mode in ("full", "chunked"):
        planner = SpeculativePlanner(make("exact"), seed=5, scoring=mode)
        for _ in range(3):  # later visits: the chunk schedule has seen rejections
            samples, p_curr = visit_of(planner, prompt, drafts, p_curr_of)
            engines[mode] = FakeEngine(p_curr)
            drive(planner, samples, engines[mode], [samples])
        cuts[mode] = [s.cut for s in samples]
        for s in samples:
            seen = s.scored_upto
            expected = [p_curr[tuple(prompt) + tuple(s.draft.token_ids[: i + 1].tolist())] for i in range(seen)]
            assert s.scored[:seen] == pytest.approx(expected)  # recovered and computed positions alike
        scored = sum(s.stats.scored_tokens for s in samples)
        needed = sum(s.cut + (s.cut < s.draft_len) for s in samples)
        if mode == "chunked" and drift >= 0.3:
            # strong drift: what the rule needed and at most one chunk more per draft, not whole drafts
            assert scored <= needed + len(samples) * planner.scorer.chunks.chunk() < sum(s.draft_len for s in samples)
        if mode == "full":
            assert scored == sum(s.draft_len for s in samples)
    assert cuts["chunked"] == cuts["full"]
    assert engines["chunked"].computed <= engines["full"].computed


def test_a_forecast_behind_the_scored_prefix_still_asks_for_the_next_token():
    """A rule may forecast a cut inside the prefix it already kept (its forecast input differs from its real one):
    the next request still scores at least one token."""
    planner = SpeculativePlanner(make("lossless", draft="own", verify="requests"), scoring="chunked")
    for _ in range(CutForecast.MIN_RECORDS):
        planner.scorer.forecast.observe(forecast=0, start=0, needed=1, draft_len=10)  # margin 0
    sample = planner.new_sample([1, 2], 20, draft([5, 6, 7, 8, 9, 10]), b"k" * 16)
    sample.scored[:3] = -0.01  # three tokens scored and kept
    planner.scorer.forecast_cut = lambda s: 0
    request = planner.scorer.next_scoring(sample)
    assert request.start == 3 and (request.end > 3 or request.next_token_ids == (8,))


@pytest.mark.parametrize("drift", [0.0, 0.1])
def test_lossless_scores_up_to_the_cut_it_forecasts_and_cuts_as_one_shot_scoring_does(drift):
    """`lossless` keeps y_i iff u_i <= p_curr(y_i): with p_prev for p_curr, the planner knows where it will likely cut
    before scoring, and the chunk ends there (the rate-based schedule alone scores more than twice what is needed)."""
    rng = np.random.default_rng(0)
    prompt = list(range(10, 74))
    table = {}

    def p_curr_of(seq):
        if seq not in table:
            table[seq] = float(np.log(rng.uniform(0.8, 1.0)))  # a confident policy: cuts some 10 tokens in
        return table[seq]

    def drafts_of(visit):  # p_prev: p_curr, moved by about `drift` nats
        drafts = []
        for j in range(8):
            tokens = rng.integers(3, 90, 40).tolist()
            seqs = [tuple(prompt) + tuple(tokens[: i + 1]) for i in range(40)]
            p_prev = [min(0.0, p_curr_of(q) + drift * rng.standard_normal()) for q in seqs]
            drafts.append(Draft(np.array(tokens, np.int32), np.array(p_prev, np.float32), "stop", visit, j))
        return drafts

    visits = [drafts_of(v) for v in range(10)]
    cuts, scored, needed = {}, {}, {}
    for mode in ("full", "forecast", "schedule"):
        planner = SpeculativePlanner(
            make("lossless", draft="own", verify="requests"), seed=5, scoring="full" if mode == "full" else "chunked"
        )
        if mode == "schedule":
            planner.scorer.forecast = None
        cuts[mode], scored[mode], needed[mode] = [], 0, 0
        for visit, drafts in enumerate(visits):
            samples, p_curr = visit_of(planner, prompt, drafts, p_curr_of, key=bytes([visit]) * 16)
            drive(planner, samples, FakeEngine(p_curr), [samples])
            cuts[mode] += [s.cut for s in samples]
            if visit >= 6:  # by then the forecast's margin is known (32 cut drafts)
                scored[mode] += sum(s.stats.scored_tokens for s in samples)
                needed[mode] += sum(s.cut + (s.cut < s.draft_len) for s in samples)
    assert cuts["forecast"] == cuts["schedule"] == cuts["full"]
    assert scored["schedule"] > 2 * needed["schedule"]  # chunks sized on the rate: long, to save round trips
    if drift == 0.0:
        assert scored["forecast"] == needed["forecast"]  # every cut where forecast, the margin 0
    else:
        assert scored["forecast"] < 0.7 * scored["schedule"]  # 311 against 526


def test_siblings_read_the_prompt_from_the_cache_and_share_their_common_prefix():
    prompt = list(range(10, 74))
    drafts = [
        Draft(np.array([5] * 12 + [6 + j], np.int32), np.full(13, -1.0, np.float32), "stop", 0, j) for j in range(4)
    ]
    planner = SpeculativePlanner(make("spec", lenience=math.inf), scoring="chunked")
    samples, p_curr = visit_of(planner, prompt, drafts, lambda seq: -0.5)
    engine = FakeEngine(p_curr)
    drive(planner, samples, engine, [samples])
    # The probe computes the prompt (counted on the first sample) and every first token; the first sample computes
    # its draft; a sibling reads the prompt and the 12 shared tokens' whole blocks and computes its last token, then
    # a point probe (4 tokens: a block boundary) scores it: 5 tokens instead of 77.
    assert samples[0].stats.scoring_prefill_tokens == 64 + 13
    assert [s.stats.scoring_prefill_tokens for s in samples[1:]] == [5, 5, 5]
    assert all(np.array_equal(s.scored, np.full(13, -0.5, np.float32)) for s in samples)
    assert [s.cut for s in samples] == [13] * 4


def test_positions_the_cache_served_are_rescored_by_point_probes():
    planner = SpeculativePlanner(make("exact"), scoring="chunked")
    sample = planner.new_sample([1, 2, 3, 4], 10, draft([5, 6, 7, 8, 9]))
    request = planner.scorer.next_scoring(sample)
    assert (request.start, request.end, request.read_cache, request.next_token_ids) == (0, 5, True, ())
    served = ScoringAnswer(np.array([np.nan] * 3 + [-0.25] * 2, np.float32), {}, 6, 3)  # 6 prompt tokens cached
    missing = planner.scorer.take_scores(sample, request, served)
    assert missing.tolist() == [0, 1, 2] and np.isnan(sample.scored[:3]).all() and sample.scored_upto == 0
    probes = planner.scorer.rescoring(sample, missing)  # a point probe per position: all before it from the cache
    assert [(r.token_ids, r.start, r.end, r.read_cache, r.next_token_ids) for r in probes] == [
        ([1, 2, 3, 4], 0, 0, True, (5,)),
        ([1, 2, 3, 4, 5], 1, 1, True, (6,)),
        ([1, 2, 3, 4, 5, 6], 2, 2, True, (7,)),
    ]
    for probe in probes:
        answer = ScoringAnswer(np.zeros(0, np.float32), {probe.next_token_ids[0]: -0.5}, len(probe.token_ids) - 1)
        assert not len(planner.scorer.take_scores(sample, probe, answer))
    assert sample.scored.tolist() == [-0.5, -0.5, -0.5, -0.25, -0.25]
    many = planner.new_sample([1, 2, 3, 4], 10, draft([5] * 9))
    [full] = planner.scorer.rescoring(many, np.arange(9))  # many positions: one request that does not read the cache
    assert (full.start, full.end, full.read_cache) == (0, 9, False)
    computed_nan = ScoringAnswer(np.array([np.nan] * 5, np.float32), {}, 0, 0)
    with pytest.raises(ValueError, match="NaN logprobs"):
        planner.scorer.take_scores(planner.new_sample([1], 10, draft([5] * 5)), request, computed_nan)


def test_a_kept_token_without_p_curr_is_an_error_not_a_guess():
    planner = SpeculativePlanner(make("full"), reused_logprobs="scored")
    sample = planner.new_sample([1], 10, draft([5, 6, 7]))
    planner.decide([sample])
    assert planner.scorer.next_scoring(sample).end == 3  # only the kept prefix is scored, after the cut
    with pytest.raises(RuntimeError, match="no p_curr"):
        planner.assemble(sample)


class LastTokenDecides(ReusePolicy):
    """Keeps a draft whole when its last token is no less likely now, else nothing: not decided by a prefix."""

    def cut(self, batch):
        last = batch.lengths - 1
        rows = torch.arange(len(last))
        fine = batch.scored_logprobs[rows, last] >= batch.draft_logprobs[rows, last]
        return torch.where(fine, batch.lengths, torch.zeros_like(batch.lengths))


@pytest.mark.parametrize("policy, traced", [(LastTokenDecides(), False), (make("spec"), True)])
def test_whole_drafts_for_rules_not_judged_chunk_by_chunk_and_for_traces(policy, traced, tmp_path):
    """A prompt probe scores first tokens for everyone; a rule that is not prefix-decidable, or a traced run, must
    still see every draft whole before cutting it."""
    from specrl_openrlhf.trace import TraceWriter

    trace = TraceWriter(tmp_path, "t") if traced else None
    planner = SpeculativePlanner(policy, scoring="chunked", trace=trace)
    drafts = [
        Draft(np.array([5 + j, 6, 7, 8], np.int32), np.full(4, -1.0, np.float32), "stop", 0, j) for j in range(3)
    ]
    samples, p_curr = visit_of(planner, list(range(10, 74)), drafts, lambda seq: -3.0)  # first tokens: rejected
    drive(planner, samples, FakeEngine(p_curr), [samples])
    assert all(s.decided and s.stats.scored_tokens == 4 and not np.isnan(s.scored).any() for s in samples)


# ---- the cut distribution through the planner, with its own uniforms -----------------------------------------------

RATIOS = (0.5, 1.5, 0.2, 0.8)  # p_curr / p_prev at each draft position: below and above 1


@pytest.mark.parametrize("scoring", ["full", "chunked"])
@pytest.mark.parametrize("lenience", [1.0, 1.65, 4.0])
def test_planner_cuts_follow_the_lenient_rule(lenience, scoring):
    """6000 four-token drafts with mixed ratios through SpeculativePlanner (uniforms from its own seeding, scores
    from a fake engine in chunks or whole): the cut k has P = a_0...a_{k-1} (1 - a_k), a_i = min(1, l r_i)."""
    rows, prompt = 6000, list(range(10, 42))
    p_prev = np.log(np.array([0.4, 0.3, 0.5, 0.25]))
    accept = np.minimum(1.0, lenience * np.array(RATIOS))
    planner = SpeculativePlanner(make("spec", lenience=lenience), seed=9, scoring=scoring)
    if planner.scorer.chunks is not None:
        planner.scorer.chunks.observe(
            examined=2, rejected=True
        )  # as after visits that rejected often: chunks of a few
    counts = np.zeros(len(RATIOS) + 1)
    for start in range(0, rows, 1000):
        drafts = [
            Draft(np.array([20, 21, 22, 23], np.int32), p_prev.astype(np.float32), "stop", 0, 0) for _ in range(1000)
        ]
        samples = [
            planner.new_sample(prompt, 8, d, key=(start + i).to_bytes(16, "little")) for i, d in enumerate(drafts)
        ]
        table = {tuple(prompt) + (20, 21, 22, 23)[: i + 1]: float(p_prev[i] + np.log(RATIOS[i])) for i in range(4)}
        drive(planner, samples, FakeEngine(table), [samples[i : i + 8] for i in range(0, len(samples), 8)])
        counts += np.bincount([s.cut for s in samples], minlength=len(RATIOS) + 1)
    kept_through = np.concatenate([[1.0], np.cumprod(accept)])  # P(cut >= k)
    expected = rows * (kept_through - np.append(kept_through[1:], 0.0))
    seen = expected > 0
    chi2 = float(((counts[seen] - expected[seen]) ** 2 / expected[seen]).sum())
    assert counts[~seen].sum() == 0 and chi2 < 16.27, (counts, expected)  # chi-square(3 dof) at 99.9%


def test_sampling_checks_warn_about_eos_masked_first_positions():
    assert check_sampling(make("spec"), temperature=1.0, min_tokens=1) == []  # raw logprobs: no mismatch
    [warning] = check_sampling(make("spec"), temperature=1.0, min_tokens=1, processed_logprobs=True)
    assert "first 1 position(s) (min_tokens)" in warning and "1 - p(EOS)" in warning
    assert check_sampling(make("random"), temperature=0.7, min_tokens=1, processed_logprobs=True) == []


def test_residual_redraws_the_rejected_position_and_continues_after_it():
    planner = SpeculativePlanner(make("residual", top_k=3), seed=1, stop_token_ids=[2])
    top = (np.array([[5, 6, 2]] * 3, np.int32), np.log(np.array([[0.5, 0.3, 0.2]] * 3, np.float32)))
    d = Draft(np.array([5, 5, 5]), np.log([0.5, 0.5, 0.5]), "stop", top_ids=top[0], top_logprobs=top[1])
    sample = planner.new_sample([1], 10, d, b"r" * 16)
    sample.scored = np.log(np.array([0.5, 0.01, 0.5], np.float32))  # token 1 all but vanishes: rejected
    sample.scored_top[0][:] = [[6, 2, 5]] * 3
    sample.scored_top[1][:] = np.log([[0.79, 0.2, 0.01]] * 3)
    planner.decide([sample])
    assert sample.cut == 1 and sample.resampled is not None
    token, logprob = sample.resampled
    assert token in (6, 2) and logprob == pytest.approx(math.log(0.79 if token == 6 else 0.2), rel=1e-5)
    request = planner.continuation(sample)
    if token == 2:  # the redrawn token ends the response: nothing to continue
        assert request is None
    else:
        assert request == ([1, 5, 6], 8)
    output, stored = planner.assemble(
        sample,
        [7] if request else [],
        [-0.3] if request else None,
        "stop" if request else None,
        new_top=(np.array([[7, 5, 6]]), np.array([[-0.3, -1.0, -2.0]], np.float32)) if request else None,
    )
    assert output.token_ids[:2] == [5, token] and output.stats.resampled_tokens == 1
    assert output.stats.decoded_tokens == (1 if request else 0) and stored.top_ids.shape == (len(output.token_ids), 3)
    assert np.array_equal(stored.top_ids[1], [6, 2, 5])  # the redrawn position keeps p_curr's top-k


def test_residual_without_top_k_leaves_the_rejection_to_the_engine():
    planner = SpeculativePlanner(make("residual"), seed=1)
    sample = planner.new_sample([1], 10, draft([5, 5], [-0.5, -0.5]), b"r" * 16)
    sample.scored = np.array([-0.5, -9.0], np.float32)
    planner.decide([sample])
    assert sample.cut == 1 and sample.resampled is None and sample.stats.resample_unavailable == 1
    assert planner.continuation(sample) == ([1, 5], 9)


def test_lossless_excludes_the_rejected_token_from_the_continuations_first_step():
    planner = SpeculativePlanner(make("lossless", draft="own", verify="requests"), seed=1, stop_token_ids=[2])
    sample = planner.new_sample([1], 10, draft([5, 6, 7], [-0.5, -0.5, -0.5]), b"r" * 16)
    sample.scored = np.log(np.array([1.0, 1e-9, 0.5], np.float32))  # token 6 all but impossible now: rejected
    planner.decide([sample])
    assert (sample.cut, sample.excluded, sample.resampled) == (1, (6,), None)
    assert planner.continuation(sample) == ([1, 5], 9)  # no extra token: the engine draws the position
    output, _ = planner.assemble(sample, [8, 2], [-0.2, -0.1], "stop")
    assert output.token_ids == [5, 8, 2] and output.logprobs[1] == pytest.approx(-0.2)
    assert output.stats.resampled_tokens == 1 and output.stats.examined_tokens == 2
    with pytest.raises(ValueError, match="excluded|exclude"):  # the engine ignored the ban: never assembled
        planner.assemble(sample, [6, 2], [-0.2, -0.1], "stop")


def test_lossless_turns_processed_first_logprobs_back_into_p_curr():
    """With the first step's token banned, processed log-probs are log p(x) - log(1 - p(y)); raw ones are log p(x)."""
    planner = SpeculativePlanner(make("lossless", draft="own", verify="requests"), seed=1, processed_logprobs=True)
    sample = planner.new_sample([1], 10, draft([5, 6], [-0.5, -0.5]), b"r" * 16)
    sample.scored = np.log(np.array([0.999999, 0.25], np.float32))
    sample.uniforms[:] = [0.5, 0.9]  # keep 5, reject 6 (0.9 > 0.25)
    planner.decide([sample])
    assert sample.excluded == (6,)
    output, stored = planner.assemble(sample, [8], [math.log(0.3 / 0.75)], "length")
    assert output.logprobs[1] == pytest.approx(math.log(0.3), abs=1e-6)
    assert stored.logprobs[1] == pytest.approx(math.log(0.3), abs=1e-6)


def test_majority_drafts_share_one_path_with_their_own_uniforms():
    planner = SpeculativePlanner(make("lossless", draft="majority", verify="requests"), seed=1)
    drafts = [
        draft(t, [-0.1] * len(t)).numbered(3, i) for i, t in enumerate([[4, 5, 6], [4, 5, 7], [4, 9], [4, 5, 7]])
    ]
    samples = planner.visit_samples([1], 10, drafts, b"k" * 16, count=4)
    assert [s.draft.token_ids.tolist() for s in samples] == [[4, 5, 7]] * 4
    assert [(s.draft.visit, s.draft.index) for s in samples] == [(3, 0), (3, 1), (3, 2), (3, 3)]
    assert len({tuple(s.uniforms) for s in samples}) == 4
    own = SpeculativePlanner(make("lossless", draft="own", verify="requests"), seed=1).visit_samples(
        [1], 10, drafts, b"k" * 16, 4
    )
    assert [s.draft.token_ids.tolist() for s in own] == [d.token_ids.tolist() for d in drafts]


def test_a_samples_requests_come_one_after_another_the_same_for_every_rule():
    planner = SpeculativePlanner(make("spec", lenience=1.0), seed=1)
    sample = planner.new_sample([1, 2], 10, draft([5, 6, 7], [-0.5, -0.5, -0.5]), b"r" * 16)
    scoring = planner.next_request(sample)
    assert isinstance(scoring, ScoringRequest) and scoring.token_ids[:2] == [1, 2]
    sample.scored[:] = [-0.5, -9.0, -0.5]  # as take_scores stores them
    sample.uniforms[:] = 0.5
    continuation = planner.next_request(sample)  # the rule cuts at the rejection: then the continuation
    assert continuation == ContinuationRequest([1, 2, 5], 9, 1, expected_tokens=2)  # the two draft tokens left
    assert planner.next_request(sample) is None  # then assemble
    off = SpeculativePlanner(make("off"))
    fresh = off.new_sample([1, 2], 4, None)
    assert (
        off.next_request(fresh) == ContinuationRequest([1, 2], 4, 0, expected_tokens=4)
        and off.next_request(fresh) is None
    )
