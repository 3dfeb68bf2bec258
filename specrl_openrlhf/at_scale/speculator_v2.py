"""Our V2 speculator as the simulator drives it (`LosslessV2`): its own code (`integration.vllm.v2.drafter`), in vLLM
0.34's call order (`miniature.v2_runner`'s request state), fed the simulator's persistent batch.

Each engine step: requests new to the batch are added (a preempted one, back with what it had taken, is resumed under
its id), the step's sampled tokens land in the request state, and `propose` drafts k tokens a row with its
confidences; a row's rejected slots are what it was given less what it kept. The step's draft lengths are then vLLM's:
with adaptive verification, its admission of the best slots by survival (`admit`, `simulator.adaptive`'s algorithm),
else k tokens every decoding row (slots past the chain hold the row's last token, as vLLM verifies them). Histories are
registered as the rollout registers them (the prompt's previous epoch at its visit's start, each finished sample
after). The host's work is hidden behind the forward (async scheduling stays on); what the speculator's kernels cost
on the GPU is priced apart (`pricing`), never this machine's time.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..cache import prompt_key
from ..integration.vllm.histories import params_message, request_id
from ..integration.vllm.v2.drafter import DrafterSettings, HistoryDrafter
from ..miniature.v2_runner import RequestStateStandIn
from ..policies.builtin import LosslessParams
from ..simulator.batch import BatchView
from ..simulator.corpus import Corpus
from ..simulator.requests import Request

# admit(confidences [B, k], capacities [B]) -> [B] the draft tokens each row verifies
Admission = Callable[[np.ndarray, np.ndarray], np.ndarray]


def every_slot(confidences: np.ndarray, capacities: np.ndarray) -> np.ndarray:
    """Without adaptive verification: every row verifies all of its k slots."""
    return capacities


class LosslessV2:
    """`lossless` on vLLM >= 0.34 in the simulator: our V2 speculator's own code, driven as vLLM's V2 runner would."""

    name, async_scheduling = "lossless,engine=v2", True

    def __init__(self, max_model_len: int, max_num_seqs: int, params: LosslessParams, admit: Admission = every_slot):
        self.k = params.num_speculative_tokens
        settings = DrafterSettings(
            max_num_reqs=max_num_seqs,
            max_model_len=max_model_len,
            k=self.k,
            history_mb=params.history_mb,
            min_match=params.min_match,
            shared=params.shared,
            lookup=params.lookup,
        )
        torch.set_num_threads(1)  # small ops: threads only wait on 2 busy cores (the GPU's time is priced apart)
        self.state = RequestStateStandIn(max_num_seqs, max_model_len)
        self.drafter = HistoryDrafter(settings, self.state, "cpu")
        self.params, self.admit = params_message(params), admit
        self.keys: dict[int, bytes] = {}
        self.ids: dict[str, str] = {}  # the simulator's request id: ours (it carries the prompt's digest)
        self.present: set[str] = set()  # the simulator's requests in the request state (not preempted)
        self.given: dict[str, int] = {}  # draft tokens each request was given at the last step
        self.last = torch.zeros(max_num_seqs, 1, dtype=torch.int64)

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float:
        for p in prompts:
            key = self.keys.setdefault(p, prompt_key(corpus.prompts[p]))
            previous = corpus.responses[epoch - 1][p] if epoch > 0 else []
            self.drafter.update(key, len(corpus.prompts[p]), True, self.params, previous, None)
        return float(epoch > 0)

    def propose(self, batch: BatchView, sampled: list[list[int]]) -> list[list[int]]:
        self._follow(batch)
        state = self.state
        rows, counts, rejected = [], [], []
        for request, new in zip(batch.rows, sampled):
            ours = self.ids[request.id]
            index = state.req_id_to_index[ours]
            n = int(state.total_len.gpu[index])
            state.all_token_ids.gpu[index, n : n + len(new)] = torch.as_tensor(new, dtype=torch.int32)
            state.total_len.gpu[index] = n + len(new)
            if new:
                self.last[index, 0] = new[-1]
            given = self.given.pop(request.id, 0)
            rows.append(index)
            counts.append(len(new))
            rejected.append(max(given - (len(new) - 1), 0) if new and given else 0)
        drafts = self.drafter.propose(
            torch.tensor(rows, dtype=torch.int32), torch.tensor(counts), torch.tensor(rejected), self.last
        )
        capacities = np.where(np.array(counts) > 0, self.k, 0)
        admitted = self.admit(self.drafter.confidences[: len(rows)].numpy(), capacities)
        out = []
        for request, draft, n in zip(batch.rows, drafts.tolist(), admitted.tolist()):
            out.append(draft[: int(n)])
            self.given[request.id] = int(n)
        return out

    def _follow(self, batch: BatchView) -> None:
        """The request state after the scheduler's step: requests gone without finishing (preempted) freed, new ones
        and resumed ones added with what they had taken, in vLLM's order."""
        batched = {r.id for r in batch.rows}
        for gone in self.present - batched:  # preempted: freed with no finish call, its id kept for its return
            self.state.remove(self.ids[gone])
            self.present.discard(gone)
            self.given.pop(gone, None)
        for request in batch.rows:
            if request.id not in self.present:
                self._add(request)
        self.state.apply_staged_writes()

    def _add(self, request: Request) -> None:
        """A request new to the batch, or one back from a preemption with what it had taken (the same id)."""
        key = self.keys.get(request.prompt_index) or prompt_key(request.prompt)
        ours = self.ids.setdefault(request.id, request_id(key))
        index = self.state.add(ours, len(request.prompt), [*request.prompt, *request.response[: request.restored]])
        self.drafter.add_request(index)
        self.present.add(request.id)

    def finished(self, request: Request) -> None:
        ours = self.ids.pop(request.id, None)
        self.given.pop(request.id, None)
        if ours is not None and request.id in self.present:
            self.present.discard(request.id)
            self.drafter.on_requests_finished({ours})
            self.state.remove(ours)

    def memory_bytes(self) -> int:
        """The histories' device memory."""
        return self.drafter.store.nbytes
