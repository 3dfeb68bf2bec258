"""vLLM 0.34's V2 model runner in miniature, as our V2 speculator sees it: its request state and its calls, in its
order, with no model (the caller says what each row sampled). Tests drive the speculator through it (new and finished
requests, aborts, `pause_generation(mode="keep")`'s preemptions and their resumption in another slot, histories
arriving between steps, two tensor-parallel ranks), and the simulator replays the speculator's own code with it.

The runner's order, read from vLLM 0.34 (`vllm/v1/worker/gpu/model_runner.py`): finished requests are reported
(`on_requests_finished`, before their slots are freed; a preempted request is freed without it), new ones added
(`add_request` with their tokens only staged, then every staged write applied at once), the step runs, its sampled
tokens land in the request state, then `propose`. `RequestState` (`vllm/v1/worker/gpu/states.py`) keeps token ids
[max_num_reqs, max_model_len] and lengths on the device, request ids and prompt lengths on the host; free slots are
taken from the end of its free list.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch


class RequestStateStandIn:
    """The fields of vLLM's `RequestState` our speculator reads, on one device."""

    def __init__(self, max_num_reqs: int, max_model_len: int, device="cpu"):
        self.max_num_reqs, self.max_model_len = max_num_reqs, max_model_len
        self.req_id_to_index: dict[str, int] = {}
        self.index_to_req_id: dict[int, str] = {}
        self.free_indices = list(range(max_num_reqs))
        tokens = torch.zeros(max_num_reqs, max_model_len, dtype=torch.int32, device=device)
        self.all_token_ids = SimpleNamespace(gpu=tokens)
        self.total_len = SimpleNamespace(gpu=torch.zeros(max_num_reqs, dtype=torch.int32, device=device))
        prompt = np.zeros(max_num_reqs, np.int32)
        self.prompt_len = SimpleNamespace(np=prompt, gpu=torch.zeros(max_num_reqs, dtype=torch.int32, device=device))
        self.prefill_len = SimpleNamespace(np=np.zeros(max_num_reqs, np.int32))
        self.num_computed_tokens_np = np.zeros(max_num_reqs, np.int32)
        self.staged: list[tuple[int, list[int]]] = []

    def add(self, request_id: str, prompt_len: int, tokens: list[int]) -> int:
        index = self.free_indices.pop()
        self.req_id_to_index[request_id], self.index_to_req_id[index] = index, request_id
        self.prompt_len.np[index], self.prefill_len.np[index] = prompt_len, len(tokens)
        self.staged.append((index, list(tokens)))
        return index

    def apply_staged_writes(self) -> None:
        for index, tokens in self.staged:
            self.all_token_ids.gpu[index, : len(tokens)] = torch.as_tensor(tokens, dtype=torch.int32)
            self.total_len.gpu[index] = len(tokens)
        self.prompt_len.gpu.copy_(torch.as_tensor(self.prompt_len.np))
        self.staged = []

    def remove(self, request_id: str) -> int:
        index = self.req_id_to_index.pop(request_id)
        del self.index_to_req_id[index]
        self.free_indices.append(index)
        return index


class MiniatureRunner:
    """Drives a speculator (any object with vLLM's calls: `add_request`, `on_requests_finished`, `propose`) over a
    `RequestStateStandIn`, in vLLM's order; the caller says what each row sampled and how many drafts it rejected."""

    def __init__(self, make_speculator, max_num_reqs: int, max_model_len: int, device="cpu"):
        self.state = RequestStateStandIn(max_num_reqs, max_model_len, device)
        self.speculator = make_speculator(self.state)
        self.device = torch.device(device)
        self.last = torch.zeros(max_num_reqs, 1, dtype=torch.int64, device=device)
        self.batch: list[str] = []  # request ids in batch order

    def schedule(self, finished=(), added=(), preempted=()) -> None:
        """The host's work before a step: `finished` ids reported then freed, `preempted` ids freed (no report),
        `added` (request id, prompt, tokens so far) given slots (resumed ones keep their tokens) and staged."""
        if finished:
            self.speculator.on_requests_finished(set(finished))
        for request_id in (*finished, *preempted):
            self.state.remove(request_id)
            self.batch.remove(request_id)
        for request_id, prompt, tokens in added:
            index = self.state.add(request_id, len(prompt), [*prompt, *tokens])
            self.speculator.add_request(index)
            self.batch.append(request_id)
        self.state.apply_staged_writes()

    def step(self, sampled: dict[str, list[int]], rejected: dict[str, int] | None = None) -> dict[str, list[int]]:
        """One step: each batch row's sampled tokens (none: still in prefill) and rejected draft count land in the
        request state, then `propose`. Returns every row's draft."""
        state, rejected = self.state, rejected or {}
        rows = [state.req_id_to_index[r] for r in self.batch]
        for request_id, index in zip(self.batch, rows):
            new = sampled.get(request_id, [])
            n = int(state.total_len.gpu[index])
            state.all_token_ids.gpu[index, n : n + len(new)] = torch.as_tensor(new, dtype=torch.int32)
            state.total_len.gpu[index] = n + len(new)
            if new:
                self.last[index, 0] = new[-1]
        device = self.device
        counts = torch.tensor([len(sampled.get(r, [])) for r in self.batch], dtype=torch.int32, device=device)
        refused = torch.tensor([rejected.get(r, 0) for r in self.batch], dtype=torch.int32, device=device)
        idx_mapping = torch.tensor(rows, dtype=torch.int32, device=device)
        if hasattr(self.speculator, "capture"):  # vLLM's `BaseSpeculator`: its own signature
            batch = SimpleNamespace(idx_mapping=idx_mapping, num_reqs=len(rows))
            drafts = self.speculator.propose(
                batch, None, None, None, None, counts, refused, self.last, None, None, None
            )
        else:
            drafts = self.speculator.propose(idx_mapping, counts, refused, self.last)
        return dict(zip(self.batch, drafts.tolist()))
