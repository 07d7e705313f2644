"""Storage of one ``swa-repro fuzz`` run: ``<stem>.json`` (cases, per-request probe status and
reason, plan info, timings, error maxima, fuzz args, provenance) + ``<stem>.npz``.

The npz holds, per probed case ``k``, its requests' rows concatenated, ``(total_qo, cols)``:
``c<k>_dlo``, ``c<k>_dhi`` int32, the probed first/last visible key minus the intended window's
(:func:`swa_repro.core.intervals.intended_bounds`; mostly zeros, so ``savez_compressed`` shrinks
them; exact round trip, ``-1`` "no key" rows included) and ``c<k>_flags`` uint8 (bits
:data:`FLAG_BITS`). ``cols`` is the JSON's ``cols``: ``one`` (every query head saw the same),
``group`` (every KV head's group saw what group 0 saw; columns are heads-in-group) or ``all``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swa_repro.core.case import Case
from swa_repro.core.errors import UsageError
from swa_repro.core.inputs import read_json, read_npz
from swa_repro.core.outputs import atomic_path, write_atomic
from swa_repro.core.intervals import Intervals, intended_bounds

FORMAT = "swa-repro-fuzz/1"
# bit -> ProbeRequest flag that, when False (True for nan), sets it
FLAG_BITS = {1: "not contiguous", 2: "not consistent (not 1/count)", 4: "nan", 8: "differs between repeats"}


@dataclass
class Observed:
    """What the kernel showed for one request: ``intervals`` ``(qo, Hq)``, the probe's status rule
    (``status``/``reason``) and the per (row, head) flag bits."""
    intervals: Intervals
    status: str
    reason: str
    flags: np.ndarray  # (qo, Hq) uint8


@dataclass
class FuzzCase:
    index: int
    case: Case
    entry: dict  # the JSON entry: statuses, reasons, plan_info, timings, max_err, error
    observed: list[Observed] | None  # None when probing the case failed (entry["error"])


@dataclass
class FuzzRun:
    path: Path
    doc: dict
    cases: list[FuzzCase]

    @property
    def flashinfer_version(self) -> str:
        return self.doc["flashinfer_version"]


# ----------------------------------------------------------------------------- probe -> observed
def observed_from_probe(req) -> Observed:
    """A fresh ``ProbeRequest`` (query-head columns) -> :class:`Observed`."""
    flags = ((~np.asarray(req.contiguous)).astype(np.uint8) * 1 | (~np.asarray(req.consistent)).astype(np.uint8) * 2
             | np.asarray(req.nan).astype(np.uint8) * 4 | (~np.asarray(req.repeat_equal)).astype(np.uint8) * 8)
    iv = req.intervals.per_qo_head(flags.shape[1])
    iv = Intervals(iv.prefix_len, iv.extend_len, np.asarray(iv.lo, np.int64), np.asarray(iv.hi, np.int64))
    return Observed(iv, req.status, req.reason, flags)


# ----------------------------------------------------------------------------- encode / decode
def _reduce_cols(case: Case, arrays: list[np.ndarray]) -> str:
    """The fewest columns that keep every (qo, Hq) array exactly (see module doc)."""
    if all((a == a[:, :1]).all() for a in arrays):
        return "one"
    g, hk = case.group_size, case.num_kv_heads
    if all((a.reshape(len(a), hk, g) == a.reshape(len(a), hk, g)[:, :1]).all() for a in arrays):
        return "group"
    return "all"


def _take(a: np.ndarray, cols: str, g: int) -> np.ndarray:
    return a[:, :1] if cols == "one" else a[:, :g] if cols == "group" else a


def _expand(a: np.ndarray, cols: str, case: Case) -> np.ndarray:
    if cols == "all":
        return a
    idx = np.zeros(case.num_qo_heads, int) if cols == "one" else np.arange(case.num_qo_heads) % case.group_size
    return a[:, idx]


def encode_case(index: int, case: Case, observed: list[Observed], entry: dict) -> tuple[dict, dict]:
    """One probed case -> (JSON entry, npz arrays named ``c<index>_*``)."""
    dlo, dhi, flags = [], [], []
    for ob in observed:
        ilo, ihi = intended_bounds(ob.intervals.prefix_len, ob.intervals.extend_len, case.window_left)
        dlo.append(np.asarray(ob.intervals.lo, np.int64) - ilo[:, None])
        dhi.append(np.asarray(ob.intervals.hi, np.int64) - ihi[:, None])
        flags.append(ob.flags)
    dlo, dhi, flags = (np.concatenate(x) for x in (dlo, dhi, flags))  # (total_qo, Hq)
    cols = _reduce_cols(case, [dlo, dhi, flags])
    g = case.group_size
    arrays = {f"c{index}_dlo": _take(dlo, cols, g).astype(np.int32), f"c{index}_dhi": _take(dhi, cols, g).astype(np.int32),
              f"c{index}_flags": _take(flags, cols, g).astype(np.uint8)}
    doc = {"index": index, "case": case.to_dict(), "cols": cols,
           "statuses": [o.status for o in observed], "reasons": [o.reason for o in observed], **entry}
    return doc, arrays


def decode_case(entry: dict, arrays) -> FuzzCase:
    case = Case.from_dict(entry["case"])
    k = entry["index"]
    if entry.get("error") or f"c{k}_dlo" not in arrays:
        return FuzzCase(k, case, entry, None)
    dlo, dhi, flags = (_expand(np.asarray(arrays[f"c{k}_{f}"]), entry["cols"], case) for f in ("dlo", "dhi", "flags"))
    want = (sum(case.extend_lens), case.num_qo_heads)
    if any(a.shape != want for a in (dlo, dhi, flags)) or len(entry["statuses"]) != len(case.extend_lens):
        raise ValueError(f"case {k}'s arrays are not {want[0]} rows x {want[1]} heads, one status per request")
    out, row = [], 0
    for i, (p, e) in enumerate(zip(case.prefix_lens, case.extend_lens)):
        ilo, ihi = intended_bounds(p, e, case.window_left)
        sl = slice(row, row + e)
        iv = Intervals(p, e, dlo[sl].astype(np.int64) + ilo[:, None], dhi[sl].astype(np.int64) + ihi[:, None])
        out.append(Observed(iv, entry["statuses"][i], entry["reasons"][i], flags[sl].astype(np.uint8)))
        row += e
    return FuzzCase(k, case, entry, out)


def write_run(stem: Path, doc: dict, entries: list[dict], arrays: dict) -> Path:
    """``<stem>.json`` + ``<stem>.npz``; returns the JSON path."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    npz = stem.with_name(stem.name + ".npz")
    with atomic_path(npz) as tmp:  # all or nothing, never through a link (core.outputs)
        np.savez_compressed(tmp, **arrays)
    path = stem.with_name(stem.name + ".json")
    write_atomic(path, (json.dumps({"format": FORMAT, **doc, "arrays": npz.name, "cases": entries},
                                   indent=1, default=_json_default) + "\n").encode())
    return path


def load_run(path) -> FuzzRun:
    """A recording, read whole before any of it is used: a truncated or hand-edited JSON, a bad
    ``.npz`` or entries that do not decode are one line (UsageError) naming the file."""
    path = Path(path)
    doc = read_json(path, "fuzz recording", ("format", "flashinfer_version", "arrays", "cases"))
    if doc["format"] != FORMAT:
        raise UsageError(f"fuzz recording {path}: not a {FORMAT} file (format={doc['format']!r})")
    if not isinstance(doc["arrays"], str) or Path(doc["arrays"]).name != doc["arrays"] or not isinstance(doc["cases"], list):
        raise UsageError(f"fuzz recording {path}: 'arrays' must name a file beside it and 'cases' be a list")
    arrays = read_npz(path.with_name(doc["arrays"]), f"fuzz recording {path.name}'s arrays")
    try:
        cases = [decode_case(e, arrays) for e in doc["cases"]]
    except (KeyError, IndexError, TypeError, ValueError) as e:  # CaseError is a ValueError
        raise UsageError(f"fuzz recording {path}: a case does not decode ({type(e).__name__}: {str(e)[:100]}); "
                         "re-record it with `swa-repro fuzz --mode live`") from None
    return FuzzRun(path, doc, cases)


def find_runs(root) -> list[Path]:
    """Fuzz recordings (not reports) directly under ``root``, sorted."""
    root = Path(root)
    return sorted(p for p in root.glob("*.json") if not p.name.endswith(".report.json") and _is_run(p))


def _is_run(path: Path) -> bool:
    try:
        with open(path, "rb") as f:  # bytes: a binary file is no recording, not a UnicodeDecodeError
            return f'"format": "{FORMAT}"'.encode() in f.read(200)
    except OSError:
        return False


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return None if np.isnan(o) else float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
