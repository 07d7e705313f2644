"""Recorded FlashInfer wrapper calls, and ``swa-repro replay`` on a GPU that has no sglang.

``record_class(cls, trace)`` returns a factory that sglang can call in place of a FlashInfer
wrapper class: it builds the wrapper and hands back a ``TracedWrapper`` that records every
constructor / ``plan`` / ``begin_forward`` / ``forward`` / ``run`` call (args, kwargs, result;
tensors by value as CPU copies, taken *before* the call) into a ``Trace``. A trace is saved with
``torch.save`` as plain containers (``.pt``) and loads with ``weights_only=True``.

``replay(trace)`` re-issues the calls, in order, against the real
``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` (and friends) on CUDA: each wrapper is
constructed with the recorded constructor args (the workspace buffer is recorded as its size and
re-allocated), and each output is compared with the recorded one (model prediction or an earlier
real run) and, when the trace carries it, with the exact float64 reference.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from swa_repro.core.errors import UsageError, check_bounds
from swa_repro.core.outputs import atomic_path, out_file, untracked_file, write_atomic
from swa_repro.evidence.recordings import provenance

RECORDED_METHODS = ("plan", "begin_forward", "forward", "forward_return_lse", "run", "run_return_lse")
OUTPUT_METHODS = ("forward", "forward_return_lse", "run", "run_return_lse")
PLAN_METHODS = ("plan", "begin_forward")
FORMAT = "swa-repro-trace/1"


# ----------------------------------------------------------------------------- encoding
SHAPE_ONLY_NUMEL = 1 << 16  # float tensors above this many elements: shape and dtype only (``values=False``)


def encode(x, *, workspace: bool = False, values: bool = True):
    """Python/torch values -> containers ``torch.load(weights_only=True)`` accepts. ``values=False``:
    floating-point tensors over :data:`SHAPE_ONLY_NUMEL` elements (q, k, v, the KV cache, outputs)
    keep their shape and dtype only; index tensors and masks are always copied."""
    if torch.is_tensor(x):
        if workspace:  # flashinfer's float workspace: its size (and which one it is) matters, not its bytes
            return {"__workspace__": int(x.numel() * x.element_size()), "id": int(x.data_ptr())}
        if not values and x.is_floating_point() and x.numel() > SHAPE_ONLY_NUMEL:
            return {"__shape__": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")}
        return x.detach().to("cpu").clone()
    if isinstance(x, torch.dtype):
        return {"__dtype__": str(x).removeprefix("torch.")}
    if isinstance(x, tuple):
        return {"__tuple__": [encode(v, values=values) for v in x]}
    if isinstance(x, list):
        return [encode(v, values=values) for v in x]
    if isinstance(x, dict):
        return {str(k): encode(v, values=values) for k, v in x.items()}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return {"__repr__": repr(x)}


def decode(x, device="cpu", workspaces: dict | None = None):
    """Inverse of :func:`encode`, tensors moved to ``device``; a workspace is re-allocated, once per
    recorded buffer when ``workspaces`` is given (sglang shares one among all its wrappers)."""
    if torch.is_tensor(x):
        return x.to(device)
    if isinstance(x, list):
        return [decode(v, device, workspaces) for v in x]
    if isinstance(x, dict):
        if "__workspace__" in x:
            if workspaces is None:
                return torch.zeros(x["__workspace__"], dtype=torch.uint8, device=device)
            key = (x.get("id"), x["__workspace__"])
            if key not in workspaces:
                workspaces[key] = torch.zeros(x["__workspace__"], dtype=torch.uint8, device=device)
            return workspaces[key]
        if "__dtype__" in x:
            return getattr(torch, x["__dtype__"])
        if "__shape__" in x:  # recorded without its values: a meta tensor of its shape
            return torch.empty(x["__shape__"], dtype=getattr(torch, x["dtype"]), device="meta")
        if "__tuple__" in x:
            return tuple(decode(v, device) for v in x["__tuple__"])
        if "__repr__" in x:
            raise ValueError(f"trace holds an opaque value {x['__repr__']}: it cannot be replayed")
        return {k: decode(v, device) for k, v in x.items()}
    return x


def first_tensor(x):
    """The first tensor of a call's result (a tensor, or a tuple of them as recorded or returned):
    the output a replay compares and the live judge runs (``audit.live``)."""
    if torch.is_tensor(x):
        return x
    if isinstance(x, dict) and "__tuple__" in x:
        return first_tensor(x["__tuple__"][0]) if x["__tuple__"] else None
    if isinstance(x, tuple) and x:
        return first_tensor(x[0])
    return None


# ----------------------------------------------------------------------------- trace
@dataclass
class Call:
    wrapper: int  # which wrapper instance, numbered in construction order
    cls: str  # flashinfer class name, e.g. BatchPrefillWithPagedKVCacheWrapper
    method: str  # "__init__", "begin_forward", "forward", ...
    args: list
    kwargs: dict
    result: object = None
    error: str | None = None  # "AssertionError: ..." when the call raised
    reads: dict | None = None  # a CUDA-graph wrapper's run: what it read from its buffers (``run_reads``)


@dataclass
class Trace:
    calls: list[Call] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    values: bool = True  # False: large float tensors recorded as shape only (``encode``); such a trace cannot replay

    def save(self, path) -> Path:
        path = Path(path)
        if path.suffix != ".pt":
            raise ValueError(f"a trace is saved as .pt; got {str(path)!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:  # never through a link (core.outputs)
            torch.save({"format": FORMAT, "meta": encode(self.meta), "calls": [asdict(c) for c in self.calls]}, tmp)
        return path

    @classmethod
    def load(cls, path) -> "Trace":
        d = torch.load(Path(path), map_location="cpu", weights_only=True)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"{path} is not a swa-repro trace ({FORMAT})")
        return cls([Call(**c) for c in d["calls"]], decode(d["meta"]))

    def of(self, cls: str | None = None, method=None, wrapper: int | None = None) -> list[Call]:
        methods = (method,) if isinstance(method, str) else method
        return [c for c in self.calls if (cls is None or c.cls == cls) and (methods is None or c.method in methods)
                and (wrapper is None or c.wrapper == wrapper)]

    def plan_kwargs(self, wrapper: int | None = None, cls: str = "BatchPrefillWithPagedKVCacheWrapper") -> list[dict]:
        """The keyword arguments of every plan/begin_forward call (scalars and dtypes only)."""
        out = []
        for c in self.of(cls, PLAN_METHODS, wrapper):
            kw = decode(c.kwargs)
            out.append({k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in kw.items()
                        if not torch.is_tensor(v)} | {"wrapper": c.wrapper})
        return out


class TracedWrapper:
    """A recording proxy: attribute reads and writes go to the wrapped object; calls of
    :data:`RECORDED_METHODS` are appended to the trace (arguments copied before the call)."""

    __slots__ = ("_inner", "_trace", "_wid", "_cls")

    def __init__(self, inner, trace: Trace, wid: int, cls_name: str):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_trace", trace)
        object.__setattr__(self, "_wid", wid)
        object.__setattr__(self, "_cls", cls_name)

    @property
    def inner(self):
        return self._inner

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in RECORDED_METHODS or not callable(attr):
            return attr

        def call(*args, **kwargs):
            v = self._trace.values
            rec = Call(self._wid, self._cls, name, encode(list(args), values=v), encode(kwargs, values=v))
            try:
                res = attr(*args, **kwargs)
            except BaseException as e:
                rec.error = f"{type(e).__name__}: {e}"
                self._trace.calls.append(rec)
                raise
            rec.result = encode(res, values=self._trace.values)
            reads = getattr(self._inner, "run_reads", None) if name in OUTPUT_METHODS else None
            if reads is not None:  # the buffers as run() found them, which later plans may have refilled
                rec.reads = encode(reads)
                self._inner.run_reads = None
            self._trace.calls.append(rec)
            return res

        call.__name__ = name  # a plain function: no ``.func``, so sglang's fast-plan probes stay False
        return call

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


def record_class(cls, trace: Trace, cls_name: str | None = None, **extra):
    """A stand-in for ``cls`` (same call signature) whose instances are recorded into ``trace``.
    ``extra`` keyword args go to ``cls`` but not into the trace (e.g. the model wrappers' GPU spec)."""
    name = cls_name or cls.__name__

    def make(*args, **kwargs):
        wid = len(trace.of(method="__init__"))
        rec_args = [encode(a, workspace=(i == 0)) for i, a in enumerate(args)]
        rec_kwargs = {k: encode(v, workspace=(k == "float_workspace_buffer")) for k, v in kwargs.items()}
        inner = cls(*args, **kwargs, **extra)
        trace.calls.append(Call(wid, name, "__init__", rec_args, rec_kwargs))
        return TracedWrapper(inner, trace, wid, name)

    make.__name__ = make.__qualname__ = name
    make.wrapped_class = cls
    return make


# ----------------------------------------------------------------------------- replay
@dataclass
class CallReport:
    index: int
    wrapper: int
    method: str
    recorded_error: str | None
    replay_error: str | None
    max_abs_vs_recorded: float | None = None  # over rows the recording defines (finite)
    max_abs_vs_reference: float | None = None
    undefined_rows_recorded: int = 0  # NaN rows in the recording (model: "undefined")
    nan_rows_replay: int = 0
    ok: bool = True
    why: str = ""


def _nan_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.isnan(x.float()).reshape(x.shape[0], -1).any(1)


def compare_output(got: torch.Tensor, recorded: torch.Tensor | None, reference: torch.Tensor | None,
                   atol: float) -> dict:
    """Max |got - recorded| over the rows the recording defines, and max |got - reference|."""
    got = got.detach().float().cpu()
    rep = {"nan_rows_replay": int(_nan_rows(got).sum())}
    if recorded is not None:
        rec = recorded.float()
        defined = ~_nan_rows(rec)
        rep["undefined_rows_recorded"] = int((~defined).sum())
        d = (got[defined] - rec[defined]).abs()
        rep["max_abs_vs_recorded"] = float(d.max()) if d.numel() else 0.0
    if reference is not None:
        d = (got - reference.float()).abs()
        rep["max_abs_vs_reference"] = float(d.nan_to_num(float("inf")).max()) if d.numel() else 0.0
    return rep


def replay(trace: Trace, backend: str = "flashinfer", atol: float = 2e-2, device: str = "cuda") -> list[CallReport]:
    """Re-issue ``trace`` against real FlashInfer; one report per plan/forward call."""

    if backend != "flashinfer":
        raise UsageError(f"replay backend {backend!r} unknown: only 'flashinfer' is supported")
    if not torch.cuda.is_available():
        raise UsageError("replay re-issues the recorded calls on real FlashInfer kernels and needs a CUDA device "
                         "(torch.cuda.is_available() is False): copy the trace to a GPU machine with torch and "
                         "flashinfer-python installed and run `swa-repro replay TRACE.pt` there")
    try:
        import flashinfer  # lazy: CUDA-only; replay is the one command here that needs it
    except Exception as e:
        raise UsageError(f"replay needs flashinfer but it does not import ({type(e).__name__}: {e}): "
                         "pip install flashinfer-python==0.6.12 (what sglang 0.5.15.post1 pins)") from None
    ref = trace.meta.get("reference") or {}
    wrappers, reports, workspaces = {}, [], {}
    for i, c in enumerate(trace.calls):
        if c.method == "__init__":
            wrappers[c.wrapper] = getattr(flashinfer, c.cls)(*decode(c.args, device, workspaces),
                                                             **decode(c.kwargs, device, workspaces))
            continue
        rep = CallReport(i, c.wrapper, c.method, c.error, None)
        try:
            res = getattr(wrappers[c.wrapper], c.method)(*decode(c.args, device), **decode(c.kwargs, device))
        except Exception as e:
            rep.replay_error = f"{type(e).__name__}: {e}"
            res = None
        if (rep.recorded_error is None) != (rep.replay_error is None) or (
                rep.recorded_error and rep.recorded_error.split(":")[0] != rep.replay_error.split(":")[0]):
            rep.ok, rep.why = False, "the replay raised differently from the recording"
        got = first_tensor(res)
        if got is not None and c.method in OUTPUT_METHODS:
            torch.cuda.synchronize()
            reference = ref.get("output") if ref.get("call") == i else None
            for k, v in compare_output(got, first_tensor(c.result), reference, atol).items():
                setattr(rep, k, v)
            if rep.max_abs_vs_recorded is not None and not rep.max_abs_vs_recorded <= atol:
                rep.ok, rep.why = False, f"real kernel differs from the recorded output by {rep.max_abs_vs_recorded:.3g}"
        reports.append(rep)
    return reports


# ----------------------------------------------------------------------------- CLI
MAX_ATOL = 10.0  # an output is a weighted average of the values (a few units): wider tells nothing


def register(sub) -> None:
    p = sub.add_parser("replay", help="re-issue recorded sglang->FlashInfer wrapper calls on real FlashInfer (CUDA)")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace .pt files written by `swa-repro sglang-check --trace-dir`")
    p.add_argument("--atol", type=float, default=2e-2,
                   help=f"max |replay - recorded| per output (default 2e-2, bf16; 0..{MAX_ATOL})")
    p.add_argument("--json", action="store_true", help="one JSON object per trace")
    p.add_argument("--out", default=None, help="also write every report, with provenance, to this .json")
    p.add_argument("--force", action="store_true", help="let --out be in the committed folders (recordings/replay/)")
    p.set_defaults(func=main)


def main(a) -> int:
    check_bounds([("--atol", a.atol, 0, MAX_ATOL)])  # NaN too: every comparison with it is False
    if a.force and not a.out:
        raise UsageError("--force goes with --out FILE (in a committed folder)")
    if a.out:
        out_file(a.out, "--out", (".json",))  # before loading traces or touching the GPU
        untracked_file(a.out, "--out", force=a.force)
    traces = []
    for t in a.traces:
        if not Path(t).is_file():
            raise UsageError(f"trace {t!r} does not exist: give a .pt written by `swa-repro sglang-check --trace-dir DIR`")
        try:
            traces.append((t, Trace.load(t)))
        except Exception as e:
            why = (str(e).strip().splitlines() or [""])[0][:200]  # torch's unpickling errors span lines
            raise UsageError(f"cannot read trace {t!r} ({type(e).__name__}: {why}): give a .pt written by "
                             "`swa-repro sglang-check --trace-dir DIR`") from None
    bad, docs = 0, []
    for path, tr in traces:
        reps = replay(tr, atol=a.atol)
        ok = all(r.ok for r in reps)
        bad += not ok
        doc = {"trace": path, "meta": {k: v for k, v in tr.meta.items() if k != "reference"},
               "ok": ok, "calls": [_finite(asdict(r)) for r in reps]}
        docs.append(doc)
        if a.json:
            print(json.dumps(doc))
        else:
            print(f"{path}: {'OK' if ok else 'MISMATCH'} ({tr.meta.get('case', '')}, patched={tr.meta.get('patched')})")
            for r in reps:
                print(f"  #{r.index:<3} w{r.wrapper} {r.method:<14} vs_recorded={_fmt(r.max_abs_vs_recorded)} "
                      f"vs_reference={_fmt(r.max_abs_vs_reference)} nan_rows={r.nan_rows_replay} "
                      f"{'ok' if r.ok else 'BAD: ' + r.why}" + (f" raised {r.replay_error}" if r.replay_error else ""))
    sys.stdout.flush()
    if a.out:  # GPU evidence: the reports with where and how they were made
        write_atomic(a.out, (json.dumps({"provenance": provenance(), "traces": docs}, indent=1) + "\n").encode())
    return 1 if bad else 0


def _fmt(x):
    return "-" if x is None else f"{x:.3g}"


def _finite(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
