"""`python scripts/bench_at_scale.py`: every rule at RL scale, simulated (`specrl_openrlhf.simulator`) on a recorded
corpus in a named regime, and priced where RL runs: a named GPU and model, every row's context, every cost.

- `cli`: the command line, its flags and its report;
- `rules`: the rules `--rules` names, in the config's spelling, each routed by what its policy says of itself;
- `run`: the rules run and priced, projected against stock, the fastest picked;
- `spacing`: the rules at each spacing (RL steps between a prompt's visits), a first visit apart from later ones, and
  a run's figure as its regime's visits mix them;
- `store`: the draft store's memory at a regime's dataset, and whether its default cap holds every prompt's last
  visit;
- `proposers`: the engine's proposers as the simulator drives them (ours, vLLM's suffix decoding and n-gram);
- `host_steps`: the engine's host time per step, measured on the tiny model (the shipped curve, or this machine's);
- `map` and `heatmap`: `--map`, every corpus x model x GPU x regime, and its picture;
- `lenience`: `--lenience-curve`, spec@ℓ beside the SPEC-RL paper's ablation;
- `validate`: `--validate`, the simulator against a real engine;
- `paper_times`: the SPEC-RL paper's rollout times beside the simulator's, on the drafted epochs;
- `engine_replay`: engine traces verified again by our engine proposer's own code (`python -m specrl_openrlhf replay`).
"""
