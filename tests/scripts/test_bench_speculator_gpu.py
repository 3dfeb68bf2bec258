"""`scripts/bench_speculator_gpu.py` runs small on CPU, says its figure is not a GPU's, and prints a RESULT line per
configuration."""

import importlib.util
from pathlib import Path

from tests.helpers import result_fields

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_speculator_gpu.py"


def test_it_runs_small_on_cpu_and_says_so(capsys):
    spec = importlib.util.spec_from_file_location("bench_speculator_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--rows", "8", "--contexts", "64", "--steps", "2", "--k", "4", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "not a GPU's figure" in out
    fields = result_fields(next(line for line in out.splitlines() if line.startswith("RESULT")))
    assert fields["rows"] == "8" and fields["context"] == "64" and float(fields["device_us"]) > 0
