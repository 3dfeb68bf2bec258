"""The proposers as the simulator (`simulator.engine`) drives them, as vLLM drives them: our engine proposer
(`HistoryProposer`, its histories registered as the rollout registers them: the prompt's previous epoch when its visit
starts, each finished sample after), vLLM's `SuffixDecodingProposer` (arctic-inference's cache) and `NgramProposer`,
each built from a stand-in of the `VllmConfig` fields it reads and called with the simulator's stand-in of the
persistent batch (`BatchView`); stock drafts nothing and keeps vLLM's async scheduling.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..pricing.curves import StepCurve
from ..simulator.batch import BatchView
from ..simulator.corpus import Corpus
from ..simulator.engine import Schedule
from ..simulator.requests import Request

SUFFIX_DEPTH, NGRAM_K = 24, 8  # vLLM's defaults (suffix: its tree's depth and k; n-gram: our k)


def vllm_config(k: int, max_model_len: int, max_num_seqs: int, **speculative) -> SimpleNamespace:
    """The fields of vLLM's `VllmConfig` the proposers read."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, **speculative),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )


class Stock:
    name, async_scheduling = "off", True

    def visit(self, epoch, prompts, corpus) -> float:
        return 0.0

    def propose(self, batch, sampled):
        return [[] for _ in sampled]

    def finished(self, request) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0


class Lossless:
    """Our engine proposer; the prompt's previous epoch is registered when its visit starts, as the rollout does
    from the draft store, and each finished sample's response after it."""

    name, async_scheduling = "lossless", False

    def __init__(self, max_model_len: int, max_num_seqs: int, curve: StepCurve, params: dict | None = None):
        from ..cache import prompt_key
        from ..integration.vllm import histories
        from ..integration.vllm.proposer import HistoryProposer
        from ..policies.builtin import LosslessParams

        histories.BOARD = self.board = histories.HistoryBoard()
        self.key = prompt_key
        rule = LosslessParams(**{**(params or {}), "cost_curve": curve.as_data()})  # priced on the curve
        self.params = histories.params_message(rule)
        self.proposer = HistoryProposer(vllm_config(rule.num_speculative_tokens, max_model_len, max_num_seqs))
        self.keys: dict[int, bytes] = {}

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float:
        for p in prompts:
            key = self.keys.setdefault(p, self.key(corpus.prompts[p]))
            previous = corpus.responses[epoch - 1][p] if epoch > 0 else []
            self.board.update(key, len(corpus.prompts[p]), True, self.params, previous, [None] * len(previous))
        self.board.drain(set())  # as the proposer would before its next step (timed with the visit)
        while self.board.pending:
            self.board.drain(set())
        held = [self.board.slots.get(self.keys[p]) for p in prompts]
        return sum(slot is not None and bool(slot.responses) for slot in held) / len(prompts)

    def propose(self, batch: BatchView, sampled):
        return self.proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)

    def finished(self, request: Request) -> None:
        key = self.keys[request.prompt_index]
        self.board.update(key, len(request.prompt), False, self.params, [request.response], [None])

    def memory_bytes(self) -> int:
        """The histories' memory: the arena's arrays."""
        return self.board.arena.nbytes


class Suffix:
    """vLLM's suffix decoding, its defaults, its response cache of `cached` requests (FIFO)."""

    name, async_scheduling = "suffix", False

    def __init__(self, max_model_len: int, max_num_seqs: int, cached: int):
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        config = vllm_config(
            SUFFIX_DEPTH,
            max_model_len,
            max_num_seqs,
            suffix_decoding_max_tree_depth=SUFFIX_DEPTH,
            suffix_decoding_max_cached_requests=cached,
            suffix_decoding_max_spec_factor=1.0,
            suffix_decoding_min_token_prob=0.1,
        )
        self.proposer = SuffixDecodingProposer(config)

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float:
        cached = self.proposer.suffix_cache.cached_requests
        previous = [any(f"e{epoch - 1}-p{p}-s{s}" in cached for s in range(corpus.samples)) for p in prompts]
        return sum(previous) / len(prompts)

    def propose(self, batch: BatchView, sampled):
        return self.proposer.propose(SUFFIX_DEPTH, batch, sampled)

    def finished(self, request) -> None:
        pass

    def memory_bytes(self) -> int:
        return int(self.proposer.suffix_cache._global_tree.estimate_memory())


class Ngram:
    """vLLM's n-gram proposer (prompt lookup), its defaults (n 5), k 8."""

    name, async_scheduling = "ngram", False

    def __init__(self, max_model_len: int, max_num_seqs: int):
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        config = vllm_config(NGRAM_K, max_model_len, max(max_num_seqs, 1024), prompt_lookup_min=5, prompt_lookup_max=5)
        self.proposer = NgramProposer(config)

    def visit(self, epoch, prompts, corpus) -> float:
        return 0.0

    def propose(self, batch: BatchView, sampled):
        return self.proposer.propose(NGRAM_K, sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)

    def finished(self, request) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0


def build(rule: str, corpus: Corpus, schedule: Schedule, curve: StepCurve, suffix_cache: int, params=None):
    """The proposer of `rule` (one of at_scale's RULES); `params`: lossless's (`LosslessParams`, as JSON)."""
    max_model_len = max(len(p) for p in corpus.prompts) + max(len(r) for e in corpus.responses for p in e for r in p)
    max_model_len += 64
    if rule == "off":
        return Stock()
    if rule == "lossless":
        return Lossless(max_model_len, schedule.max_num_seqs, curve, params)  # the curve's host column: a fixed cost
    if rule == "suffix":
        return Suffix(max_model_len, schedule.max_num_seqs, suffix_cache)
    return Ngram(max_model_len, schedule.max_num_seqs)
