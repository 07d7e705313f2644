"""The keys FlashInfer lets each row of an effective call see, index level, from what it was told:
causal or the custom mask, the window only if compiled in at plan, and an fa2 call planned without
the window but run with one starting each CTA at its first row's window (the kernel model,
``kernel.model.simulate``). The rules and their source lines: ``audit.keys``' docstring, **attended**.
"""

from __future__ import annotations

import numpy as np

from swa_repro.core.case import Case
from swa_repro.core.errors import CaseError
from swa_repro.kernel.model import fa2_cta_tile_q, simulate
from swa_repro.sglang.audit.calls import Pair
from swa_repro.sglang.audit.env import DECODE, PAGED, RAGGED


def recorded_backend(p: Pair) -> str:
    """What runs as the trace alone says: decode and an explicit ``fa2`` are fa2, an explicit ``fa3``
    fa3, ``auto`` left unresolved (no GPU class: no CTA leak modelled)."""
    return "fa2" if p.backend == "fa2" or p.cls == DECODE else ("fa3" if p.backend == "fa3" else "auto")


def leaks(p: Pair, plan: dict, fwd: dict, backend: str) -> bool:
    """An fa2 prefill call, paged or ragged, causal and without a custom mask, planned without the
    window and run with one: its CTAs start at their first row's window (the module docstring)."""
    causal = bool(fwd.get("causal", True))
    return (p.cls in (PAGED, RAGGED) and backend == "fa2" and causal and plan.get("custom_mask") is None
            and int(plan["window_left"]) < 0 <= int(fwd["window_left"]))


def _kernel_visible(p: Pair, plan: dict, fwd: dict, qo: int, kv: int, hq: int, req: int, geo,
                    backend: str) -> np.ndarray | None:
    """(Hq, qo, kv) what FlashInfer lets each row see, index level (see the module docstring)."""
    if leaks(p, plan, fwd, backend):
        return _fa2_leak(plan, int(fwd["window_left"]), hq, req, geo)
    r = np.arange(qo)[:, None]
    j = np.arange(kv)[None, :]
    causal = True if p.cls == DECODE else bool(fwd.get("causal", True))
    mask = plan.get("custom_mask")
    if mask is not None:
        off = sum(a * b for a, b in zip(geo[0][:req], geo[1][:req]))
        vis = mask[off: off + qo * kv].view(qo, kv).bool().numpy()
    elif causal:
        vis = j <= kv - qo + r
    else:
        vis = np.ones((qo, kv), bool)
    compiled, w = int(plan["window_left"]) >= 0, int(fwd["window_left"])
    if compiled:
        vis = vis & (j + qo + w >= kv + r)
    vis = np.broadcast_to(vis, (hq, qo, kv)).copy()
    if mask is not None and w >= 0 and p.cls == PAGED:  # a custom mask runs on fa2 (prefill.py:2974)
        vis &= _fa2_cta_start(plan, geo, qo, kv, w, hq)
    return vis


def _fa2_cta_start(plan: dict, geo, qo: int, kv: int, w: int, hq: int) -> np.ndarray:
    """(Hq, qo, kv): keys at or after the first key of the CTA holding each (row, head): an fa2
    CTA starts at ``kv + q_tile * CTA_TILE_Q / group - (qo + W)`` with the run's window ``W``
    (prefill.cuh:3826-3827), compiled in or not, and packs rows as ``row * group + head % group``;
    CTA_TILE_Q from the plan's mean packed query length (``kernel.model.fa2_cta_tile_q``)."""
    group = int(plan["num_qo_heads"]) // int(plan["num_kv_heads"])
    live = [n for n in geo[0] if n > 0]
    tile = fa2_cta_tile_q(sum(n * group for n in live) // max(len(live), 1), int(plan["head_dim_qk"]))
    packed = np.arange(qo)[None, :] * group + (np.arange(hq) % group)[:, None]  # (Hq, qo)
    start = kv + (packed // tile * tile) // group - (qo + w)
    return np.arange(kv)[None, None, :] >= start[:, :, None]


def plan_case(plan: dict, geo, window: int, backend: str, **extra) -> tuple[Case | None, list[int]]:
    """The kernel model's Case for a recorded prefill plan, run with ``window``: the batch as planned
    (its requests with queries, ``live``), heads, page size (a ragged plan's is 1, prefill.py:3162)
    and plan window; flashinfer 0.6.12's model. None when the plan is no Case the model takes."""
    live = [i for i, n in enumerate(geo[0]) if n > 0]
    try:
        return Case(prefix_lens=tuple(geo[1][i] - geo[0][i] for i in live), extend_lens=tuple(geo[0][i] for i in live),
                    num_qo_heads=int(plan["num_qo_heads"]), num_kv_heads=int(plan["num_kv_heads"]),
                    head_dim=int(plan["head_dim_qk"]), page_size=int(plan.get("page_size", 1)), window_left=window,
                    plan_window_left=int(plan["window_left"]), backend=backend, flashinfer_version="0.6.12",
                    **extra), live
    except CaseError:
        return None, live


def _fa2_leak(plan: dict, w: int, hq: int, req: int, geo) -> np.ndarray | None:
    """The kernel model of an fa2 prefill planned without the window, run with ``w`` (CTA-granular
    start, prefill.cuh): the batch as planned, this request's per-head masks."""
    case, live = plan_case(plan, geo, w, "fa2", disable_split_kv=bool(plan.get("disable_split_kv")),
                           fixed_split_size=-1 if plan.get("fixed_split_size") is None else int(plan["fixed_split_size"]))
    if case is None:
        return None
    rm = simulate(case).requests[live.index(req)]
    if rm.status == "undefined":
        return None
    g = case.num_qo_heads // case.num_kv_heads
    return np.stack([rm.mask(h % g) for h in range(hq)])
