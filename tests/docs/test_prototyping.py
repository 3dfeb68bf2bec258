"""docs/prototyping.md runs as written: every ```bash block, in order, in one shell."""

import itertools
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "prototyping.md"


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", text, re.M | re.S)


@pytest.mark.ray
def test_the_tutorial_runs_as_written(tmp_path):
    blocks = bash_blocks(DOC.read_text())
    assert len(blocks) == 3  # record, replay, train
    env = {**os.environ, "OUT": str(tmp_path / "tutorial"), "VLLM_LOGGING_LEVEL": "ERROR"}
    process = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(blocks)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    results = [line for line in process.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 2 and "policy=spec" in results[0] and "policy=probabilityfloor" in results[1]

    lines = process.stdout.splitlines()
    table = lines.index(next(line for line in lines if line.startswith("| rule | reuse ratio")))
    rows = list(itertools.takewhile(lambda line: line.startswith("| "), lines[table + 2 :]))
    replayed = {row.split(" | ")[0].removeprefix("| "): row.split(" | ")[1:] for row in rows}
    assert len(replayed) == 6  # the recorded cuts and five rules
    recorded = replayed.pop("recorded (the run's own cuts)")
    spec = replayed.pop("spec(lenience=1.6487212707001282)")
    assert spec[:4] == recorded[:4]  # replaying the run's own rule reproduces its reuse
    floor = next(v for k, v in replayed.items() if k.startswith("<") or "floor=0.2" in k)
    assert float(floor[0]) <= float(spec[0])  # the floor only ever rejects more
    assert (tmp_path / "tutorial" / "floor" / "runs.png").is_file()
