"""The paper's experiments in miniature, on a CPU machine (laptops, CI): `bash scripts/quickstart.sh`.

A tiny Qwen3 model (`tiny_model`) is warm-started (`warm_start`) on a local math task (`task`), then trained with
GRPO (`grpo`) through OpenRLHF's real rollout path on Ray: its `SamplesGenerator` and `RolloutRayActor`, vLLM engines
on CPU with their KV cache sized in bytes (`engine`) and weights reloaded after each step (`weights`). The quickstart
plans which rules train side by side (`plan`), runs them (`rollouts`, `training`) and reports paired results over
seeds (`summary`).

Nothing here is needed on a GPU cluster, where OpenRLHF starts the engines and DeepSpeed trains; the adapters users
run there sit one level up, in `specrl_openrlhf.integration`.
"""


def user_cache(name: str):
    """The user's cache folder for `name` (`$XDG_CACHE_HOME/specrl_openrlhf/NAME`, else `~/.cache/...`)."""
    import os
    from pathlib import Path

    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specrl_openrlhf" / name
