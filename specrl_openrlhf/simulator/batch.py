"""The persistent batch as a proposer reads it (`BatchView`): rows in slots, as vLLM's `InputBatch` keeps them. A new
request takes the lowest free slot and the last rows move down into the holes left (`InputBatch.condense`), as a
proposer that follows rows by slot sees them.

Engine-free: numpy only.
"""

from __future__ import annotations

import numpy as np

from .requests import Request


class BatchView:
    """The persistent batch as a proposer reads it (the fields of vLLM's `InputBatch` its proposers use), rows in
    slots: `req_ids`, `req_id_to_index`, `num_tokens_no_spec` [max_num_seqs], `num_prompt_tokens` [max_num_seqs] and
    `token_ids_cpu` [max_num_seqs, max_len]."""

    def __init__(self, max_num_seqs: int, max_len: int):
        self.rows: list[Request] = []
        self.req_ids: list[str] = []
        self.req_id_to_index: dict[str, int] = {}
        self.token_ids_cpu = np.zeros((max_num_seqs, max_len), np.int32)
        self.num_tokens_no_spec = np.zeros(max_num_seqs, np.int32)
        self.num_prompt_tokens = np.zeros(max_num_seqs, np.int32)

    def update(self, finished: set[str], added: list[Request]) -> None:
        """vLLM's `_update_states`: finished rows leave, new requests take the lowest free slots, then the last rows
        move down into the remaining holes."""
        holes = sorted(i for i, r in enumerate(self.rows) if r.id in finished)
        rows: list[Request | None] = [None if r.id in finished else r for r in self.rows]
        for request in added:
            slot = holes.pop(0) if holes else len(rows)
            if slot == len(rows):
                rows.append(request)
            else:
                rows[slot] = request
            self._write(slot, request)
        while holes:
            last = max(i for i, r in enumerate(rows) if r is not None) if any(r is not None for r in rows) else -1
            hole = holes.pop(0)
            if hole >= last:
                break
            rows[hole], rows[last] = rows[last], None
            n = int(self.num_tokens_no_spec[last])
            self.token_ids_cpu[hole, :n] = self.token_ids_cpu[last, :n]
            self.num_tokens_no_spec[hole], self.num_prompt_tokens[hole] = n, self.num_prompt_tokens[last]
        self.rows = [r for r in rows if r is not None]
        self.req_ids = [r.id for r in self.rows]
        self.req_id_to_index = {r: i for i, r in enumerate(self.req_ids)}

    def _write(self, slot: int, request: Request) -> None:
        n, taken = len(request.prompt), request.response[: request.restored]
        self.token_ids_cpu[slot, :n] = request.prompt
        self.token_ids_cpu[slot, n : n + len(taken)] = taken
        self.num_prompt_tokens[slot] = n
        self.num_tokens_no_spec[slot] = n + len(taken)

    def extend(self, slot: int, tokens: list[int]) -> None:
        n = int(self.num_tokens_no_spec[slot])
        self.token_ids_cpu[slot, n : n + len(tokens)] = tokens
        self.num_tokens_no_spec[slot] = n + len(tokens)
