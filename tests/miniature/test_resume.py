"""`--resume`: the groups an earlier run finished (`resume`)."""

import json

from specrl_openrlhf.miniature import quickstart_args
from specrl_openrlhf.miniature.resume import finished_groups


def labels(groups):
    return [[run.label for run in group.runs] for group in groups]


def test_resume_keeps_the_groups_that_finished(tmp_path):
    args = quickstart_args.parse_args(["--seeds", "0,1", "--out", str(tmp_path)])
    done_rows = [
        {"kind": "epoch", "run": label, "epoch": e, "held_out_accuracy": 0.5}
        for label in labels(args.groups)[0]
        for e in range(3)
    ]
    half = [{"kind": "epoch", "run": labels(args.groups)[1][0], "epoch": 0}]
    runs = [run.describe() | {"acc_before": 0.4} for run in args.groups[0].runs]
    (tmp_path / "metrics.json").write_text(json.dumps({"runs": runs, "rows": done_rows + half}))
    assert finished_groups(tmp_path, args.groups) == {"default/s0"}
    assert len(args.groups[0].runs[0].rows) == 3 and args.groups[0].runs[0].accuracy_before == 0.4
    # one seed first, more seeds on resume: the labels change ("off" becomes "default-s0-off"); the group is kept
    one = quickstart_args.parse_args(["--out", str(tmp_path / "one")])
    rows = [{"kind": "epoch", "run": label, "epoch": e} for label in labels(one.groups)[0] for e in range(3)]
    runs = [run.describe() for run in one.groups[0].runs]
    (tmp_path / "one" / "metrics.json").write_text(json.dumps({"runs": runs, "rows": rows}))
    more = quickstart_args.parse_args(["--seeds", "0,1", "--out", str(tmp_path / "one")])
    assert finished_groups(tmp_path / "one", more.groups) == {"default/s0"}
    kept = more.groups[0].runs[0]
    assert labels(one.groups)[0][0] == "off" and kept.label == "default-s0-off"
    assert [r["run"] for r in kept.rows] == ["default-s0-off"] * 3
