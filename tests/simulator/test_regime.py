"""The regimes (`simulator.regime`): an engine and its RL step in the GPU's units, the simulator's schedule at one
scale, and the named regimes' sources."""

import pytest

from specrl_openrlhf.simulator.engine import Schedule
from specrl_openrlhf.simulator.regime import REGIMES, Regime, regime


def test_a_simulated_row_stands_for_scale_of_the_gpus_rows_tokens_and_kv_cache():
    paper = REGIMES["paper"]  # 1,024 requests an engine on a corpus of 32 prompts x 8 samples: scale 4
    assert paper.scale(samples=8, prompts=32) == 4
    assert paper.schedule(8, 32, 400_000) == Schedule(
        max_num_seqs=256, prompts_per_step=32, max_num_batched_tokens=2048, kv_capacity_tokens=100_000
    )
    openrlhf = REGIMES["openrlhf"]  # 256 requests: the corpus's whole step at scale 1, a queue on 128 rows
    assert openrlhf.schedule(8, 32, None) == Schedule(
        max_num_seqs=128, prompts_per_step=32, max_num_batched_tokens=2048
    )
    # fewer requests than the corpus holds: fewer prompts a step, at scale 1
    assert Regime(requests_per_engine=64).schedule(8, 32, None).prompts_per_step == 8


def test_every_field_is_checked_and_a_change_names_the_regime_custom():
    with pytest.raises(ValueError, match="regime custom: max_num_seqs must be a positive integer"):
        Regime(max_num_seqs=0)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be a number in \(0, 1\]"):
        Regime(gpu_memory_utilization=1.5)
    changed = REGIMES["openrlhf"].with_fields(max_num_seqs=512, host=None)
    assert changed.name == "openrlhf+custom" and changed.max_num_seqs == 512 and "max_num_seqs" in changed.source
    assert REGIMES["openrlhf"].with_fields(max_num_seqs=128) is REGIMES["openrlhf"]  # nothing changed
    with pytest.raises(ValueError, match="--regime 'verl': choose one of openrlhf, paper, throughput"):
        regime("verl")


def test_each_named_regime_says_where_its_figures_come_from():
    for name, r in REGIMES.items():
        assert r.name == name and r.source and name in r.describe() and f"regime={name}" in r.fields()
    assert (REGIMES["openrlhf"].max_num_seqs, REGIMES["openrlhf"].max_num_batched_tokens) == (128, 2048)
    assert REGIMES["throughput"].requests_per_engine == REGIMES["openrlhf"].requests_per_engine  # the same RL step


def test_openrlhfs_engines_run_without_cuda_graphs_as_its_examples_do_and_the_others_with_them():
    """`enforce_eager`: on in `openrlhf`, as the example commands OpenRLHF ships set it (counted here in the commands
    the tests hold, OpenRLHF 3c3be623), off in `paper` (veRL's default) and `throughput`; every verdict prints it."""
    import json
    from pathlib import Path

    examples = json.loads((Path(__file__).parents[1] / "data" / "openrlhf_examples.json").read_text())["examples"]
    eager = [name for name, args in examples.items() if "--vllm.enforce_eager" in args]
    assert (len(eager), len(examples)) == (6, 8) and "train_dapo_ray_hybrid_engine" in eager
    assert "6 of the 8 example commands" in REGIMES["openrlhf"].source
    assert {name: r.enforce_eager for name, r in REGIMES.items()} == {
        "openrlhf": True,
        "paper": False,
        "throughput": False,
    }
    assert "CUDA graphs off (enforce_eager)" in REGIMES["openrlhf"].describe()
    assert "CUDA graphs on" in REGIMES["paper"].describe()
    assert "enforce_eager=on" in REGIMES["openrlhf"].fields() and "enforce_eager=off" in REGIMES["paper"].fields()
    changed = REGIMES["openrlhf"].with_fields(enforce_eager=False)
    assert changed.name == "openrlhf+custom" and not changed.enforce_eager


def test_visits_are_fields_with_their_source_and_every_verdict_names_them():
    openrlhf, paper = REGIMES["openrlhf"], REGIMES["paper"]
    # the DAPO example: 20,000 prompts at 128 a step, one episode; the paper: 6,144 at 1,024 a step, 15 epochs
    assert (openrlhf.steps_between_visits, openrlhf.visits, openrlhf.dataset_prompts) == (156, 1, 20_000)
    assert (paper.steps_between_visits, paper.visits, paper.dataset_prompts) == (6, 15, 6144)
    throughput = REGIMES["throughput"]
    assert (throughput.steps_between_visits, throughput.visits) == (openrlhf.steps_between_visits, openrlhf.visits)
    assert "156 RL steps" in openrlhf.source and "one episode" in openrlhf.source and "15 epochs" in paper.source
    assert "back after 156 RL steps, 1 visit a prompt (no prompt returns)" in openrlhf.describe()
    assert "back after 6 RL steps, 15 visits a prompt (then 14 later visits)" in paper.describe()
    assert "steps_between_visits=6 visits=15 dataset_prompts=6144" in paper.fields()
    assert "the next RL step" in Regime(steps_between_visits=1).describe_visits()
    changed = openrlhf.with_fields(visits=3)
    assert changed.name == "openrlhf+custom" and changed.visits == 3 and "visits" in changed.source
    for name in ("steps_between_visits", "visits", "dataset_prompts"):
        with pytest.raises(ValueError, match=f"regime custom: {name} must be a positive integer"):
            Regime(**{name: 0})
