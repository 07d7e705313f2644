"""The kernel model against what the kernel showed, per request and per query head (the fuzz rule).

A request is *broken* when the probe shows an output that is no softmax over the window's keys
by any defined rule: an in-window key missing, a future key, non-contiguous visible keys,
run-to-run differences, or anything else the probe's status rule calls ``undefined`` (NaN,
values not ``1/count``, random data not explained by the probed mask). Then the model must say
``undefined``. Otherwise the model's mask must equal the probed one on every row and query head,
and its status (``exact`` / ``leak``, :func:`swa_repro.core.intervals.status_of`) must be the
observed one; a model ``undefined`` there is a disagreement too.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

import numpy as np

from swa_repro.core.case import Case
from swa_repro.core.intervals import Intervals, intended_bounds
from swa_repro.evidence.fuzz_store import FLAG_BITS, Observed


def broken_reason(ob: Observed, window_left: int) -> str | None:
    """Why the kernel's output for this request is not defined by a mask; ``None`` if it is."""
    iv = ob.intervals
    why = []
    _, missing = iv.diff(window_left)
    if missing.any():
        why.append(f"{int((missing > 0).sum())} (row, head) miss in-window keys")
    _, ihi = intended_bounds(iv.prefix_len, iv.extend_len, window_left)
    future = np.asarray(iv.hi) > ihi[:, None]
    if future.any():
        why.append(f"{int(future.sum())} (row, head) see future keys")
    for bit, what in FLAG_BITS.items():
        n = int(((ob.flags & bit) > 0).sum())
        if n:
            why.append(f"{n} (row, head) {what}")
    if ob.status == "undefined" and not why:
        why.append(ob.reason)
    return "; ".join(why) or None


@dataclass
class CaseComparison:
    case: Case
    index: int
    requests: int = 0
    comparisons: int = 0  # request x query-head pairs
    agreements: int = 0
    model_statuses: list = field(default_factory=list)
    kernel_statuses: list = field(default_factory=list)  # exact / leak / undefined(broken)
    disagreements: list = field(default_factory=list)


def compare_case(case: Case, observed: list[Observed], index: int = 0, model=None) -> CaseComparison:
    """Hold ``simulate(case)`` to the observed requests (see the module doc)."""
    from swa_repro.kernel.model import simulate

    model = model or simulate(case)
    out = CaseComparison(case, index, requests=len(observed))
    hq = case.num_qo_heads
    for i, (ob, mr) in enumerate(zip(observed, model.requests)):
        miv, mstatus = mr.intervals, mr.status  # (qo, group) heads-in-group
        broken = broken_reason(ob, case.window_left)
        out.comparisons += hq
        out.model_statuses.append(mstatus)
        out.kernel_statuses.append("undefined" if broken else ob.status)
        if broken:
            if mstatus == "undefined":
                out.agreements += hq
            else:
                out.disagreements.append(_disagreement(case, index, i, "model misses undefined", mstatus, "undefined",
                                                       list(range(hq)), broken))
            continue
        if mstatus == "undefined":
            out.disagreements.append(_disagreement(case, index, i, "model says undefined, kernel looked defined",
                                                   mstatus, ob.status, list(range(hq)), ob.reason))
            continue
        m, k = miv.per_qo_head(hq), ob.intervals.per_qo_head(hq)
        bad = [h for h in range(hq) if not (np.array_equal(m.lo[:, h], k.lo[:, h]) and np.array_equal(m.hi[:, h], k.hi[:, h]))]
        status_ok = mstatus == ob.status
        out.agreements += 0 if not status_ok else hq - len(bad)
        if bad or not status_ok:
            detail = _first_diff(m, k, bad) if bad else f"same masks, kernel status {ob.status}: {ob.reason}"
            out.disagreements.append(_disagreement(case, index, i, "mask differs" if bad else "status differs",
                                                   mstatus, ob.status, bad or list(range(hq)), detail))
    return out


def _first_diff(m: Intervals, k: Intervals, heads) -> str:
    h = heads[0]
    rows = np.flatnonzero((m.lo[:, h] != k.lo[:, h]) | (m.hi[:, h] != k.hi[:, h]))
    q = int(rows[0])
    return (f"{len(rows)} rows differ on head {h} (heads {heads[:8]}{'...' if len(heads) > 8 else ''}); first row {q} "
            f"(position {m.prefix_len + q}): model keys [{m.lo[q, h]}, {m.hi[q, h]}], kernel [{k.lo[q, h]}, {k.hi[q, h]}]")


def _disagreement(case, index, request, kind, model_status, kernel_status, heads, detail) -> dict:
    return {"case_index": index, "case_name": case.name, "request": request, "kind": kind,
            "model_status": model_status, "kernel_status": kernel_status, "heads": heads, "detail": detail,
            "case": case.to_dict(), "reproduce": reproduce_cli(case), "python": reproduce_python(case)}


def reproduce_cli(case: Case) -> str:
    """One ``swa-repro mask --mode live`` line that probes this case again (model: ``--mode model``)."""
    args = ["swa-repro", "mask", "--mode", "live", "--backend", case.backend,
            "--plan-window-left", str(case.plan_window_left), "--window-left", str(case.window_left),
            "--prefix-lens", ",".join(map(str, case.prefix_lens)), "--extend-lens", ",".join(map(str, case.extend_lens)),
            "--num-qo-heads", str(case.num_qo_heads), "--num-kv-heads", str(case.num_kv_heads),
            "--head-dim", str(case.head_dim), "--page-size", str(case.page_size), "--sm-count", str(case.sm_count),
            "--flashinfer-version", case.flashinfer_version, "--out", f"{case.name or 'case'}.npz"]
    if case.disable_split_kv:
        args.insert(args.index("--sm-count"), "--disable-split-kv")
    return shlex.join(args)


def reproduce_python(case: Case) -> str:
    d = {k: v for k, v in case.to_dict().items() if k != "name"}
    return ("from swa_repro.core.case import Case; from swa_repro.kernel.probe import probe_case; "
            "from swa_repro.kernel.model import simulate; "
            f"c = Case(**{d!r}); print(probe_case(c).summary()['status'], simulate(c).statuses)")
