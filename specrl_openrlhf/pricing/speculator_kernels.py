"""A GPU speculator's own time a step: vLLM 0.34's suffix speculator (`SuffixSpeculator`), priced by the kernels it
launches (`SUFFIX_V2_KERNEL_US`), an estimate, never measured here.

Terminology:
- *kernels*: what the speculator launches on the GPU, in the order of `KERNELS`: after each step's sampling,
  `observe` (its acceptance stats, with adaptive verification only), `local_scan` (each row's suffix in its own
  text), `finalize` (the corpus's candidates, their votes, the drafts); before a step, `ingest` (the requests that
  finished, into its corpus) and, where adaptive verification cuts the step's drafts, `assign` (the slots admitted).
  They run in the step's stream after the forward, so their time adds to the step's; the host launches them ahead
  (async scheduling), so none of the host's time does.
- *estimate* (`SUFFIX_V2_KERNEL_US`): no GPU ran them here. Each kernel is priced at a floor of 5 µs (a small
  kernel's launch-to-finish; vllm-omni PR #6516 measured about 5 µs inside each launch call), and `finalize` at 40
  µs: one program a row, 16 candidates, each verified over up to 24 tokens and voted over 8 positions in 16 x 16
  comparisons, one wave of programs at RL batch sizes (up to 132 rows on an H100's SMs). `assign` at 20 µs: one
  program that bisects a threshold over every slot (31 passes). Every figure that uses them names the model
  (`SOURCE`).

Core module: numpy only.
"""

from __future__ import annotations

import numpy as np

KERNELS = ("observe", "local_scan", "finalize", "ingest", "assign")
SUFFIX_V2_KERNEL_US = {"observe": 5.0, "local_scan": 5.0, "finalize": 40.0, "ingest": 5.0, "assign": 20.0}
SOURCE = "estimated: 5 µs a kernel, 40 µs its draft kernel, 20 µs its admission kernel (pricing.speculator_kernels)"


def kernel_seconds(launched) -> np.ndarray:
    """[S] seconds of the speculator's kernels at each step, `launched` [S, len(KERNELS)] the kernels each launched.

    >>> kernel_seconds([[0, 1, 1, 0, 0], [1, 1, 1, 1, 1]]).round(6).tolist()
    [4.5e-05, 7.5e-05]
    """
    us = np.array([SUFFIX_V2_KERNEL_US[name] for name in KERNELS], np.float64)
    return np.asarray(launched, np.float64).reshape(-1, len(KERNELS)) @ us * 1e-6


def draft_seconds(adaptive: bool) -> float:
    """Seconds its drafting kernels take a step (`observe` with adaptive verification, `local_scan`, `finalize`): the
    drafter's cost adaptive verification weighs."""
    return float(kernel_seconds([[int(adaptive), 1, 1, 0, 0]])[0])
