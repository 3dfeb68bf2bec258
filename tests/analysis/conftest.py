"""The recorded CPU run the report's tests read: the quickstart's lenience grid (tests/data)."""

import gzip
from pathlib import Path

import pytest

DATA = Path(__file__).parents[1] / "data" / "lenience_grid_metrics.json.gz"


@pytest.fixture
def grid_run(tmp_path) -> Path:
    folder = tmp_path / "lenience_grid"
    folder.mkdir()
    (folder / "metrics.json").write_bytes(gzip.decompress(DATA.read_bytes()))
    return folder
