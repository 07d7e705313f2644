"""Masks reduced by blocks for drawing, never averaged: a reduced mask cell says "no / some / every key in
the block visible", a difference cell "any extra key" / "any missing key" (max-pooling of the boolean
difference), a tile-map cell the most severe state in its block, so a single leaked key in a 32k x 32k
mask still shows. Masks are per-row intervals (``lo, hi`` inclusive, the ``RequestModel`` /
``ProbeResult`` layout): a 32k-token case never materialises a dense ``(qo, kv)`` array. What
``plots`` draws; no matplotlib here.
"""

from __future__ import annotations

import numpy as np

from swa_repro.core.intervals import ceil_div, intended_bounds
from swa_repro.kernel.model import RequestModel

MAX_CELLS = 256  # per axis, after reduction


def block_size(n: int, max_cells: int = MAX_CELLS) -> int:
    """Smallest block edge that fits ``n`` cells into ``max_cells``."""
    return max(1, ceil_div(n, max_cells))


def maxpool(a: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """Max over ``block`` = (rows, cols) tiles of a 2-D array (bool -> "any"); edges padded with the
    array's minimum so padding never adds anything."""
    br, bc = block
    r, c = a.shape
    nr, nc = ceil_div(r, br), ceil_div(c, bc)
    fill = False if a.dtype == bool else a.min(initial=0)
    p = np.full((nr * br, nc * bc), fill, dtype=a.dtype)
    p[:r, :c] = a
    return p.reshape(nr, br, nc, bc).max(axis=(1, 3))


def reduce_bool(a: np.ndarray, max_cells: int = MAX_CELLS) -> np.ndarray:
    """A 2-D bool array reduced to at most ``max_cells`` per axis: a cell is True iff any element of
    its block is (so a single True survives any reduction)."""
    return maxpool(np.asarray(a, bool), (block_size(a.shape[0], max_cells), block_size(a.shape[1], max_cells)))


def intervals_any(lo, hi, n_cols: int, block: tuple[int, int]) -> np.ndarray:
    """Reduced "any key" map of row intervals without a dense array.

    ``lo, hi`` are ``(rows,)`` or ``(rows, k)`` (k intervals per row, inclusive, empty when
    ``lo < 0`` or ``lo > hi``: ``core.intervals.bounds_to_mask``'s rule). Returns bool ``(ceil(rows/br), ceil(n_cols/bc))``: a cell is True iff
    some interval of some row in its row block touches its column block. O(rows * k)."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    lo, hi = (lo[:, None], hi[:, None]) if lo.ndim == 1 else (lo, hi)
    br, bc = block
    rows = lo.shape[0]
    nr, nc = ceil_div(rows, br), ceil_div(n_cols, bc)
    rb = np.broadcast_to((np.arange(rows) // br)[:, None], lo.shape)
    lo_c, hi_c = np.clip(lo, 0, n_cols - 1), np.clip(hi, 0, n_cols - 1)
    ok = (lo >= 0) & (lo <= hi) & (lo < n_cols)
    diff = np.zeros((nr, nc + 1), np.int64)  # difference array over column blocks
    np.add.at(diff, (rb[ok], lo_c[ok] // bc), 1)
    np.add.at(diff, (rb[ok], hi_c[ok] // bc + 1), -1)
    return np.cumsum(diff, axis=1)[:, :nc] > 0


def intervals_all(lo, hi, n_cols: int, block: tuple[int, int]) -> np.ndarray:
    """Reduced "every key visible" map of one interval per row: True iff every row of the row
    block covers its whole column block (the last, partial column block counts up to ``n_cols``)."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    br, bc = block
    rows = lo.shape[0]
    nr, nc = ceil_div(rows, br), ceil_div(n_cols, bc)
    hi_pad = np.where(hi >= n_cols - 1, nc * bc - 1, hi)  # reaching the last key covers the padding
    first = ceil_div(np.maximum(lo, 0), bc)  # first fully covered column block
    last = (hi_pad + 1) // bc - 1
    ok = (lo >= 0) & (lo <= hi) & (first <= last)
    rb = np.arange(rows) // br
    diff = np.zeros((nr, nc + 1), np.int64)
    np.add.at(diff, (rb[ok], first[ok]), 1)
    np.add.at(diff, (rb[ok], last[ok] + 1), -1)
    full = np.cumsum(diff, axis=1)[:, :nc]
    rows_in_block = np.minimum(br, rows - np.arange(nr) * br)[:, None]
    return full == rows_in_block


def reduce_mask(lo, hi, n_cols: int, block) -> np.ndarray:
    """int8 map: 0 nothing visible, 1 some keys of the block visible, 2 every key visible."""
    return intervals_any(lo, hi, n_cols, block).astype(np.int8) + intervals_all(lo, hi, n_cols, block)


def difference_intervals(lo, hi, ilo, ihi):
    """Extra and missing keys of effective per-head intervals ``lo, hi (qo, heads)`` against the
    intended ``ilo, ihi (qo,)``, as ``(qo, 2)`` interval pairs: extra = keys some head attends that
    the window excludes; missing = window keys some head does not attend."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    lo, hi = (lo[:, None], hi[:, None]) if lo.ndim == 1 else (lo, hi)
    empty = (lo > hi) | (hi < 0)
    big = np.iinfo(np.int64).max // 4
    a, b = np.where(empty, big, lo).min(1), np.where(empty, -1, hi).max(1)  # union (heads overlap)
    A, B = np.where(empty, big, lo).max(1), np.where(empty, -1, hi).min(1)  # intersection
    A = np.where(empty.any(1), big, A)  # a head that sees nothing misses the whole window
    extra_lo = np.stack([a, np.maximum(a, ihi + 1)], 1)
    extra_hi = np.stack([np.minimum(b, ilo - 1), b], 1)
    miss_lo = np.stack([ilo, np.maximum(ilo, B + 1)], 1)
    miss_hi = np.stack([np.minimum(ihi, A - 1), ihi], 1)
    return (extra_lo, extra_hi), (miss_lo, miss_hi)


def reduce_difference(lo, hi, ilo, ihi, n_cols: int, block) -> np.ndarray:
    """int8 map with ``DIFF_STATES``: extra / missing / both outrank agreement, so a single extra
    or missing key colours its block."""
    (elo, ehi), (mlo, mhi) = difference_intervals(lo, hi, ilo, ihi)
    extra = intervals_any(elo, ehi, n_cols, block)
    miss = intervals_any(mlo, mhi, n_cols, block)
    seen = intervals_any(ilo, ihi, n_cols, block)
    out = seen.astype(np.int8)
    out[extra] = 2
    out[miss] = 3
    out[extra & miss] = 4
    return out


def request_difference(req: RequestModel, window_left: int, max_cells: int = MAX_CELLS):
    """``(reduced difference map, block)`` of one modelled request against its intended window."""
    block = (block_size(req.extend_len, max_cells), block_size(req.kv_len, max_cells))
    ilo, ihi = intended_bounds(req.prefix_len, req.extend_len, window_left)
    return reduce_difference(req.intervals.lo, req.intervals.hi, ilo, ihi, req.kv_len, block), block


def reduce_tiles(tiles: np.ndarray, max_cols: int = MAX_CELLS, max_rows: int | None = None) -> tuple[np.ndarray, int]:
    """Tile map ``(q_tiles, kv)`` reduced along keys (and along q tiles when ``max_rows`` is given)
    by the most severe state (0 < 1 < 2). Returns ``(map, key block)``; the q-tile block is
    ``block_size(q_tiles, max_rows)``."""
    bc = block_size(tiles.shape[1], max_cols)
    br = 1 if max_rows is None else block_size(tiles.shape[0], max_rows)
    return maxpool(tiles.astype(np.int8), (br, bc)), bc


def row_kv_start(req: RequestModel, cta_tile_q: int, group: int, head: int = 0) -> np.ndarray:
    """``(qo,)`` kv_start of the CTA holding each query row of head-in-group ``head``: the row's
    packed index is ``q*group + head`` and its tile ``packed // CTA_TILE_Q`` (prefill.cuh:2441)."""
    q = np.arange(req.extend_len)
    return np.asarray(req.kv_start)[(q * group + head) // cta_tile_q]
