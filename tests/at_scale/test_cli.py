"""bench_at_scale (`at_scale.cli`): bad input is one clear error before anything runs, and the simulator's
schedule matches what a real engine ran on the same responses."""

import json

import numpy as np
import pytest

from specrl_openrlhf.at_scale import cli, run
from specrl_openrlhf.at_scale.proposers import Stock
from specrl_openrlhf.simulator.corpus import Corpus
from specrl_openrlhf.simulator.engine import EngineSimulator, Schedule
from tests.helpers import REPO, result_fields


def toy_corpus(tmp_path, scored=False):
    responses = [[[[5, 6, 7], [5, 6, 9]], [[8, 9], [8, 9]]], [[[5, 6, 7], [5, 6, 7]], [[8, 2], [8, 9]]]]
    logprobs = [[[np.full(len(r), -0.5, np.float32) for r in p] for p in e] for e in responses]
    empty = [[np.zeros(0, np.float32)] * 2] * 2
    scores = [empty, [[np.full(len(r), -0.25, np.float32) for r in p] for p in responses[0]]] if scored else []
    corpus = Corpus([[1, 2, 3], [1, 2, 4]], responses, {"model": "toy"}, logprobs if scored else [], scores)
    corpus.save(tmp_path / "c.npz")
    return str(tmp_path / "c.npz")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--corpus", "/nonexistent.npz"], "no such corpus file"),
        (["--curve", "/nonexistent.json"], "no such step curve file"),
        (["--model", "llama"], "--model 'llama': choose one of qwen3-1.7b, qwen3-8b, qwen3-14b"),
        (["--gpu", "a100"], "--gpu 'a100': choose one of h100, h200, b200"),
        (
            ["--rules", "off,lossless,history_mb=0"],
            "--rules lossless,history_mb=0: reuse policy 'lossless': history_mb",
        ),
        (["--rules", "lossless"], "--rules takes off (stock, what every rule is projected against)"),
        (["--rules", "off,spec@x"], "--rules spec@x: the lenience after @ must be a number"),
        (["--rules", "off,speck"], "--rules speck: unknown reuse policy 'speck'. Did you mean 'spec'?"),
        (["--rules", "verify=requests,off"], "verify=requests comes before any rule; write RULE,verify=requests"),
        (["--rules", "off,exact,exact"], "--rules names exact twice"),
        (
            ["--rules", "off,lossless:requests"],
            "--rules lossless:requests: write the config's spelling, lossless,verify=requests",
        ),
        (
            ["--rules", "off,delayed"],
            "--rules delayed: rule delayed(lenience=1.6487212707001282) scores drafts from 2",
        ),
        (["--rules", 'off,vllm,speculative_config={"method":"eagle"}'], "it runs model-free proposers only"),
        (["--rules", "off,policies/none.py:Rule"], "--rules policies/none.py:Rule: --rollout_reuse"),
        (["--validate", "--rules", "off,speck"], "Did you mean 'spec'?"),
        (["--prefix-caching", "maybe"], "argument --prefix-caching: invalid choice: 'maybe'"),
        (["--map", "--lenience-curve"], "argument --lenience-curve: not allowed with argument --map"),
        (["--spacing", "1,x"], "--spacing 1,x: give RL steps between a prompt's visits (>= 1) or regime: 'x'"),
        (["--visits", "0"], "regime openrlhf+custom: visits must be a positive integer"),
        (["--steps-between-visits", "0"], "steps_between_visits must be a positive integer"),
    ],
)
def test_bad_input_is_one_clear_error(argv, message, capsys, tmp_path):
    corpus = [] if "--corpus" in argv else ["--corpus", toy_corpus(tmp_path, scored=True)]
    with pytest.raises(SystemExit) as stop:
        cli.parse_args(corpus + argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_ratio_rule_on_a_corpus_without_its_scoring_pass_says_how_to_record_one(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--corpus", toy_corpus(tmp_path), "--rules", "off,exact"])
    assert "has no scoring pass" in capsys.readouterr().err


def test_validate_runs_the_rules_named_and_names_those_it_cannot_check():
    from specrl_openrlhf.at_scale.validate import validated

    checked, skipped = validated(["off", "lossless,verify=requests", "exact"])
    assert checked == {"off": "off", "lossless(verify=requests)": "lossless,verify=requests"} and skipped == ["exact"]
    assert list(validated(list(cli.RULES))[0].values()) == ["off", "lossless", "suffix", "lossless,verify=requests"]


def test_every_path_runs_and_the_result_line_names_every_figure(tmp_path, capsys):
    pytest.importorskip("aiconfigurator_core")
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"points": [{"rows": 1, "seconds": 0.001}, {"rows": 8, "seconds": 0.002}]}))
    rules = ["off", "lossless", "lossless,verify=requests", "spec@1.65", "exact"]
    argv = ["--corpus", toy_corpus(tmp_path, scored=True), "--host", str(host), "--rules", ",".join(rules)]
    # two visits a prompt: the run is the corpus's first visit and its later one once each
    assert cli.main([*argv, "--requests-per-engine", "4", "--max-num-seqs", "8", "--visits", "2"]) == 0
    out = capsys.readouterr().out
    result = out.splitlines()[-1]
    assert result.startswith("RESULT ")
    fields = result_fields(result)
    # the label as given
    assert "| lossless,verify=requests | requests |" in out and "| lossless | engine (vLLM <= 0.33, V1) |" in out
    for rule in rules:
        for name in ("projected", "projected_async", "breakeven_host_ms", "kept", "steps"):
            assert f"{name}[{rule}]" in fields, (name, rule)
    assert float(fields["projected[off]"]) == 1.0 and float(fields["forward_s[off]"]) > float(fields["prefill_s[off]"])
    assert fields["missing"] == "none" and fields["model"] == "qwen3-8b" and fields["gpu"] == "h100"
    assert fields["prefix_caching"] == "on"  # every rule's schedule: the request path needs the cache
    # half the toy's 2 prompts return, 2 samples each: a simulated request stands for 2 of the engine's 4
    assert fields["regime"] == "openrlhf+custom" and fields["max_num_seqs"] == "8" and fields["scale"] == "2"
    assert fields["steps_between_visits"] == "156" and fields["visits"] == "2" and fields["spacings"] == "1,8,156"
    assert "| lossless | 156 (regime) |" in out and "| exact | 8 |" in out  # each rule at each spacing
    for rule in rules[1:]:  # the first visit and the later ones apart, at each spacing
        assert f"projected_first[{rule}]" in fields and f"kept_later_s8[{rule}]" in fields
        assert float(fields[f"projected_first[{rule}]"]) > 0 and f"projected_later_s1[{rule}]" in fields
    assert float(fields["kept_first[exact]"]) == 0.0  # nothing to reuse on a first visit
    assert cli.parse_args([*argv, "--prefix-caching", "off"]).cell.regime.prefix_caching is False
    for reading in ("projected", "projected_async", "projected_no_host"):  # and each drafted epoch's
        assert f"{reading}[exact]" in fields and ("projected_e1[exact]" in fields) and "kept_e1[exact]" in fields
    # the fastest rule by each host reading, stock included, and its lead over the runner-up
    for reading, suffix in (("projected", ""), ("projected_async", "_async")):
        leader = fields[f"fastest{suffix}"]
        ranked = sorted((float(fields[f"{reading}[{rule}]"]) for rule in rules), reverse=True)
        assert float(fields[f"{reading}[{leader}]"]) == ranked[0]
        assert float(fields[f"fastest{suffix}_margin"]) == pytest.approx(ranked[0] / ranked[1], abs=2e-3)
    # prompt 0 returns (prompt 1's responses fill the gaps): its epoch 1 against the tree of its epoch 0, [5, 6, 7]
    # twice following [5, 6, 7] | [5, 6, 9] for 3 tokens each: 6 of its 12 response tokens
    assert float(fields["kept[lossless,verify=requests]"]) == pytest.approx(6 / 12)


def test_a_plugin_is_priced_through_its_own_cut(tmp_path, capsys, monkeypatch):
    """A rule written from policies/template.py, by its reference, on the request path: the toy's p_curr (-0.25) is
    above its p_prev (-0.5), so spec@1.65 keeps each of the returning prompt's two drafts (3 tokens each) whole, 6 of
    its 12 response tokens, and PrefixCap (spec@1.65, at most 90% of a draft) floor(0.9 x length) of each: 2 and 2,
    4 of 12; with max_fraction=0.5, 1 of each, 2 of 12."""
    pytest.importorskip("aiconfigurator_core")
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"points": [{"rows": 1, "seconds": 0.001}, {"rows": 8, "seconds": 0.002}]}))
    monkeypatch.chdir(REPO)  # the reference as a user in the repository writes it
    plugin = "policies/prefix_cap.py:PrefixCap"
    rules = ["off", "spec@1.65", plugin, f"{plugin},max_fraction=0.5"]
    argv = ["--corpus", toy_corpus(tmp_path, scored=True), "--host", str(host), "--rules", ",".join(rules)]
    assert cli.main([*argv, "--requests-per-engine", "4", "--max-num-seqs", "8", "--visits", "2"]) == 0
    out = capsys.readouterr().out
    fields = result_fields(out.splitlines()[-1])
    kept = {rule: float(fields[f"kept[{rule}]"]) for rule in rules[1:]}
    assert kept == pytest.approx({"spec@1.65": 6 / 12, plugin: 4 / 12, f"{plugin},max_fraction=0.5": 2 / 12}, abs=1e-3)
    assert float(fields[f"kept_e1[{plugin}]"]) == pytest.approx(4 / 6, abs=1e-3)  # the drafted epoch's 6 tokens
    for rule in rules[1:]:
        assert f"| {rule} | requests |" in out and float(fields[f"projected[{rule}]"]) > 0
    assert float(fields[f"steps[{plugin}]"]) > 0


def test_a_memory_budget_too_small_for_one_step_is_refused(tmp_path, capsys, monkeypatch):
    from specrl_openrlhf.integration.vllm.v1.arena import Arena

    monkeypatch.setattr(Arena, "BYTES_PER_NODE", 1 << 20)  # a MiB a token: 1 MiB holds less than a step
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"points": [{"rows": 1, "seconds": 0.001}, {"rows": 8, "seconds": 0.002}]}))
    argv = ["--corpus", toy_corpus(tmp_path), "--host", str(host), "--rules", "off,lossless,history_mb=1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--rules lossless,history_mb=1: history_mb=1 is too small for one RL step's histories" in err


@pytest.mark.engine
def test_the_schedule_replays_what_an_engine_ran(async_engine):
    """12 requests on the shared engine, stock, 4 samples of each of 3 prompts sent at once: replaying their responses
    through the simulator (the engine's rows) gives the same decoding row-steps and prefills, each prompt computed
    once and read from the prefix cache by its siblings, and the same steps give or take the requests' arrival."""
    import asyncio

    import vllm

    from specrl_openrlhf.integration.vllm.edge import engine_generate
    from specrl_openrlhf.integration.vllm.step_log import take_steps

    engine, runner = async_engine
    prompts = [[1 + p] + [7 + i % 50 for i in range(64)] for p in range(3)]  # 64 cached: 2 CPU blocks, 4 GPU ones
    params = vllm.SamplingParams(max_tokens=24, temperature=1.0, seed=None)

    async def visit():
        generate = engine_generate(engine)
        return await asyncio.gather(*[generate(p, params) for p in prompts for _ in range(4)])

    runner.run(engine.reset_prefix_cache())
    take_steps(engine)
    outputs = runner.run(visit())
    steps = take_steps(engine)
    responses = [[list(outputs[4 * p + s].outputs[0].token_ids) for s in range(4)] for p in range(3)]
    corpus = Corpus(prompts, [responses])
    schedule = Schedule(max_num_seqs=engine.vllm_config.scheduler_config.max_num_seqs, prompts_per_step=3)
    sim = EngineSimulator(corpus, schedule, Stock()).run()
    assert sum(r.prefill_rows for r in sim.records) == int(steps.prefill_rows.sum()) == 12
    assert sum(r.prefill_tokens for r in sim.records) == int(steps.prefill_tokens.sum()) == 3 * (65 + 3 * 1)
    assert sum(r.decode_rows for r in sim.records) == int(steps.decode_rows.sum())
    assert abs(len(sim.records) - len(steps)) <= 2


def test_each_simulated_row_holds_and_carries_the_gpus_share_over_the_scale(tmp_path, monkeypatch):
    """16 requests an engine on a corpus of 2 a step (half its prompts return): a simulated row stands for 8
    of the GPU's, so its rows, token budget and KV capacity are the engine's over 8, and no priced step carries more
    than vLLM's max_num_batched_tokens."""
    pytest.importorskip("aiconfigurator_core")
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"points": [{"rows": 1, "seconds": 0.001}, {"rows": 8, "seconds": 0.002}]}))
    argv = ["--corpus", toy_corpus(tmp_path), "--rules", "off", "--requests-per-engine", "16", "--host", str(host)]
    args = cli.parse_args(argv)
    schedules = []
    simulate = run.simulate
    monkeypatch.setattr(
        run,
        "simulate",
        lambda rule, corpus, schedule, *rest, **kw: (
            schedules.append(schedule) or simulate(rule, corpus, schedule, *rest, **kw)
        ),
    )
    run.run_rules(args.rules, args.loaded, args.cell, args.host, {})
    _, capacity = args.cell.price()
    assert [(s.max_num_seqs, s.max_num_batched_tokens, s.kv_capacity_tokens) for s in schedules] == [
        (128 // 8, 2048 // 8, capacity // 8)
    ]


def test_each_rule_is_projected_with_cuda_graphs_and_without_and_vllms_two_suffix_decodings_are_told_apart(
    tmp_path, capsys
):
    """`--enforce-eager` sets the regime's mode (openrlhf: on); every run prints each rule against stock in both modes
    and what stock loses without CUDA graphs. vLLM 0.34's suffix speculator (`suffix,engine=v2`) runs beside vLLM
    <= 0.33's (`suffix`), each named for its vLLM; its adaptive verification is off without CUDA graphs (said so)."""
    pytest.importorskip("aiconfigurator_core")
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"points": [{"rows": 1, "seconds": 0.001}, {"rows": 8, "seconds": 0.002}]}))
    rules = ["off", "suffix,engine=v2,adaptive=off", "suffix,engine=v2,adaptive=on"]
    argv = ["--corpus", toy_corpus(tmp_path), "--host", str(host), "--rules", ",".join(rules)]
    argv += ["--requests-per-engine", "4", "--max-num-seqs", "8"]
    assert cli.parse_args(argv).cell.regime.enforce_eager  # openrlhf's
    assert not cli.parse_args([*argv, "--enforce-eager", "off"]).cell.regime.enforce_eager
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    fields = result_fields(out.splitlines()[-1])
    assert fields["enforce_eager"] == "on" and float(fields["stock_eager_over_graphs"]) > 1.0
    for rule in rules[1:]:
        for name in ("projected_graphs", "projected_async_graphs", "kept_graphs", "projected_eager", "kept_eager"):
            assert f"{name}[{rule}]" in fields
        assert fields[f"engine[{rule}]"] == "v2" and f"| {rule} | engine (vLLM 0.34, V2 GPU) |" in out
    assert fields["modes_visits"] == "later"  # the modes compared where the rules reuse a visit
    off = "suffix,engine=v2,adaptive=off"
    assert fields[f"projected_later[{off}]"] == fields[f"projected_eager[{off}]"]
    assert "stock without CUDA graphs takes" in out and "CUDA graphs off (enforce_eager)" in out
    assert "suffix,engine=v2,adaptive=on: adaptive verification off: it needs full CUDA graphs" in out
    assert "proposer s estimated" in out  # its kernels' GPU time, a model named beside the figure
    # without eager, the same flag's other reading: the regime says so and adaptive verification runs
    assert cli.main([*argv, "--enforce-eager", "off"]) == 0
    fields = result_fields(capsys.readouterr().out.splitlines()[-1])
    assert fields["enforce_eager"] == "off"
    on = "suffix,engine=v2,adaptive=on"
    assert fields[f"projected_later[{on}]"] == fields[f"projected_graphs[{on}]"]
