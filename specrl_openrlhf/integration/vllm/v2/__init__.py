"""`lossless` on vLLM >= 0.34: a V2 speculator that drafts on the GPU from each prompt's histories, registered through
vLLM's speculator registry (`register_speculative_method`), with no host sync in `propose` (async scheduling stays on).

- `registration`: the method's name and its registration from our `vllm.general_plugins` entry point (every vLLM);
- `config`: `HistorySpeculatorConfig`, the `SpeculatorConfig` vLLM reads (vLLM >= 0.34 only);
- `speculator`: `HistorySpeculator`, the `BaseSpeculator` vLLM builds in each worker (vLLM >= 0.34 only): a thin
  adapter of vLLM's request state onto `drafter`;
- `drafter`: `HistoryDrafter`, the engine-free speculator in vLLM's call order (torch only);
- `store`: `DeviceHistories`, every history on the device, and the host's book of slots and columns (torch only);
- `kernels`: the drafting kernels, torch ops with no host sync (torch only);
- `acceptance`: the acceptance model on the device, the core's `budget.acceptance` buckets (torch only).
"""
