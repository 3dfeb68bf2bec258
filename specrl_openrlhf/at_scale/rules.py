"""The rules a bench runs (`--rules`), spelled as `--rollout_reuse` takes them (`config.parse_rule`): a registered
name (`spec`, `lossless`, a plugin's), `NAME@LENIENCE` or `path/rule.py:Class`, each with `,key=value` parameters
(`lossless,verify=requests`, `lossless,history_mb=2048`), comma-separated (`references.split_rules`).

Each is routed by what its policy says of itself, not by its name (`BenchRule.path`): a rule that verifies in the
engine runs its engine proposer there (`proposers.method`: ours for `lossless`, vLLM's for `suffix`, `ngram` and
`vllm` with either method), one that drafts nothing is stock (`off`), every other runs on the request path
(`simulator.request_workload`: through its own `cut`, or, for `lossless`, the coupling). A rule's label in tables and
RESULT lines is its spelling as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..config import parse_rule
from ..policies import ReusePolicy
from ..simulator.corpus import Corpus
from ..simulator.engine import Schedule
from ..simulator.request_workload import request_workload
from .proposers import method

STOCK = "off"  # the label every rule is projected against
# each engine proposer's vLLM, as tables name it, and its runner, as RESULT lines do (`engine_fields`)
ENGINES = {
    "lossless": "vLLM <= 0.33, V1",
    "lossless_v2": "vLLM >= 0.34, V2 GPU",
    "suffix": "vLLM <= 0.33, V1",
    "suffix_v2": "vLLM 0.34, V2 GPU",
}


@dataclass(frozen=True)
class BenchRule:
    """A rule of `--rules`: its spelling (`label`), its policy, and where it runs: `path` ("stock", "engine" or
    "requests") and, on the engine path, its proposer (`method`: "lossless" (ours, vLLM <= 0.33's V1 runner),
    "lossless_v2" (ours, vLLM >= 0.34's V2 runner), "suffix" (vLLM <= 0.33's), "suffix_v2" (vLLM 0.34's GPU
    speculator) or "ngram")."""

    label: str
    policy: ReusePolicy
    path: Literal["stock", "engine", "requests"]
    method: str | None = None

    def drafts_on_price(self, eager: bool) -> bool:
        """Whether what it verifies depends on the step price, in an engine with CUDA graphs or without (`eager`): our
        V1 proposer's budget, and vLLM's adaptive verification (`suffix,engine=v2,adaptive=on`, `lossless,engine=v2`),
        which an engine without CUDA graphs does not run."""
        return self.method == "lossless" or (self.adaptive_verification and not eager)

    @property
    def adaptive_verification(self) -> bool:
        """Whether it asks for vLLM's adaptive verification (`suffix,engine=v2` and `lossless,engine=v2`
        unless `adaptive=off`): what it verifies then depends on whether the engine has CUDA graphs, even where no
        price does."""
        return self.method in ("suffix_v2", "lossless_v2") and self.policy.params.adaptive != "off"

    @property
    def runs_on(self) -> str:
        """Where it runs, as a table names it: the path, and for vLLM's suffix decoding the vLLM it is."""
        peer = ENGINES.get(self.method or "")
        return f"{self.path} ({peer})" if peer else self.path

    @property
    def proposer_key(self) -> str | None:
        """The name the engine benchmarks read this proposer's measured cost by (`pricing.measured.rule_cost`), where
        the rule is that proposer as registered (its label is the name); else None: its cost is its own."""
        return self.method if self.label == self.method else None


def bench_rule(label: str) -> BenchRule:
    """`label` parsed and routed (a fresh policy each time: a stateful rule starts afresh); a ValueError names
    `--rules`, the spelling and the fix."""
    if label.startswith("lossless:"):  # the spelling before the config's
        raise ValueError(f"--rules {label}: write the config's spelling, lossless,verify=requests (,draft=own ...)")
    try:
        policy = parse_rule(label, flag="--rules")
        kind = method(policy)
    except (ValueError, TypeError) as error:  # an unknown name, a plugin that fails, a bad parameter
        text = str(error)
        raise ValueError(text if text.startswith("--rules") else f"--rules {label}: {text}") from None
    path = "engine" if kind else "stock" if policy.draft_age == 0 else "requests"
    return BenchRule(label, policy, path, kind)


def bench_rules(labels: list[str], corpus: Corpus | None = None) -> list[BenchRule]:
    """Every rule of `labels` parsed and routed, stock among them and none twice, and each request-path rule checked
    against `corpus` where given (one that reads what the corpus lacks: named); a ValueError says what to change."""
    if STOCK not in labels:
        raise ValueError(
            f"--rules takes off (stock, what every rule is projected against) and any rules --rollout_reuse takes "
            f"(NAME, NAME@LENIENCE, path/rule.py:Class, each with ,key=value parameters), got {','.join(labels)}"
        )
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ValueError(f"--rules names {', '.join(twice)} twice; a rule's spelling is its label: give it once")
    rules = [bench_rule(label) for label in labels]
    for rule in rules:
        if corpus is not None and rule.path == "requests":
            try:
                request_workload(rule.policy, corpus)
            except ValueError as error:
                raise ValueError(f"--rules {rule.label}: {error}") from None
    if any(rule.method == "suffix" for rule in rules):
        from ..miniature.gpu_smoke import suffix_installed

        if not suffix_installed():
            raise ValueError("--rules suffix needs arctic-inference's suffix tree: bash scripts/install.sh builds it")
    return rules


def engine_fields(rules: list[BenchRule]) -> str:
    """`engine[RULE]=v1|v2` for a RESULT line: the runner each rule verified in the engine ran on (v1: vLLM <= 0.33's,
    proposers on the host; v2: vLLM >= 0.34's, speculators on the GPU), so that a script tells the two engines' rows
    apart whatever the label."""
    return " ".join(
        f"engine[{r.label}]={'v2' if r.method.endswith('_v2') else 'v1'}" for r in rules if r.method in ENGINES
    )


def step_history_bytes(corpus: Corpus, schedule: Schedule) -> int:
    """The arena bytes the largest RL step's previous-epoch histories take (`Arena.BYTES_PER_NODE` a token)."""
    from ..integration.vllm.v1.arena import Arena

    largest = 0
    for epoch in range(1, corpus.epochs):
        for prompts in schedule.steps_of(epoch, len(corpus.prompts)):
            tokens = sum(len(r) for p in prompts for r in corpus.responses[epoch - 1][p])
            largest = max(largest, tokens)
    return largest * Arena.BYTES_PER_NODE


def history_budget_error(rules: list[BenchRule], corpus: Corpus, schedule: Schedule) -> str | None:
    """Where our engine proposer's `history_mb` can't hold one RL step's histories, what to write instead."""
    needed = step_history_bytes(corpus, schedule)
    for rule in rules:
        budget = rule.policy.params.history_mb if rule.method == "lossless" else math.inf  # V2: its own slots
        if needed > budget * 2**20:
            return (
                f"--rules {rule.label}: history_mb={budget} is too small for one RL step's histories "
                f"({needed / 2**20:.1f} MiB); raise it to {math.ceil(needed / 2**20)} or more"
            )
    return None
