"""The rollout simulator: recorded responses replayed through vLLM's scheduling, with no model running, so that any
model-free proposer's or request-path rule's engine steps, drafts and kept tokens are known at RL scale.

- `corpus`: recorded corpora (`Corpus`), what the simulator replays, and their figures against an RL run (`quality`);
- `regime`: what the simulator runs, the engine and the RL step as a user names them (`Regime`), and the named
  regimes (`REGIMES`: `openrlhf`, `paper`, `throughput`);
- `engine`: the engine's schedule (`EngineSimulator`), as `Schedule` sizes it, and its step records (`Simulation`);
- `requests`: the requests an RL step sends and their state in flight, and the prefix cache they read;
- `visits`: how RL comes back to a prompt: the other prompts' requests an engine serves between two visits, and
  whether the draft store still holds a returning prompt's last visit;
- `batch`: the persistent batch as a proposer reads it (`BatchView`);
- `request_workload`: the request path as a workload: scoring requests, then continuations;
- `request_plans`: what each sample keeps there, cut by the rule itself (its `cut`, or `lossless`'s coupling);
- `adaptive`: vLLM 0.34's adaptive verification, the draft slots a step verifies (`AdaptiveVerification`).

Engine-free: numpy, the core (policies, pricing) only. What drives a real proposer through it, and prices what it
records, is `specrl_openrlhf.at_scale`.
"""
