"""Exact float64 causal sliding-window attention: the yardstick every kernel is held to.

Which keys a query may see is said once: element-wise in :func:`visible`, and in interval form in
:func:`swa_repro.core.intervals.intended_bounds` (``tests/test_reference.py`` holds the two equal).
"""

from __future__ import annotations

import math

import numpy as np

from swa_repro.core.intervals import bounds_to_mask, intended_bounds


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
    """Per row ``[lo, hi]`` of :func:`intended_mask`: :func:`~swa_repro.core.intervals.intended_bounds`."""
    return intended_bounds(prefix_len, extend_len, window_left)


def interval_to_mask(lo: np.ndarray, hi: np.ndarray, kv_len: int) -> np.ndarray:
    """Rows of ``[lo, hi]`` -> bool ``(rows, kv_len)``: :func:`~swa_repro.core.intervals.bounds_to_mask`."""
    return bounds_to_mask(lo, hi, kv_len)


def masked_attention(q, k, v, mask, sm_scale: float | None = None, logits_soft_cap: float = 0.0, device=None):
    """float64 softmax attention for one request.

    q ``(qo, Hq, D)``, k/v ``(kv, Hk, D)``; mask bool ``(qo, kv)`` shared by all heads or
    ``(Hq, qo, kv)`` per head. Returns ``(qo, Hq, D)`` float64; a row with no visible key is 0.
    ``logits_soft_cap > 0`` caps the scaled logits as FlashInfer does, ``cap * tanh(s / cap)``
    (flashinfer variants.cuh:47-48, 72; Gemma-2's ``attn_logit_softcapping``). ``device``: where
    the float64 product runs (default the CPU; a GPU audit at a 4096 window judges on its GPU).
    """
    import torch  # here, not at the top: the kernel model and `swa-repro mask` need only numpy

    qo, hq, d = q.shape
    hk = k.shape[1]
    g = hq // hk
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    dev = device or "cpu"
    q64, k64, v64 = q.double().to(dev), k.double().to(dev), v.double().to(dev)
    k64 = k64.repeat_interleave(g, dim=1)  # (kv, Hq, D)
    v64 = v64.repeat_interleave(g, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q64, k64) * sm_scale  # (Hq, qo, kv)
    if logits_soft_cap and logits_soft_cap > 0:
        logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
    m = torch.as_tensor(np.asarray(mask), dtype=torch.bool).to(dev)
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


def interval_attention(q, k, v, lo, hi, sm_scale=None, max_elems: int = 1 << 26):
    """float64 attention on ``q``'s device, key ``j`` visible to (row, head) iff ``lo <= j <= hi``.

    q ``(qo, Hq, D)``, k/v ``(kv, Hk, D)``, lo/hi ``(qo, Hq)`` (an ``Intervals``' arrays); row
    chunks keep the logits under ``max_elems``. Equals :func:`masked_attention` with the interval
    mask, without building it: a 32k-key request fits.
    """
    import torch

    qo, hq, d = q.shape
    kv, hk = k.shape[:2]
    g = hq // hk
    dev = q.device
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    k64, v64 = k.to(dev, torch.float64), v.to(dev, torch.float64)
    lo = torch.as_tensor(np.asarray(lo), device=dev).long().view(qo, hk, g)
    hi = torch.as_tensor(np.asarray(hi), device=dev).long().view(qo, hk, g)
    keys = torch.arange(kv, device=dev)
    out = torch.zeros(qo, hq, d, dtype=torch.float64, device=dev)
    step = max(1, max_elems // max(1, hq * kv))
    for s in range(0, qo, step):
        qs = q[s:s + step].to(torch.float64).view(-1, hk, g, d)  # (n, Hk, g, D)
        logits = torch.einsum("nhgd,khd->hgnk", qs, k64) * scale  # (Hk, g, n, kv)
        l_ = lo[s:s + step].permute(1, 2, 0)[..., None]
        h_ = hi[s:s + step].permute(1, 2, 0)[..., None]
        logits.masked_fill_(~((keys >= l_) & (keys <= h_)), float("-inf"))
        p = torch.nan_to_num(torch.softmax(logits, -1), nan=0.0)  # empty rows -> 0
        out[s:s + step] = torch.einsum("hgnk,khd->nhgd", p, v64).reshape(-1, hq, d)
    return out


def row_max_abs(o, ref) -> np.ndarray:
    """Per row max |o - ref| over heads and dims, float32 ``(qo,)``; NaN in ``o`` stays NaN."""
    import torch

    return (o.to(ref.device, torch.float64) - ref).abs().amax(dim=(1, 2)).float().cpu().numpy()
