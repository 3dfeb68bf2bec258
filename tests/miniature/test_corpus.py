"""The real model's corpora (`miniature.corpus`): the named ones and where they ship, the long style's prompts and
reward, and a missing corpus named with the command that records it."""

import dataclasses
import random

import numpy as np
import pytest

from specrl_openrlhf.miniature import corpus


def test_the_named_corpora_ship_in_the_package_and_an_unknown_name_is_one_error():
    assert set(corpus.PRESETS) == {"short", "drift", "long"}
    assert corpus.named("long").parent == corpus.SHIPPED and corpus.named("short").name == "short.npz"
    assert corpus.PRESETS["long"].policy == "tiny" and corpus.PRESETS["long"].max_tokens == 1024
    with pytest.raises(ValueError, match="--corpus takes short, drift, long or a corpus file, got 'medium'"):
        corpus.named("medium")
    with pytest.raises(ValueError, match="policy must be one of"):
        corpus.CorpusSettings(policy="epic")


def test_the_recorder_records_a_variant_of_a_preset_only_into_a_file_of_its_own(monkeypatch, tmp_path, capsys):
    """`--lr` / `--updates` change the preset's drift; the shipped file, which the preset names, stays as it is."""
    with pytest.raises(SystemExit):
        corpus.main(["short", "--lr", "2e-4"])
    assert "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        corpus.main(["short", "--updates", "-1", "--out", str(tmp_path / "x.npz")])
    assert "--updates >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        corpus.main(["short", "--prompts-per-update", "0", "--out", str(tmp_path / "x.npz")])
    assert "--prompts-per-update >= 1" in capsys.readouterr().err

    class Recorded(Exception):
        pass

    def record(settings, checkpoint=None):
        raise Recorded(settings, checkpoint)

    monkeypatch.setattr(corpus, "record", record)
    with pytest.raises(Recorded) as seen:
        corpus.main(["long", "--lr", "2e-4", "--updates", "3", "--prompts-per-update", "8", "--out", str(tmp_path)])
    settings, checkpoint = seen.value.args
    assert settings == dataclasses.replace(corpus.PRESETS["long"], lr=2e-4, updates=3, prompts_per_update=8)
    assert checkpoint.name == "long-lr0.0002-updates3-prompts_per_update8"  # not the preset's own checkpoint


@pytest.mark.parametrize("name", sorted(corpus.PRESETS))
def test_each_shipped_corpus_is_the_recording_of_its_preset_with_its_scoring_pass(name):
    from specrl_openrlhf.simulator.corpus import Corpus, quality

    shipped = Corpus.load(corpus.named(name))
    settings = corpus.PRESETS[name]
    assert shipped.scored and shipped.epochs == settings.epochs and shipped.samples == settings.samples
    assert len(shipped.prompts) == settings.prompts and shipped.meta.get("policy", "smollm2") == settings.policy
    assert shipped.meta["max_tokens"] == settings.max_tokens and shipped.meta["temperature"] == settings.temperature
    assert max(len(r) for e in shipped.responses for p in e for r in p) <= settings.max_tokens
    figures = quality(shipped)
    assert 0 < figures["cut_share"] < 1 and 0 <= figures["repeated_share"] < 1
    # the scoring pass is the next epoch's policy on the last epoch's responses: the policy-gradient steps between
    # epochs move the policy by at most a GRPO step's KL (the quickstart's: hundredths of a nat a token), except where
    # long's policy mends the counting its first steps lost (docs/benchmarks.md: 0.12 into its third epoch)
    most = {"long": 0.15}.get(name, 0.05)
    for e in range(1, shipped.epochs):
        gap = np.concatenate(
            [s - lp for ss, lps in zip(shipped.scores[e], shipped.logprobs[e - 1]) for s, lp in zip(ss, lps)]
        )
        assert np.isfinite(gap).all() and 0 < figures[f"kl_epoch{e}"] < most


def test_the_drift_corpus_drifts_more_than_the_short_one_it_varies():
    from specrl_openrlhf.simulator.corpus import Corpus, quality

    short, drift = (quality(Corpus.load(corpus.named(name))) for name in ("short", "drift"))
    assert all(drift[f"kl_epoch{e}"] > 2 * short[f"kl_epoch{e}"] for e in (1, 2))


PAPER_KEPT = {1.0: 0.26, 1.2214: 0.60, 1.6487: 0.72, 2.2255: 0.79, 7.389: 0.85}  # the paper's lenience ablation


@pytest.fixture(scope="module")
def long_figures():
    from specrl_openrlhf.simulator.corpus import Corpus, quality

    shipped = Corpus.load(corpus.named("long"))
    return shipped, quality(shipped)


def test_the_long_corpus_responses_are_long(long_figures):
    _, figures = long_figures
    assert figures["mean_tokens"] >= 600


def test_the_long_corpus_drifts_without_a_break_no_epoch_a_fifth_from_the_one_before(long_figures):
    _, figures = long_figures
    assert figures["epoch_length_step"] <= 0.2


def test_the_long_corpus_is_rarely_cut_and_does_not_loop(long_figures):
    _, figures = long_figures
    assert figures["cut_share"] <= 0.2
    assert figures["repeated_share"] <= 0.2


def test_the_long_corpus_has_an_rl_policys_entropy_mostly_certain_with_forks(long_figures):
    _, figures = long_figures
    assert figures["surprisal_below_0.01"] >= 0.4
    assert 0.1 <= figures["surprisal_p80"] <= 1.0
    assert figures["distinct_share"] >= 0.9  # a group's samples differ: not a policy that writes one thing


@pytest.mark.parametrize("lenience", sorted(PAPER_KEPT))
def test_the_long_corpus_drifts_as_the_papers_grpo_run_across_its_lenience_ablation(long_figures, lenience):
    _, figures = long_figures
    assert abs(figures[f"kept_spec@{lenience:g}"] - PAPER_KEPT[lenience]) <= 0.10


def test_the_long_corpus_visits_each_prompt_four_times(long_figures):
    shipped, _ = long_figures
    assert len(shipped.prompts) >= 32 and shipped.samples >= 8 and shipped.epochs >= 4


class Trainer:  # what the checkpoint keeps of `grpo.PartialTrainer`: its state
    def __init__(self, value):
        self.value = value

    def state(self):
        return {"weights": {"w": self.value}, "optimizer": {}}


def test_a_checkpoint_resumes_the_epochs_the_sampler_and_the_trainer_and_refuses_another_recordings(tmp_path):
    from specrl_openrlhf.simulator.corpus import Corpus

    settings = corpus.CorpusSettings(prompts=1, samples=2, epochs=3)
    logprobs = [[[np.full(2, -0.5, np.float32), np.full(1, -0.25, np.float32)]]]
    partial = Corpus([[1, 2]], [[[[5, 6], [7]]]], {"model": "toy"}, logprobs, [corpus._unscored(settings)])
    rng = random.Random(4)
    rng.random()
    corpus.save_checkpoint(tmp_path, settings, partial, rng, Trainer(1.5))
    loaded, rng_state, trainer_state = corpus.load_checkpoint(tmp_path, settings, [[1, 2]])
    assert loaded.responses == partial.responses and trainer_state["weights"]["w"] == 1.5
    resumed = random.Random()
    resumed.setstate(rng_state)
    assert resumed.random() == rng.random()  # the prompts each update trains on are drawn as they would have been
    assert corpus.load_checkpoint(tmp_path, corpus.CorpusSettings(prompts=1, samples=2, epochs=4), [[1, 2]]) is None
    assert corpus.load_checkpoint(tmp_path, settings, [[1, 3]]) is None  # the prompts' format changed since
    (tmp_path / "state.pt").write_bytes(b"cut short")
    assert corpus.load_checkpoint(tmp_path, settings, [[1, 2]]) is None  # a corrupt checkpoint: recorded afresh, said
    assert corpus.load_checkpoint(tmp_path / "none", settings, [[1, 2]]) is None


def test_the_trainers_state_restores_its_weights_and_moments(tiny_model_dir):
    import torch

    from specrl_openrlhf.miniature.grpo import PartialTrainer

    trainer = PartialTrainer(tiny_model_dir, lr=1e-2, layers=1, seed=0, dtype="float32")
    trainer.step([[1, 2], [1, 2]], [[3, 4], [5]], [1.0, 0.0], [0, 0])
    state = trainer.state()
    fresh = PartialTrainer(tiny_model_dir, lr=1e-2, layers=1, seed=0, dtype="float32")
    fresh.load_state(state)
    for trained in (trainer, fresh):  # the same next step from both: weights and Adam's moments came back
        trained.step([[1, 2], [1, 2]], [[3, 4], [5]], [0.0, 1.0], [0, 0])
    after, resumed = trainer.state()["weights"], fresh.state()["weights"]
    assert after.keys() == resumed.keys() and all(torch.equal(after[k], resumed[k]) for k in after)
    assert not all(torch.equal(after[k], state["weights"][k]) for k in after)


def test_the_token_mean_loss_cancels_what_responses_of_opposite_advantage_share(tiny_model_dir):
    """Two responses of one group, [3, 4] rewarded and [3] not: token 3 after the prompt is in both with opposite
    advantages, so DAPO's token-level loss leaves only log p(4 | prompt, 3); a mean over each response's tokens does
    not (it pushes 3 down: the losing response is the shorter)."""
    import torch

    from specrl_openrlhf.miniature.grpo import PartialTrainer, group_advantages

    def gradient(token_mean: bool, prompts, responses, rewards):
        trainer = PartialTrainer(tiny_model_dir, lr=1e-3, layers=1, seed=0, dtype="float32", token_mean=token_mean)
        trainer.optimizer.step = trainer.optimizer.zero_grad = lambda *args, **kwargs: None  # keep the gradient
        trainer.step(prompts, responses, rewards, [0] * len(rewards))
        return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])

    advantage = float(group_advantages(torch.tensor([1.0, 0.0]), [0, 0])[0])
    shared = gradient(True, [[1, 2], [1, 2]], [[3, 4], [3]], [1.0, 0.0])
    trainer = PartialTrainer(tiny_model_dir, lr=1e-3, layers=1, seed=0, dtype="float32")
    (trainer._sample_loss([1, 2, 3], [4], advantage) / 3).backward()  # 3 tokens in the batch
    alone = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    assert torch.allclose(shared, alone, atol=1e-7)
    assert not torch.allclose(gradient(False, [[1, 2], [1, 2]], [[3, 4], [3]], [1.0, 0.0]), alone, atol=1e-4)
