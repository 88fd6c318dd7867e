"""JSON text that every reader can parse: a leaf module (it imports nothing of trainfit).

Python's ``json`` writes a non-finite float as ``NaN`` / ``Infinity``, which is not JSON (RFC 8259
§6): ``jq``, JavaScript's ``JSON.parse`` and strict parsers reject the whole file. trainfit's files
and ``--json`` outputs say an unknown or unrepresentable number as ``null`` instead, and
``allow_nan=False`` makes any float that slipped through an error here rather than a file no one
can read (an audit found train.json and monitor.jsonl holding NaN after an evaluation with no label
tokens).
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_null(obj: Any) -> Any:
    """``obj`` with every non-finite float inside dicts, lists and tuples replaced by ``None``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_or_null(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite_or_null` (``obj``), never writing ``NaN`` or ``Infinity``."""
    return json.dumps(finite_or_null(obj), allow_nan=False, **kwargs)
