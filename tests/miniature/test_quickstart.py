"""The quickstart's run (`quickstart.main`): its whole run is tests/docs/test_prototyping.py (the tutorial's first
command is the quickstart's default run, in the slow pass); its flags are tests/miniature/test_quickstart_args.py."""

from specrl_openrlhf.miniature import quickstart


def test_a_dry_run_prints_the_plan_and_starts_nothing(tmp_path, capsys):
    assert quickstart.main(["--dry-run", "--seeds", "0,1", "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "default/s0: 128 prompts x 3 epochs, lr 0.00015, held-out at the end: default-s0-off, default-s0-spec@1.65, "
        "default-s0-lossless",
        "default/s1: 128 prompts x 3 epochs, lr 0.00015, held-out at the end: default-s1-off, default-s1-spec@1.65, "
        "default-s1-lossless",
    ]
    assert not (tmp_path / "out" / "metrics.json").exists()
