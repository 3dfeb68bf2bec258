"""docs/install.md names what the code declares: every entry point of the installed distribution (its group, name and
target in one table row), the engine each supported vLLM runs and the `gpu` extra that keeps it, the vLLM versions the
sampler fix covers and no version range, the environment switches,
the arctic-inference version scripts/build_suffix_tree.sh builds, and vLLM's plugin groups, the ones its `VLLM_PLUGINS`
allow-list filters."""

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

import _specrl_openrlhf_hook
from specrl_openrlhf.integration.vllm import versions
from specrl_openrlhf.integration.vllm.v1 import sampler_fix
from specrl_openrlhf.policies.builtin import HISTORY_SPECULATOR

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "install.md"
DISTRIBUTION = "specrl-openrlhf"


def installed_entry_points() -> set[tuple[str, str, str]]:
    """(group, name, target) of each entry point in the installed distribution's metadata."""
    return {(e.group, e.name, e.value) for e in importlib.metadata.distribution(DISTRIBUTION).entry_points}


def declared_entry_points() -> set[tuple[str, str, str]]:
    """(group, name, target) of each entry point pyproject.toml declares ([project.scripts] is `console_scripts`)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    return {(group, name, target) for group, points in groups.items() for name, target in points.items()}


def table_rows(text: str) -> list[list[str]]:
    """Every markdown table row of `text`, as its cells."""
    return [
        [cell.strip() for cell in line.strip("| \n").split(" | ")] for line in text.splitlines() if line[:2] == "| "
    ]


def row_of(first_cells: tuple[str, ...], text: str) -> list[str] | None:
    """The table row whose first cells are `first_cells`, or None."""
    return next((row for row in table_rows(text) if tuple(row[: len(first_cells)]) == first_cells), None)


def test_the_installed_metadata_is_pyproject_tomls():
    assert installed_entry_points() == declared_entry_points(), "stale install: pip install -e . again"
    assert {group for group, _, _ in installed_entry_points()} >= {
        "console_scripts",
        "vllm.general_plugins",
        "vllm.logits_processors",
        "vllm.stat_logger_plugins",
    }


def test_every_entry_point_has_a_row_with_its_group_name_and_target():
    text = DOC.read_text()
    missing = [
        f"{group} {name} = {target}"
        for group, name, target in sorted(installed_entry_points())
        if row_of((f"`{group}`", f"`{name}`", f"`{target}`"), text) is None
    ]
    assert not missing, f"docs/install.md has no table row for: {missing}"


def test_each_supported_vllm_has_a_row_naming_the_engine_it_runs_and_the_gpu_extra_keeps_it():
    text = DOC.read_text()
    engines = {"v1": "V1 `custom_class` proposer", "v2": f"V2 speculator `{HISTORY_SPECULATOR}`"}
    for major, minor in versions.SUPPORTED:
        row = row_of((f"{major}.{minor}",), text)
        assert row is not None, f"docs/install.md has no row for vLLM {major}.{minor}"
        assert row[1].startswith(engines[versions.runner_of(f"{major}.{minor}.0")]), row
    gpu = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    (vllm,) = [r for r in gpu if r.startswith("vllm")]
    assert f"`{vllm}`" in text and not [r for r in gpu if r.startswith("openrlhf")]  # OpenRLHF's pins move vLLM
    kept = SpecifierSet(vllm.removeprefix("vllm"))
    (oldest_major, oldest), (newest_major, newest) = min(versions.SUPPORTED), max(versions.SUPPORTED)
    assert all(f"{major}.{minor}.0" in kept for major, minor in versions.SUPPORTED)
    assert f"{newest_major}.{newest + 1}.0" not in kept and f"{oldest_major}.{oldest - 1}.0" not in kept


def test_the_sampler_fixs_versions_are_the_ones_it_supports():
    text = DOC.read_text()
    header = row_of(("workaround",), text)
    row = next(row for row in table_rows(text) if f"`{sampler_fix.__name__}`" in row)
    covered, elsewhere = row[header.index("vLLM versions covered")], row[header.index("elsewhere")]
    supported = {".".join(map(str, version)) for version in sampler_fix.SUPPORTED}
    assert set(re.findall(r"\b0\.\d+\b", covered)) == supported
    left_alone = set(re.findall(r"\b0\.\d+\b", elsewhere))
    assert left_alone and not left_alone & supported


def test_no_vllm_version_range_is_claimed():
    """The workarounds cover the versions they list (0.29 and 0.32), not a range: 0.30 and 0.31 are left alone."""
    ranges = re.findall(r"\b0\.\d+(?:\.x)?\s*(?:-|–|to)\s*0\.\d+", DOC.read_text())
    assert not ranges, f"docs/install.md claims vLLM version ranges: {ranges}"


def test_the_switches_the_code_reads_are_documented():
    switches = {row[0] for row in table_rows(DOC.read_text())}
    for switch in (sampler_fix.SWITCH, _specrl_openrlhf_hook.SWITCH, "VLLM_USE_V2_MODEL_RUNNER", "VLLM_PLUGINS"):
        assert f"`{switch}`" in switches, switch


def test_the_arctic_inference_version_is_the_one_the_script_builds():
    script = (REPO / "scripts" / "build_suffix_tree.sh").read_text()
    built = re.search(r"^VERSION=(\S+)$", script, re.M).group(1)
    text = DOC.read_text()
    assert f"`pip install arctic-inference=={built}`" in text and f"arctic-inference {built} sdist" in text


def test_the_groups_vllm_plugins_filters_are_vllms_plugin_groups():
    import vllm.plugins

    paragraph = next(p for p in DOC.read_text().split("\n\n") if p.startswith("`VLLM_PLUGINS` is vLLM's allow-list"))
    filtered = {value for name, value in vars(vllm.plugins).items() if name.endswith("_PLUGINS_GROUP")}
    assert set(re.findall(r"`(vllm\.\w+)`", paragraph)) == filtered
    assert "vllm.logits_processors" not in filtered  # the doc says the allow-list does not reach our logits processor
