"""What our V2 speculator's `propose` costs a step on a GPU: its drafting kernels (`integration.vllm.v2`: torch ops, no
host sync) for `--rows` rows whose responses are `--context` tokens deep, each prompt's 8 previous responses and its
rows in flight in the store, every row sampling as an engine step would. Plain PyTorch (no vLLM: the lent GPU machine
has none), from a checkout where the package isn't installed too.

    python scripts/bench_speculator_gpu.py                                  # 128 and 512 rows, contexts 1k to 4k
    python scripts/bench_speculator_gpu.py --rows 8 --contexts 256 --steps 5  # small, on CPU: not a GPU figure

On a GPU every timed step runs under CUDA's sync debug mode set to error (`torch.cuda.set_sync_debug_mode`): a host
sync in `propose` fails the run. Each step is timed on the device (CUDA events around the step's kernels) and on the
host (the launches' wall time, which async scheduling overlaps with the forward). One RESULT line per (rows, context).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

try:
    from specrl_openrlhf.cache import prompt_key
except ImportError:  # a checkout where the package isn't installed (the lent GPU machine): its root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from specrl_openrlhf.cache import prompt_key
from specrl_openrlhf.integration.vllm.histories import params_message, request_id
from specrl_openrlhf.integration.vllm.v2.drafter import DrafterSettings, HistoryDrafter
from specrl_openrlhf.miniature.v2_runner import RequestStateStandIn
from specrl_openrlhf.policies.builtin import LosslessParams

SAMPLES = 8  # rows a prompt, and previous responses a prompt (OpenRLHF's examples: 8 samples)


def workload(rows: int, context: int, k: int, seed: int = 0):
    """Prompts of 8 rows each; per prompt 8 previous responses that share a stem and part at random points, each row
    following one of them: (prompts, histories, each row's prompt and response-to-be)."""
    rng = np.random.default_rng(seed)
    prompts = [[1, *rng.integers(3, 30_000, 63).tolist()] for _ in range(max(1, rows // SAMPLES))]
    histories, rows_of = [], []
    length = context + 64 * (k + 1)
    for prompt in prompts:
        stem = rng.integers(3, 30_000, length)
        responses = []
        for _ in range(SAMPLES):
            split = int(rng.integers(length // 2, length))
            responses.append(np.concatenate([stem[:split], rng.integers(3, 30_000, length - split)]).tolist())
        histories.append(responses)
        rows_of += [(prompt, responses[int(rng.integers(0, SAMPLES))]) for _ in range(SAMPLES)]
    return prompts, histories, rows_of[:rows]


def run(rows: int, context: int, k: int, steps: int, device: torch.device) -> dict:
    prompts, histories, rows_of = workload(rows, context, k)
    max_len = 64 + context + 64 * (k + 1) + 8
    state = RequestStateStandIn(rows, max_len, device)
    drafter = HistoryDrafter(DrafterSettings(max_num_reqs=rows, max_model_len=max_len, k=k), state, device)
    rule = params_message(LosslessParams())
    for prompt, responses in zip(prompts, histories):
        drafter.update(prompt_key(prompt), len(prompt), True, rule, responses, None)
    for prompt, response in rows_of:  # every row already `context` tokens into its response
        index = state.add(request_id(prompt_key(prompt)), len(prompt), [*prompt, *response[:context]])
        drafter.add_request(index)
    state.apply_staged_writes()
    idx = torch.arange(rows, dtype=torch.int32, device=device)
    last = torch.zeros(rows, 1, dtype=torch.int64, device=device)
    sampled = torch.ones(rows, dtype=torch.int32, device=device)
    rejected = torch.zeros(rows, dtype=torch.int32, device=device)
    truth = torch.tensor([r[: max_len - 64] for _, r in rows_of], dtype=torch.int32, device=device)
    depth = torch.full((rows,), context, dtype=torch.int64, device=device)
    device_us, host_us = [], []
    for step in range(steps + 3):  # 3 warm-up steps
        # the engine's step: each row took 1-3 tokens of its response (the rest of its draft rejected)
        taken = torch.tensor(np.random.default_rng(step).integers(1, 4, rows), device=device)
        for j in range(3):
            write = j < taken
            column = (depth + j).clamp(max=truth.shape[1] - 1)
            state.all_token_ids.gpu[idx.long(), 64 + column] = torch.where(
                write, truth[idx.long(), column], state.all_token_ids.gpu[idx.long(), 64 + column]
            )
        depth += taken
        state.total_len.gpu.copy_((64 + depth).to(torch.int32))
        sampled.copy_(taken.to(torch.int32))
        rejected.copy_((k - taken + 1).clamp(min=0).to(torch.int32))
        timed = measure(drafter, idx, sampled, rejected, last, device)
        if step >= 3:
            device_us.append(timed[0])
            host_us.append(timed[1])
    return {"device_us": statistics.median(device_us), "host_us": statistics.median(host_us)}


def measure(drafter, idx, sampled, rejected, last, device) -> tuple[float, float]:
    """One `propose`: its device time (CUDA events; on CPU the wall time) and its host time (the launches)."""
    if device.type != "cuda":
        start = time.perf_counter()
        drafter.propose(idx, sampled, rejected, last)
        wall = (time.perf_counter() - start) * 1e6
        return wall, wall
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.set_sync_debug_mode("error")  # a host sync in propose fails the run
    start = time.perf_counter()
    begin.record()
    drafter.propose(idx, sampled, rejected, last)
    end.record()
    host = (time.perf_counter() - start) * 1e6
    torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1e3, host


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="128,512", help="batch rows, a comma list")
    parser.add_argument("--contexts", default="1024,2048,4096", help="each row's response depth, a comma list")
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    parser.add_argument("--steps", type=int, default=30, help="timed steps a configuration")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU: not a GPU's figure"
    check = "CUDA's sync debug mode error on every timed step" if device.type == "cuda" else "no sync check on CPU"
    print(f"[speculator] {machine}, torch {torch.__version__}, k={args.k}, {check}")
    for rows in (int(r) for r in args.rows.split(",")):
        for context in (int(c) for c in args.contexts.split(",")):
            found = run(rows, context, args.k, args.steps, device)
            print(
                f"RESULT rows={rows} context={context} k={args.k} device_us={found['device_us']:.1f} "
                f"host_us={found['host_us']:.1f} machine={machine.replace(' ', '_')}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
