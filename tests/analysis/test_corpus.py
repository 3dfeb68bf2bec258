"""Corpora (`analysis.corpus`): the file and its errors, the log-probs and scoring pass a ratio rule replays, and
the quality figures that say whether a corpus is what RL sees."""

import numpy as np
import pytest

from specrl_openrlhf.analysis.corpus import Corpus, quality, repeated_tokens


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


def test_quality_states_each_epochs_drift_as_the_staleness_meters_kl():
    """k3 = r - 1 - log r a token, r = p_curr / p_prev, over epoch 0's responses scored by epoch 1's policy."""
    figures = quality(scored_toy())
    log_ratios = np.array([-0.75 + 0.5, -0.5 + 1.0, -1.5 + 2.0])
    assert figures["kl_epoch1"] == pytest.approx(np.mean(np.expm1(log_ratios) - log_ratios))
    assert "kl_epoch2" not in figures and not any(k.startswith("kl_") for k in quality(Corpus([[1]], [[[[2]]]])))
