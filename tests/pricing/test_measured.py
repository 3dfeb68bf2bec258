"""What this machine measured (`pricing.measured`): the proposers' costs and the host curve, cached per machine in
the measurement cache (the test suite's own: tests/conftest.py), a host curve with when and how it was taken."""

import datetime
import json
import os

import specrl_openrlhf as sr
from specrl_openrlhf.pricing import measured
from specrl_openrlhf.pricing.curves import HostCurve

MACHINE = "test CPU, 2 cores"
POINTS = [{"rows": 16, "seconds": 0.001}, {"rows": 64, "seconds": 0.002}]


def test_the_suite_never_writes_the_users_cache(tmp_path, monkeypatch):
    assert measured.CACHE_ENV in os.environ  # set for the whole session (tests/conftest.py)
    monkeypatch.setenv(measured.CACHE_ENV, str(tmp_path / "measures"))
    assert measured.cache_root() == tmp_path / "measures"
    monkeypatch.delenv(measured.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert measured.cache_root() == tmp_path / "xdg" / "specrl_openrlhf" / "at_scale"


def test_an_older_or_corrupt_cost_file_is_not_read_and_prices_the_rule_as_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv(measured.CACHE_ENV, str(tmp_path))
    path = measured.cache_root() / f"proposer_us-{measured.machine_key(MACHINE)}.json"
    path.write_text(json.dumps({"suffix": 54.5, "lossless": {"base_us": 613.0, "row_us": 3.1}}))  # suffix: old
    assert measured.proposer_costs(MACHINE) == {"lossless": {"base_us": 613.0, "row_us": 3.1}}
    suffix = measured.rule_cost(sr.make("suffix"), MACHINE)
    assert suffix.proposer_us is None and suffix.missing == ("proposer_cost",)  # unknown: named missing
    lossless = measured.rule_cost(sr.make("lossless"), MACHINE)
    assert (lossless.proposer_base_us, lossless.proposer_us, lossless.missing) == (613.0, 3.1, ())
    assert measured.rule_cost(sr.make("lossless", verify="requests"), MACHINE).async_scheduling
    assert measured.proposer_costs("another CPU") == {}
    path.write_text("[1, 2")
    assert measured.proposer_costs(MACHINE) == {}
    saved = measured.save_proposer_costs({"ngram": {"base_us": 5.0, "row_us": 0.5}}, MACHINE)
    assert saved == path and measured.proposer_costs(MACHINE) == {"ngram": {"base_us": 5.0, "row_us": 0.5}}


def test_a_cached_host_curve_is_read_while_fresh_and_of_this_format(tmp_path, monkeypatch):
    monkeypatch.setenv(measured.CACHE_ENV, str(tmp_path))
    curve, why = measured.cached_host_curve(MACHINE)
    assert curve is None and "no host curve cached" in why
    taken = measured.taken_now(MACHINE, 0.7)
    assert set(taken) == {"time", "machine", "load", "format"} and taken["format"] == measured.HOST_FORMAT
    saved = measured.save_host_curve(HostCurve(POINTS, MACHINE, "measured here", taken), MACHINE)
    assert saved.source == str(measured.host_cache_path(MACHINE)) and saved.taken == taken
    curve, why = measured.cached_host_curve(MACHINE)
    assert curve is not None and curve.taken == taken and why.startswith("cached at")
    later = datetime.datetime.fromisoformat(taken["time"]) + datetime.timedelta(days=measured.HOST_MAX_AGE_DAYS + 1)
    curve, why = measured.cached_host_curve(MACHINE, now=later)
    assert curve is None and "days ago" in why
    old = {"machine": MACHINE, "points": POINTS}  # format 2 carried no `taken`
    measured.host_cache_path(MACHINE).write_text(json.dumps(old))
    curve, why = measured.cached_host_curve(MACHINE)
    assert curve is None and "of format None" in why
