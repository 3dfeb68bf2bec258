"""The proposers as the simulator (`simulator.engine`) drives them, as vLLM drives them: our engine proposer
(`HistoryProposer`, its histories registered as the rollout registers them: the prompt's previous epoch when its visit
starts, each finished sample after), vLLM's `SuffixDecodingProposer` (arctic-inference's cache) and `NgramProposer`,
each built from a stand-in of the `VllmConfig` fields it reads and called with the simulator's stand-in of the
persistent batch (`BatchView`); stock drafts nothing and keeps vLLM's async scheduling. Which one a rule runs is what
the rule says of itself (`method`): the speculative config its engines get (`ReusePolicy.engine_arguments`).

Between two visits of the returning prompts each takes what its cache holds of the other requests an engine served
(`between_visits`, `simulator.visits.OtherRequests`): vLLM's suffix decoding the last `suffix_decoding_max_cached_
requests` responses (FIFO), ours every other visit as the rollout registers it (its previous visit too), the arena
rebuilt past `history_mb` as the engine's is; stock and the n-gram proposer keep nothing across requests.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from ..policies import ReusePolicy
from ..policies.builtin import HISTORY_PROPOSER, LosslessParams
from ..pricing.curves import StepCurve
from ..simulator.batch import BatchView
from ..simulator.corpus import Corpus
from ..simulator.engine import Schedule
from ..simulator.requests import Request
from ..simulator.visits import OtherRequests, StoreHeld

SUFFIX_DEPTH, NGRAM_K = 24, 8  # vLLM's defaults (suffix: its tree's depth and k; n-gram: our k)
SUFFIX_CACHED = 10_000  # vLLM's suffix_decoding_max_cached_requests default: responses an engine keeps, FIFO
REMEMBERING = (
    "lossless",
    "lossless_v2",
    "suffix",
    "suffix_v2",
)  # methods whose proposer keeps other requests' responses: the spacing matters


def vllm_config(k: int, max_model_len: int, max_num_seqs: int, max_num_batched_tokens=0, **speculative):
    """The fields of vLLM's `VllmConfig` the proposers read (`max_num_batched_tokens` 0: not read)."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, **speculative),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )


class Stock:
    name, async_scheduling = "off", True

    def between_visits(self, others) -> None:
        pass

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
    from the draft store (`store`: which the store still holds), and each finished sample's response after it.
    `params`: the rule's, its budget priced on `curve` (None: the rule's own `cost_curve`) at `cost_scale` of the
    GPU's rows a row, its `history_mb` over `cost_scale` (a simulated response stands for `cost_scale`)."""

    name, async_scheduling = "lossless", False

    def __init__(
        self,
        max_model_len: int,
        schedule: Schedule,
        curve: StepCurve | None,
        params: LosslessParams,
        cost_scale=1,
        store: StoreHeld | None = None,
    ):
        from ..cache import prompt_key
        from ..integration.vllm.histories import params_message
        from ..integration.vllm.v1 import board as boards
        from ..integration.vllm.v1.proposer import HistoryProposer

        boards.BOARD = self.board = boards.HistoryBoard()
        self.key, self.store = prompt_key, store or StoreHeld()
        priced = params.cost_curve if curve is None else curve.as_data()
        budget = max(1, math.ceil(params.history_mb / cost_scale))
        rule = replace(params, cost_curve=priced, cost_scale=cost_scale, history_mb=budget)
        self.params = params_message(rule)
        config = vllm_config(
            rule.num_speculative_tokens, max_model_len, schedule.max_num_seqs, schedule.max_num_batched_tokens
        )
        self.proposer = HistoryProposer(config)
        self.keys: dict[int, bytes] = {}

    def between_visits(self, others: OtherRequests) -> None:
        """The gap's last other visits whose tokens fit in `history_mb` (`Arena.BYTES_PER_NODE` a token: the arena
        holds no more of them, less where a trie shares prefixes), each registered as the rollout registers it (its
        previous visit at its start, then its responses) and drained as the engine drains between steps: past the
        budget the board rebuilds from the newest, as the engine's does."""
        from ..integration.vllm.v1.arena import Arena

        room, tail = self.params["history_mb"] * (1 << 20) // Arena.BYTES_PER_NODE, []
        for other in others.newest_first():
            room -= sum(len(r) for r in other.previous + other.responses)
            if room < 0:
                break
            tail.append(other)
        for other in reversed(tail):
            responses = other.previous + other.responses
            key = self.key([-1, *other.key.encode()])  # a digest no prompt gives (token ids are never negative)
            self.board.update(key, len(other.prompt), True, self.params, responses, [None] * len(responses))
            self._drain()

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float:
        for p in prompts:
            key = self.keys.setdefault(p, self.key(corpus.prompts[p]))
            previous = self.store.previous(corpus, epoch, p)
            self.board.update(key, len(corpus.prompts[p]), True, self.params, previous, [None] * len(previous))
        self._drain()  # as the proposer would before its next step (timed with the visit)
        held = [self.board.slots.get(self.keys[p]) for p in prompts]
        return sum(slot is not None and bool(slot.responses) for slot in held) / len(prompts)

    def _drain(self) -> None:
        self.board.drain(set())
        while self.board.pending:
            self.board.drain(set())

    def propose(self, batch: BatchView, sampled):
        return self.proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)

    def finished(self, request: Request) -> None:
        key = self.keys[request.prompt_index]
        self.board.update(key, len(request.prompt), False, self.params, [request.response], [None])

    def memory_bytes(self) -> int:
        """The histories' memory: the arena's arrays."""
        return self.board.arena.nbytes


class Suffix:
    """vLLM's suffix decoding, its response cache of `cached` requests (FIFO) unless `config` names its own; the rest
    of `config` (the rule's speculative config) as given, vLLM's defaults elsewhere."""

    name, async_scheduling = "suffix", False

    def __init__(self, max_model_len: int, max_num_seqs: int, cached: int, config: dict | None = None):
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        given = {k: v for k, v in (config or {}).items() if k.startswith("suffix_decoding_")}
        settings = {
            "suffix_decoding_max_tree_depth": SUFFIX_DEPTH,
            "suffix_decoding_max_cached_requests": cached,
            "suffix_decoding_max_spec_factor": 1.0,
            "suffix_decoding_min_token_prob": 0.1,
        } | given
        self.k = int((config or {}).get("num_speculative_tokens", settings["suffix_decoding_max_tree_depth"]))
        self.proposer = SuffixDecodingProposer(vllm_config(self.k, max_model_len, max_num_seqs, **settings))

    def between_visits(self, others: OtherRequests) -> None:
        """The gap's last responses its FIFO holds, each a request started, answered and stopped: where the gap holds
        more than the FIFO, nothing before it is left, so a fresh cache takes them."""
        cache = self.proposer.suffix_cache
        held = cache.max_cached_requests
        if others.responses >= held:
            cache = self.proposer.suffix_cache = type(cache)(cache.max_tree_depth, held)
        for other in others.tail(held):
            prompt = np.asarray(other.prompt, np.int32)
            for s, response in enumerate(other.responses):
                request = f"{other.key}-s{s}"
                cache.start_request(request, prompt)
                cache.add_active_response(request, np.asarray(response, np.int32))
                cache.stop_request(request)

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float:
        cached = self.proposer.suffix_cache.cached_requests
        previous = [any(f"e{epoch - 1}-p{p}-s{s}" in cached for s in range(corpus.samples)) for p in prompts]
        return sum(previous) / len(prompts)

    def propose(self, batch: BatchView, sampled):
        return self.proposer.propose(self.k, batch, sampled)

    def finished(self, request) -> None:
        pass

    def memory_bytes(self) -> int:
        return int(self.proposer.suffix_cache._global_tree.estimate_memory())


class Ngram:
    """vLLM's n-gram proposer (prompt lookup), the rule's speculative config, vLLM's defaults elsewhere (n 5), k 8."""

    name, async_scheduling = "ngram", False

    def __init__(self, max_model_len: int, max_num_seqs: int, config: dict | None = None):
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        config = config or {}
        low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        low, high = low or high or 5, high or low or 5  # as vLLM's `SpeculativeConfig` fills them in
        self.k = int(config.get("num_speculative_tokens", NGRAM_K))
        settings = vllm_config(
            self.k, max_model_len, max(max_num_seqs, 1024), prompt_lookup_min=low, prompt_lookup_max=high
        )
        self.proposer = NgramProposer(settings)

    def between_visits(self, others) -> None:
        pass

    def visit(self, epoch, prompts, corpus) -> float:
        return 0.0

    def propose(self, batch: BatchView, sampled):
        return self.proposer.propose(self.k, sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)

    def finished(self, request) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0


def method(policy: ReusePolicy) -> str | None:
    """The engine proposer `policy` verifies with, by the speculative config it gives its engines: "lossless" (ours),
    "suffix" (vLLM <= 0.33's), "suffix_v2" (vLLM 0.34's GPU speculator) or "ngram" (vLLM's); None: it verifies
    nothing in the engine. A ValueError names any other (a draft
    model's method: the simulator drives model-free proposers only)."""
    if not policy.verifies_in_engine:
        return None
    config = policy.engine_arguments().get("speculative_config") or {}
    if config.get("method") == "custom_class" and config.get("model") == HISTORY_PROPOSER:
        return "lossless_v2" if policy.params.runs_on == "v2" else "lossless"  # V2: vLLM >= 0.34's runner
    if config.get("method") == "suffix" and getattr(policy.params, "runs_on", "v1") == "v2":
        return "suffix_v2"  # vLLM 0.34's GPU speculator (`suffix_v2`)
    if config.get("method") in ("suffix", "ngram"):
        return config["method"]
    raise ValueError(
        f"rule {policy.describe()} verifies in the engine with {config.get('method') or 'no speculative config'}, "
        "which the simulator can't drive: it runs model-free proposers only (lossless, suffix, ngram)"
    )


def build(
    policy: ReusePolicy,
    corpus: Corpus,
    schedule: Schedule,
    curve: StepCurve,
    suffix_cache: int,
    cost_scale=1,
    store: StoreHeld | None = None,
):
    """The engine proposer of `policy` (`method`; stock where it has none) for `corpus` on `schedule`: ours with its
    budget priced on `curve` at `cost_scale` and its previous visits from the draft store (`store`), vLLM's suffix
    decoding with `suffix_cache` cached responses unless its config names a number, the V2 GPU speculators (ours,
    `speculator_v2.build_lossless_v2`, and vLLM 0.34's suffix decoding, `suffix_v2.build_suffix_v2`) with their
    memory at `cost_scale` and their adaptive verification priced on `curve`."""
    max_model_len = max(len(p) for p in corpus.prompts) + max(len(r) for e in corpus.responses for p in e for r in p)
    max_model_len += 64
    kind = method(policy)
    if kind is None:
        return Stock()
    if kind == "lossless":  # the curve's host column: a fixed cost
        return Lossless(max_model_len, schedule, curve, policy.params, cost_scale, store)
    if kind == "lossless_v2":
        from .speculator_v2 import build_lossless_v2

        return build_lossless_v2(policy.params, max_model_len, schedule.max_num_seqs, curve, cost_scale, store)
    config = policy.params.speculative_config
    if kind == "suffix_v2":
        from .suffix_v2 import build_suffix_v2

        return build_suffix_v2(policy.params, curve, cost_scale)
    if kind == "suffix":
        return Suffix(max_model_len, schedule.max_num_seqs, suffix_cache, config)
    return Ngram(max_model_len, schedule.max_num_seqs, config)
