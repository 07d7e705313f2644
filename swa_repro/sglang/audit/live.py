"""Live verdicts: each effective call of a driven path re-issued on a kernel, its output held
against the float64 reference over the keys the layer intends (``audit.keys``).

The audit records sglang's calls on recording stand-ins (the same trace on a CPU and on a GPU);
here each effective call (``audit.calls.pairs``) is rebuilt on a fresh wrapper from its recorded
constructor, plan and forward, and executed:

* ``flashinfer_executor``: the real FlashInfer classes on CUDA (``swa-repro audit --mode live``).
  A CUDA-graph replay re-plans a captured wrapper through ``fast_decode_plan`` / sglang's
  ``fast_prefill_plan``, which never re-pick the module (flashinfer decode.py:2898; 0.5.23
  flashinfer_backend.py:180): the replayed plan runs with the window and cap of the capture's plan;
* ``model_executor``: the kernel-model wrappers on CPU (``kernel.wrappers``), for tests.

Per call and query row: ``err_intended`` (vs the reference over the intended keys with the layer's
cap), ``err_uncapped`` (the same keys, no cap) and ``err_predicted`` (vs the reference over the keys
``audit.keys`` says the backend that ran attends, with the cap the plan compiled in): the last one is
the model held against the real kernel. A row is *wrong* when ``err_intended > atol``. The model
*agrees* when every element of the kernel's output is within ``atol + RTOL * |reference|`` of the
predicted reference (``torch.isclose``'s rule; ``excess_predicted``, recorded from 2026-12-05 on):
a bf16 output is rounded relative to its size, and an uncapped Gemma-2 call's outputs are large
enough that one ulp passes ``atol`` alone (its EAGLE tree: 0.0203 on the H100 that day, row for
row the rows the model predicted).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from swa_repro.core.reference import masked_attention
from swa_repro.engine.tolerance import ATOL, RTOL
from swa_repro.kernel.graph_buffers import check_index_dtypes
from swa_repro.kernel.wrappers import unpack_paged_kv_cache
from swa_repro.sglang.audit.calls import Pair, pairs
from swa_repro.sglang.audit.env import PAGED, RAGGED
from swa_repro.sglang.audit.keys import call_keys
from swa_repro.sglang.trace import decode
from swa_repro.sglang.trace import first_tensor as _first_tensor


def _call(trace, index: int, device, workspaces):
    c = trace.calls[index]
    return c.method, decode(c.args, device, workspaces), decode(c.kwargs, device, workspaces)


def _execute(make, trace, p: Pair, device: str, workspaces: dict, backend=None) -> tuple:
    """A fresh wrapper from the recorded constructor (``backend(pair)``, where given and not None:
    the backend it is built with instead of the recorded one), the pair's plan (a replay: with the
    capture plan's window and cap, the module that was captured), then its forward: ``(output rows,
    the backend the wrapper ran)``, the latter as FlashInfer resolved it at plan (``_backend``, set
    from ``auto`` at prefill.py:2018 / decode.py:1069 in 0.7.2)."""
    init = next(c for c in trace.calls if c.wrapper == p.wrapper and c.method == "__init__")
    kwargs = decode(init.kwargs, device, workspaces)
    chosen = backend(p) if backend is not None else None
    if chosen is not None and "backend" in kwargs:
        kwargs["backend"] = chosen
    w = make(p.cls)(*decode(init.args, device, workspaces), **kwargs)
    method, args, kwargs = _call(trace, p.plan[0], device, workspaces)
    replay = p.stage == "replay" and p.capture_plan is not None
    if replay or getattr(trace.calls[p.fwd[0]], "reads", None) is not None:
        # a CUDA-graph forward: planned with what its run read from the buffers (the mask a wrapper
        # sharing one planned last, audit.calls.pairs), which this fresh wrapper does not share
        args, kwargs = [], _bound_plan(p, device)
    if replay:
        kwargs.update({k: p.capture_plan[1][k] for k in ("window_left", "logits_soft_cap")})
    if p.cls in (PAGED, RAGGED):  # a clear error, never a kernel fault that poisons the process's context
        check_index_dtypes(w, "paged" if p.cls == PAGED else "ragged", kwargs)
    announce(trace, p, "launching")
    getattr(w, method)(*args, **kwargs)
    method, args, kwargs = _call(trace, p.fwd[0], device, workspaces)
    out = _first_tensor(getattr(w, method)(*args, **kwargs))
    announce(trace, p, "returned")
    return out, getattr(w, "_backend", None)


def _bound_plan(p: Pair, device: str) -> dict:
    """The plan arguments the recorded plan passed, with what the run read in place of its own
    (``audit.calls.pairs``), on ``device``. The reads keep their buffers' dtype
    (``kernel.graph_buffers.paged_reads``): sglang's int32 (0.5.23 flashinfer_backend.py:474-479,
    :485-487, :1107-1111, :1139-1140), the dtype it plans with, so the fresh wrapper's module is built
    for the indices its buffers hold; ``_execute`` checks it (``graph_buffers.check_index_dtypes``: planned
    int64 over int32 buffers, FlashInfer's kernel reads them as int64, the illegal memory access of the
    H100 call of 2026-12-06)."""
    plan = {k: p.plan[1][k] for k in p.plan[2][1]}
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in plan.items()}


ANNOUNCE_ENV = "SWA_REPRO_ANNOUNCE_CALLS"  # set (scripts/gpu_family.sh's graph child): one stderr line per launch


def announce(trace, p: Pair, what: str) -> None:
    """Where :data:`ANNOUNCE_ENV` is set, a call about to be planned and launched (``launching``) or
    returned from its launch (``returned``), on stderr, flushed: with ``CUDA_LAUNCH_BLOCKING=1`` a kernel
    fault is reported at its launch, and the call launched and never returned (the warm-up runs calls in
    parallel threads) is named in the log even if the process dies before its JSON is written."""
    if os.environ.get(ANNOUNCE_ENV):
        meta = trace.meta or {}
        print(f"live: {what} {meta.get('path')} layer={meta.get('layer')} {p.stage} {p.cls} "
              f"wrapper={p.wrapper} plan=#{p.plan[0]} forward=#{p.fwd[0]} backend={p.backend}",
              file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Executor:
    """``executor(trace, pair, workspaces) -> (output, backend ran)``: a recorded call on a fresh
    wrapper of ``make(class name)``, its tensors on ``device`` (where its output, and a judge's
    reference, live); ``backend``: ``pair -> backend or None`` to build the wrapper with instead of
    the recorded one (a GPU class's choice run on this card: ``audit.family.executor_for``)."""
    make: object
    device: str
    backend: object = None

    def __call__(self, trace, p: Pair, ws: dict) -> tuple:
        return _execute(self.make, trace, p, self.device, ws, self.backend)


def flashinfer_executor(device: str = "cuda") -> Executor:
    """Real FlashInfer wrappers on ``device`` (imported here: CUDA hosts only)."""
    import flashinfer

    return Executor(lambda cls: getattr(flashinfer, cls), device)


def model_executor() -> Executor:
    """The kernel-model wrappers on CPU (``kernel.wrappers``): what a CPU host can execute."""
    from swa_repro.sglang.harness import MODEL_CLASSES

    return Executor(lambda cls: MODEL_CLASSES[cls], "cpu")


# ----------------------------------------------------------------------------- one call
@dataclass
class CallOutcome:
    stage: str
    cls: str
    index: int  # the forward's index in the trace
    rows: int
    wrong_rows: int  # err_intended > atol
    predicted_wrong_rows: int  # rows audit.keys says attend other keys than intended, or run with another cap
    max_err_intended: float | None
    max_err_uncapped: float | None
    max_err_predicted: float | None  # None where the model calls the rows undefined
    nan_rows: int
    error: str | None = None
    backend: str | None = None  # the backend the wrapper ran (FlashInfer's resolution of ``auto``)
    seconds: float | None = None  # executing and judging the call (a slow live step says where its time went)
    max_excess_predicted: float | None = None  # max |out - predicted| - RTOL * |predicted|: agrees if <= atol

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def _kv(p: Pair, fwd: dict, slots: np.ndarray):
    idx = torch.as_tensor(slots, dtype=torch.long)
    if p.cls == RAGGED:
        return fwd["k"].cpu()[idx], fwd["v"].cpu()[idx]
    k, v = unpack_paged_kv_cache(fwd["paged_kv_cache"])
    return (k.cpu().reshape(-1, *k.shape[2:])[idx], v.cpu().reshape(-1, *v.shape[2:])[idx])


ROW_BLOCK = 512  # query rows per float64 reference (see _err)


def _err(q, k, v, out, mask, sm: float, cap: float, device) -> torch.Tensor:
    """``(rows, 2)``: per query row, the largest |out - reference| and the largest |out - reference|
    - RTOL * |reference| over heads and dims, the reference held to ``mask`` (``(rows, kv)`` or
    ``(heads, rows, kv)``), ROW_BLOCK rows at a time: a 4096 window's whole call (32 heads x 4392
    rows x 4648 keys) is 5 GB of float64 logits, which ran out of GPU memory with both sites judging
    at once (the H100 call of 2026-12-05)."""
    errs = []
    for r0 in range(0, len(q), ROW_BLOCK):
        sl = slice(r0, r0 + ROW_BLOCK)
        ref = masked_attention(q[sl], k, v, mask[..., sl, :], sm, cap, device=device)
        d = (out[sl].double().to(ref.device) - ref).abs()
        errs.append(torch.stack([d, d - RTOL * ref.abs()]).reshape(2, ref.shape[0], -1).amax(2).T.cpu())
    return torch.cat(errs) if errs else torch.zeros(0, 2, dtype=torch.float64)


def judge(p: Pair, out: torch.Tensor, snap: dict, window: int, cap: float, atol: float = ATOL,
          device=None, ran: str | None = None) -> CallOutcome:
    """One executed call against the references (see the module docstring); ``device``: where the
    float64 references run (``core.reference.masked_attention``; default the CPU); ``ran``: the
    backend the wrapper ran, what the prediction models (None: the recorded one)."""
    plan, fwd = p.plan[1], p.fwd[1]
    q = fwd["q"].cpu()
    sm = fwd.get("sm_scale") or plan.get("sm_scale") or 1.0 / math.sqrt(q.shape[-1])
    kernel_cap = float(fwd.get("logits_soft_cap") or 0.0) if float(plan.get("logits_soft_cap") or 0.0) > 0 else 0.0
    errs, pred, excess, nan_rows, pred_wrong = [], [], [], 0, 0
    for rk in call_keys(p, snap, window, ran):
        k, v = _kv(p, fwd, rk.k_index)
        qr, o = q[rk.rows], out.float().cpu()[rk.rows]
        nan_rows += int(torch.isnan(o).reshape(len(rk.rows), -1).any(1).sum())
        e_int = _err(qr, k, v, o, rk.intended, sm, cap, device)[:, 0]
        e_unc = _err(qr, k, v, o, rk.intended, sm, 0.0, device)[:, 0] if cap else e_int  # no cap: the same reference
        errs.append(torch.stack([e_int, e_unc], 1))
        if rk.attended is None:
            pred_wrong += len(rk.rows)
            continue
        e_pred = _err(qr, k, v, o, rk.attended, sm, kernel_cap, device)
        pred.append(e_pred[:, 0])
        excess.append(e_pred[:, 1])
        differs = (rk.attended != rk.intended[None]).any((0, 2))
        pred_wrong += int((differs | (kernel_cap != cap)).sum())
    e = torch.cat(errs) if errs else torch.zeros(0, 2, dtype=torch.float64)
    bad = e[:, 0].nan_to_num(float("inf")) > atol
    mx = lambda t: float(t.nan_to_num(float("inf")).max()) if t.numel() else None  # noqa: E731
    return CallOutcome(p.stage, p.cls, p.fwd[0], len(e), int(bad.sum()), pred_wrong, mx(e[:, 0]), mx(e[:, 1]),
                       mx(torch.cat(pred)) if pred else None, nan_rows,
                       max_excess_predicted=mx(torch.cat(excess)) if excess else None)


# ----------------------------------------------------------------------------- JIT warm-up
def module_signature(trace, p: Pair, backend=None) -> tuple:
    """What decides which compiled module a call needs (prefill.py:2025-2042, decode.py:1054):
    the class, backend (``backend(pair)`` where an executor builds it with another), window and cap
    compiled at plan, custom mask, and the constructor's flags."""
    init = next(c for c in trace.calls if c.wrapper == p.wrapper and c.method == "__init__")
    kw = decode(init.kwargs)
    plan = (p.capture_plan or p.plan)[1]
    chosen = (backend(p) if backend is not None else None) or p.backend
    return (p.cls, chosen, int(plan["window_left"]) >= 0, float(plan.get("logits_soft_cap") or 0) > 0,
            plan.get("custom_mask") is not None, bool(kw.get("use_cuda_graph")), bool(kw.get("use_tensor_cores")),
            int(plan.get("head_dim_qk") or plan.get("head_dim") or 0))


def warm(runs, executor, *, workers: int | None = None, deadline: float | None = None) -> dict:
    """:func:`warm_calls` of every run on one executor."""
    return warm_calls([(run, executor) for run in runs], workers=workers, deadline=deadline)


def warm_calls(items, *, workers: int | None = None, deadline: float | None = None) -> dict:
    """``items``: ``(run, executor)``. Execute one call per distinct module in parallel threads, so
    the JIT builds overlap (each build is its own ninja job behind a per-module file lock, flashinfer
    jit/core.py:342 in 0.7.2; as ``kernel.live.prebuild_modules``). Each thread gets its own
    workspace. By default every signature gets its own thread: with fewer (8 until 2026-12-04) the
    builds came in two waves, and the second wave's modules (the decode ones in the H200 log of that
    day) started ~190 s late; a thread whose module another thread is building only waits on its
    lock. ``{signature: seconds or error}``; a failure here is not fatal (the judged pass runs the
    call again and says why). At ``deadline`` it stops waiting: a build still running is said so and
    left to finish (ninja keeps what it compiled for the next process that asks for the module). The
    threads are daemons: a ``ThreadPoolExecutor``'s are joined at interpreter exit, and on the H100
    of 2026-12-06 both sites' processes, their JSON written, hung on fa3 builds until the step's
    ``timeout`` killed them (``KeyboardInterrupt`` in ``_wait_for_tstate_lock``)."""
    import threading

    todo = {}
    for run, executor in items:
        for p in pairs(run):
            todo.setdefault(module_signature(run.trace, p, getattr(executor, "backend", None)), (run, p, executor))
    results, sem = {}, threading.Semaphore(max(1, min(workers or len(todo), len(todo) or 1)))

    def one(key, item):
        with sem:
            results[key] = _warm_one(item, deadline)
    threads = [threading.Thread(target=one, args=(repr(sig), item), daemon=True) for sig, item in todo.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return {repr(sig): results.get(repr(sig), STILL_BUILDING) for sig in todo}


STILL_BUILDING = "still building at the live time budget's end"


def _warm_one(item, deadline: float | None):
    run, p, executor = item
    t = time.monotonic()
    if deadline is not None and t > deadline:
        return "skipped: the live time budget ran out"
    try:
        executor(run.trace, p, {})
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return round(time.monotonic() - t, 1)
    except Exception as e:  # noqa: BLE001 - reported; the judged pass says why per call
        return f"error: {type(e).__name__}: {str(e)[:200]}"


def unwarmed(warmed: dict, backend=None):
    """``pair -> reason or None`` for :func:`live_of_run`'s ``skip``: a call whose module the warm-up
    left still building (its first call would wait on the build's lock past every deadline: on the
    H100 of 2026-12-06 the judged pass's first fa3 call did, and no call after it ran) or could not
    run is said not run, and the other calls still run."""
    def why(trace, p) -> str | None:
        got = warmed.get(repr(module_signature(trace, p, backend)))
        if got is None or isinstance(got, (int, float)):
            return None
        return f"not run: its module's warm-up: {got}"
    return why


# ----------------------------------------------------------------------------- one driven path
def live_of_run(run, executor, *, deadline: float | None = None, atol: float = ATOL, window: int | None = None,
                cap: float | None = None, ref_device=None, skip=None) -> dict:
    """Every effective call of ``run`` executed and judged: a summary and the calls. ``window`` /
    ``cap``: what the rows are held against, by default the layer's own (``run.layer_window``,
    ``run.layer_cap``); a model family's audit passes the window its config intends (HF's count,
    ``families.SmallConfig.intended_window``), which a release may hand the layer differently.
    ``ref_device``: where :func:`judge` runs the float64 references (default the CPU). ``skip``:
    ``(trace, pair) -> reason or None`` (:func:`unwarmed`), a call said not run for that reason."""
    window = run.layer_window if window is None else window
    cap = run.layer_cap if cap is None else cap
    outcomes, ws = [], {}
    for p in pairs(run):
        why = "not run: the live time budget ran out" if deadline is not None and time.monotonic() > deadline \
            else (skip(run.trace, p) if skip is not None else None)
        if why:
            outcomes.append(CallOutcome(p.stage, p.cls, p.fwd[0], 0, 0, 0, None, None, None, 0, why))
            continue
        t = time.monotonic()
        try:
            out, ran = executor(run.trace, p, ws)
            if out is not None and out.is_cuda:
                torch.cuda.synchronize()
            outcomes.append(replace(judge(p, out, run.snapshot, window, cap, atol, device=ref_device, ran=ran),
                                    backend=ran, seconds=round(time.monotonic() - t, 2)))
        except Exception as e:  # said per call, never hidden
            outcomes.append(CallOutcome(p.stage, p.cls, p.fwd[0], 0, 0, 0, None, None, None, 0,
                                        f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"))
    return summarize(outcomes, atol)


def summarize(outcomes: list[CallOutcome], atol: float = ATOL) -> dict:
    ran = [o for o in outcomes if o.error is None]

    def mx(attr):
        vals = [getattr(o, attr) for o in ran if getattr(o, attr) is not None]
        return max(vals) if vals else None
    pred, excess = mx("max_err_predicted"), mx("max_excess_predicted")
    return {"calls": len(outcomes), "executed": len(ran), "rows": sum(o.rows for o in ran),
            "wrong_rows": sum(o.wrong_rows for o in ran), "predicted_wrong_rows": sum(o.predicted_wrong_rows for o in ran),
            "max_err_intended": mx("max_err_intended"), "max_err_uncapped": mx("max_err_uncapped"),
            "max_err_predicted": pred, "max_excess_predicted": excess,
            "model_agrees": None if pred is None else (excess if excess is not None else pred) <= atol,
            "nan_rows": sum(o.nan_rows for o in ran), "backends": sorted({o.backend for o in ran if o.backend}),
            "errors": sorted({o.error for o in outcomes if o.error}),
            "per_call": [o.to_dict() for o in outcomes]}
