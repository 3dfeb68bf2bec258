"""Our V2 speculator as the simulator drives it (`LosslessV2`): its own code (`integration.vllm.v2.drafter`), in vLLM
0.34's call order (`miniature.v2_runner`'s request state), fed the simulator's persistent batch.

Each engine step: requests new to the batch are added (a preempted one, back with what it had taken, is resumed under
its id), the step's sampled tokens land in the request state, and `propose` drafts k tokens a row with its
confidences; a row's rejected slots are those it verified less those it kept. The step's draft lengths are then
vLLM's: with adaptive verification, its admission of the best slots by survival (`admit`, `simulator.adaptive`),
priced where the simulation runs; else k tokens every decoding row (slots past the chain hold the row's last token, and
vLLM verifies them). Histories are registered as the rollout registers them (the prompt's previous visit from the
draft store at its visit's start; a finished sample's response is in its column already), and between two visits the
other prompts' visits an engine served take their slots (`between_visits`: the newest its slots hold). The host's
work is hidden behind the forward (async scheduling stays on); what its kernels cost on the GPU is
`pricing.speculator_kernels.HISTORY_V2`'s estimate (`gpu_kernels`), never this machine's time.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from ..cache import prompt_key
from ..integration.vllm.histories import params_message, request_id
from ..integration.vllm.v2.drafter import DrafterSettings, HistoryDrafter
from ..miniature.v2_runner import RequestStateStandIn
from ..policies.builtin import LosslessParams
from ..pricing.curves import StepPrice
from ..pricing.speculator_kernels import HISTORY_V2
from ..simulator.adaptive import AdaptiveVerification
from ..simulator.batch import BatchView
from ..simulator.corpus import Corpus
from ..simulator.requests import Request
from ..simulator.visits import OtherRequests, StoreHeld
from .suffix_v2 import adaptive_verification

STEP, WRITE, ASSIGN = (HISTORY_V2.names.index(name) for name in ("step", "write", "assign"))


class LosslessV2:
    """`lossless,engine=v2` in the simulator: our V2 speculator's own code, driven as vLLM's V2 runner would drive it;
    `adaptive`: vLLM's adaptive verification (None: every row verifies its k slots). `gpu_kernels` [steps][kernels]:
    what it launched at each step."""

    name, async_scheduling, kernels = "lossless_v2", True, HISTORY_V2

    def __init__(
        self,
        max_model_len: int,
        max_num_seqs: int,
        params: LosslessParams,
        adaptive: AdaptiveVerification | None,
        store: StoreHeld | None = None,
    ):
        torch.set_num_threads(1)  # small ops: threads only wait on 2 busy cores (the GPU's time is priced apart)
        self.k, self.adaptive = params.num_speculative_tokens, adaptive
        settings = DrafterSettings(
            max_num_reqs=max_num_seqs,
            max_model_len=max_model_len,
            k=self.k,
            history_mb=params.history_mb,
            min_match=params.min_match,
            shared=params.shared,
            lookup=params.lookup,
        )
        self.state = RequestStateStandIn(max_num_seqs, max_model_len)
        self.drafter = HistoryDrafter(settings, self.state, "cpu")
        self.params, self.store = params_message(params), store or StoreHeld()
        self.keys: dict[int, bytes] = {}
        self.ids: dict[str, str] = {}  # the simulator's request id: ours (it carries the prompt's digest)
        self.present: set[str] = set()  # the simulator's requests in the request state (not preempted)
        self.drafted: dict[str, int] = {}  # each row's draft tokens verified, as of the last step
        self.last = torch.zeros(max_num_seqs, 1, dtype=torch.int64)
        self.gpu_kernels: list[list[int]] = []
        self.launching = np.zeros(len(HISTORY_V2.names), np.int64)  # launched before the next step's propose
        self.note = ""  # what the simulation changed of the rule (`build_lossless_v2`)

    def between_visits(self, others: OtherRequests) -> None:
        """The gap's newest other visits its slots hold, each registered as the rollout registers it (its previous
        visit, then its responses): older ones would be evicted by them, least recently used first."""
        newest = []
        for other in others.newest_first():
            if len(newest) == self.drafter.store.size.slots:
                break
            newest.append(other)
        for other in reversed(newest):
            key = prompt_key([-1, *other.key.encode()])  # a digest no prompt gives (token ids are never negative)
            self.drafter.update(key, len(other.prompt), True, self.params, other.previous + other.responses, None)
            self.launching[WRITE] += 1

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float:
        held = 0
        for p in prompts:
            key = self.keys.setdefault(p, prompt_key(corpus.prompts[p]))
            previous = self.store.previous(corpus, epoch, p)
            self.drafter.update(key, len(corpus.prompts[p]), True, self.params, previous, None)
            self.launching[WRITE] += 1
            held += bool(previous)
        return held / len(prompts)

    def propose(self, batch: BatchView, sampled: list[list[int]]) -> list[list[int]]:
        self._follow(batch)
        state, rows, counts, rejected = self.state, [], [], []
        for request, new in zip(batch.rows, sampled):
            index = state.req_id_to_index[self.ids[request.id]]
            n = int(state.total_len.gpu[index])
            state.all_token_ids.gpu[index, n : n + len(new)] = torch.as_tensor(new, dtype=torch.int32)
            state.total_len.gpu[index] = n + len(new)
            if new:
                self.last[index, 0] = new[-1]
            verified = request.drafted - self.drafted.get(request.id, request.drafted)
            rows.append(index)
            counts.append(len(new))
            rejected.append(verified + 1 - len(new) if new else 0)
        self.drafted = {r.id: r.drafted for r in batch.rows}
        drafts = self.drafter.propose(
            torch.tensor(rows, dtype=torch.int32), torch.tensor(counts), torch.tensor(rejected), self.last
        ).tolist()
        self.gpu_kernels.append((self.launching + np.eye(len(HISTORY_V2.names), dtype=np.int64)[STEP]).tolist())
        self.launching[:] = 0
        if self.adaptive is not None:
            self.adaptive.record([r.id for r in batch.rows], self.drafter.confidences[: len(rows)].numpy())
        return [draft if n else [] for draft, n in zip(drafts, counts)]  # a row still in prefill verifies nothing

    def admit(self, rows: list[Request], prefill_budget: int) -> None:
        """Adaptive verification's admission of the slots the step scheduled (none without it)."""
        if self.adaptive is not None and self.adaptive.admit(rows, prefill_budget):
            self.launching[ASSIGN] += 1

    def _follow(self, batch: BatchView) -> None:
        """The request state after the scheduler's step: requests gone without finishing (preempted) freed, new ones
        and resumed ones added with what they had taken, in vLLM's order."""
        batched = {r.id for r in batch.rows}
        for gone in self.present - batched:  # preempted: freed with no finish call, its id kept for its return
            self.state.remove(self.ids[gone])
            self.present.discard(gone)
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
        self.drafted.pop(request.id, None)
        if self.adaptive is not None:
            self.adaptive.added(request.id)

    def finished(self, request: Request) -> None:
        ours = self.ids.pop(request.id, None)
        self.drafted.pop(request.id, None)
        if ours is not None and request.id in self.present:
            self.present.discard(request.id)
            self.drafter.on_requests_finished({ours})
            self.state.remove(ours)

    def memory_bytes(self) -> int:
        """The histories' device memory."""
        return self.drafter.store.nbytes


def build_lossless_v2(
    params: LosslessParams, max_model_len: int, max_num_seqs: int, price: StepPrice, scale=1, store=None
):
    """Our V2 speculator of the rule's `params` at `scale` of the GPU's rows a simulated row (its `history_mb` over
    `scale`: a simulated response stands for `scale`), its previous visits from the draft store (`store`), its adaptive
    verification (`adaptive` auto or on) priced on `price`, except in an engine without CUDA graphs (`price.eager`),
    where vLLM refuses it: there every row verifies `fixed_tokens` slots (`LosslessV2.note` says so where it was
    asked for)."""
    drafting = HISTORY_V2.draft_seconds({"step": 1})
    adaptive, note = adaptive_verification(params.adaptive, params.num_speculative_tokens, price, scale, drafting)
    k = params.num_speculative_tokens if adaptive is not None else params.fixed_tokens  # as `engine_arguments`
    held = replace(params, history_mb=max(1, math.ceil(params.history_mb / scale)), num_speculative_tokens=k)
    speculator = LosslessV2(max_model_len, max_num_seqs, held, adaptive, store)
    speculator.note = note
    return speculator
