"""The requests a simulated RL step sends to the engine, and each one's state in flight (`simulator.engine` runs
them).

Terminology:
- *request* (`Request`): a prompt and its recorded response, how much of its prompt is prefilled (a chunk at a time
  within the step's token budget) and of its response taken, the draft it is to verify, and, after a preemption, the
  response tokens it prefills again with its prompt.
- *workload* (`Workload`): the requests an RL step sends (`Samples`: each prompt's n samples, for the engine path and
  stock), and the ones a finished request sends after it (the request path's continuation after its scoring).
- *prefix cache* (vLLM's `enable_prefix_caching`): a request's prompt tokens in it (`Request.cached`, whole
  `BLOCK_TOKENS` blocks, never the last token: `cached_tokens`) are not prefilled. vLLM caches a block when it
  allocates it, so a prompt's n samples sent together prefill it once: the first computes it, its siblings read its
  whole blocks (`samples_of`), even when admitted in the same step.

Engine-free: stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .corpus import Corpus

BLOCK_TOKENS = 16  # vLLM's GPU KV-cache block: the prefix cache serves whole blocks


@dataclass
class Request:
    """One request in flight: its prompt and recorded response, how much of its prompt is prefilled and of its
    response taken. `cached`: prompt tokens read from the prefix cache (never prefilled); `prompt_logprobs`: its
    prefill computes every prompt token's log-prob (a scoring request); `restored`: response tokens taken before a
    preemption, prefilled again with the prompt."""

    id: str
    prompt_index: int
    prompt: list[int]
    response: list[int]
    prefilled: int = 0
    taken: int = 0
    draft: list[int] = field(default_factory=list)  # proposed at the last step, verified at the next
    cached: int = 0
    prompt_logprobs: bool = False
    restored: int = 0
    admitted: int = -1  # when the engine admitted it (its order in vLLM's running queue)
    drafted: int = 0  # draft tokens it verified
    accepted: int = 0  # of them, those it kept

    def __post_init__(self):
        self.prefilled = max(self.prefilled, min(self.cached, len(self.prompt)))

    @property
    def finished(self) -> bool:
        return self.taken >= len(self.response)

    @property
    def to_prefill(self) -> int:
        """Tokens its prefill covers: the prompt, and after a preemption what it had taken."""
        return len(self.prompt) + self.restored

    @property
    def context(self) -> int:
        """Tokens it holds in the KV cache."""
        return self.prefilled + (self.taken - self.restored if self.prefilled >= self.to_prefill else 0)

    def preempt(self) -> None:
        """Its KV cache is freed: it waits to prefill its prompt and what it has taken again."""
        self.restored, self.prefilled, self.cached, self.draft = self.taken, 0, 0, []


class Workload(Protocol):
    """The requests of an RL step (`requests`), and those a finished request sends after it (`followups`); `kept`:
    the response tokens the workload kept from drafts outside the engine (the request path's verified prefixes)."""

    kept: int

    def requests(self, epoch: int, prompts: list[int], corpus: Corpus) -> list[Request]: ...

    def followups(self, request: Request) -> list[Request]: ...


def cached_tokens(shared: int, length: int) -> int:
    """Prompt tokens a request of `length` reads from the prefix cache when `shared` of them are there: whole blocks,
    short of its last token (vLLM computes at least that one)."""
    return BLOCK_TOKENS * (min(shared, length - 1) // BLOCK_TOKENS)


def samples_of(tag: str, prompt_index: int, prompt: list[int], responses: list[list[int]]) -> list[Request]:
    """A prompt's samples sent together: the first prefills the prompt, its siblings read its whole blocks."""
    shared = cached_tokens(len(prompt), len(prompt))
    return [
        Request(f"{tag}-s{s}", prompt_index, prompt, response, cached=shared if s else 0)
        for s, response in enumerate(responses)
    ]


class Samples:
    """The default workload: every prompt's recorded responses as samples, sent at once."""

    kept = 0

    def requests(self, epoch: int, prompts: list[int], corpus: Corpus) -> list[Request]:
        return [
            r for p in prompts for r in samples_of(f"e{epoch}-p{p}", p, corpus.prompts[p], corpus.responses[epoch][p])
        ]

    def followups(self, request: Request) -> list[Request]:
        return []
