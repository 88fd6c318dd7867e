"""Typed access to one field of a JSON document report reads: a missing key, a wrong type or a
non-finite number is one :class:`ReportInputError` naming the file and the field's path
(``configs[3].memory.peak_device_bytes``), with the fix."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

FORMATS_HINT = "the fields are described in docs/json-formats.md"

__all__ = ["FORMATS_HINT", "JsonObj", "ReportInputError", "short_repr"]


class ReportInputError(Exception):
    """One bad input: ``message`` names the file and field, ``hint`` says what to do."""

    def __init__(self, message: str, hint: str = FORMATS_HINT) -> None:
        super().__init__(message)
        self.hint = hint


# --- typed field access ---------------------------------------------------------------------------

_MISSING = object()


@dataclass
class JsonObj:
    """A JSON object with the file and the path to it, so that errors can name both."""

    file: str
    where: str
    data: dict[str, Any]
    hint: str = FORMATS_HINT

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str, what: str) -> ReportInputError:
        return ReportInputError(f"{self.file}: {self._name(key)}: {what}", self.hint)

    def _get(self, key: str, required: bool) -> Any:
        if key not in self.data:
            if required:
                raise self.fail(key, "missing")
            return _MISSING
        return self.data[key]

    def num(self, key: str, *, required: bool = True, nullable: bool = True,
            integer: bool = False) -> Any:
        v = self._get(key, required)
        if v is _MISSING or (v is None and nullable):
            return None
        ok = isinstance(v, int) if integer else isinstance(v, int | float)
        if isinstance(v, bool) or not ok or (isinstance(v, float) and not math.isfinite(v)):
            kind = "an integer" if integer else "a number"
            raise self.fail(key, f"expected {kind}{' or null' if nullable else ''}, got {v!r}")
        low, high = _RANGE.get(key) or ((0, None) if key.startswith("peak_")
                                        and key.endswith("_bytes") else (None, None))
        if (low is not None and v < low) or (high is not None and v > high):
            # a share over 100 % or a negative peak was drawn as it was, beside a "why" that
            # contradicted it (an audit): no command writes one, so the file was edited
            raise self.fail(key, f"{v!r} is outside {low} … {'∞' if high is None else high}, "
                            "where every trainfit output keeps it")
        return v

    def int_(self, key: str, **kw: Any) -> Any:
        return self.num(key, integer=True, **kw)

    def str_(self, key: str, *, required: bool = True, nullable: bool = True) -> Any:
        v = self._get(key, required)
        if v is _MISSING or (v is None and nullable):
            return None
        if not isinstance(v, str):
            raise self.fail(key, f"expected a string, got {v!r}")
        return v

    def bool_(self, key: str, *, required: bool = True, nullable: bool = True) -> Any:
        v = self._get(key, required)
        if v is _MISSING or (v is None and nullable):
            return None
        if not isinstance(v, bool):
            raise self.fail(key, f"expected true or false, got {v!r}")
        return v

    def obj(self, key: str, *, required: bool = True, nullable: bool = False) -> JsonObj | None:
        v = self._get(key, required)
        if v is _MISSING or (v is None and nullable):
            return None
        if not isinstance(v, dict):
            raise self.fail(key, f"expected an object, got {short_repr(v)}")
        return JsonObj(self.file, self._name(key), v, self.hint)

    def list_(self, key: str, *, required: bool = True) -> list[Any]:
        v = self._get(key, required)
        if v is _MISSING or v is None:
            if required:
                raise self.fail(key, "expected a list, got null")
            return []
        if not isinstance(v, list):
            raise self.fail(key, f"expected a list, got {short_repr(v)}")
        return v

    def objs(self, key: str, *, required: bool = True) -> list[JsonObj]:
        out = []
        for i, item in enumerate(self.list_(key, required=required)):
            name = f"{key}[{i}]"
            if not isinstance(item, dict):
                raise self.fail(name, f"expected an object, got {short_repr(item)}")
            out.append(JsonObj(self.file, self._name(name), item, self.hint))
        return out

    def strs(self, key: str, *, required: bool = True) -> list[str]:
        items = self.list_(key, required=required)
        for i, s in enumerate(items):
            if not isinstance(s, str):
                raise self.fail(f"{key}[{i}]", f"expected a string, got {short_repr(s)}")
        return list(items)

    def numbers(self, key: str, keys: tuple[str, ...] | None = None) -> dict[str, float | None]:
        """An object whose values are numbers or null (``keys``: required keys, else any)."""
        o = self.obj(key)
        assert o is not None
        names = keys if keys is not None else tuple(o.data)
        return {k: o.num(k) for k in names}


_SHARES = ("data_wait_fraction", "matmul_time_fraction", "overhead_fraction", "other_fraction",
           "device_busy_fraction", "device_idle_fraction", "sync_fraction", "padding_fraction",
           "optimizer_fraction", "logging_fraction", "compute_fraction", "recompute_fraction",
           "mfu", "hfu", "parts_scale")
_RANGE: dict[str, tuple[float | None, float | None]] = {
    **{k: (0, 1) for k in _SHARES},
    **{k: (0, None) for k in ("capacity_bytes", "host_rss_bytes", "total_params",
                              "trainable_params", "step_time_s", "tokens_per_s")}}
"""What a number read by name may be: shares of a step (and MFU) in 0 … 1, sizes and times ≥ 0."""


def short_repr(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
