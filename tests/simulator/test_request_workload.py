"""The request path replayed on a corpus (`simulator.request_workload`, `simulator.request_plans`): `lossless`'s cuts
against the planner's own under the one-hot coupling, every other rule's cuts the planner's own (its `cut`, the seeds
a run draws), by hand too, and the schedule of rounds and continuations in the simulator."""

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.cache import prompt_key
from specrl_openrlhf.config import parse_rule
from specrl_openrlhf.seeds import entropy_of, uniforms_for
from specrl_openrlhf.simulator.corpus import Corpus
from specrl_openrlhf.simulator.engine import EngineSimulator, Schedule
from specrl_openrlhf.simulator.request_workload import NoDrafts, request_workload
from specrl_openrlhf.simulator.requests import BLOCK_TOKENS, Samples
from tests.helpers import ADAPTIVE

MAX_TOKENS = 8
PROMPTS = [list(range(100, 120)), list(range(200, 220))]  # 20 tokens: one whole cache block each
PREVIOUS = [  # epoch 0; 9 is EOS, a response of MAX_TOKENS ran out of budget
    [[10, 11, 12, 13, 9], [10, 11, 14, 15, 16, 9], [10, 11, 14, 17, 9]],
    [[], [30, 31, 32, 33, 34, 35, 36, 37], [30, 31, 40, 9]],
]
RECORDED = [  # epoch 1, sampled from the current policy
    [[10, 11, 14, 17, 18, 9], [10, 11, 12, 13, 9], [10, 11, 14, 17, 9]],
    [[30, 31, 32, 33, 34, 35, 36, 37], [30, 31, 40, 41, 9], [30, 9]],
]


def toy(scored: bool = False) -> Corpus:
    responses = [PREVIOUS, RECORDED]
    if not scored:
        return Corpus(PROMPTS, responses, {"max_tokens": MAX_TOKENS})
    logprobs = [[[np.full(len(r), -1.0, np.float32) for r in samples] for samples in epoch] for epoch in responses]
    scores = [
        [[np.zeros(0, np.float32) for _ in samples] for samples in PREVIOUS],
        [[np.full(len(r), -0.5, np.float32) for r in samples] for samples in PREVIOUS],
    ]
    return Corpus(PROMPTS, responses, {"max_tokens": MAX_TOKENS}, logprobs, scores)


def random_corpus(seed: int = 0, prompts: int = 4, samples: int = 4, epochs: int = 3) -> Corpus:
    """Responses over a 3-token vocabulary (so that drafts and responses share prefixes), EOS-ended or cut at
    MAX_TOKENS, with random sampled log-probs and scoring pass."""
    rng = np.random.default_rng(seed)

    def response():
        n = int(rng.integers(1, MAX_TOKENS + 1))
        body = rng.integers(10, 13, n).tolist()
        return body if n == MAX_TOKENS else body[: n - 1] + [9]

    responses = [[[response() for _ in range(samples)] for _ in range(prompts)] for _ in range(epochs)]
    logprobs = [[[rng.uniform(-3, 0, len(r)).astype(np.float32) for r in s] for s in e] for e in responses]
    scores = [[[np.zeros(0, np.float32) for _ in range(samples)] for _ in range(prompts)]]
    scores += [[[rng.uniform(-3, 0, len(r)).astype(np.float32) for r in s] for s in e] for e in responses[:-1]]
    return Corpus([list(range(20)) for _ in range(prompts)], responses, {"max_tokens": MAX_TOKENS}, logprobs, scores)


def lossless(draft: str = "tree") -> sr.ReusePolicy:
    return sr.make("lossless", verify="requests", draft=draft)


def workload(rule: str, corpus: Corpus, **kwargs):
    """The workload of `rule` in the config's spelling (`config.parse_rule`)."""
    return request_workload(parse_rule(rule), corpus, **kwargs)


def planner_cuts(draft: str, prompt: int) -> list[tuple[int, list[int] | None] | None]:
    """The planner's (cut, continuation's tokens or None) of each sample of epoch 1's visit of `prompt`, with p_curr
    one-hot on the recorded response (log p_curr 0 on its token, -100 elsewhere): under the coupling, what `lossless`
    keeps of a draft when the current policy's sample is that response. None: the sample has no draft."""
    planner = sr.SpeculativePlanner(sr.make("lossless", verify="requests", draft=draft), seed=0)
    claimed = [
        sr.Draft(np.array(r), np.zeros(len(r)), "stop" if len(r) < MAX_TOKENS else "length", 0, s) if r else None
        for s, r in enumerate(PREVIOUS[prompt])
    ]
    samples = planner.open_visit(PROMPTS[prompt], MAX_TOKENS, claimed, key=bytes(16), count=len(claimed))
    out = []
    for sample, recorded in zip(samples, RECORDED[prompt]):
        if sample.tree is not None:  # one tree, p_curr on its nodes: one-hot on this sample's recorded response
            history, node = sample.tree.history, 0
            sample.tree.logprobs[:] = -100.0
            sample.tree.logprobs[0] = np.nan
            for token in recorded:
                if (node := history.kids[node].get(token)) is None:
                    break
                sample.tree.logprobs[node] = 0.0
            sample.tree.scored = True
        elif sample.draft is not None:
            y = sample.draft.token_ids
            agree = [i < len(recorded) and y[i] == recorded[i] for i in range(len(y))]
            sample.scored = np.where(agree, 0.0, -100.0).astype(np.float32)
        else:
            out.append(None)
            continue
        planner.decide([sample])
        assert sample.decided
        continuation = planner.continuation(sample)
        out.append((sample.cut, None if continuation is None else continuation[0]))
    return out


@pytest.mark.parametrize("draft", ["own", "majority", "tree"])
def test_lossless_cuts_are_the_planners_under_the_one_hot_coupling(draft):
    replay = request_workload(lossless(draft), toy())
    for prompt in range(len(PROMPTS)):
        decisions = replay.plan(1, prompt, toy()).decisions
        expected = planner_cuts(draft, prompt)
        got = [None if d is None else (d.kept, PROMPTS[prompt] + d.prefix if d.rest else None) for d in decisions]
        assert got == expected, (draft, prompt)
        for d, recorded in zip(decisions, RECORDED[prompt]):  # the whole response is the recorded one
            assert d is None or d.prefix + d.rest == recorded


def test_the_rules_keep_what_their_proposal_shares_with_the_recorded_response():
    kept = {
        draft: [
            [d and d.kept for d in request_workload(lossless(draft), toy()).plan(1, p, toy()).decisions]
            for p in range(2)
        ]
        for draft in ("own", "majority", "tree")
    }
    # own: each its previous response; majority: 10 11 14 15 16 9 and 30 31 32 .. 37; tree: any previous path
    assert kept == {
        "own": [[2, 2, 5], [None, 2, 1]],
        "majority": [[3, 2, 3], [8, 2, 1]],
        "tree": [[4, 5, 5], [8, 3, 1]],
    }
    assert workload("lossless,verify=requests", toy()).plans.draft == "tree"  # lossless's default draft


def test_a_visit_sends_a_probe_and_one_scoring_request_per_draft_or_branch():
    for rule, drafts in (("own", 3), ("majority", 3), ("tree", 3), ("exact", 3)):
        replay = request_workload(sr.make("exact") if rule == "exact" else lossless(rule), toy(scored=True))
        requests = replay.requests(1, [0], toy(scored=True))
        assert [r.id for r in requests] == [f"e1-p0-r{i}" for i in range(1 + drafts)], rule
        probe, first, *rest = requests
        assert all(r.prompt_logprobs and len(r.response) == 1 for r in requests)
        assert probe.prompt == PROMPTS[0] and probe.cached == 0  # the prompt alone, computed once
        assert first.cached == rest[0].cached == BLOCK_TOKENS  # the prompt's whole block, from the probe
    tree = request_workload(lossless("tree"), toy()).requests(1, [0], toy())
    # each branch once, its last token scored as the one that follows
    assert [r.prompt[20:] for r in tree[1:]] == [[10, 11, 12, 13], [10, 11, 14, 15, 16], [10, 11, 14, 17]]


def test_epoch_0_is_plain_samples():
    replay = request_workload(lossless("own"), toy())
    got = [(r.id, r.prompt, r.response, r.cached, r.prompt_logprobs) for r in replay.requests(0, [0, 1], toy())]
    stock = [(r.id, r.prompt, r.response, r.cached, r.prompt_logprobs) for r in Samples().requests(0, [0, 1], toy())]
    assert got == stock and replay.kept == 0


def test_continuations_wait_for_the_whole_round_and_read_the_prefix_cache():
    replay = request_workload(lossless("own"), toy())
    round_ = replay.requests(1, [0], toy())
    assert all(replay.followups(r) == [] for r in round_[:-1])  # the round is not done yet
    after = replay.followups(round_[-1])
    # sample 2 kept its draft whole (it ended with EOS): no continuation
    assert [(r.id, r.prompt[20:], r.response) for r in after] == [
        ("e1-p0-s0-continuation", [10, 11], [14, 17, 18, 9]),
        ("e1-p0-s1-continuation", [10, 11], [12, 13, 9]),
    ]
    assert all(r.cached == BLOCK_TOKENS and not r.prompt_logprobs for r in after)
    assert replay.followups(round_[-1]) == []
    visit = replay.requests(1, [1], toy())  # sample 0 has no draft: it waits for the round, then samples
    after = [f for r in visit for f in replay.followups(r)]
    assert [r.id for r in after] == ["e1-p1-s0", "e1-p1-s1-continuation", "e1-p1-s2-continuation"]
    assert after[0].response == RECORDED[1][0] and after[0].cached == BLOCK_TOKENS


def test_spec_cuts_at_the_first_u_above_lenience_times_the_ratio():
    p_prev, p_curr = [-1.0] * 4, [-1.0, -1.5, -1.6, -2.1]
    previous, recorded = [10, 11, 12, 13], [10, 11, 20, 21, 22, 9]
    corpus = Corpus(
        [list(range(20))],
        [[[previous]], [[recorded]]],
        {"max_tokens": MAX_TOKENS},
        [[[np.array(p_prev, np.float32)]], [[np.zeros(len(recorded), np.float32)]]],
        [[[np.zeros(0, np.float32)]], [[np.array(p_curr, np.float32)]]],
    )
    # the uniforms a run draws for the draft: the seed, the prompt's key, the draft's visit (epoch 0), index, length
    u = uniforms_for(entropy_of(0, prompt_key(list(range(20))), 0, 0, 4), 4)
    np.testing.assert_allclose(u, [0.9914, 0.1619, 0.6424, 0.5942], atol=1e-4)
    # acceptance min(1, l e^(p_curr - p_prev)): l = 1: 1, 0.607, 0.549, 0.333 -> u_2 = 0.642 > 0.549: cut 2
    # l = 1.65: 1, 1, 0.905, 0.549 -> u_3 = 0.594 > 0.549: cut 3
    for rule, cut in (("exact", 2), ("spec@1.65", 3)):
        replay = workload(rule, corpus)
        [decision] = replay.plan(1, 0, corpus).decisions
        assert decision.kept == cut and decision.prefix == previous[:cut]
        assert len(decision.rest) == len(recorded) - cut  # the length borrowed from the recorded response
        replay.requests(1, [0], corpus)
        assert replay.kept == cut


def test_exact_keeps_no_more_than_spec_on_the_same_uniforms():
    corpus = random_corpus()
    exact, spec = workload("exact", corpus), workload("spec@1.65", corpus)
    cuts = []
    for epoch in range(1, corpus.epochs):
        for p in range(len(corpus.prompts)):
            for a, b in zip(exact.plan(epoch, p, corpus).decisions, spec.plan(epoch, p, corpus).decisions):
                assert a.kept <= b.kept
                cuts.append((a.kept, b.kept))
    assert any(a < b for a, b in cuts)  # the corpus tells them apart


def test_a_policy_that_moved_towards_every_draft_token_keeps_every_draft_whole():
    base = random_corpus()
    scores = [base.scores[0]] + [
        [[base.logprobs[e - 1][p][s] + 0.1 for s in range(base.samples)] for p in range(len(base.prompts))]
        for e in range(1, base.epochs)
    ]
    corpus = Corpus(base.prompts, base.responses, base.meta, base.logprobs, scores)
    for rule in ("exact", "spec@1.65", "spec"):
        replay = workload(rule, corpus)
        for e in range(1, corpus.epochs):
            for p in range(len(corpus.prompts)):
                kept = [d.kept for d in replay.plan(e, p, corpus).decisions]
                assert kept == [len(r) for r in corpus.responses[e - 1][p]], rule


class Watching(NoDrafts):
    """The stock proposer, noting the engine steps each request took part in."""

    def __init__(self):
        self.step, self.steps = 0, {}

    def propose(self, batch, sampled):
        self.step += 1
        for request in batch.rows:
            self.steps.setdefault(request.id, []).append(self.step)
        return super().propose(batch, sampled)


class Recording:
    """A workload that keeps every request it sent."""

    def __init__(self, inner):
        self.inner, self.sent = inner, []

    @property
    def kept(self):
        return self.inner.kept

    def requests(self, epoch, prompts, corpus):
        out = self.inner.requests(epoch, prompts, corpus)
        self.sent += out
        return out

    def followups(self, request):
        out = self.inner.followups(request)
        self.sent += out
        return out


@pytest.mark.parametrize(
    "rule",
    [
        "lossless,verify=requests,draft=own",
        "lossless,verify=requests,draft=majority",
        "lossless,verify=requests",
        "spec@1.65",
    ],
)
def test_a_continuation_enters_the_engine_only_after_its_round_finished(rule):
    corpus = random_corpus(seed=1)
    watching, sending = Watching(), Recording(workload(rule, corpus))
    schedule = Schedule(max_num_seqs=6, prompts_per_step=2, max_num_batched_tokens=48)
    run = EngineSimulator(corpus, schedule, watching, workload=sending).run()
    visits = {r.id.rsplit("-", 1)[0] for r in sending.sent if r.prompt_logprobs}
    assert visits
    for visit in visits:
        mine = [r for r in sending.sent if r.id.startswith(visit + "-")]
        scoring = [r for r in mine if r.prompt_logprobs]
        after = [r for r in mine if not r.prompt_logprobs]
        last = max(watching.steps[r.id][-1] for r in scoring)
        assert all(watching.steps[r.id][0] > last for r in after), visit
    scoring = [r for r in sending.sent if r.prompt_logprobs]
    logits = run.column("logit_tokens")
    assert logits.sum() == sum(len(r.prompt) - r.cached for r in scoring)  # every scored token, once
    assert (logits <= run.column("prefill_tokens")).all() and run.accepted == 0


def test_the_kept_share_is_the_kept_tokens_over_the_response_tokens():
    corpus = toy()
    run = EngineSimulator(corpus, Schedule(max_num_seqs=4, prompts_per_step=1), NoDrafts(), workload=None).run()
    assert run.kept == 0
    own = request_workload(lossless("own"), corpus)
    run = EngineSimulator(corpus, Schedule(max_num_seqs=4, prompts_per_step=1), NoDrafts(), workload=own).run()
    tokens = sum(len(r) for epoch in (PREVIOUS, RECORDED) for samples in epoch for r in samples)
    kept = 2 + 2 + 5 + 2 + 1  # under the coupling the rule's response is the recorded one: kept + generated
    assert run.response_tokens + run.kept_outside == tokens and run.kept == pytest.approx(kept / tokens)
    # full keeps every draft whole (prompt 1's second, cut at the budget, no longer than its 8 tokens: the 5 recorded
    # follow none of it) and generates only prompt 1's first sample (8 tokens): 5 + 6 + 5 + 8 + 4 tokens kept of 36
    full = request_workload(sr.make("full"), corpus)
    run = EngineSimulator(corpus, Schedule(max_num_seqs=4, prompts_per_step=1), NoDrafts(), workload=full).run()
    assert run.epoch_tokens[1] == (8, 28) and run.kept_in(1) == pytest.approx(28 / 36)


def test_what_a_corpus_lacks_for_a_rule_is_named():
    for rule in ("spec@1.65", "exact", ADAPTIVE):
        with pytest.raises(ValueError, match=r"corpus .* has no scoring pass .*specrl_openrlhf.miniature.corpus"):
            workload(rule, toy())
    with pytest.raises(ValueError, match=r"scores drafts from 2 visits back, but a corpus's scoring pass"):
        workload("delayed", toy(scored=True))
    for rule in ("off", "lossless", "suffix"):
        with pytest.raises(ValueError, match="sends no drafts on the request path"):
            workload(rule, toy(scored=True))

    class Majority(sr.ReusePolicy):  # a rule of one's own that proposes the majority path
        draft_choice = "majority"

        def cut(self, batch):
            return batch.lengths

    with pytest.raises(ValueError, match="proposes the majority of a visit's responses"):
        request_workload(Majority(), toy(scored=True))
    for rule in ("lossless,verify=requests,draft=own", "random", "full"):  # they read no scores
        workload(rule, toy())


@pytest.mark.parametrize("rule", ["spec@1.65", "exact", "anchored@2", "residual", "random", ADAPTIVE])
def test_a_rules_cuts_are_the_planners_with_the_seeds_a_run_draws(rule):
    """Each drafted visit of a random corpus through the request path's planner (`SpeculativePlanner`, seed 3): the
    corpus's previous response as the draft (p_prev as sampled, numbered by its epoch and sample), p_curr its scoring
    pass; the simulator's cuts are the planner's, uniforms included. A stateful rule is updated alike: the planner's
    copy once per RL step, by its feedback."""
    corpus = random_corpus(seed=2, prompts=6)
    replay, policy = workload(rule, corpus, seed=3, update_every=4 * corpus.samples), parse_rule(rule)
    planner = sr.SpeculativePlanner(policy, seed=3)
    coordinator = sr.policies.stateful.FeedbackCoordinator(policy, 4 * corpus.samples) if policy.keeps_state else None
    for epoch in range(1, corpus.epochs):
        for step in ([0, 1, 2, 3], [4, 5]):
            got = [d and d.kept for plan in replay.plans.plans(epoch, step, corpus) for d in plan.decisions]
            samples = []
            for p in step:
                for s, previous in enumerate(corpus.responses[epoch - 1][p]):
                    draft = sr.Draft(np.array(previous), corpus.logprobs[epoch - 1][p][s], "stop", epoch - 1, s)
                    sample = planner.new_sample(corpus.prompts[p], MAX_TOKENS, draft, prompt_key(corpus.prompts[p]))
                    if planner.scores_drafts:
                        sample.scored = corpus.scores[epoch][p][s].copy()
                    samples.append(sample)
            planner.decide(samples)
            assert got == [s.cut for s in samples], (rule, epoch, step)
            if coordinator is not None:
                coordinator.report(*planner.take_feedback(0))
    if coordinator is not None:  # it was steered, and the simulator's copy went the same way
        assert coordinator.updates == replay.plans.coordinator.updates >= 2
        assert policy.lenience != policy.params.lenience
        assert replay.plans.policy.lenience == pytest.approx(policy.lenience)


def test_a_rule_that_scores_nothing_sends_its_continuations_at_once():
    corpus = toy()
    full, random = workload("full", corpus), workload("random", corpus)
    sent = full.requests(1, [0, 1], corpus)
    assert not any(r.prompt_logprobs for r in sent)  # no round
    # full keeps every draft whole: prompt 0's three drafts ended by EOS, nothing to generate; prompt 1's first sample
    # has no draft (a plain sample), its second filled the budget (kept whole), its third ended by EOS
    assert [r.id for r in sent] == ["e1-p1-s0"] and full.kept == 5 + 6 + 5 + 8 + 4
    assert all(full.followups(r) == [] for r in sent)
    decisions = random.plan(1, 0, corpus).decisions
    sent = random.requests(1, [0], corpus)
    assert all(0 <= d.kept <= len(previous) for d, previous in zip(decisions, PREVIOUS[0]))
    assert [r.id for r in sent] == [f"e1-p0-s{s}-continuation" for s, d in enumerate(decisions) if d.rest]
    assert [r.cached for r in sent] == [0] + [BLOCK_TOKENS] * (len(sent) - 1)  # the prompt, from the first


def test_one_cut_a_step():
    corpus = random_corpus(seed=3, prompts=6)
    policy, calls = sr.make("spec", lenience=1.65), []
    cut = policy.cut
    policy.cut = lambda batch: calls.append(len(batch.lengths)) or cut(batch)
    schedule = Schedule(max_num_seqs=8, prompts_per_step=4)
    EngineSimulator(corpus, schedule, NoDrafts(), workload=request_workload(policy, corpus)).run()
    assert calls == [16, 8] * (corpus.epochs - 1)  # every drafted RL step's samples at once
