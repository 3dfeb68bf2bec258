"""How far one scoring request reaches into a draft, for rules whose first rejection decides the cut: the chunk that
costs least at this engine's recent rejection rate (`ChunkSchedule`), and a margin past where the rule forecasts its
cut (`CutForecast`). `scoring.DraftScorer` asks them; core module: numpy only.
"""

from __future__ import annotations

import numpy as np


class ChunkSchedule:
    """How many draft tokens one scoring request covers, for rules whose first rejection decides the cut.

    Such a rule needs p_curr only up to the first rejection. Drafts are scored in chunks; a chunk that is all
    accepted is followed by the next, and the prefix cache serves each later chunk its prompt and earlier chunks.
    A chunk too long scores tokens past the rejection; one too short pays many round trips, each costing about
    `round_trip_tokens` scored tokens (the partial cache block it computes again, and its wait for a sequence slot).
    With rejections at this engine's recent rate q per examined token, a chunk of c tokens costs
    (c + round_trip_tokens) / (1 - (1 - q)^c) per draft; the chunk is the c that costs least. With little drift the
    best chunk outgrows any draft, and a draft is scored in one request, as without chunks.
    """

    LONGEST = 1 << 16  # a best chunk this long means: the whole draft in one request
    CANDIDATES = np.unique(np.minimum(np.round(1.08 ** np.arange(146)), LONGEST).astype(np.int64))  # 1 .. LONGEST

    def __init__(self, round_trip_tokens: float = 64.0, half_life_tokens: float = 16384.0):
        if not (round_trip_tokens >= 0 and half_life_tokens > 0):
            raise ValueError(
                f"bad chunk schedule: round_trip_tokens={round_trip_tokens}, half_life_tokens={half_life_tokens}"
            )
        self.round_trip_tokens, self.half_life_tokens = float(round_trip_tokens), float(half_life_tokens)
        self.rejections = 0.0  # decayed counts over recently examined tokens
        self.tokens = 0.0
        self._best: int | None = None  # cached until the next observation

    def chunk(self) -> int | None:
        """Draft tokens for the next request, or None for the whole rest of the draft."""
        if self.rejections <= 0.0:
            return None
        if self._best is None:
            q = min(1.0, self.rejections / self.tokens)
            candidates = self.CANDIDATES
            with np.errstate(divide="ignore"):
                reached = -np.expm1(candidates * np.log1p(-q))  # P(a rejection within c tokens)
            self._best = int(candidates[np.argmin((candidates + self.round_trip_tokens) / reached)])
        return None if self._best >= self.LONGEST else self._best

    def observe(self, examined: int, rejected: bool) -> None:
        """One cut draft: the tokens the rule examined (up to and including its first rejection)."""
        decay = 0.5 ** (examined / self.half_life_tokens)
        self.tokens = self.tokens * decay + examined
        self.rejections = self.rejections * decay + float(rejected)
        self._best = None


class CutForecast:
    """Where a rule will cut a draft, asked of the rule itself with p_prev standing in for p_curr where the draft is
    not scored yet, and how far past that forecast a scoring chunk should reach.

    The uniforms are drawn before scoring, so a rule such as `lossless` (keep y_i iff u_i <= p_curr(y_i)) tells where
    it would cut if the policy had not moved: a chunk that ends a margin past that forecast scores few tokens past
    the real cut and rarely needs a second request. The margin is the one that would have cost least on the drafts
    cut most recently: the tokens it scores plus `round_trip_tokens` for each draft it leaves short (see
    `ChunkSchedule`). Among the margins is "the whole draft", so a rule whose forecast says nothing (`spec`, which
    keeps every draft whose policy did not move) costs no more than without one.
    """

    MARGINS = np.array([0, 1, 2, 4, 8, 16, 32, 64, ChunkSchedule.LONGEST], np.int64)
    MIN_RECORDS = 32  # before this many cut drafts, the chunk schedule alone decides
    SAMPLE_EVERY = 8  # while the whole draft is the best margin, one request in this many still forecasts

    def __init__(self, round_trip_tokens: float = 64.0, window: int = 512):
        if not (round_trip_tokens >= 0 and window >= self.MIN_RECORDS):
            raise ValueError(f"bad cut forecast: round_trip_tokens={round_trip_tokens}, window={window}")
        self.round_trip_tokens = float(round_trip_tokens)
        self.records = np.zeros((int(window), 4), np.int64)  # rows: forecast cut, start, tokens needed, draft length
        self.count = 0
        self._margin: int | None = None  # cached until the next observation
        self._asked = 0

    def wanted(self) -> bool:
        """Whether to forecast for the next scoring request. Not while the whole draft is the best margin (a rule whose
        forecast says nothing, such as `spec`), but for one request in `SAMPLE_EVERY`, so that the margin can move."""
        if self.margin() != ChunkSchedule.LONGEST:
            return True
        self._asked += 1
        return self._asked % self.SAMPLE_EVERY == 0

    def margin(self) -> int | None:
        """Tokens past the forecast cut (after the forecast rejection) that a chunk should score, or None while too
        few drafts were cut to tell."""
        if self.count < self.MIN_RECORDS:
            return None
        if self._margin is None:
            forecast, start, needed, length = self.records[: min(self.count, len(self.records))].T  # [N] each
            covered = np.minimum(length, forecast + 1 + self.MARGINS[:, None])  # [M, N]
            short = needed > covered
            cost = covered - start + short * (self.round_trip_tokens + needed - covered)
            self._margin = int(self.MARGINS[np.argmin(cost.mean(axis=1))])
        return self._margin

    def observe(self, forecast: int, start: int, needed: int, draft_len: int) -> None:
        """One cut draft: the cut forecast at its first scoring request, that request's first draft position, the
        tokens the rule examined (up to and including its first rejection) and the draft's length."""
        self.records[self.count % len(self.records)] = (forecast, start, needed, draft_len)
        self.count += 1
        self._margin = None
