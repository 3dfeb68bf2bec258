"""Corpora (`simulator.corpus`): the file and its errors, the log-probs and scoring pass a ratio rule replays, and
the quality figures that say whether a corpus is what RL sees."""

import numpy as np
import pytest

from specrl_openrlhf.simulator.corpus import PAPER_LENIENCES, Corpus, quality, repeated_tokens, spec_kept


def scored_toy():
    prompts = [[1, 2], [3]]
    responses = [[[[4, 5]], [[6]]], [[[7]], [[8, 9, 10]]]]  # [E][P][n]
    logprobs = [[[np.array([-0.5, -1.0])], [np.array([-2.0])]], [[np.array([-0.25])], [np.array([-1, -2, -3.0])]]]
    empty = np.zeros(0, np.float32)
    scores = [[[empty], [empty]], [[np.array([-0.75, -0.5])], [np.array([-1.5])]]]  # epoch 0's, by epoch 1's policy
    return Corpus(prompts, responses, {"model": "toy", "max_tokens": 3}, logprobs, scores)


def test_a_corpus_survives_its_file_and_a_bad_file_is_one_error(tmp_path):
    toy = Corpus([[1, 2], [3]], [[[[4, 5]], [[6]]], [[[7]], [[8, 9, 10]]]], {"model": "toy"})
    toy.save(tmp_path / "c.npz")
    back = Corpus.load(tmp_path / "c.npz")
    assert back.prompts == toy.prompts and back.responses == toy.responses and back.meta == {"model": "toy"}
    assert not back.scored
    with pytest.raises(ValueError, match="no such corpus file"):
        Corpus.load(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="bad.npz: not a readable corpus .*delete it and run again"):
        Corpus.load(tmp_path / "bad.npz")
    np.savez(tmp_path / "foreign.npz", header=np.frombuffer(b'{"format": "other"}', np.uint8))
    with pytest.raises(ValueError, match="not a corpus of version 2"):
        Corpus.load(tmp_path / "foreign.npz")
    with pytest.raises(ValueError, match="same number of responses"):
        Corpus([[1], [2]], [[[[3]], [[4], [5]]]])


def test_log_probs_and_the_scoring_pass_survive_the_file_token_for_token(tmp_path):
    toy = scored_toy()
    assert toy.scored
    toy.save(tmp_path / "s.npz")
    back = Corpus.load(tmp_path / "s.npz")
    assert back.scored and back.responses == toy.responses
    for mine, theirs in ((back.logprobs, toy.logprobs), (back.scores, toy.scores)):
        for e, epoch in enumerate(theirs):
            for p, samples in enumerate(epoch):
                np.testing.assert_allclose(mine[e][p][0], samples[0], atol=1e-3)  # float16 on file
    assert len(back.scores[0][1][0]) == 0 and len(back.scores[1][1][0]) == 1  # scored: epoch 0's one-token response


def test_log_probs_that_do_not_match_the_responses_are_refused():
    toy = scored_toy()
    short = [[[np.array([-0.5])], [np.array([-2.0])]], toy.logprobs[1]]
    with pytest.raises(ValueError, match="log-probs must match its responses"):
        Corpus(toy.prompts, toy.responses, {}, short, toy.scores)
    shifted = [toy.scores[1], toy.scores[1]]  # scores for the first epoch, which has no drafts
    with pytest.raises(ValueError, match="scores hold"):
        Corpus(toy.prompts, toy.responses, {}, toy.logprobs, shifted)


def test_quality_counts_cut_responses_and_tokens_inside_a_repeated_8_gram():
    loop = list(range(8)) * 3  # 24 tokens, every one inside a repeated 8-gram
    fresh = list(range(100, 124))  # none
    assert repeated_tokens(loop) == 24 and repeated_tokens(fresh) == 0
    assert repeated_tokens(list(range(9)) + list(range(9))) == 18  # a repeat of 9 covers both copies
    toy = Corpus([[1]], [[[loop, fresh, [5]]]], {"max_tokens": 24})
    figures = quality(toy)
    assert figures["mean_tokens"] == pytest.approx(49 / 3) and figures["cut_share"] == pytest.approx(2 / 3)
    assert figures["repeated_share"] == pytest.approx(24 / 49)


def test_quality_states_each_epochs_length_and_the_largest_step_between_epochs():
    epochs = [[[[1] * 100, [1] * 100]], [[[1] * 120, [1] * 100]], [[[1] * 60, [1] * 50]]]  # means 100, 110, 55
    figures = quality(Corpus([[1]], epochs))
    assert [figures[f"mean_tokens_epoch{e}"] for e in range(3)] == [100, 110, 55]
    assert figures["epoch_length_step"] == pytest.approx(0.5)  # 110 to 55, not 100 to 110
    assert quality(Corpus([[1]], epochs[:1]))["epoch_length_step"] == 0.0


def test_quality_states_each_epochs_drift_as_the_staleness_meters_kl():
    """k3 = r - 1 - log r a token, r = p_curr / p_prev, over epoch 0's responses scored by epoch 1's policy."""
    figures = quality(scored_toy())
    log_ratios = np.array([-0.75 + 0.5, -0.5 + 1.0, -1.5 + 2.0])
    assert figures["kl_epoch1"] == pytest.approx(np.mean(np.expm1(log_ratios) - log_ratios))
    assert "kl_epoch2" not in figures and not any(k.startswith("kl_") for k in quality(Corpus([[1]], [[[[2]]]])))


def test_quality_states_the_policys_entropy_as_sampled_and_its_groups_distinct_responses():
    figures = quality(scored_toy())  # surprisals 0.5, 1, 2, 0.25, 1, 2, 3
    surprisal = np.array([0.5, 1.0, 2.0, 0.25, 1.0, 2.0, 3.0])
    assert figures["surprisal_below_0.01"] == 0.0 and figures["surprisal_mean"] == pytest.approx(surprisal.mean())
    assert figures["surprisal_p80"] == pytest.approx(np.percentile(surprisal, 80))
    assert figures["distinct_share"] == 1.0
    twins = Corpus([[1]], [[[[4, 5], [4, 5], [6], [7]]]])
    assert quality(twins)["distinct_share"] == 0.75


def test_spec_kept_is_the_expected_prefix_a_ratio_rule_keeps_of_the_drafted_epochs():
    """Draft [4, 5] (p_prev e^-0.5, e^-1) scored e^-0.75, e^-0.5: a = (e^-0.25, 1) at lenience 1, so it keeps
    e^-0.25 + e^-0.25 tokens, and its response is the draft (it ended) when kept whole, else the recorded [7]; draft
    [6] (e^-2 scored e^-1.5): a = 1, kept whole, and it ended: a response of 1 token."""
    toy = scored_toy()
    whole = np.exp(-0.25)
    assert spec_kept(toy, 1.0) == pytest.approx((2 * whole + 1) / (2 * whole + (1 - whole) + 1))
    assert spec_kept(toy, np.exp(0.25)) == pytest.approx(1.0)  # every token accepted
    figures = quality(toy)
    assert [k for k in figures if k.startswith("kept_spec@")] == [f"kept_spec@{x:g}" for x in PAPER_LENIENCES]


def test_spec_kept_is_what_the_request_path_replay_keeps_on_the_shipped_long_corpus():
    """The replay (`request_workload`, what bench_at_scale prices) draws the uniforms; its share of the drafted
    epochs' tokens is spec_kept's expectation up to sampling noise."""
    import specrl_openrlhf as sr
    from specrl_openrlhf.miniature.corpus import named
    from specrl_openrlhf.simulator.request_workload import request_workload

    long = Corpus.load(named("long"))
    for lenience in PAPER_LENIENCES:
        replay = request_workload(sr.make("spec", lenience=lenience), long)
        kept = total = 0
        for e in range(1, long.epochs):
            for p in range(len(long.prompts)):
                for decision, recorded in zip(replay.plan(e, p, long).decisions, long.responses[e][p]):
                    if decision is None:  # no draft: a plain sample
                        total += len(recorded)
                    else:
                        kept, total = kept + decision.kept, total + decision.kept + len(decision.rest)
        assert kept / total == pytest.approx(spec_kept(long, lenience), abs=0.03)
