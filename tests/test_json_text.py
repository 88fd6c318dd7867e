"""trainfit's JSON is strict JSON: no NaN or Infinity reaches a file or stdout."""

from __future__ import annotations

import json
import math

import pytest

from trainfit import json_text


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"non-JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_become_null_wherever_they_are() -> None:
    obj = {"a": math.nan, "b": [1.5, math.inf, {"c": -math.inf}], "d": (2, math.nan), "e": "NaN",
           "f": 0.0, "g": None, "h": True}
    out = _strict(json_text.dumps(obj))
    assert out == {"a": None, "b": [1.5, None, {"c": None}], "d": [2, None], "e": "NaN", "f": 0.0,
                   "g": None, "h": True}
    with pytest.raises(ValueError):
        _strict(json.dumps(obj))  # what the writers used before: the check can fail
