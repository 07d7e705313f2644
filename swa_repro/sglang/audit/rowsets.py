"""Sets of key ids per token row, as flat arrays of inclusive ranges: ``audit.spans``' stage form.

At a real window a stage holds thousands of rows, each seeing a few ranges per head and per call
(a ragged + paged pair). Kept as Python lists per row, merging and counting them was most of the
family audit's CPU time; here every row's set is three flat ``int64`` arrays, ``t`` (the row),
``lo`` and ``hi``, and the set algebra is numpy over all rows at once:

* :func:`union`: the canonical form, sorted by ``(t, lo)``, disjoint and non-adjacent within a row
  (what ``rows.merge`` gives each row, empty ranges dropped);
* :func:`covered`: how many ids of row ``t`` are ``<= x``, so ``|[a, b] & U_t|`` is two look-ups;
* :func:`padded`: each row's ranges side by side, in a given row order (``rows.encode_flat``).

``tests/test_audit_rowsets.py`` holds each against the per-row Python forms on random sets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RowRanges:
    """Row ``t[i]`` holds ids ``lo[i]..hi[i]``; after :func:`union`, sorted by ``(t, lo)`` with
    each row's ranges disjoint and non-adjacent."""
    t: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    def rows(self, keep: np.ndarray) -> RowRanges:
        """Only the ranges of rows in ``keep`` (order kept)."""
        m = np.isin(self.t, keep)
        return RowRanges(self.t[m], self.lo[m], self.hi[m])


def flat(t, lo, hi) -> RowRanges:
    """Ranges ``(..., K)`` of rows ``t`` (broadcast to them), flattened, empty ones dropped; unsorted."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    t = np.broadcast_to(np.asarray(t, np.int64), lo.shape)
    keep = (hi >= lo).ravel()
    return RowRanges(t.ravel()[keep], lo.ravel()[keep], hi.ravel()[keep])


def concat(parts) -> RowRanges:
    parts = list(parts)
    if not parts:
        return RowRanges(*(np.zeros(0, np.int64) for _ in range(3)))
    return RowRanges(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("t", "lo", "hi")))


def _grouped_cummax(g: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Running maximum of ``v`` restarting at each new group ``g`` (``g`` ascending from 0)."""
    m = int(v.min())
    span = int(v.max()) - m + 1
    if (int(g[-1]) + 1) * span < (1 << 62):
        off = g * span
        return np.maximum.accumulate(off + (v - m)) - off + m
    out = v.copy()  # ids too far apart to offset: a loop per group (never at the audit's sizes)
    for a, b in zip(*_bounds(g)):
        out[a:b] = np.maximum.accumulate(v[a:b])
    return out


def _bounds(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    return starts, np.r_[starts[1:], len(g)]


def union(r: RowRanges) -> RowRanges:
    """Per row, the union of its ranges as sorted, disjoint, non-adjacent ranges."""
    keep = r.hi >= r.lo
    t, lo, hi = r.t[keep], r.lo[keep], r.hi[keep]
    if not len(t):
        return RowRanges(t, lo, hi)
    order = np.lexsort((lo, t))
    t, lo, hi = t[order], lo[order], hi[order]
    new_row = np.r_[True, t[1:] != t[:-1]]
    reach = _grouped_cummax(np.cumsum(new_row) - 1, hi)  # the furthest id so far in the row
    start = new_row.copy()
    start[1:] |= lo[1:] > reach[:-1] + 1
    s = np.flatnonzero(start)
    e = np.r_[s[1:], len(t)] - 1
    return RowRanges(t[s], lo[s], reach[e])


def covered(u: RowRanges, t: np.ndarray, x: np.ndarray) -> np.ndarray:
    """How many ids ``<= x`` row ``t`` holds in ``u`` (a :func:`union`), per query."""
    t, x = np.asarray(t, np.int64), np.asarray(x, np.int64)
    if not len(u.t) or not len(t):
        return np.zeros(len(t), np.int64)
    m = min(int(u.lo.min()), int(x.min()))
    span = max(int(u.hi.max()), int(x.max())) - m + 2
    keys = u.t * span + (u.lo - m)  # (t, lo) in lexicographic order, as u is sorted
    i = np.searchsorted(keys, t * span + (x - m), side="right") - 1
    ok = (i >= 0) & (u.t[np.maximum(i, 0)] == t)
    length = u.hi - u.lo + 1
    before = np.cumsum(length) - length  # ids in earlier ranges, every row
    row_start = np.r_[True, u.t[1:] != u.t[:-1]]
    first = np.maximum.accumulate(np.where(row_start, np.arange(len(u.t)), 0))  # each range's row's first range
    j = np.maximum(i, 0)
    inside = before[j] - before[first[j]] + np.minimum(x, u.hi[j]) - u.lo[j] + 1
    return np.where(ok, inside, 0)


def overlap_sizes(u: RowRanges, t, lo, hi) -> np.ndarray:
    """``|[lo, hi] & U_t|`` per query range (0 for an empty one)."""
    t, lo, hi = (np.asarray(a, np.int64) for a in (t, lo, hi))
    n = covered(u, np.r_[t, t], np.r_[hi, lo - 1])
    return np.where(hi >= lo, n[:len(t)] - n[len(t):], 0)


def padded(u: RowRanges, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lo, hi, count)``: row ``order[k]``'s ranges in line ``k`` of ``(len(order), width)``
    arrays (unused slots 0), and how many each row has."""
    pos = np.full(int(max(order.max(initial=-1), u.t.max(initial=-1))) + 1, -1, np.int64)
    pos[order] = np.arange(len(order))
    line = pos[u.t]
    keep = line >= 0
    line, lo, hi = line[keep], u.lo[keep], u.hi[keep]
    count = np.bincount(line, minlength=len(order))
    starts = np.cumsum(count) - count
    idx = np.argsort(line, kind="stable")  # u is sorted by lo within a row: stable keeps that order
    line, lo, hi = line[idx], lo[idx], hi[idx]
    slot = np.arange(len(line)) - starts[line]
    width = int(count.max(initial=0))
    out_lo, out_hi = np.zeros((len(order), width), np.int64), np.zeros((len(order), width), np.int64)
    out_lo[line, slot], out_hi[line, slot] = lo, hi
    return out_lo, out_hi, count
