"""Engine steps as a run records them (`pricing.steps`): the makespan split, and the decode context, a column a
recorder may not have."""

import doctest
import json
import math

import numpy as np
import pytest

from specrl_openrlhf.pricing import steps as steps_module
from specrl_openrlhf.pricing.steps import EngineSteps


def steps(*rows_and_tokens, dt=0.01):
    return EngineSteps.of([(dt * (i + 1), 0, 0, r, t, 0, 0) for i, (r, t) in enumerate(rows_and_tokens)])


def test_doctests():
    result = doctest.testmod(steps_module)
    assert result.attempted >= 1 and result.failed == 0


def test_the_makespan_split_finds_the_tail():
    record = steps((32, 32), (32, 40), (31, 31), (20, 30), (8, 8), (2, 6), dt=0.01)
    split = record.split(start=0.0)
    assert split["full_steps"] == 3 and split["tail_steps"] == 3 and split["peak_rows"] == 32
    assert split["full_s"] == pytest.approx(0.03) and split["tail_s"] == pytest.approx(0.03)
    assert record.split()["full_s"] == pytest.approx(0.03)  # the first step's time: the median gap
    both = record + record
    assert len(both) == 12 and EngineSteps.from_dict(both.as_dict()).rows.tolist() == both.rows.tolist()


def test_a_decode_context_not_recorded_is_nan_and_survives_the_file():
    plain = steps((4, 4), (4, 8))
    assert np.isnan(plain.decode_context).all() and "decode_context" not in plain.as_dict()
    assert not plain.context_recorded.any()
    known = EngineSteps.of([(0.3, 0, 0, 4, 4, 0, 0, 640)])
    both = plain + known
    assert both.context_recorded.tolist() == [False, False, True]
    data = json.loads(json.dumps(both.as_dict()))  # strict JSON: None, never NaN
    assert data["decode_context"] == [None, None, 640.0]
    back = EngineSteps.from_dict(data)
    assert math.isnan(back.decode_context[0]) and back.decode_context[2] == 640.0
    assert len(EngineSteps.of([])) == 0 and len(EngineSteps.of([]).decode_context) == 0
