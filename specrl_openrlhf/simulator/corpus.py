"""Corpora of recorded rollouts: what the simulator (`simulator.engine`) replays.

Terminology:
- *corpus* (`Corpus`): responses recorded with stock generation, per epoch, prompt and sample, from a policy trained
  between epochs. An epoch's drafts come from the epoch before it.
- *sampled log-probs* (`Corpus.logprobs`): each response token's log-prob under the policy that sampled it.
- *scoring pass* (`Corpus.scores`): epoch e - 1's responses scored by epoch e's policy, as a ratio rule's scoring
  requests read them.

Engine-free: numpy only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..staleness import scored_token_sums

CORPUS_FORMAT, CORPUS_VERSION = "specrl-corpus", 2  # 2: log-probs and the scoring pass; 1 still loads


@dataclass(frozen=True)
class Corpus:
    """Responses recorded per epoch, prompt and sample (token ids), with the prompts they answer; optionally each
    response token's log-prob as sampled (`logprobs`) and the scoring pass (`scores`): the log-probs of epoch e - 1's
    responses under epoch e's policy, what a ratio rule (`spec`, `exact`) reads when it verifies last epoch's drafts.
    `scores[0]` is empty (the first epoch has no drafts)."""

    prompts: list[list[int]]  # [P]
    responses: list[list[list[list[int]]]]  # [E][P][n] token ids
    meta: dict = field(default_factory=dict)  # how it was recorded
    logprobs: list[list[list[np.ndarray]]] = field(default_factory=list)  # [E][P][n] float32 [len(response)]
    scores: list[list[list[np.ndarray]]] = field(default_factory=list)  # [E][P][n] float32 [len(previous response)]

    def __post_init__(self):
        if not self.prompts or not self.responses:
            raise ValueError("a corpus needs prompts and at least one epoch of responses")
        for epoch in self.responses:
            if len(epoch) != len(self.prompts) or len({len(samples) for samples in epoch}) != 1:
                raise ValueError("a corpus epoch holds the same number of responses for every prompt")
        if self.logprobs and self._lengths(self.logprobs) != self._lengths(self.responses):
            raise ValueError("a corpus's log-probs must match its responses token for token")
        if self.scores and (
            len(self.scores) != self.epochs
            or any(len(first) for samples in self.scores[0] for first in samples)
            or self._lengths(self.scores[1:]) != self._lengths(self.responses[:-1])
        ):
            raise ValueError(
                "a corpus's scores hold, for each epoch after the first, one log-prob a token of the epoch before"
            )

    @staticmethod
    def _lengths(nested) -> list:
        return [[[len(r) for r in samples] for samples in epoch] for epoch in nested]

    @property
    def epochs(self) -> int:
        return len(self.responses)

    @property
    def samples(self) -> int:
        return len(self.responses[0][0])

    @property
    def scored(self) -> bool:
        """Whether the corpus holds what a ratio rule replays: sampled log-probs and the scoring pass."""
        return bool(self.logprobs) and bool(self.scores)

    def truncated(self, tokens: int) -> Corpus:
        """The corpus with every response cut at `tokens` (its log-probs and scores with it), as an engine whose
        `max_tokens` is `tokens` would have ended them."""
        longest = max(len(r) for epoch in self.responses for samples in epoch for r in samples)
        if longest <= tokens:  # nothing to cut: the recording's own budget stands
            return self

        def cut(nested):
            return [[[r[:tokens] for r in samples] for samples in epoch] for epoch in nested]

        meta = {**self.meta, "max_tokens": tokens}
        return Corpus(self.prompts, cut(self.responses), meta, cut(self.logprobs), cut(self.scores))

    def save(self, path: str | Path) -> None:
        """One `.npz` (token ids flat, with offsets; log-probs as float16 in the same order), written to a temporary
        file then renamed."""
        responses = [r for e in self.responses for p in e for r in p]
        sequences = [p for p in self.prompts] + responses
        lengths = np.array([len(s) for s in sequences], np.int64)
        header = {
            "format": CORPUS_FORMAT,
            "version": CORPUS_VERSION,
            "prompts": len(self.prompts),
            "epochs": self.epochs,
            "samples": self.samples,
            "meta": self.meta,
        }
        arrays = {"lengths": lengths, "tokens": _flat(sequences, np.int32)}
        if self.scored:
            arrays["logprobs"] = _flat([r for e in self.logprobs for p in e for r in p], np.float16)
            arrays["scores"] = _flat([r for e in self.scores[1:] for p in e for r in p], np.float16)
        path = Path(path)
        tmp = path.with_suffix(".tmp.npz")
        np.savez_compressed(tmp, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> Corpus:
        """A corpus file; a missing, corrupt or foreign one is one ValueError naming it and the fix."""
        fix = "delete it and run again to record it anew"
        try:
            with np.load(Path(path)) as data:
                header = json.loads(bytes(data["header"]).decode())
                names = ("lengths", "tokens", "logprobs", "scores")
                arrays = {name: data[name] for name in names if name in data.files}
        except FileNotFoundError:
            raise ValueError(f"{path}: no such corpus file (scripts/bench_at_scale.py records one)") from None
        except Exception as error:
            raise ValueError(f"{path}: not a readable corpus ({type(error).__name__}: {error}); {fix}") from None
        if header.get("format") != CORPUS_FORMAT or header.get("version") not in (1, CORPUS_VERSION):
            found = header.get("format"), header.get("version")
            raise ValueError(f"{path}: not a corpus of version {CORPUS_VERSION} ({found}); {fix}")
        if "lengths" not in arrays or "tokens" not in arrays:
            raise ValueError(f"{path}: the corpus has no token ids; {fix}")
        lengths, tokens = arrays["lengths"], arrays["tokens"]
        prompts, epochs, samples = header["prompts"], header["epochs"], header["samples"]
        if len(lengths) != prompts * (1 + epochs * samples) or lengths.sum() != len(tokens):
            raise ValueError(f"{path}: the corpus is truncated; {fix}")
        sequences = _split(tokens, lengths)
        shape = (epochs, prompts, samples)
        responses = _nest([s.tolist() for s in sequences[prompts:]], shape)
        logprobs, scores = [], []
        if "logprobs" in arrays and "scores" in arrays:
            response_lengths = lengths[prompts:]
            previous = response_lengths[: (epochs - 1) * prompts * samples]
            if arrays["logprobs"].size != response_lengths.sum() or arrays["scores"].size != previous.sum():
                raise ValueError(f"{path}: the corpus's log-probs are truncated; {fix}")
            logprobs = _nest([a.astype(np.float32) for a in _split(arrays["logprobs"], response_lengths)], shape)
            scored = [a.astype(np.float32) for a in _split(arrays["scores"], previous)]
            scored = _nest(scored, (epochs - 1, *shape[1:]))
            scores = [[[np.zeros(0, np.float32) for _ in range(samples)] for _ in range(prompts)], *scored]
        prompt_ids = [s.tolist() for s in sequences[:prompts]]
        return cls(prompt_ids, responses, header.get("meta", {}), logprobs, scores)


def _flat(sequences, dtype) -> np.ndarray:
    return np.concatenate([np.asarray(s, dtype) for s in sequences]) if sequences else np.zeros(0, dtype)


def _split(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [flat[bounds[i] : bounds[i + 1]] for i in range(len(lengths))]


def _nest(items: list, shape: tuple[int, int, int]) -> list:
    it = iter(items)
    return [[[next(it) for _ in range(shape[2])] for _ in range(shape[1])] for _ in range(shape[0])]


REPEAT_GRAM = 8  # a token inside an 8-gram its response repeats is a loop's, which any proposer drafts trivially


def repeated_tokens(response) -> int:
    """How many of a response's tokens lie inside an n-gram (n = `REPEAT_GRAM`) that occurs twice or more in it."""
    n, seen = len(response), {}
    marked = np.zeros(n, bool)
    for i in range(n - REPEAT_GRAM + 1):
        gram = tuple(response[i : i + REPEAT_GRAM])
        first = seen.setdefault(gram, i)
        if first != i:
            marked[first : first + REPEAT_GRAM] = marked[i : i + REPEAT_GRAM] = True
    return int(marked.sum())


PAPER_LENIENCES = (1.0, 1.2214, 1.6487, 2.2255, 7.389)  # the paper's lenience ablation: 1, e^0.2, e^0.5, e^0.8, e^2
CERTAIN_SURPRISAL = 0.01  # nats: a token the policy was all but sure of


def quality(corpus: Corpus) -> dict[str, float]:
    """What a corpus is like: mean response tokens, overall and by epoch (`mean_tokens_epoch{e}`), and the largest
    change of an epoch's mean from the epoch before (`epoch_length_step`, a share of the earlier one: a policy that
    breaks between two visits shows here), the share of responses cut at the token limit (`max_tokens` in its meta;
    NaN where it is not recorded), the share of tokens inside a repeated 8-gram, the share of distinct
    responses in a prompt's group (`distinct_share`, mean over visits), and with log-probs and a scoring pass:
    - the policy's entropy as sampled: the share of tokens with surprisal (-log p as sampled) below 0.01 nats, the
      80th percentile and the mean of surprisal;
    - how far the policy drifted into each epoch e >= 1: `kl_epoch{e}`, the staleness meter's KL(p_prev || p_curr) a
      token (`reuse/kl_prev_curr`) over epoch e - 1's responses;
    - `kept_spec@{lenience}` for the paper's leniences (`PAPER_LENIENCES`): the share of the drafted epochs' tokens
      a ratio rule keeps (`spec_kept`)."""
    responses = [r for e in corpus.responses for p in e for r in p]
    lengths = np.array([len(r) for r in responses])
    limit = corpus.meta.get("max_tokens")
    figures = {
        "mean_tokens": float(lengths.mean()),
        "cut_share": float((lengths >= limit).mean()) if limit else float("nan"),
        "repeated_share": sum(repeated_tokens(r) for r in responses) / max(int(lengths.sum()), 1),
        "distinct_share": float(np.mean([len({tuple(r) for r in p}) / len(p) for e in corpus.responses for p in e])),
    }
    by_epoch = [float(np.mean([len(r) for p in e for r in p])) for e in corpus.responses]
    figures.update({f"mean_tokens_epoch{e}": mean for e, mean in enumerate(by_epoch)})
    steps = [abs(b - a) / a for a, b in zip(by_epoch, by_epoch[1:]) if a > 0]
    figures["epoch_length_step"] = max(steps, default=0.0)
    if corpus.scored:
        surprisal = -np.concatenate([lp for e in corpus.logprobs for p in e for lp in p])
        figures[f"surprisal_below_{CERTAIN_SURPRISAL}"] = float((surprisal < CERTAIN_SURPRISAL).mean())
        figures["surprisal_p80"] = float(np.percentile(surprisal, 80))
        figures["surprisal_mean"] = float(surprisal.mean())
        for e in range(1, corpus.epochs):
            scored = np.concatenate([s for samples in corpus.scores[e] for s in samples])
            drafted = np.concatenate([lp for samples in corpus.logprobs[e - 1] for lp in samples])
            kl_sum = scored_token_sums(drafted, scored, drafted, lenience=None)["kl_sum"]
            figures[f"kl_epoch{e}"] = kl_sum / max(len(scored), 1)
        for lenience in PAPER_LENIENCES:
            figures[f"kept_spec@{lenience:g}"] = spec_kept(corpus, lenience)
    return figures


def spec_kept(corpus: Corpus, lenience: float) -> float:
    """The share of the drafted epochs' (e >= 1) response tokens that the ratio rule `spec@lenience` keeps in
    expectation: token i of the draft (epoch e - 1's response of the same prompt and sample) is accepted with
    probability a_i = min(1, lenience * p_curr_i / p_prev_i) (p_prev as sampled, p_curr the scoring pass), and the
    kept prefix runs to the first rejection, so a draft keeps sum_i prod_{j <= i} a_j tokens. A response's length is
    the request path's replay's (`request_plans.CutPlans`): cut at i, i kept tokens and what the recorded response
    holds past them (at least one); kept whole, the draft where it ended (shorter than `max_tokens`), else the longer
    of the draft and the recorded response."""
    limit = corpus.meta.get("max_tokens") or float("inf")
    kept = total = 0.0
    for e in range(1, corpus.epochs):
        for p, samples in enumerate(corpus.scores[e]):
            for s, p_curr in enumerate(samples):
                p_prev = corpus.logprobs[e - 1][p][s].astype(np.float64)
                log_accept = np.minimum(np.log(lenience) + p_curr.astype(np.float64) - p_prev, 0.0)
                survive = np.exp(np.cumsum(log_accept))  # [n] the chance that tokens 0..i are all accepted
                recorded, drafted = len(corpus.responses[e][p][s]), len(p_curr)
                if not drafted:
                    total += recorded
                    continue
                cut_at = np.concatenate([[1.0], survive[:-1]]) - survive  # [n] the chance that token i is rejected
                whole_length = drafted if drafted < limit else max(drafted, recorded)
                kept += float(survive.sum())
                total += float(cut_at @ np.maximum(recorded, np.arange(1, drafted + 1))) + survive[-1] * whole_length
    return float(kept / total) if total else float("nan")  # NaN: no epoch has drafts
