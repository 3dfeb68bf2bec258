"""Responses a run verified in the engine, verified again by our engine proposer's own code: what
`python -m specrl_openrlhf replay` keeps of `lossless`'s engine traces (`analysis.replay.replay_verified` takes
`engine_kept` as its `verify`).

Each visit runs in the simulator (`simulator.engine`) as one RL step of one prompt, its history (the responses the
engine drafted from) registered when it starts and its samples sent at once, through `HistoryProposer` as vLLM drives
it (`proposers.Lossless`): each sample drafts from the history and from its siblings in flight, and vLLM's one-hot
verification keeps of a recorded response, a sample of p_curr whatever was proposed, exactly the draft tokens it
agrees with. What a trace does not hold is left out: the prompt's text (a stand-in no response matches, so prompt
lookup finds nothing there), the other prompts in the engine (`shared` re-entries find none), and the step costs a
goodput budget prices slots on: it proposes as a static budget that keeps every slot, what it could keep at most.
"""

from __future__ import annotations

from dataclasses import replace

from ..policies.builtin import LosslessParams
from ..simulator.corpus import Corpus
from ..simulator.engine import EngineSimulator, Schedule
from .proposers import Lossless

STAND_IN = 1 << 30  # the stand-in prompt's token id: above any vocabulary, so no response holds it
STEP_TOKENS = 1 << 16  # a step carries every row's draft: no budget of tokens cuts one


class Counting(Lossless):
    """Our engine proposer, noting what each finished request kept and drafted."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.verified: dict[str, tuple[int, int]] = {}

    def finished(self, request) -> None:
        self.verified[request.id] = (request.accepted, request.drafted)
        super().finished(request)


def engine_kept(params: LosslessParams, visits: list[tuple[list, list]]) -> list[list[tuple[int, int]]]:
    """(kept, drafted) of each sample of every visit, its samples in order. A visit: (its history's responses, its
    samples' responses), token ids."""
    if params.budget == "goodput":  # slots are priced on step costs a trace does not hold: every slot
        params = replace(params, budget="static", min_accept_prob=0.0)
    out = []
    for history, samples in visits:
        if not samples:
            out.append([])
            continue
        corpus = Corpus([[STAND_IN] * 4], [[[list(r) for r in history]], [[list(r) for r in samples]]])
        longest = max(len(r) for r in [*history, *samples])
        schedule = Schedule(max_num_seqs=len(samples), prompts_per_step=1, max_num_batched_tokens=STEP_TOKENS)
        proposer = Counting(4 + longest + 64, schedule, None, params)
        EngineSimulator(corpus, schedule, proposer).run(first_epoch=1)
        out.append([proposer.verified[f"e1-p0-s{s}"] for s in range(len(samples))])
    return out
