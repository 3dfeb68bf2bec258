"""bench_at_scale (`miniature.at_scale`): bad input is one clear error before anything runs, and the simulator's
schedule matches what a real engine ran on the same responses."""

import json

import pytest

from specrl_openrlhf.analysis.corpus import Corpus
from specrl_openrlhf.analysis.simulator import EngineSimulator, Schedule
from specrl_openrlhf.miniature import at_scale
from specrl_openrlhf.miniature.sim_proposers import Stock


def toy_corpus(tmp_path):
    corpus = Corpus([[1, 2, 3], [1, 2, 4]], [[[[5, 6, 7]] * 2, [[8, 9]] * 2]] * 2, {"model": "toy"})
    corpus.save(tmp_path / "c.npz")
    return str(tmp_path / "c.npz")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--corpus", "/nonexistent.npz"], "no such corpus file"),
        (["--curve", "/nonexistent.json"], "no such step curve file"),
        (["--prefill", "measured"], "has no prefill column: measure one"),
        (["--params", '{"history_mb": 0}'], "--params: history_mb must be a positive integer"),
        (["--rules", "lossless"], "--rules takes off and any of"),
    ],
)
def test_bad_input_is_one_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        at_scale.parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_memory_budget_too_small_for_one_step_is_refused(tmp_path, capsys, monkeypatch):
    from specrl_openrlhf.integration.vllm.arena import Arena

    monkeypatch.setattr(Arena, "BYTES_PER_NODE", 1 << 20)  # a MiB a token: 1 MiB holds less than a step
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"points": [{"rows": 1, "seconds": 0.001}, {"rows": 8, "seconds": 0.002}]}))
    argv = ["--corpus", toy_corpus(tmp_path), "--host-steps", str(host), "--rules", "off,lossless"]
    assert at_scale.main([*argv, "--params", '{"history_mb": 1}']) == 2
    assert "history_mb=1 is too small for one RL step's histories" in capsys.readouterr().err


@pytest.mark.engine
def test_the_schedule_replays_what_an_engine_ran(async_engine):
    """12 requests on the shared engine, stock: replaying their responses through the simulator (the engine's rows)
    gives the same decoding row-steps and prefills, and the same steps give or take the requests' arrival."""
    import asyncio

    import vllm

    from specrl_openrlhf.integration.vllm.edge import engine_generate
    from specrl_openrlhf.integration.vllm.step_log import take_steps

    engine, runner = async_engine
    prompts = [[1 + p, 7, 9, 11, 13] for p in range(3)]
    params = vllm.SamplingParams(max_tokens=24, temperature=1.0, seed=None)

    async def visit():
        generate = engine_generate(engine)
        return await asyncio.gather(*[generate(p, params) for p in prompts for _ in range(4)])

    take_steps(engine)
    outputs = runner.run(visit())
    steps = take_steps(engine)
    responses = [[list(outputs[4 * p + s].outputs[0].token_ids) for s in range(4)] for p in range(3)]
    corpus = Corpus(prompts, [responses])
    schedule = Schedule(max_num_seqs=engine.vllm_config.scheduler_config.max_num_seqs, prompts_per_step=3)
    sim = EngineSimulator(corpus, schedule, Stock()).run()
    assert sum(r.prefill_rows for r in sim.records) == int(steps.prefill_rows.sum()) == 12
    assert sum(r.decode_rows for r in sim.records) == int(steps.decode_rows.sum())
    assert abs(len(sim.records) - len(steps)) <= 2
