"""The draft store at a regime's dataset (`draft_store`): the memory it needs to hold every prompt's last visit
between visits, by its own byte accounting (`simulator.visits.store_bytes`, scaled from the corpus's responses to the
regime's `dataset_prompts`), whether the run's default cap holds it, and, where it does not, the share of returning
prompts it still holds at a spacing (`visits.lru_held_share`): the others have no previous visit in the simulation.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..simulator.corpus import Corpus
from ..simulator.regime import Regime
from ..simulator.visits import lru_held_share, store_bytes


@dataclass(frozen=True)
class DraftStoreFit:
    """The draft store over a regime's dataset at one spacing (see the module's docstring)."""

    prompts: int  # the dataset's
    first_bytes: int  # a prompt's after its first visit
    later_bytes: int  # after a later one: the visit it claimed and its own, until its next opens
    cap_bytes: int  # the first turns' share of the default cap
    cap_gb: float  # --reuse.cache_max_gb's default
    between: int  # prompts visited between two visits of a prompt at the spacing

    @property
    def needed(self) -> int:
        return self.prompts * self.later_bytes

    @property
    def held_share(self) -> float:
        """The share of returning prompts whose last visit the store holds."""
        return lru_held_share(self.cap_bytes / max(self.later_bytes, 1), self.between)

    def describe(self) -> str:
        holds = (
            "holds every prompt's last visit"
            if self.held_share >= 1
            else f"holds {self.cap_bytes // self.later_bytes:,} prompts (LRU): {self.held_share:.0%} of returning "
            "prompts still find their last visit, the others have none in the simulation"
        )
        return (
            f"the draft store needs {self.needed / 2**30:.2f} GiB for {self.prompts:,} prompts between visits "
            f"({self.later_bytes / 2**10:.0f} KiB a prompt: two visits' responses, the claimed one kept until the "
            f"next opens; {self.first_bytes / 2**10:.0f} KiB after a first visit; DraftCache's accounting at the "
            f"corpus's responses); its default cap {self.cap_bytes / 2**30:.2f} GiB (--reuse.cache_max_gb "
            f"{self.cap_gb:g}, first turns' share) {holds}"
        )


def draft_store(corpus: Corpus, regime: Regime, spacing: int) -> DraftStoreFit:
    """The draft store over `regime`'s dataset with `corpus`'s responses, a prompt back after `spacing` RL steps (the
    prompts between two of its visits: the dataset's at the regime's own spacing, in proportion at another)."""
    first, later = store_bytes(corpus)
    cap_gb, cap = default_cap()
    between = max(1, round(regime.dataset_prompts * spacing / regime.steps_between_visits))
    return DraftStoreFit(regime.dataset_prompts, first, later, cap, cap_gb, between)


def default_cap() -> tuple[float, int]:
    """(--reuse.cache_max_gb's default, the bytes of it the first turns' drafts may take: the store's shards give the
    rest to follow-up turns)."""
    from ..config import ReuseConfig
    from ..integration.openrlhf.draft_store import FOLLOW_UP_SHARE

    config = ReuseConfig()
    return config.cache_max_gb, int(config.cache_max_bytes * (1 - FOLLOW_UP_SHARE))
