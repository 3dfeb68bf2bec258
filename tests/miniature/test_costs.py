"""miniature/costs.py: the proposers' measured costs, cached per machine."""

import json

import specrl_openrlhf as sr
from specrl_openrlhf.miniature import costs


def test_an_older_or_corrupt_cost_file_is_not_read_and_prices_the_rule_as_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = costs.cache_root() / f"proposer_us-{costs.machine_key()}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"suffix": 54.5, "lossless": {"base_us": 613.0, "row_us": 3.1}}))  # suffix: old format
    assert costs.proposer_costs() == {"lossless": {"base_us": 613.0, "row_us": 3.1}}
    assert costs.rule_cost(sr.make("suffix")).proposer_us is None  # unknown: the figure is labelled optimistic
    lossless = costs.rule_cost(sr.make("lossless"))
    assert (lossless.proposer_base_us, lossless.proposer_us) == (613.0, 3.1)
    path.write_text("[1, 2")
    assert costs.proposer_costs() == {}
