"""Counting and schema shared by the GPU study, the CPU benchmark, the report and notebook 06.

Pure functions, no torch: the report and the tests run anywhere.

Visibility is the project's one rule (``swa_repro.core.reference.visible``): the query at absolute
position ``p`` sees key ``j`` iff ``p - W <= j <= p``; ``W = -1`` is plain causal. The per-row
interval form of it is ``swa_repro.core.intervals.intended_bounds``, used here, never re-derived.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from swa_repro.core.intervals import intended_bounds

RESULTS_DIR = Path(__file__).resolve().parent / "results"
GPU_RESULTS = RESULTS_DIR / "h200_swa_prefill.json"
CPU_RESULTS = RESULTS_DIR / "cpu_model.json"
WORKFLOW_RESULTS = RESULTS_DIR / "cpu_workflow.json"  # make repro / make test timings (cpu_workflow.py)

FLASHINFER_VARIANTS = ("fixed", "buggy", "causal")
TORCH_VARIANTS = ("flex", "sdpa")
VARIANTS = FLASHINFER_VARIANTS + TORCH_VARIANTS
BACKENDS = ("fa2", "fa3", "torch")
GPU_PROVENANCE_KEYS = ("gpu", "driver", "torch", "flashinfer", "cuda", "date", "command")
RECORD_KEYS = ("backend", "variant", "seq_len", "batch", "window", "num_qo_heads", "num_kv_heads", "head_dim")
TIMING_KEYS = ("ms", "useful_tflops", "peak_fraction")


# ----------------------------------------------------------------------------- counting
def window_pairs(prefix_len: int, extend_len: int, window_left: int) -> int:
    """Exact in-window causal (query, key) pairs of one request whose ``extend_len`` queries sit at
    positions ``prefix_len..prefix_len+extend_len-1``: the sum of its intended intervals' lengths."""
    lo, hi = intended_bounds(prefix_len, extend_len, window_left)  # (qo,) inclusive
    return int((hi - lo + 1).sum())


def useful_flops(seq_len: int, batch: int, window: int, num_qo_heads: int, head_dim: int) -> int:
    """Only the in-window pairs count: per pair and query head, ``q.k`` (2d) and ``p*v`` (2d)."""
    return batch * num_qo_heads * window_pairs(0, seq_len, window) * 4 * head_dim


def computed_pairs(variant: str, seq_len: int, window: int, backend: str = "", cta_tile_q: int = 128,
                   group: int = 1) -> int:
    """Pairs a variant is *expected* to compute per request and query head (for the report's
    "wasted work" column): fa3-buggy and causal the whole triangle; sdpa with a dense mask the whole
    square; fa2-buggy the window plus its per-tile leak, each packed row of a CTA of ``cta_tile_q``
    rows starting at the window start of the tile's first row (GUIDE; kernel_model.cta_kv_start)."""
    if variant == "causal" or (variant == "buggy" and backend == "fa3"):
        return window_pairs(0, seq_len, -1)
    if variant == "sdpa":
        return seq_len * seq_len
    if variant == "buggy" and backend == "fa2":
        rows_per_tile = max(cta_tile_q // group, 1)
        total = 0
        for start in range(0, seq_len, rows_per_tile):  # rows start..end-1 all see [kv0, p]
            end, kv0 = min(start + rows_per_tile, seq_len), max(0, start - window)
            total += (end - start) * (1 - kv0) + (start + end - 1) * (end - start) // 2
        return total
    return window_pairs(0, seq_len, window)


def min_bytes(seq_len: int, batch: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
              elem_bytes: int = 2) -> int:
    """Fewest bytes through device memory: q, k, v read once, o written once."""
    tokens = seq_len * batch
    return tokens * head_dim * elem_bytes * (2 * num_qo_heads + 2 * num_kv_heads)


# ----------------------------------------------------------------------------- provenance
def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_provenance(command: str) -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "machine": platform.node(), "cpu": cpu or platform.processor(), "cpu_count": os.cpu_count(),
        "python": platform.python_version(), "platform": platform.platform(),
        "git_commit": _run(["git", "-C", str(RESULTS_DIR.parent.parent), "rev-parse", "HEAD"]),
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date": now_iso(), "command": command,
    }


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
    return " ".join([Path(sys.executable).name, *sys.argv])


# ----------------------------------------------------------------------------- I/O and schema
def finite(x):
    """JSON has no NaN/inf: non-finite floats become ``None`` (the validator then flags them)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def write_json_atomic(path: Path, doc: dict) -> None:
    """Write then rename, so a run killed mid-write leaves the previous complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite(doc), indent=1, allow_nan=False, default=str) + "\n")
    os.replace(tmp, path)


def load_json(path: Path) -> dict | None:
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else None


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_gpu_results(doc: dict) -> list[str]:
    """Problems with a GPU results document (empty list: well-formed). Every record names its shape;
    a record either has finite ``ms, useful_tflops, peak_fraction`` or says why not in ``error``."""
    errs = []
    if not isinstance(doc, dict):
        return ["results must be a JSON object"]
    prov = doc.get("provenance")
    if not isinstance(prov, dict):
        errs.append("missing provenance object")
    else:
        errs += [f"provenance lacks {k!r}" for k in GPU_PROVENANCE_KEYS if k not in prov]
    peak = doc.get("peak_bf16_tflops")
    if peak is not None and not (_num(peak) and peak > 0):
        errs.append(f"peak_bf16_tflops must be a positive number, got {peak!r}")
    recs = doc.get("records")
    if not isinstance(recs, list):
        return errs + ["records must be a list"]
    for i, r in enumerate(recs):
        where = f"record {i}"
        missing = [k for k in RECORD_KEYS if k not in r]
        if missing:
            errs.append(f"{where} lacks {missing}")
            continue
        if r["backend"] not in BACKENDS:
            errs.append(f"{where}: backend {r['backend']!r} not in {BACKENDS}")
        ok_variants = TORCH_VARIANTS if r["backend"] == "torch" else FLASHINFER_VARIANTS
        if r["variant"] not in ok_variants:
            errs.append(f"{where}: variant {r['variant']!r} not valid for backend {r['backend']!r}")
        if r["variant"] == "causal" and r["window"] != -1:
            errs.append(f"{where}: causal records carry window -1")
        if r["variant"] != "causal" and not (isinstance(r["window"], int) and r["window"] >= 0):
            errs.append(f"{where}: window must be an int >= 0")
        for k in ("seq_len", "batch", "num_qo_heads", "num_kv_heads", "head_dim"):
            if not (isinstance(r[k], int) and r[k] >= 1):
                errs.append(f"{where}: {k} must be a positive int")
        if r.get("error"):
            continue
        for k in TIMING_KEYS:
            if not (_num(r.get(k)) and r[k] > 0):
                errs.append(f"{where}: {k} must be a positive number (or give 'error')")
        if not errs and peak and _num(r.get("useful_tflops")):
            if abs(r["peak_fraction"] - r["useful_tflops"] / peak) > 1e-6 * max(1.0, r["peak_fraction"]):
                errs.append(f"{where}: peak_fraction != useful_tflops / peak_bf16_tflops")
    return errs


def timed_records(records) -> list[dict]:
    return [r for r in records if not r.get("error")]


def flops_mismatches(records) -> list[dict]:
    """Timed records whose ``useful_flops`` is not what their shape gives (:func:`useful_flops`)."""
    return [r for r in timed_records(records) if r.get("useful_flops") != useful_flops(
        r["seq_len"], r["batch"], r["window"], r["num_qo_heads"], r["head_dim"])]


def rate_mismatches(records) -> list[dict]:
    """Timed records whose ``useful_tflops`` is not useful FLOPs / time."""
    return [r for r in timed_records(records) if abs(r["useful_tflops"] * r["ms"] * 1e9 / r["useful_flops"] - 1) > 1e-6]


def fixed_rel_errs(records) -> list[float]:
    """Sampled-row errors of every kernel planned with the window (against the windowed reference)."""
    return [r["rel_err"] for r in records if r["variant"] == "fixed" and r.get("rel_err") is not None]


def fa3_buggy_windowed(records) -> list[dict]:
    """Timed fa3 records planned without the window whose window cuts keys (W < L - 1)."""
    return [r for r in timed_records(records) if (r["backend"], r["variant"]) == ("fa3", "buggy")
            and r["window"] < r["seq_len"] - 1]


def validate_cpu_results(doc: dict) -> list[str]:
    errs = []
    if not isinstance(doc, dict):
        return ["results must be a JSON object"]
    if not isinstance(doc.get("provenance"), dict):
        errs.append("missing provenance object")
    km = doc.get("kernel_model")
    if not isinstance(km, list) or not km:
        errs.append("kernel_model must be a non-empty list")
    else:
        for i, r in enumerate(km):
            if not (_num(r.get("median_s")) and r["median_s"] > 0):
                errs.append(f"kernel_model[{i}] lacks a positive median_s")
    return errs
