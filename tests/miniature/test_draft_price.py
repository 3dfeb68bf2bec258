"""What the quickstart's `lossless` prices drafts on (`draft_price`): the modelled step it ships, and that drafts
priced on it depend on the tokens alone, not on this machine's clock."""

import json
import random

import numpy as np
import pytest

from specrl_openrlhf.miniature import draft_price, quickstart_args
from specrl_openrlhf.pricing.curves import StepCurve


def test_a_modelled_step_prices_every_step_on_its_line():
    data = draft_price.step_curve(8.0, 0.01, 0.05, device="a test engine")
    curve = StepCurve.from_data(data)
    for rows, tokens in ((1, 1), (7, 3), (64, 17), (100, 5)):  # inside the grid and past it
        assert curve.time(rows, tokens) == pytest.approx(1e-3 * (8.0 + 0.01 * rows + 0.05 * rows * tokens))
    # the budget's linear model: base (with the rows' cost), nothing more a row, a carried token
    assert curve.budget_cost(40).tolist() == pytest.approx([1e-3 * (8.0 + 0.01 * 40), 0.0, 5e-5])
    with pytest.raises(ValueError, match="base > 0"):
        draft_price.step_curve(0.0, 0.01, 0.05, device="")


def test_the_shipped_step_is_a_curve_of_its_own_fit_and_names_its_machine():
    data = json.loads(draft_price.STEP_MODEL.read_text())
    fit = data["fit"]
    assert StepCurve.load(draft_price.STEP_MODEL).time(32, 2) == pytest.approx(
        1e-3 * (fit["base_ms"] + fit["row_ms"] * 32 + fit["token_ms"] * 64)
    )
    assert data["taken"]["machine"] in data["device"] and data["taken"]["run"] == "lossless"
    assert "modelled step of this CPU engine" in draft_price.describe("model", None)


def metrics(tmp_path, steps):
    path = tmp_path / "metrics.json"
    runs = [{"name": "lossless", "seed": 0}]
    path.write_text(json.dumps({"runs": runs, "rows": [{"kind": "step", "run": "lossless", **s} for s in steps]}))
    return path


def test_the_step_is_fitted_from_the_last_epoch_of_a_runs_budget(tmp_path):
    cost = {"step_row_ms": 0.0}
    steps = [
        {"epoch": 0, "step_base_ms": 5.0, "step_token_ms": 0.09, **cost},
        {"epoch": 1, "step_base_ms": 8.0, "step_token_ms": 0.05, **cost},
        {"epoch": 1, "step_base_ms": 9.0, "step_token_ms": 0.03, **cost},
    ]
    data = draft_price.fit_step_model(metrics(tmp_path, steps))
    assert data["fit"] == pytest.approx({"base_ms": 8.5, "row_ms": 0.0, "token_ms": 0.04})
    assert data["taken"]["seeds"] == [0] and data["taken"]["last_epoch_steps"] == 2
    with pytest.raises(ValueError, match="no steps of 'lossless' with the budget's step cost"):
        draft_price.fit_step_model(metrics(tmp_path, [{"epoch": 0}]))


def test_the_quickstart_prices_lossless_on_the_modelled_step_unless_told_otherwise(tmp_path):
    def lossless_params(*flags):
        args = quickstart_args.parse_args([*flags, "--out", str(tmp_path)])
        return next(r.method.config.params for r in args.groups[0].runs if r.method.name == "lossless")

    assert lossless_params()["cost_curve"] == str(draft_price.STEP_MODEL)
    assert "cost_curve" not in lossless_params("--draft-price", "measured")
    gpu = str(draft_price.STEP_MODEL.parents[2] / "docs" / "gpu_step_h200.json")
    assert lossless_params("--draft-price", "measured", "--cost-curve", gpu)["cost_curve"] == gpu
    runs = quickstart_args.parse_args(["--out", str(tmp_path)]).groups[0].runs
    assert draft_price.reproduces("model", None, runs).startswith("what reproduces: decoded tokens, the seed's")
    assert "not lossless's decoded tokens" in draft_price.reproduces("measured", None, runs)


def toy_corpus(prompts=8, samples=4, epochs=3, length=48):
    """Each prompt's responses share a stem and part ways at random points, visit after visit."""
    from specrl_openrlhf.simulator.corpus import Corpus

    rng = np.random.default_rng(0)
    stems = [rng.integers(3, 100, length).tolist() for _ in range(prompts)]

    def response(stem):
        return stem[: int(rng.integers(length // 4, length))] + rng.integers(3, 100, int(rng.integers(1, 24))).tolist()

    responses = [[[response(stem) for _ in range(samples)] for stem in stems] for _ in range(epochs)]
    return Corpus([[1, *rng.integers(3, 100, 12).tolist()] for _ in range(prompts)], responses)


def drafts_under_a_noisy_clock(params, noise_seed: int) -> list[int]:
    """The draft tokens of every engine step of a small simulated rollout, the proposer's clock advancing by step
    times that vary at random (`noise_seed`), as a loaded machine's do."""
    from specrl_openrlhf.at_scale.proposers import Lossless
    from specrl_openrlhf.simulator.engine import EngineSimulator, Schedule

    schedule = Schedule(max_num_seqs=16, prompts_per_step=4)
    proposer = Lossless(256, schedule, None, params)
    noise, now = random.Random(noise_seed), [0.0]

    def clock():
        now[0] += 0.005 * (1.0 + noise.random())
        return now[0]

    proposer.proposer.clock = clock
    return EngineSimulator(toy_corpus(), schedule, proposer).run().column("drafted").tolist()


def test_drafts_priced_on_the_modelled_step_do_not_follow_the_clock(tmp_path):
    """The quickstart's own lossless parameters: the same drafts, step for step, under two machines' noise; priced on
    the measured steps instead (`--draft-price measured`), the noise changes them."""
    args = quickstart_args.parse_args(["--out", str(tmp_path)])
    config = next(r.method.config for r in args.groups[0].runs if r.method.name == "lossless")
    modelled = config.build_policy().params
    first, second = (drafts_under_a_noisy_clock(modelled, seed) for seed in (1, 2))
    assert sum(first) > 0 and first == second
    measured = type(modelled)(**{**config.params, "cost_curve": None})
    assert drafts_under_a_noisy_clock(measured, 1) != drafts_under_a_noisy_clock(measured, 2)
