"""vLLM: what both of its engines share, and each engine's own proposer (`v1`, `v2`).

vLLM <= 0.33 runs our `lossless` proposer through its V1 runner's `custom_class` hook (`v1`: a CPU proposer, paid
serially, which turns async scheduling off); vLLM >= 0.34 has no V1 runner and takes out-of-tree speculators through
its V2 registry (`v2`: a GPU speculator with no host sync, which keeps async scheduling). The installed vLLM chooses
(`versions`). Shared by both:
- `edge`: our `SamplingParams`, vLLM's answers parsed into the core's types, the engine's limits;
- `histories`: the histories' format and the `collective_rpc` call that carries them to either engine;
- `hashing`: the one hash of a token sequence (a response's identity, a row's last tokens);
- `versions`: which engine the installed vLLM runs (the V1 proposer or the V2 speculator, adaptive verification),
  and what that engine can't run, refused before it starts;
- `engine_args`: the engine arguments a rule needs; `engine_defaults`: the size vLLM gives OpenRLHF's engines;
- `exclude`: the exact resample's logits processor (the request path), for each of vLLM's runners;
- `plugin`: our `vllm.general_plugins` entry point (the CPU fixes, the V2 speculator's registration);
- `step_log`: our stat logger, one record per engine step.
"""
