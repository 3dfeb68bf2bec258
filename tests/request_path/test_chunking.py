"""How far a scoring request reaches (`request_path.chunking`): the chunk that weighs round trips against tokens
scored past the rejection, and the margin past a rule's forecast cut. The planner's tests run them on drafts."""

import numpy as np
import pytest

from specrl_openrlhf.request_path.chunking import ChunkSchedule, CutForecast


def test_chunk_schedule_weighs_round_trips_against_tokens_scored_past_the_rejection():
    assert ChunkSchedule().chunk() is None  # no rejection seen yet: whole drafts in one request
    rng = np.random.default_rng(0)
    for q in (0.3, 0.1, 0.01):
        first_rejections = rng.geometric(q, 20_000)  # drafts rejected at a constant rate

        def cost(chunk, round_trip, first_rejections=first_rejections):  # tokens scored + round trips, per draft
            requests = np.ceil(first_rejections / chunk)
            return float(np.mean(requests * (chunk + round_trip)))

        for round_trip in (0.0, 16.0, 64.0):
            schedule = ChunkSchedule(round_trip_tokens=round_trip)
            for _ in range(20):
                schedule.observe(examined=round(1 / q), rejected=True)
            chunk = schedule.chunk()
            assert chunk == 1 if round_trip == 0 else chunk > 1  # free round trips: score token by token
            best = min(cost(c, round_trip) for c in range(1, 40 * round(1 / q)))
            assert cost(chunk, round_trip) <= 1.03 * best
    little_drift = ChunkSchedule()
    little_drift.observe(examined=10**6, rejected=True)
    assert little_drift.chunk() > 8192  # longer than the paper's drafts: one request each
    little_drift.observe(examined=10**8, rejected=False)
    assert little_drift.chunk() is None
    with pytest.raises(ValueError, match="round_trip_tokens=-1"):
        ChunkSchedule(round_trip_tokens=-1)


def test_cut_forecast_reaches_as_far_past_the_forecast_as_recent_cuts_needed():
    forecast = CutForecast(round_trip_tokens=64)
    for _ in range(CutForecast.MIN_RECORDS - 1):
        forecast.observe(forecast=10, start=1, needed=14, draft_len=100)  # cut at 13: three tokens after the forecast
    assert forecast.margin() is None  # too few drafts to tell
    forecast.observe(forecast=10, start=1, needed=14, draft_len=100)
    assert forecast.margin() == 4  # the least of MARGINS that covers a rejection 3 tokens late
    useless = CutForecast(round_trip_tokens=64)  # a rule whose forecast is "keeps all" (spec when nothing moved)
    rng = np.random.default_rng(0)
    for needed in rng.integers(1, 60, 200).tolist():
        useless.observe(forecast=60, start=1, needed=needed, draft_len=60)
    assert useless.margin() == 0  # reaching the forecast means the whole draft already
    with pytest.raises(ValueError, match="window=8"):
        CutForecast(window=8)
