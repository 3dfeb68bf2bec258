"""vLLM 0.34's GPU suffix speculator as the simulator drives it (`SuffixV2`), as vLLM's V2 model runner does: its
drafts for every row after each step's sampling, the requests that finished added to its corpus before the next
(sorted by id), its drafts verified K slots a row within the step's token budget, or, with adaptive verification
(`simulator.adaptive`), the slots that verification admits, priced where the simulation runs (`PricedAdmission`).

What the runner does around it (`vllm/v1/worker/gpu/model_runner.py`): `propose` after `postprocess_sampled`, so the
step's sampled tokens are in each row's token ids; `on_requests_finished` before a finished request's slot is freed;
`add_request` for every new or resumed request (which resets its adaptive bookkeeping); async scheduling stays on,
so the speculator's host work is hidden and its GPU kernels are the step's (`gpu_kernels`, priced by
`pricing.speculator_kernels.SUFFIX_V2`). Its kernels are `suffix_v2_kernels`'.
"""

from __future__ import annotations

import numpy as np

from ..pricing.curves import StepPrice
from ..pricing.kernels import MODELS
from ..pricing.projection import Pricing, step_costs
from ..pricing.speculator_kernels import SUFFIX_V2
from ..simulator.adaptive import AdaptiveVerification, StepShape
from ..simulator.batch import BatchView
from ..simulator.corpus import Corpus
from ..simulator.requests import Request
from ..simulator.visits import OtherRequests
from . import suffix_v2_kernels as kernels

LOGITS_CHUNK_BYTES = 2**30  # vLLM 0.34's MAX_CHUNK_BYTES: one verification chunk's fp32 logits


class PricedAdmission:
    """Adaptive verification's costs (`simulator.adaptive.AdmissionCost`) on `price` at `scale` of the GPU's rows a
    row: the verification step's forward (`projection.step_costs`) at the step's own contexts, and a GPU speculator's
    drafting kernels a step (`drafter_s`, `pricing.speculator_kernels`)."""

    def __init__(self, price: StepPrice, scale: int, drafter_s: float):
        self.pricing, self.drafter_s = Pricing(price, scale=scale), drafter_s

    def verify(self, shape: StepShape, drafts: np.ndarray) -> np.ndarray:
        drafts = np.asarray(drafts, np.float64)
        budgets = np.ones_like(drafts)
        costs = step_costs(
            budgets * shape.decode_rows,
            shape.decode_rows + drafts,
            budgets * shape.prefill_tokens,
            self.pricing,
            decode_context=budgets * shape.decode_context,
            prefill_rows=budgets * shape.prefill_rows,
            logit_tokens=budgets * shape.logit_tokens,
            prefill_context=budgets * shape.prefill_context,
        )
        return costs.gpu

    def draft(self, rows: int) -> float:
        return self.drafter_s


EAGER_NOTE = "adaptive verification off: it needs full CUDA graphs, and this engine runs without (vLLM refuses it)"


def adaptive_verification(adaptive: str, k: int, price: StepPrice, scale: int, drafting_s: float):
    """(vLLM's adaptive verification of `k` slots priced on `price`, or None where every row verifies a fixed count;
    the note where it was asked for and can't run) for a rule's `adaptive` (on, off or auto): auto turns it on where
    the engine has CUDA graphs; an engine without (`price.eager`) can't run it, as vLLM refuses it there."""
    eager = getattr(price, "eager", None) is not None
    if adaptive == "on" and eager:
        return None, EAGER_NOTE
    if adaptive == "on" or (adaptive == "auto" and not eager):
        vocab = MODELS.get(getattr(price, "model", ""), MODELS["qwen3-8b"])["vocab"]  # a curve's: Qwen3's
        return AdaptiveVerification(k, PricedAdmission(price, scale, drafting_s), max_drafts(vocab, scale)), ""
    return None, ""


class SuffixV2:
    """vLLM 0.34's `SuffixSpeculator` in the simulator: a corpus of `corpus_tokens` tokens (0: each row's own text
    only), `depth` tokens matched at most, `k` slots a row; `adaptive`: vLLM's adaptive verification (None: every row
    verifies its k slots). `gpu_kernels` [steps][len(KERNELS)]: the kernels it launched at each step."""

    name, async_scheduling, kernels = "suffix_v2", True, SUFFIX_V2

    def __init__(self, k: int, depth: int, corpus_tokens: int, adaptive: AdaptiveVerification | None = None):
        kernels.compile_kernels()
        self.k, self.depth, self.adaptive = k, depth, adaptive
        self.has_corpus = corpus_tokens > 0 and depth >= 2  # corpus matches need the 2-token key
        self.corpus = np.full(max(corpus_tokens, 1) if self.has_corpus else 1, -1, np.int32)
        self.num_buckets = 1 << (max(16, len(self.corpus) // 4) - 1).bit_length()  # vLLM's next power of 2
        self.table = np.full(2 * (self.num_buckets if self.has_corpus else 1) * kernels.SLOTS, -1, np.int64)
        self.stats = np.zeros((2 * kernels.LEN_BUCKETS, k, 2), np.int64)  # (accepted, observed) per bucket, slot
        self.head = self.doc_seq = self.steps = 0
        self.owner = np.full(len(self.corpus), -1, np.int64)  # the document each position holds (its doc_seq)
        self.docs: dict[str, tuple[int, int]] = {}  # a finished request's (start, doc_seq)
        self.pending: list[tuple[str, np.ndarray]] = []  # finished since the last step, not yet ingested
        self.last: dict[str, tuple[int, int]] = {}  # a row's last draft: (stats bucket, valid tokens)
        self.drafted: dict[str, int] = {}  # a row's drafts verified, as of the last step
        self.gpu_kernels: list[list[int]] = []
        self.note = ""  # what the simulation changed of the rule (`build_suffix_v2`)
        self.launching = np.zeros(len(SUFFIX_V2.names), np.int64)  # before the next step's propose

    def between_visits(self, others: OtherRequests) -> None:
        """The gap's other responses, each a request that finished, ingested into the ring: only the newest that fit
        in it (the older ones, and what the ring held before, would be overwritten by them)."""
        if not self.has_corpus:
            return
        room, documents = len(self.corpus), []
        for other in others.newest_first():
            tail = other.prompt[max(len(other.prompt) - kernels.PROMPT_CONTEXT, 0) :]
            for s in range(len(other.responses) - 1, -1, -1):
                room -= len(tail) + len(other.responses[s]) + 1  # its tokens and separator
                if room < 0:
                    break
                documents.append((f"{other.key}-s{s}", np.array(tail + other.responses[s], np.int64)))
            if room < 0:
                break
        self._ingest()
        self._write(documents[::-1])  # oldest first, as they finished

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float:
        """The share of `prompts` with a response of the epoch before intact in the corpus."""
        self._ingest()
        held = [any(self._intact(f"e{epoch - 1}-p{p}-s{s}") for s in range(corpus.samples)) for p in prompts]
        return sum(held) / len(prompts)

    def _intact(self, request_id: str) -> bool:
        start, seq = self.docs.get(request_id, (-1, -1))
        return start >= 0 and self.owner[start] == seq

    def finished(self, request: Request) -> None:
        tail = request.prompt[max(len(request.prompt) - kernels.PROMPT_CONTEXT, 0) :]
        self.pending.append((request.id, np.array(tail + request.response, np.int64)))
        self.last.pop(request.id, None)
        self.drafted.pop(request.id, None)

    def _ingest(self) -> None:
        """vLLM's `on_requests_finished`: the finished requests' documents, in sorted id order."""
        if self.pending and self.has_corpus:
            self._write(sorted(self.pending, key=lambda p: p[0]))
        self.pending = []

    def _write(self, documents: list[tuple[str, np.ndarray]]) -> None:
        """The documents into the ring in order, one ingest launch."""
        for request_id, doc in documents:
            start, self.head = kernels.ingest(self.corpus, self.table, self.head, self.doc_seq, doc, self.num_buckets)
            self.owner[start : self.head] = self.doc_seq  # its tokens and separator
            self.docs[request_id] = (start, self.doc_seq)
            self.doc_seq += 1
        self.launching[SUFFIX_V2.names.index("ingest")] += bool(documents)

    def propose(self, batch: BatchView, sampled: list[list[int]]) -> list[list[int]]:
        self._ingest()
        rows = len(batch.rows)
        num_sampled = np.array([len(s) for s in sampled], np.int64)
        if self.adaptive is not None:
            self._observe(batch.rows, num_sampled)
        tokens, lengths = batch.token_ids_cpu[:rows], batch.num_tokens_no_spec[:rows].astype(np.int64)
        drafts, valid, buckets, confidences = kernels.propose_rows(
            tokens, lengths, num_sampled, self.corpus, self.table, self.num_buckets, self.depth, self.k,
            self.stats, self.adaptive is not None, self.has_corpus,
        )  # fmt: skip
        launched = self.launching + [self.adaptive is not None, 1, 1, 0, 0]
        self.gpu_kernels.append(launched.tolist())
        self.launching[:] = 0
        if self.adaptive is not None:
            ids = [r.id for r in batch.rows]
            self.last = {r: (int(buckets[i]), int(valid[i])) for i, r in enumerate(ids)}
            self.adaptive.record(ids, confidences)
        return drafts.tolist()

    def _observe(self, rows: list[Request], num_sampled: np.ndarray) -> None:
        """vLLM's `_suffix_observe_kernel` on each row's verdict on its last draft, the stats halved every
        `STATS_HALF_LIFE` steps; rows new to the batch (`add_request`) have no last draft."""
        for b, request in enumerate(rows):
            if request.id not in self.drafted:  # new or resumed since the last step
                self.last.pop(request.id, None)
                self.adaptive.added(request.id)
            verified = request.drafted - self.drafted.get(request.id, request.drafted)
            bucket, valid = self.last.get(request.id, (-1, 0))
            rejected = verified + 1 - num_sampled[b] if num_sampled[b] else 0
            kernels.observe(self.stats, bucket, valid, num_sampled[b], rejected)
        self.drafted = {r.id: r.drafted for r in rows}
        self.steps += 1
        if self.steps % kernels.STATS_HALF_LIFE == 0:
            self.stats >>= 1

    def admit(self, rows: list[Request], prefill_budget: int) -> None:
        """Adaptive verification's admission of the slots the step scheduled (none without it)."""
        if self.adaptive is not None and self.adaptive.admit(rows, prefill_budget):
            self.launching[SUFFIX_V2.names.index("assign")] += 1

    def memory_bytes(self) -> int:
        """What it holds on the GPU: the corpus, its index and the stats."""
        return int(self.corpus.nbytes + self.table.nbytes + self.stats.nbytes)


def max_drafts(vocab: int, scale: int):
    """Adaptive verification's limit on a step's draft slots at `rows` simulated rows, each `scale` of the GPU's: one
    verification chunk's logits (vLLM's `get_max_chunk_logits`: 1 GiB of fp32 rows of `vocab`) less a bonus token a
    row, in simulated slots."""
    chunk = max(1, LOGITS_CHUNK_BYTES // (vocab * 4))
    return lambda rows: max(0, chunk - rows * scale) // scale


def build_suffix_v2(params, price: StepPrice, scale: int = 1) -> SuffixV2:
    """vLLM 0.34's suffix speculator of the rule's `params` (`policies.speculative.SuffixParams`) at `scale` of the
    GPU's rows a simulated row: its corpus holds 1 / `scale` of the GPU's tokens (each simulated response stands for
    `scale`), and its adaptive verification (`adaptive` on or auto) is priced on `price`, except in an engine without
    CUDA graphs (`price.eager`), which vLLM refuses it in: there every row verifies its K slots (`SuffixV2.note`)."""
    config = params.speculative_config
    cached = config.get("suffix_decoding_max_cached_requests", 1) != 0
    corpus = config.get("suffix_decoding_corpus_tokens", kernels.CORPUS_TOKENS) if cached else 0
    k, depth = config["num_speculative_tokens"], config.get("suffix_decoding_max_tree_depth", kernels.DEPTH)
    drafting = SUFFIX_V2.draft_seconds({"observe": 1, "local_scan": 1, "finalize": 1})
    adaptive, note = adaptive_verification(params.adaptive, k, price, scale, drafting)
    speculator = SuffixV2(k, depth, max(corpus // scale, 1) if corpus else 0, adaptive)
    speculator.note = note
    return speculator
