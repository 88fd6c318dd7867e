"""The alignment of two allocator traces (:mod:`trainfit.memory.depth_trace`): difflib's own
matcher, its inner loop run on numpy rows.

Why not plain ``difflib.SequenceMatcher``: a trace's events take few distinct values (alloc or
free, bytes, stream — 35 in Gemma-3's 14- and 20-layer traces of 16,128 and 22,892 events), so
each element of the shallow trace meets thousands of equal ones in the deeper trace and
``find_longest_match`` walks 34.6 M pairs in Python: 6.3 s of a plan's group on 2 cores (the
longest part of Gemma-3 27B's plan after the simulations themselves).  Why not another diff
(Myers, patience): the alignment the depth extrapolation was checked with, to the byte, is
difflib's — which longest block it takes first, ties to the earliest in either trace — and a
different alignment of runs of equal events would move inserted runs and with them the blocks
each copy frees.  So only ``find_longest_match`` is replaced, by the same dynamic programme
(CPython's ``j2len``, one row per shallow element) on the deeper trace's positions of that
element as arrays, with CPython's tie-break; ``get_matching_blocks`` and ``get_opcodes`` are
difflib's.  Same opcodes (tests/memory/test_trace_align.py compares them on random and layered
sequences; Gemma-3's still extrapolate to the byte, tests/memory/test_extrapolate.py), in 1.3 s
for Gemma-3's traces."""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Sequence

import numpy as np


class TraceMatcher(difflib.SequenceMatcher):
    """``difflib.SequenceMatcher(None, a, b, autojunk=False)``, faster where ``a`` and ``b`` take
    few distinct values.  Nothing is junk (no ``isjunk``, no popular elements), so difflib's
    extension of a match over junk is empty and left out."""

    def __init__(self, a: Sequence[Hashable], b: Sequence[Hashable]) -> None:
        super().__init__(None, a, b, autojunk=False)
        ids: dict[Hashable, int] = {}
        self._a_ids = np.array([ids.setdefault(x, len(ids)) for x in a], dtype=np.int64)
        b_ids = np.array([ids.setdefault(x, len(ids)) for x in b], dtype=np.int64)
        order = np.argsort(b_ids, kind="stable")
        starts = np.searchsorted(b_ids[order], np.arange(len(ids) + 1))
        # each value → its positions in b, ascending (difflib's b2j as arrays)
        self._b_at = [order[starts[v]:starts[v + 1]] for v in range(len(ids))]

    def set_seq1(self, a: Sequence[Hashable]) -> None:
        """Made once: the value ids are built for the sequences given to ``__init__``."""
        self._made_once()
        super().set_seq1(a)

    def set_seq2(self, b: Sequence[Hashable]) -> None:
        self._made_once()
        super().set_seq2(b)

    def _made_once(self) -> None:
        if hasattr(self, "_b_at"):
            raise TypeError("TraceMatcher: make a new matcher for other sequences")

    def find_longest_match(self, alo: int = 0, ahi: int | None = None, blo: int = 0,
                           bhi: int | None = None) -> difflib.Match:
        """The longest a[i:i+k] == b[j:j+k] inside the ranges: the one ending first in ``a``,
        then starting first in ``b`` (difflib's choice)."""
        ahi = len(self.a) if ahi is None else ahi
        bhi = len(self.b) if bhi is None else bhi
        best_i, best_j, best_k = alo, blo, 0
        empty = np.empty(0, dtype=np.int64)
        prev_j, prev_k = empty, empty  # the previous row: positions in b and match lengths there
        for i in range(alo, ahi):
            js = self._b_at[self._a_ids[i]]
            lo, hi = np.searchsorted(js, (blo, bhi))
            js = js[lo:hi]
            if js.size == 0:
                prev_j, prev_k = empty, empty
                continue
            k = np.ones(js.size, dtype=np.int64)
            if prev_j.size:
                # k[j] = prev_k[j - 1] + 1 where the previous row matched at j - 1
                at = np.minimum(np.searchsorted(prev_j, js - 1), prev_j.size - 1)
                hit = prev_j[at] == js - 1
                k[hit] += prev_k[at[hit]]
            m = int(np.argmax(k))  # the first of the row's longest: difflib's strict ">"
            if k[m] > best_k:
                best_k = int(k[m])
                best_i, best_j = i - best_k + 1, int(js[m]) - best_k + 1
            prev_j, prev_k = js, k
        return difflib.Match(best_i, best_j, best_k)
