"""Per-request visible-key intervals and the one status rule (exact / leak / undefined).

Every source of a mask speaks this type: the kernel model (``kernel.model.RequestModel``), the probe
of the real kernel (``kernel.probe.ProbeRequest``) and a committed recording (its requests are
``ProbeRequest`` read back) each expose ``.intervals``, ``.status`` and ``.reason``, so counting
extra and missing keys, and deciding the status, happen here and nowhere else.

Row ``q`` of a request with prefix ``P`` sits at absolute position ``P + q``; ``lo[q, h]`` and
``hi[q, h]`` are its first and last visible key for head column ``h`` (inclusive), ``-1`` when it
sees none. Columns are either query heads ``Hq`` or heads-in-group ``g`` (the kernel model's
GQA-packed rows repeat for every KV head); :func:`qo_head_columns` maps one to the other.

The window rule itself is :func:`swa_repro.core.reference.visible` (element form);
:func:`intended_bounds` is its interval form, the only one (``tests/test_reference.py`` holds the two
equal).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def ceil_div(a, b):
    """``ceil(a / b)`` for ints and int arrays (the kernels' ``ceil_div``, math.cuh)."""
    return -(-a // b)


def nan_max(x, empty=None, *, skip_nan: bool = False):
    """Largest value of ``x``, NaN-aware. By default a NaN counts as the largest (a NaN output is
    the worst error); ``skip_nan=True`` ignores NaN (summaries that count NaN rows separately).
    ``empty`` when nothing is left to take the max of."""
    x = np.asarray(x, np.float64)
    if skip_nan:
        x = x[~np.isnan(x)]
    if x.size == 0:
        return empty
    return float("nan") if np.isnan(x).any() else float(x.max())


def qo_head_columns(num_qo_heads: int, group_size: int) -> np.ndarray:
    """Column of a ``(qo, group)`` array that query head ``h`` reads: FlashInfer packs GQA rows as
    ``packed = q * group + h % group`` (prefill.cuh ``get_warp_idx_q``/``packed_offset``), so every
    KV head sees the same per-head-in-group mask."""
    return np.arange(num_qo_heads) % group_size


def intended_bounds(prefix_len: int, extend_len: int, window_left: int) -> tuple[np.ndarray, np.ndarray]:
    """``(qo,)`` first and last key each query may see (:func:`swa_repro.core.reference.visible`)."""
    pos = np.arange(prefix_len, prefix_len + extend_len, dtype=np.int64)
    lo = np.zeros_like(pos) if window_left < 0 else np.maximum(pos - window_left, 0)
    return lo, pos


def bounds_to_mask(lo: np.ndarray, hi: np.ndarray, kv_len: int) -> np.ndarray:
    """Bool ``(qo, kv)`` from inclusive per-row bounds; a row with ``lo < 0`` or ``hi < lo`` is empty."""
    lo, hi = np.asarray(lo), np.asarray(hi)
    k = np.arange(kv_len)[None, :]
    return (k >= lo[:, None]) & (k <= hi[:, None]) & (lo[:, None] >= 0)


@dataclass(frozen=True, eq=False)
class Intervals:
    """Visible keys of one request: ``lo, hi`` ``(qo, heads)`` inclusive, ``-1`` = none.
    Compare with :meth:`equals` (``==`` is identity: the fields are arrays)."""
    prefix_len: int
    extend_len: int
    lo: np.ndarray
    hi: np.ndarray

    def __post_init__(self):
        lo, hi = np.asarray(self.lo), np.asarray(self.hi)
        if lo.ndim != 2 or lo.shape != hi.shape or lo.shape[0] != self.extend_len:
            raise ValueError(f"lo/hi must both be (extend_len={self.extend_len}, heads); got {lo.shape}, {hi.shape}")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    @property
    def kv_len(self) -> int:
        return self.prefix_len + self.extend_len

    @property
    def heads(self) -> int:
        return int(self.lo.shape[1])

    def mask(self, head: int | None = None) -> np.ndarray:
        """Bool ``(qo, kv)`` of head column ``head``; ``None``: the union over all columns."""
        if head is not None:
            return bounds_to_mask(self.lo[:, head], self.hi[:, head], self.kv_len)
        out = np.zeros((self.extend_len, self.kv_len), bool)
        for h in range(self.heads):
            out |= bounds_to_mask(self.lo[:, h], self.hi[:, h], self.kv_len)
        return out

    def diff(self, window_left: int) -> tuple[np.ndarray, np.ndarray]:
        """``(extra, missing)`` ``(qo, heads)``: keys attended that the window excludes, and
        in-window keys not attended. Exact interval arithmetic, empty rows included."""
        ilo, ihi = (b[:, None] for b in intended_bounds(self.prefix_len, self.extend_len, window_left))
        lo, hi = self.lo.astype(np.int64), self.hi.astype(np.int64)
        seen = np.where((lo >= 0) & (hi >= lo), hi - lo + 1, 0)
        both = np.where(seen > 0, np.maximum(np.minimum(hi, ihi) - np.maximum(lo, ilo) + 1, 0), 0)
        return seen - both, (ihi - ilo + 1) - both

    def per_qo_head(self, num_qo_heads: int) -> "Intervals":
        """The same intervals with one column per query head (see :func:`qo_head_columns`)."""
        if self.heads == num_qo_heads:
            return self
        cols = qo_head_columns(num_qo_heads, self.heads)
        return Intervals(self.prefix_len, self.extend_len, self.lo[:, cols], self.hi[:, cols])

    def equals(self, other: "Intervals") -> bool:
        """Same visible keys on every row and column (columns broadcast to query heads)."""
        n = max(self.heads, other.heads)
        a, b = self.per_qo_head(n), other.per_qo_head(n)
        return bool(np.array_equal(a.lo, b.lo) and np.array_equal(a.hi, b.hi))

    @classmethod
    def intended(cls, prefix_len: int, extend_len: int, window_left: int, heads: int = 1) -> "Intervals":
        """Every column sees exactly its window (``window_left=-1``: plain causal)."""
        lo, hi = intended_bounds(prefix_len, extend_len, window_left)
        return cls(prefix_len, extend_len, np.repeat(lo[:, None], heads, 1), np.repeat(hi[:, None], heads, 1))


class IntervalsView:
    """Read-only views onto ``self.intervals``, shared by every per-request result (the kernel
    model's, the probe's, a recording's) so each exposes the same names."""
    intervals: Intervals

    @property
    def prefix_len(self) -> int:
        return self.intervals.prefix_len

    @property
    def extend_len(self) -> int:
        return self.intervals.extend_len

    @property
    def kv_len(self) -> int:
        return self.intervals.kv_len

    @property
    def lo(self) -> np.ndarray:  # (qo, heads) first visible key, -1 = none
        return self.intervals.lo

    @property
    def hi(self) -> np.ndarray:  # (qo, heads) last visible key, -1 = none
        return self.intervals.hi

    def mask(self, head: int | None = None) -> np.ndarray:
        """Effective mask ``(qo, kv)`` of head column ``head``; ``None``: union over heads."""
        return self.intervals.mask(head)


def status_of(iv: Intervals, window_left: int, broken: str | None = None) -> tuple[str, str]:
    """The one status rule: ``undefined`` when ``broken`` says why the output is not a softmax
    over one key set (split-KV race, NaN, run-to-run differences); else ``exact`` when every row
    and head sees exactly its window; else ``leak``, with the counts."""
    if broken:
        return "undefined", broken
    extra, missing = iv.diff(window_left)
    if not extra.any() and not missing.any():
        return "exact", "effective mask equals the intended window"
    return "leak", (f"{int(extra.sum())} (query row, head) x key pairs outside the window are attended, "
                    f"{int(missing.sum())} in-window pairs dropped")
