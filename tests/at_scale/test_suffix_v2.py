"""vLLM 0.34's GPU suffix speculator in the simulator (`at_scale.suffix_v2`): driven as the V2 runner drives it (the
finished responses join its corpus, every row verifies K slots, its kernels counted a step), with vLLM's adaptive
verification trimming what does not pay, off in an engine without CUDA graphs; the rule's spelling routes to it."""

import numpy as np
import pytest

from specrl_openrlhf.at_scale import proposers
from specrl_openrlhf.at_scale.suffix_v2 import (
    PricedAdmission,
    SuffixV2,
    adaptive_verification,
    build_suffix_v2,
    max_drafts,
)
from specrl_openrlhf.config import parse_rule
from specrl_openrlhf.pricing import speculator_kernels
from specrl_openrlhf.simulator.adaptive import AdaptiveVerification, StepShape
from specrl_openrlhf.simulator.corpus import Corpus
from specrl_openrlhf.simulator.engine import EngineSimulator, Schedule


def corpus(prompts=4, samples=2, epochs=2, length=12):
    """Prompts of 4 tokens; every epoch the same responses, 300 + 20 p + position (none repeats inside itself)."""
    heads = [[1, 2, 3, 10 + p] for p in range(prompts)]
    responses = [[[300 + 20 * p + i for i in range(length)] for _ in range(samples)] for p in range(prompts)]
    return Corpus(heads, [responses] * epochs)


class Priced:
    """Adaptive verification's costs: a step `base` + `per_token` a token; the drafter free."""

    def __init__(self, per_token):
        self.per_token = per_token

    def verify(self, shape: StepShape, drafts):
        return 0.01 + self.per_token * (shape.non_draft_tokens + np.asarray(drafts, np.float64))

    def draft(self, rows):
        return 0.0


def run(speculator, toy=None, rows=8):
    toy = toy or corpus()
    return EngineSimulator(toy, Schedule(max_num_seqs=rows, prompts_per_step=4), speculator).run()


def test_the_responses_that_finished_draft_the_next_epoch_k_slots_every_row():
    speculator = SuffixV2(k=4, depth=24, corpus_tokens=4096)
    sim = run(speculator)
    first = [r for r in sim.records if r.epoch == 0]
    assert sum(r.accepted for r in first) < sum(r.accepted for r in sim.records if r.epoch == 1)
    assert sim.kept_in(1) > 0.6 and sim.found_previous == [1.0]  # every prompt's responses were in the ring
    # every decoding row verifies its 4 slots, fillers included, until its response ends
    assert all(r.drafted == 4 * r.decode_rows for r in first if r.decode_rows and r.decode_tokens > r.decode_rows)
    assert len(speculator.gpu_kernels) == len(sim.records)  # one propose a step
    launched = np.array(speculator.gpu_kernels)
    assert launched[:, 0].sum() == 0 and launched[:, 1].sum() == len(sim.records)  # no stats without adaptive
    assert launched[:, 3].sum() >= 1  # the finished requests were ingested
    assert speculator.memory_bytes() == 4096 * 4 + 2 * 1024 * 8 * 8 + 18 * 4 * 2 * 8


def test_without_a_corpus_a_row_drafts_from_its_own_text_only():
    sim = run(SuffixV2(k=4, depth=24, corpus_tokens=0))
    assert sim.accepted == 0  # no response repeats itself


def test_adaptive_verification_trims_the_slots_that_do_not_pay_and_keeps_those_that_do():
    free = AdaptiveVerification(4, Priced(per_token=0.0), max_drafts=lambda rows: 1000)
    dear = AdaptiveVerification(4, Priced(per_token=1.0), max_drafts=lambda rows: 1000)
    kept, trimmed = SuffixV2(4, 24, 4096, free), SuffixV2(4, 24, 4096, dear)
    sim_free, sim_dear = run(kept), run(trimmed)
    assert dear.binding > free.binding > 0  # fillers' confidence is 0: even free slots are left out where they are
    assert sum(r.drafted for r in sim_dear.records) < sum(r.drafted for r in sim_free.records)
    assert sim_free.kept_in(1) >= sim_dear.kept_in(1)
    # its stats learned: corpus drafts of the second epoch accepted, first-epoch fillers rejected
    assert kept.stats[..., 1].sum() > 0 and kept.stats[..., 0].sum() > 0
    launched = np.array(trimmed.gpu_kernels)
    assert launched[:, 0].sum() == len(sim_dear.records) and launched[:, 4].sum() == dear.binding


def test_the_rule_routes_to_it_and_builds_it_from_its_config():
    for spelling, kind in (("suffix", "suffix"), ("suffix,engine=v1", "suffix"), ("suffix,engine=v2", "suffix_v2")):
        assert proposers.method(parse_rule(spelling, flag="--rules")) == kind
    params = parse_rule("suffix,engine=v2,adaptive=on", flag="--rules").params
    price = pytest.importorskip("specrl_openrlhf.at_scale.run").Cell().kernels()  # the openrlhf regime: eager
    eager = build_suffix_v2(params, price, scale=4)
    assert eager.adaptive is None and "needs full CUDA graphs" in eager.note and eager.k == 8
    assert len(eager.corpus) == (1 << 20) // 4  # each simulated response stands for 4 of the GPU's
    graphs = build_suffix_v2(params, price.with_eager(False), scale=1)
    assert graphs.adaptive is not None and not graphs.note
    off = parse_rule('suffix,engine=v2,speculative_config={"method":"suffix","suffix_decoding_max_cached_requests":0}')
    assert not build_suffix_v2(off.params, price).has_corpus


def test_adaptive_verification_runs_where_the_engine_has_cuda_graphs_and_says_why_where_asked_and_refused():
    eager = pytest.importorskip("specrl_openrlhf.at_scale.run").Cell().kernels()  # the openrlhf regime: eager
    graphs = eager.with_eager(False)
    for adaptive, price, runs, said in (
        ("on", eager, False, True),
        ("auto", eager, False, False),
        ("off", eager, False, False),
        ("on", graphs, True, False),
        ("auto", graphs, True, False),
        ("off", graphs, False, False),
    ):
        verification, note = adaptive_verification(adaptive, 16, price, 2, 50e-6)
        assert (verification is not None) == runs and bool(note) == said, (adaptive, price.eager)
        if runs:
            assert verification.k == 16 and verification.max_drafts(128) == max_drafts(151936, 2)(128)


def test_its_admission_is_priced_at_the_steps_shape_and_its_kernels_estimate():
    model = pytest.importorskip("specrl_openrlhf.at_scale.run").Cell().kernels().with_eager(False)
    drafting = speculator_kernels.SUFFIX_V2.draft_seconds({"observe": 1, "local_scan": 1, "finalize": 1})
    cost = PricedAdmission(model, scale=2, drafter_s=drafting)
    shape = StepShape(64, 64 * 1024, 0, 0, 0, 0, 64, 64)
    seconds = cost.verify(shape, np.array([0, 64, 256]))
    assert seconds[0] == pytest.approx(model.time(128, 1, 1024)) and np.all(np.diff(seconds) > 0)
    assert cost.draft(64) == pytest.approx(drafting) == pytest.approx(50e-6)  # observe, local scan, finalize
    assert max_drafts(151936, 1)(128) == 1766 - 128 and max_drafts(151936, 4)(128) == (1766 - 512) // 4


def test_vllm_034s_suffix_ring_keeps_the_newest_responses_of_a_gap_that_fit():
    """vLLM 0.34's ring (`SuffixV2`, 2,000 tokens here): a gap of 300 visits of 2 responses of 200 tokens overwrites
    the returning prompts' last visit and all but the gap's newest responses that fit."""
    from specrl_openrlhf.simulator.visits import OtherRequests
    from tests.at_scale.test_proposers import corpus

    toy = corpus(prompts=4, samples=2, epochs=2, length=200)
    ring = SuffixV2(k=8, depth=24, corpus_tokens=2000)
    for s in range(2):
        ring.pending.append((f"e0-p0-s{s}", np.array([3, *toy.responses[0][0][s]], np.int64)))
    assert ring.visit(1, [0], toy) == 1.0  # the prompt's last visit in the ring
    gap = OtherRequests(toy, (1, 3), epoch=1, visits=300)
    ring.between_visits(gap)
    assert ring.visit(1, [0], toy) == 0.0  # overwritten
    newest = [f"{gap.visit(299).key}-s{s}" for s in (0, 1)]
    assert all(ring._intact(request) for request in newest)
    assert not ring._intact(f"{gap.visit(290).key}-s0")  # 20 responses of 204 tokens: more than the ring
