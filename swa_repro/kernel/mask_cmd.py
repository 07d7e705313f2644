"""``swa-repro mask``: effective masks of one case, from the kernel model or the real kernel.

Default output: intervals, the form every mask source speaks (:mod:`swa_repro.core.intervals`).
Per request ``i``: ``lo_i``, ``hi_i`` int32 ``(extend_len, num_qo_heads)``, the first and last key
each query row sees per query head (inclusive, ``-1`` = none), and its status and reason; plus the
case, the summary and where the masks came from (``provenance``). ``--out x.npz`` (compressed) or
``--out x.json``. A 32k-token request takes well under a second this way.

``--dense`` writes what this command wrote before: ``mask_0, mask_1, ...`` (bool, extend_len x
kv_len; union over the query heads) and ``status`` to an ``.npz``. One byte per (query, key) cell,
so it is refused above :data:`DENSE_LIMIT_CELLS`. Either way a JSON summary goes to stdout.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import shlex
import sys
import zipfile

import numpy as np
from numpy.lib import format as npformat

from swa_repro.core.case import HEAD_DIMS, MAX_HEADS, MAX_KV_LEN, Case
from swa_repro.core.errors import CaseError, check_bounds
from swa_repro.core.intervals import Intervals
from swa_repro.core.outputs import atomic_path, out_file, untracked_file, write_atomic
from swa_repro.core.versions import FLASHINFER_VERSIONS, evidence_note

FORMAT = "swa-repro-mask-intervals/1"
# --dense: one bool per (query, key) cell over all requests; 2**30 cells is a 1 GiB mask (one 32k
# request), which takes a few seconds to fill and write.
DENSE_LIMIT_CELLS = 2**30
# Tokens per KV page: the fuzz draws 1..64 (fuzz_cases.PAGE_SIZES); 4096 leaves room to experiment
# while a live probe's pages stay allocatable.
MAX_PAGE_SIZE = 4096
# SMs of the GPU modelled (H100/H200: 132); 1024 leaves room for larger parts.
MAX_SM_COUNT = 1024


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip() != "")
    except ValueError:
        raise CaseError(f"{flag} takes comma-separated integers like 0,4,8; got {text!r}") from None
    return vals


def add_case_args(p) -> None:
    """The shape flags shared by every command that takes one case."""
    p.add_argument("--backend", default="fa2", help="fa2 | fa3 | auto")
    p.add_argument("--plan-window-left", type=int, default=-1, help="window given to plan(): -1 = the bug")
    p.add_argument("--window-left", type=int, default=4, help="the layer's window, given to forward()")
    p.add_argument("--prefix-lens", required=True, help="comma-separated, one per request")
    p.add_argument("--extend-lens", required=True, help="comma-separated, one per request")
    p.add_argument("--num-qo-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--disable-split-kv", action="store_true")
    p.add_argument("--sm-count", type=int, default=132, help="SMs of the GPU modelled (H100/H200: 132)")
    p.add_argument("--flashinfer-version", default="0.7.2.post1",
                   help=f"modelled flashinfer: {' | '.join(FLASHINFER_VERSIONS)}")


def case_bounds(a) -> list:
    """(flag, value, lowest, highest) of every number of :func:`add_case_args`: the Case's own limits
    (int32 key positions, CUDA's grid), so nothing past them reaches numpy (an OverflowError)."""
    return [("--window-left", a.window_left, -1, MAX_KV_LEN),
            ("--plan-window-left", a.plan_window_left, -1, MAX_KV_LEN),
            ("--num-qo-heads", a.num_qo_heads, 1, MAX_HEADS), ("--num-kv-heads", a.num_kv_heads, 1, MAX_HEADS),
            ("--head-dim", a.head_dim, 1, max(max(d) for d in HEAD_DIMS.values())),
            ("--page-size", a.page_size, 1, MAX_PAGE_SIZE), ("--sm-count", a.sm_count, 1, MAX_SM_COUNT)]


def case_from_args(a) -> Case:
    return Case(
        prefix_lens=_ints(a.prefix_lens, "--prefix-lens"), extend_lens=_ints(a.extend_lens, "--extend-lens"),
        num_qo_heads=a.num_qo_heads, num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, page_size=a.page_size,
        window_left=a.window_left, plan_window_left=a.plan_window_left, backend=a.backend,
        disable_split_kv=a.disable_split_kv, sm_count=a.sm_count, flashinfer_version=a.flashinfer_version,
    )


def register(sub) -> None:
    p = sub.add_parser("mask", help="effective masks of one case (model or live probe) -> .npz/.json intervals")
    p.add_argument("--mode", choices=("model", "live"), default="model")
    add_case_args(p)
    p.add_argument("--out", required=True, help="output: .npz or .json (per-row key intervals); .npz with --dense")
    p.add_argument("--force", action="store_true", help="let --out be in the committed folders (docs/, recordings/)")
    p.add_argument("--dense", action="store_true",
                   help=f"write bool (extend_len, kv_len) masks instead (.npz; at most {DENSE_LIMIT_CELLS} cells)")
    p.set_defaults(func=main)


def requests_for(case: Case, mode: str) -> tuple[list, dict]:
    """Per-request results (``.intervals``, ``.status``, ``.reason``) and a summary, from the model
    or the real kernel."""
    if mode == "model":
        from swa_repro.kernel.model import simulate

        res = simulate(case)
        return res.requests, res.summary()
    from swa_repro.core.mode import require_live

    require_live()
    from swa_repro.kernel.probe import probe_case

    pr = probe_case(case)
    return pr.requests, pr.summary()


def dense_union(iv: Intervals) -> np.ndarray:
    """Bool ``(qo, kv)``: :meth:`Intervals.mask` (union over columns), filled row by row: one slice
    per (row, column) instead of comparisons over the whole ``(qo, kv)`` grid."""
    out = np.zeros((iv.extend_len, iv.kv_len), bool)
    for h in range(iv.heads):
        lo, hi = iv.lo[:, h], iv.hi[:, h]
        for q in np.flatnonzero((lo >= 0) & (hi >= lo)):
            out[q, lo[q]:hi[q] + 1] = True
    return out


def provenance(case: Case, mode: str) -> dict:
    """Where the masks came from: the model of which flashinfer, or which kernel on which GPU."""
    from swa_repro import __version__

    doc = {"source": "kernel model (swa_repro.kernel.model)" if mode == "model" else "real kernel (swa_repro.kernel.probe)",
           "swa_repro": __version__, "python": platform.python_version(), "numpy": np.__version__,
           "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "command": shlex.join(["swa-repro", *sys.argv[1:]])}
    if mode == "model":
        return {**doc, "flashinfer_modelled": case.flashinfer_version, "sm_count_modelled": case.sm_count,
                **_evidence(case, mode)}
    import torch

    from swa_repro.kernel.live import installed_flashinfer_version

    return {**doc, "flashinfer": installed_flashinfer_version(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0))}


def interval_doc(case: Case, reqs) -> list[dict]:
    """Per request: bounds per query head as int32 ``(qo, Hq)`` arrays, status, reason."""
    out = []
    for r in reqs:
        iv = r.intervals.per_qo_head(case.num_qo_heads)
        out.append({"prefix_len": iv.prefix_len, "extend_len": iv.extend_len, "status": r.status, "reason": r.reason,
                    "lo": iv.lo.astype(np.int32), "hi": iv.hi.astype(np.int32)})
    return out


def write_intervals(path: str, meta: dict, rows: list[dict]) -> None:
    """Through ``core.outputs`` (all or nothing, a link never written through), as every output."""
    if path.endswith(".json"):
        doc = {**meta, "requests": [{**r, "lo": r["lo"].tolist(), "hi": r["hi"].tolist()} for r in rows]}
        write_atomic(path, (json.dumps(doc, separators=(",", ":"), default=str) + "\n").encode())
        return
    arrays = {f"{k}_{i}": r[k] for i, r in enumerate(rows) for k in ("lo", "hi")}
    with atomic_path(path) as tmp:
        _savez(tmp, meta, rows, arrays)


def _savez(path: str, meta: dict, rows: list[dict], arrays: dict) -> None:
    np.savez_compressed(path, meta=np.array(json.dumps(meta, default=str)), status=np.array([r["status"] for r in rows]),
                        reason=np.array([r["reason"] for r in rows]),
                        prefix_lens=np.array([r["prefix_len"] for r in rows], np.int64),
                        extend_lens=np.array([r["extend_len"] for r in rows], np.int64), **arrays)


def savez_fast(path: str, **arrays) -> None:
    """``np.savez_compressed`` at zlib level 1 (numpy's writes at 6): the same ``.npz`` for
    ``np.load``, ~3x faster for a mostly-empty 1 GiB mask (the file ~4x larger: MBs, not GBs).
    Written as :func:`core.outputs.atomic_path`: all or nothing, never through a link."""
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for name, arr in arrays.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                npformat.write_array(f, np.asanyarray(arr), allow_pickle=False)


def check_dense(case: Case, out: str) -> None:
    if not out.endswith(".npz"):
        raise CaseError(f"--dense writes an .npz file: give --out NAME.npz (got {out!r}), or drop --dense for intervals")
    cells = sum(e * kv for e, kv in zip(case.extend_lens, case.kv_lens))
    if cells > DENSE_LIMIT_CELLS:
        raise CaseError(f"--dense: {cells} (query, key) cells is over the {DENSE_LIMIT_CELLS} (1 GiB) a dense mask may "
                        "hold; drop --dense to write per-row key intervals instead")


def _evidence(case: Case, mode: str) -> dict:
    """Model mode: what backs the model of this flashinfer (recordings, or its sources alone)."""
    return {"evidence": evidence_note(case.flashinfer_version)} if mode == "model" else {}


def main(a) -> int:
    case = case_from_args(a)  # first: its messages name what to change (window_left, the head counts)
    check_bounds(case_bounds(a))  # then the highest of every number, which Case leaves open
    if a.dense:
        check_dense(case, a.out)
    out_file(a.out, "--out", (".npz", ".json"))  # before any work: nothing written on bad input
    untracked_file(a.out, "--out", force=a.force)
    reqs, summary = requests_for(case, a.mode)
    status = [r.status for r in reqs]
    if a.dense:
        arrays = {f"mask_{i}": dense_union(r.intervals) for i, r in enumerate(reqs)}
        savez_fast(a.out, status=np.array(status), **arrays)
    else:
        meta = {"format": FORMAT, "mode": a.mode, "case": case.to_dict(), "summary": summary,
                "provenance": provenance(case, a.mode),
                "layout": "lo_i/hi_i int32 (extend_len, num_qo_heads): first/last visible key, inclusive, -1 none"}
        write_intervals(a.out, meta, interval_doc(case, reqs))
    json.dump({"mode": a.mode, "case": case.to_dict(), "out": a.out, "output": "dense" if a.dense else "intervals",
               **summary, **_evidence(case, a.mode)}, sys.stdout)
    sys.stdout.write("\n")
    return 0
