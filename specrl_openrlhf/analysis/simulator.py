"""A rollout simulator from recorded responses: a model-free proposer's engine steps, drafts and accepted tokens at RL
scale, with no model running.

Terminology:
- *corpus* (`Corpus`): responses recorded with stock generation, per epoch, prompt and sample, from a policy trained
  between epochs. An epoch's drafts come from the epoch before it.
- *coupling*: vLLM verifies a model-free draft one-hot (keep draft token y with probability p(y), else sample p
  without y), which has the law of "sample x from p; keep y if and only if x = y". So, given a response recorded from
  the policy, a proposer's accepted tokens at a step are its draft's longest prefix that agrees with the recorded
  continuation, and the row then takes the next recorded token (a rejection's resample, or the bonus token).
- *schedule* (`EngineSimulator`): vLLM's continuous batching, as its V1 scheduler and persistent batch run it. A
  step of the RL loop sends `prompts_per_step` prompts x n samples at once; the engine runs up to `max_num_seqs`
  rows, admits waiting requests first come first served as rows free up (their prompts prefilled within
  `max_num_batched_tokens`, after the decoding rows' tokens), and keeps rows in slots: a new request takes the lowest
  free slot and the last rows move down into the holes left (`InputBatch.condense`), as a proposer that follows rows
  by slot sees them. After every step the proposer gets each row's sampled tokens, tokens so far and token ids, and
  returns each row's draft, verified at the next step.
- *proposer* (`SimProposer`): what the simulator drives; the integration's adapters wrap the real ones.
- *record* (`StepRecord`): per engine step, its decoding rows and tokens carried, its prefill rows and tokens, the
  draft tokens it verified and accepted, and the wall time the proposer (and its history updates) took here.

Engine-free: numpy only. Pricing the records is `pricing.py`'s.
"""

from __future__ import annotations

import gc
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

CORPUS_FORMAT, CORPUS_VERSION = "specrl-corpus", 1


@dataclass(frozen=True)
class Corpus:
    """Responses recorded per epoch, prompt and sample (token ids), with the prompts they answer."""

    prompts: list[list[int]]  # [P]
    responses: list[list[list[list[int]]]]  # [E][P][n]
    meta: dict = field(default_factory=dict)  # how it was recorded

    def __post_init__(self):
        if not self.prompts or not self.responses:
            raise ValueError("a corpus needs prompts and at least one epoch of responses")
        for epoch in self.responses:
            if len(epoch) != len(self.prompts) or len({len(samples) for samples in epoch}) != 1:
                raise ValueError("a corpus epoch holds the same number of responses for every prompt")

    @property
    def epochs(self) -> int:
        return len(self.responses)

    @property
    def samples(self) -> int:
        return len(self.responses[0][0])

    def save(self, path: str | Path) -> None:
        """One `.npz` (token ids flat, with offsets), written to a temporary file then renamed."""
        sequences = [p for p in self.prompts] + [r for e in self.responses for p in e for r in p]
        lengths = np.array([len(s) for s in sequences], np.int64)
        header = {
            "format": CORPUS_FORMAT,
            "version": CORPUS_VERSION,
            "prompts": len(self.prompts),
            "epochs": self.epochs,
            "samples": self.samples,
            "meta": self.meta,
        }
        path = Path(path)
        tmp = path.with_suffix(".tmp.npz")
        np.savez_compressed(
            tmp,
            header=np.frombuffer(json.dumps(header).encode(), np.uint8),
            lengths=lengths,
            tokens=np.concatenate([np.asarray(s, np.int32) for s in sequences])
            if sequences
            else np.zeros(0, np.int32),
        )
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> Corpus:
        """A corpus file; a missing, corrupt or foreign one is one ValueError naming it and the fix."""
        fix = "delete it and run again to record it anew"
        try:
            with np.load(Path(path)) as data:
                header = json.loads(bytes(data["header"]).decode())
                arrays = {name: data[name] for name in ("lengths", "tokens") if name in data.files}
        except FileNotFoundError:
            raise ValueError(f"{path}: no such corpus file (scripts/bench_at_scale.py records one)") from None
        except Exception as error:
            raise ValueError(f"{path}: not a readable corpus ({type(error).__name__}: {error}); {fix}") from None
        if header.get("format") != CORPUS_FORMAT or header.get("version") != CORPUS_VERSION or len(arrays) != 2:
            found = header.get("format"), header.get("version")
            raise ValueError(f"{path}: not a corpus of version {CORPUS_VERSION} ({found}); {fix}")
        lengths, tokens = arrays["lengths"], arrays["tokens"]
        prompts, epochs, samples = header["prompts"], header["epochs"], header["samples"]
        if len(lengths) != prompts * (1 + epochs * samples) or lengths.sum() != len(tokens):
            raise ValueError(f"{path}: the corpus is truncated; {fix}")
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        sequences = [tokens[bounds[i] : bounds[i + 1]].tolist() for i in range(len(lengths))]
        it = iter(sequences[prompts:])
        responses = [[[next(it) for _ in range(samples)] for _ in range(prompts)] for _ in range(epochs)]
        return cls(sequences[:prompts], responses, header.get("meta", {}))


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """The RL loop and the engine: `prompts_per_step` prompts x the corpus's samples per RL step, every prompt once
    an epoch (in a seeded shuffle), on one engine of `max_num_seqs` rows."""

    max_num_seqs: int = 512
    prompts_per_step: int = 32
    max_num_batched_tokens: int = 8192
    seed: int = 0

    def __post_init__(self):
        for name in ("max_num_seqs", "prompts_per_step", "max_num_batched_tokens"):
            if (
                isinstance(getattr(self, name), bool)
                or not isinstance(getattr(self, name), int)
                or getattr(self, name) < 1
            ):
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")

    def steps_of(self, epoch: int, prompts: int) -> list[list[int]]:
        """The prompts of each RL step of an epoch."""
        order = list(range(prompts))
        random.Random(self.seed * 1000 + epoch).shuffle(order)
        return [order[i : i + self.prompts_per_step] for i in range(0, prompts, self.prompts_per_step)]


@dataclass
class Request:
    """One sample in flight: its recorded response, how much of its prompt is prefilled and of its response taken."""

    id: str
    prompt_index: int
    prompt: list[int]
    response: list[int]
    prefilled: int = 0
    taken: int = 0
    draft: list[int] = field(default_factory=list)  # proposed at the last step, verified at the next

    @property
    def finished(self) -> bool:
        return self.taken >= len(self.response)


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
        n = len(request.prompt)
        self.token_ids_cpu[slot, :n] = request.prompt
        self.num_tokens_no_spec[slot] = self.num_prompt_tokens[slot] = n

    def extend(self, slot: int, tokens: list[int]) -> None:
        n = int(self.num_tokens_no_spec[slot])
        self.token_ids_cpu[slot, n : n + len(tokens)] = tokens
        self.num_tokens_no_spec[slot] = n + len(tokens)


class SimProposer(Protocol):
    """What the simulator drives. `visit(step, prompts)`: an RL step's prompts start (the moment a rollout sends
    their histories); `propose(batch, sampled)`: every row's draft after an engine step, as vLLM asks; `finished`: a
    sample is done (its response joins its visit's history). `found_previous` is the share of the prompts of the last
    `visit` whose previous epoch the proposer holds."""

    name: str
    async_scheduling: bool

    def visit(self, epoch: int, prompts: list[int], corpus: Corpus) -> float: ...

    def propose(self, batch: BatchView, sampled: list[list[int]]) -> list[list[int]]: ...

    def finished(self, request: Request) -> None: ...


@dataclass
class StepRecord:
    decode_rows: int
    decode_tokens: int  # 1 + drafts per decoding row
    prefill_rows: int
    prefill_tokens: int
    drafted: int
    accepted: int
    proposer_s: float  # this machine's wall time of the proposer's `propose` after this step
    rl_step: int
    register_s: float = 0.0  # and of the history updates before it (a visit's start, finished samples)


@dataclass
class Simulation:
    """What a run of the simulator recorded: every engine step, per RL step the share of returning prompts whose
    previous epoch the proposer held, and the response tokens."""

    records: list[StepRecord] = field(default_factory=list)
    found_previous: list[float] = field(default_factory=list)
    response_tokens: int = 0

    def column(self, name: str) -> np.ndarray:
        return np.array([getattr(r, name) for r in self.records])

    @property
    def accepted(self) -> int:
        return int(self.column("accepted").sum()) if self.records else 0

    @property
    def kept(self) -> float:
        return self.accepted / max(self.response_tokens, 1)


class EngineSimulator:
    """Runs the corpus's epochs `first_epoch`.. through one engine and a proposer (`run`)."""

    def __init__(self, corpus: Corpus, schedule: Schedule, proposer: SimProposer, clock=time.perf_counter):
        self.corpus, self.schedule, self.proposer, self.clock = corpus, schedule, proposer, clock
        longest = max(len(p) for p in corpus.prompts) + max(len(r) for e in corpus.responses for p in e for r in p)
        self.max_len = longest + 64

    def run(self, first_epoch: int = 0, progress=None) -> Simulation:
        out = Simulation()
        rl_step = 0
        gc.collect()
        gc.disable()  # the simulator's own garbage is not the proposer's time: no collection lands in a timed call
        try:
            for epoch in range(first_epoch, self.corpus.epochs):
                for prompts in self.schedule.steps_of(epoch, len(self.corpus.prompts)):
                    self._rl_step(epoch, prompts, rl_step, out)
                    rl_step += 1
                    if progress is not None:
                        progress(rl_step)
        finally:
            gc.enable()
        return out

    def _rl_step(self, epoch: int, prompts: list[int], rl_step: int, out: Simulation) -> None:
        start = self.clock()
        found = self.proposer.visit(epoch, prompts, self.corpus)
        registering = self.clock() - start
        if epoch > 0:
            out.found_previous.append(found)
        waiting = [
            Request(f"e{epoch}-p{p}-s{s}", p, self.corpus.prompts[p], response)
            for p in prompts
            for s, response in enumerate(self.corpus.responses[epoch][p])
        ]
        out.response_tokens += sum(len(r.response) for r in waiting)
        batch = BatchView(self.schedule.max_num_seqs, self.max_len)
        done: set[str] = set()
        while True:
            admitted = []
            while waiting and len(batch.rows) - len(done) + len(admitted) < self.schedule.max_num_seqs:
                admitted.append(waiting.pop(0))
            batch.update(done, admitted)
            if not batch.rows:
                return
            budget = self.schedule.max_num_batched_tokens
            budget -= sum(1 + len(r.draft) for r in batch.rows if r.prefilled == len(r.prompt))
            record = self._engine_step(batch, budget, rl_step)
            out.records.append(record)
            done = {request.id for request in batch.rows if request.finished}
            start = self.clock()
            for request in batch.rows:
                if request.id in done:
                    self.proposer.finished(request)
            record.register_s, registering = registering + self.clock() - start, 0.0

    def _engine_step(self, batch: BatchView, budget: int, rl_step: int) -> StepRecord:
        """One engine step: decoding rows verify their drafts against their recorded continuations, prefills go on
        within the token budget; then the proposer drafts for the next step."""
        sampled: list[list[int]] = []
        decode_rows = decode_tokens = prefill_rows = prefill_tokens = drafted = accepted = 0
        for slot, request in enumerate(batch.rows):
            if request.prefilled < len(request.prompt):  # in prefill: as much of the prompt as the budget allows
                chunk = min(len(request.prompt) - request.prefilled, max(budget, 0))
                request.prefilled += chunk
                budget -= chunk
                prefill_rows += chunk > 0
                prefill_tokens += chunk
                if request.prefilled == len(request.prompt):  # the prefill's step samples the first token
                    taken = request.response[:1]
                    request.taken = len(taken)
                    batch.extend(slot, taken)
                    sampled.append(taken)
                else:
                    sampled.append([])
                continue
            draft, request.draft = request.draft, []
            position = request.taken
            ahead = request.response[position : position + len(draft)]
            a = 0
            while a < len(ahead) and ahead[a] == draft[a]:
                a += 1
            taken = request.response[position : position + a + 1]
            request.taken += len(taken)
            batch.extend(slot, taken)
            sampled.append(taken)
            decode_rows += 1
            decode_tokens += 1 + len(draft)
            drafted += len(draft)
            accepted += a
        start = self.clock()
        drafts = self.proposer.propose(batch, sampled)
        proposer_s = self.clock() - start
        for request, draft in zip(batch.rows, drafts):
            request.draft = [] if request.finished else list(draft)
        return StepRecord(
            decode_rows, decode_tokens, prefill_rows, prefill_tokens, drafted, accepted, proposer_s, rl_step
        )
