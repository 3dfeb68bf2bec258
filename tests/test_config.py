"""One definition of our settings: the flags, the grid's per-cell flags and docs/usage.md's table all come from
`ReuseConfig`; a parsed command line gives back the config it describes."""

import argparse
import dataclasses
import json
import re

import pytest

from specrl_openrlhf import config
from specrl_openrlhf.config import ReuseConfig
from tests.helpers import REPO


def test_the_docs_table_is_the_flags_table():
    text = (REPO / "docs" / "usage.md").read_text()
    table = re.search(r"<!-- flags:begin -->\n(.*?)\n<!-- flags:end -->", text, re.S).group(1)
    assert table == config.flags_markdown(), "docs/usage.md's flag table is stale: paste config.flags_markdown()"


def test_every_field_has_a_flag_and_a_parsed_command_line_gives_back_the_config():
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    assert config.from_namespace(parser.parse_args([])) == ReuseConfig()
    flags = [f.metadata["flag"] for f in dataclasses.fields(ReuseConfig)]
    assert len(set(flags)) == len(flags) and all(f.startswith("--") for f in flags)
    args = parser.parse_args(
        ["--rollout_reuse", "exact", "--reuse.params", "{}", "--reuse.plugin", "a.py", "--reuse.plugin", "b.py"]
        + ["--reuse.seed", "3", "--reuse.scoring", "full", "--reuse.cache_shards", "2", "--reuse.dry_run"]
    )
    parsed = config.from_namespace(args)
    assert (parsed.policy, parsed.seed, parsed.scoring, parsed.cache_shards, parsed.dry_run) == (
        "exact",
        3,
        "full",
        2,
        True,
    )
    assert parsed.plugins == ("a.py", "b.py")


def test_a_subset_of_the_flags_for_the_quickstart():
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, ["policy", "lenience"])
    assert {a.dest for a in parser._actions} == {"help", "rollout_reuse", "lenience"}
    with pytest.raises(ValueError, match="no ReuseConfig fields"):
        config.add_arguments(parser, ["nope"])


def test_a_grid_cells_flags():
    words = config.cell_flags(policy="spec", lenience=1.65, params={"a": 1}, trace_dir="t")
    assert words == [
        "--rollout_reuse",
        "spec",
        "--lenience",
        "1.65",
        "--reuse.params",
        '{"a": 1}',
        "--reuse.trace_dir",
        "t",
    ]
    assert config.cell_flags(policy="off", lenience=None, params={}) == ["--rollout_reuse", "off"]
    with pytest.raises(ValueError, match="seed is not set per grid cell"):
        config.cell_flags(seed=3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"policy": "spec", "lenience": 0.0}, "--lenience"),
        ({"reused_logprobs": "mine"}, "--reuse.logprobs"),
        ({"cache_max_gb": -1}, "--reuse.cache_max_gb"),
        ({"checkpoint_poll_s": 0}, "--reuse.checkpoint_poll_s"),
        ({"update_every": 0}, "--reuse.update_every"),
        ({"max_num_seqs": 0}, "--vllm.max_num_seqs must be a positive integer, got 0"),
        ({"max_num_batched_tokens": 2.5}, "--vllm.max_num_batched_tokens must be a positive integer, got 2.5"),
        ({"max_num_seqs": 256, "max_num_batched_tokens": 128}, "128 is below --vllm.max_num_seqs 256"),
    ],
)
def test_bad_values_name_their_flag(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        ReuseConfig(**kwargs)


def test_a_config_travels_as_json():
    original = ReuseConfig(policy="exact", plugins=("a.py",), params={"x": 1})
    assert ReuseConfig.from_json(original.to_json()) == original


def test_a_folder_is_writable_when_a_file_can_be_written_in_it(tmp_path):
    from specrl_openrlhf.config import check_writable_folder

    check_writable_folder("--reuse.trace_dir", tmp_path / "new" / "traces")  # created
    assert (tmp_path / "new" / "traces").is_dir() and not list((tmp_path / "new" / "traces").iterdir())
    with pytest.raises(ValueError, match="--reuse.trace_dir /proc/specrl: not a writable folder"):
        check_writable_folder("--reuse.trace_dir", "/proc/specrl")  # root's permission bits say yes; /proc says no


def test_a_file_a_rule_names_travels_as_its_data(tmp_path):
    """`resolved()` (what a run publishes to its executors) holds a step curve's data: no process reads the file."""
    path = tmp_path / "curve.json"
    grid = [{"rows": r, "tokens": q, "seconds": 0.01 * r * q} for r in (32, 64) for q in (1, 2)]
    path.write_text(json.dumps({"device": "a GPU", "curve": grid}))
    config = ReuseConfig(policy="lossless", params={"cost_curve": str(path), "cost_scale": 8})
    published = ReuseConfig.from_json(config.resolved().to_json())
    path.unlink()
    assert published.params["cost_scale"] == 8 and published.params["cost_curve"]["device"] == "a GPU"
    assert published.build_policy().params.cost_curve == published.params["cost_curve"]
    assert ReuseConfig(policy="spec").resolved() == ReuseConfig(policy="spec")


def test_the_engine_size_flags_give_the_engine_arguments_they_set():
    assert ReuseConfig().engine_size_arguments == {}
    assert ReuseConfig(max_num_batched_tokens=4096).engine_size_arguments == {"max_num_batched_tokens": 4096}
    both = ReuseConfig(max_num_seqs=256, max_num_batched_tokens=8192).engine_size_arguments
    assert both == {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
