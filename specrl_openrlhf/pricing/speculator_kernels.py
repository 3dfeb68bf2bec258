"""A GPU speculator's own time a step, by the kernels it launches (`SpeculatorKernels`): vLLM 0.34's suffix speculator
(`SUFFIX_V2`) and ours (`HISTORY_V2`), estimates, never measured here.

Terminology:
- *kernels*: what a speculator launches on the GPU, each step or at some steps, in the order of its table. They run in
  the step's stream after the forward, so their time adds to the step's; the host launches them ahead (async
  scheduling), so none of the host's time does.
- vLLM 0.34's `SuffixSpeculator`: after each step's sampling, `observe` (its acceptance stats, with adaptive
  verification only), `local_scan` (each row's suffix in its own text), `finalize` (the corpus's candidates, their
  votes, the drafts); before a step, `ingest` (the requests that finished, into its corpus) and, where adaptive
  verification cuts the step's drafts, `assign` (the slots admitted).
- ours (`integration.vllm.v2`): `step`, the drafter's whole step (verdicts, the sampled tokens into their columns and
  the index, candidates, matches, the vote, confidences), compiled into fused kernels on a GPU; `write`, a registration
  of histories (their tokens and index entries: a few kernels, at a visit's start and as samples finish); `assign`,
  vLLM's admission, as above.
- *estimate*: no GPU ran them here. A small kernel is priced at a floor of 5 µs (its launch-to-finish; vllm-omni PR
  #6516 measured about 5 µs inside each launch call). The suffix speculator's `finalize` at 40 µs: one program a row,
  16 candidates, each verified over up to 24 tokens and voted over 8 positions in 16 x 16 comparisons, one wave of
  programs at RL batch sizes (up to 132 rows on an H100's SMs); `assign` at 20 µs: one program that bisects a
  threshold over every slot (31 passes). Our `step` at `HISTORY_STEP_KERNELS` such kernels: the fused kernels torch's
  compiler makes of it, counted where it compiles the step on a CPU (`torch._inductor.metrics`); `write` at 4. Every
  figure that uses them names the model (`SpeculatorKernels.source`).

Core module: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KERNEL_FLOOR_US = 5.0  # a small kernel's launch-to-finish (vllm-omni PR #6516)
ASSIGN_US = 20.0  # vLLM's admission kernel: one program bisecting over every slot
HISTORY_STEP_KERNELS = 102  # our compiled step's fused kernels (torch's inductor, counted compiling it on a CPU)


@dataclass(frozen=True)
class SpeculatorKernels:
    """A speculator's kernels (`names`, in its table's order), each one's estimated µs, and where the figures come
    from."""

    names: tuple[str, ...]
    us: tuple[float, ...]
    source: str

    def seconds(self, launched) -> np.ndarray:
        """[S] seconds of the kernels launched at each step, `launched` [S, len(names)] how many of each.

        >>> SUFFIX_V2.seconds([[0, 1, 1, 0, 0], [1, 1, 1, 1, 1]]).round(6).tolist()
        [4.5e-05, 7.5e-05]
        """
        return np.asarray(launched, np.float64).reshape(-1, len(self.names)) @ np.asarray(self.us) * 1e-6

    def draft_seconds(self, drafting: dict[str, int]) -> float:
        """Seconds of one step's drafting kernels (`drafting`: how many of each name): the drafter's cost adaptive
        verification weighs."""
        return float(self.seconds([[drafting.get(name, 0) for name in self.names]])[0])


SUFFIX_V2 = SpeculatorKernels(
    ("observe", "local_scan", "finalize", "ingest", "assign"),
    (KERNEL_FLOOR_US, KERNEL_FLOOR_US, 40.0, KERNEL_FLOOR_US, ASSIGN_US),
    "estimated: 5 µs a kernel, 40 µs its draft kernel, 20 µs its admission kernel (pricing.speculator_kernels)",
)
HISTORY_V2 = SpeculatorKernels(
    ("step", "write", "assign"),
    (HISTORY_STEP_KERNELS * KERNEL_FLOOR_US, 4 * KERNEL_FLOOR_US, ASSIGN_US),
    f"estimated: its compiled step's {HISTORY_STEP_KERNELS} fused kernels (counted compiling it on a CPU) at 5 µs "
    "each, 20 µs vLLM's admission kernel (pricing.speculator_kernels)",
)
