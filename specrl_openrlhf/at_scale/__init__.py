"""`python scripts/bench_at_scale.py`: every rule at RL scale, simulated (`specrl_openrlhf.simulator`) on a recorded
corpus in a named regime, and priced where RL runs: a named GPU and model, every row's context, every cost.

- `cli`: the command line, its flags and its report;
- `tables`: the report's tables, each rule's verdict and each drafted epoch's;
- `rules`: the rules `--rules` names, in the config's spelling, each routed by what its policy says of itself;
- `run`: the rules run and priced, projected against stock, the fastest picked;
- `spacing`: the rules at each spacing (RL steps between a prompt's visits), a first visit apart from later ones, and
  a run's figure as its regime's visits mix them;
- `store`: the draft store's memory at a regime's dataset, and whether its default cap holds every prompt's last
  visit;
- `proposers`: the engine's proposers as the simulator drives them (ours, vLLM's suffix decoding and n-gram);
- `speculator_v2`: our V2 speculator (vLLM >= 0.34) as the simulator drives it: its own code, in vLLM 0.34's order;
- `suffix_v2` and `suffix_v2_kernels`: vLLM 0.34's GPU suffix speculator, its kernels re-implemented on the CPU, as
  the simulator drives it, with or without its adaptive verification;
- `eager_modes`: each rule projected with CUDA graphs and without (`enforce_eager`), and what stock loses without;
- `host_steps`: the engine's host time per step, measured on the tiny model (the shipped curve, or this machine's);
- `map` and `heatmap`: `--map`, every corpus x model x GPU x regime, and its picture;
- `lenience`: `--lenience-curve`, spec@ℓ beside the SPEC-RL paper's ablation;
- `validate`: `--validate`, the simulator against a real engine;
- `paper_times`: the SPEC-RL paper's rollout times beside the simulator's, on the drafted epochs;
- `engine_replay`: engine traces verified again by our engine proposer's own code (`python -m specrl_openrlhf replay`).
"""
