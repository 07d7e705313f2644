"""Exact float64 causal sliding-window attention: the yardstick every kernel is held to.

The visibility rule lives in :func:`visible` and nowhere else (see ``config`` for the words).
"""

from __future__ import annotations

import math

import numpy as np


def visible(q_pos, k_pos, window_left: int):
    """Key ``k_pos`` is visible to query ``q_pos`` iff ``q_pos - window_left <= k_pos <= q_pos``."""
    ok = k_pos <= q_pos
    if window_left >= 0:
        ok = ok & (k_pos >= q_pos - window_left)
    return ok


def intended_mask(prefix_len: int, extend_len: int, window_left: int) -> np.ndarray:
    """Bool ``(extend_len, kv_len)``: row ``i`` is the query at absolute position ``prefix_len + i``."""
    q = np.arange(prefix_len, prefix_len + extend_len)[:, None]  # (qo, 1)
    k = np.arange(prefix_len + extend_len)[None, :]  # (1, kv)
    return visible(q, k, window_left)


def intended_interval(prefix_len: int, extend_len: int, window_left: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row ``[lo, hi]`` (inclusive) of :func:`intended_mask`."""
    hi = np.arange(prefix_len, prefix_len + extend_len)
    lo = np.zeros_like(hi) if window_left < 0 else np.maximum(hi - window_left, 0)
    return lo, hi


def interval_to_mask(lo: np.ndarray, hi: np.ndarray, kv_len: int) -> np.ndarray:
    """Rows of ``[lo, hi]`` intervals -> bool ``(rows, kv_len)``; ``lo > hi`` is an empty row."""
    k = np.arange(kv_len)[None, :]
    return (k >= np.asarray(lo)[:, None]) & (k <= np.asarray(hi)[:, None])


def masked_attention(q, k, v, mask, sm_scale: float | None = None):
    """float64 softmax attention for one request.

    q ``(qo, Hq, D)``, k/v ``(kv, Hk, D)``; mask bool ``(qo, kv)`` shared by all heads or
    ``(Hq, qo, kv)`` per head. Returns ``(qo, Hq, D)`` float64; a row with no visible key is 0.
    """
    import torch  # here, not at the top: the kernel model and `swa-repro mask` need only numpy

    qo, hq, d = q.shape
    hk = k.shape[1]
    g = hq // hk
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    q64, k64, v64 = q.double().cpu(), k.double().cpu(), v.double().cpu()
    k64 = k64.repeat_interleave(g, dim=1)  # (kv, Hq, D)
    v64 = v64.repeat_interleave(g, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q64, k64) * sm_scale  # (Hq, qo, kv)
    m = torch.as_tensor(np.asarray(mask), dtype=torch.bool)
    m = m.expand(hq, qo, k.shape[0]) if m.dim() == 2 else m
    logits = logits.masked_fill(~m, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # empty rows
    return torch.einsum("hqk,khd->qhd", p, v64)


def reference_attention(prefix_lens, extend_lens, window_left, qs, ks, vs, sm_scale=None):
    """Intended output for a batch: lists of per-request q ``(qo,Hq,D)``, k/v ``(kv,Hk,D)``."""
    return [
        masked_attention(q, k, v, intended_mask(p, e, window_left), sm_scale)
        for p, e, q, k, v in zip(prefix_lens, extend_lens, qs, ks, vs)
    ]
