"""``swa-repro audit``: the plan/forward contract of every FlashInfer call sglang makes.

FlashInfer compiles some attention parameters into the module it picks at ``plan()``:
``window_left >= 0`` (use_sliding_window) and ``logits_soft_cap > 0`` (use_logits_soft_cap)
(flashinfer 0.6.12 prefill.py:2035-2036 paged, :3129-3130 ragged, decode.py:1054-1055). The
deprecated ``forward()`` / ``forward_return_lse()`` overwrite the values afterwards (prefill.py
:2136-2137, :2526-2527, :3206-3207, decode.py:1176-1177) but never re-pick the module, and the
compiled-out variant ignores them (variants.cuh:47, 72 soft cap; :88-89 window). So a parameter
whose forward value differs from its plan value is silently not applied.

The audit drives every path that plans a wrapper (``audit.paths``), then, per recorded wrapper,
compares each forward/run call with the plan that preceded it (and a CUDA-graph replay's plan
with the captured forward). A finding is such a recorded difference, or a layer value that
reached neither call ("dropped"); its effect is judged from the recorded tensors (is any visible
key outside the window in *this* call?), and for a paged fa2 prefill quantified by the kernel
model. Which public reports hold is then read off the findings, never the other way round.

The audit reads the importable sglang as it is (``run_audit()``); ``what_if="patched"`` /
``"unpatched"`` swap PR #31501's two methods in-process first. Another release is audited in its
own subprocess (``audit.release``); finding classes and the release table are ``audit.table``'s,
what the findings say to a reader (public reports, advice) ``audit.reports``', the command line
``audit.cli``'s.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from swa_repro.core.errors import UsageError
from swa_repro.kernel.model import simulate
from swa_repro.sglang.audit import calls as ac
from swa_repro.sglang.audit import keys as ak
from swa_repro.sglang.audit import paths as ap
from swa_repro.sglang.audit.attended import plan_case
from swa_repro.sglang.audit.calls import bound, geometry
from swa_repro.sglang.audit.env import DECODE, PAGED
from swa_repro.sglang.trace import PLAN_METHODS


@dataclass
class Finding:
    path: str
    layer: str  # layer configuration, e.g. swa8_cap50
    parameter: str
    plan_value: object
    forward_value: object
    layer_value: object  # what the layer asked for
    wrapper: str  # class#id (backend)
    kind: str  # mismatch (plan != forward) | dropped (neither carries the layer's value)
    stage: str  # eager | capture | replay
    effect: str  # wrong | none
    consequence: str
    evidence: dict

    def to_dict(self) -> dict:
        return _jsonable(asdict(self))


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    return x


# ----------------------------------------------------------------------------- reading a trace
def _param(bound: dict, passed: set, param: str) -> str:
    return f"{param}={bound.get(param)!r}" if param in passed else f"{param} not passed"


def call_text(method: str, bound: dict, passed: set, param: str) -> str:
    """``begin_forward(window_left not passed)`` / ``forward(window_left=8)``: the evidence."""
    return f"{method}({_param(bound, passed, param)})"


def plan_texts(run: ap.PathRun) -> list[str]:
    """What each plan call of a driven path carried (the evidence that a parameter reaches plan)."""
    out = []
    for c in run.trace.calls:
        if c.method in PLAN_METHODS and not c.error:
            b, g = bound(c.cls, c.method, c.args, c.kwargs)
            out.append(f"{c.cls}.{c.method}({_param(b, g, 'window_left')}, {_param(b, g, 'logits_soft_cap')})")
    return sorted(set(out))


def _cap(x) -> float:
    return float(x or 0.0)


def pairs_outside_window(cls_name: str, plan: dict, causal: bool, window: int) -> int:
    """(query row, key) pairs this call makes visible (causal limit and the plan's custom mask,
    no window) that a window of ``window`` excludes. Rows are placed as FlashInfer places them:
    causal -> row i at key position kv - qo + i; non-causal (sglang's prefix-only paged part of a
    ragged extend) -> the queries follow the KV, row i at kv + i."""
    (qo_lens, kv_lens), mask = geometry(cls_name, plan), plan.get("custom_mask")
    off, total = 0, 0
    for qo, kv in ((a, b) for a, b in zip(qo_lens, kv_lens) if a):
        pos = torch.arange(qo)[:, None] + (kv - qo if causal else kv)
        if mask is None:  # closed form, no (qo, kv) mask: per row, the keys below pos - window
            total += int((pos - window).clamp(0, kv).sum())
            continue
        keys = torch.arange(kv)[None, :]
        vis = keys <= pos if causal else torch.ones(qo, kv, dtype=torch.bool)
        if mask is not None:
            vis = vis & mask[off: off + qo * kv].view(qo, kv).bool()
            off += qo * kv
        total += int((vis & (keys < pos - window)).sum())
    return total


def kernel_model_of(plan: dict, window: int, backend: str) -> dict | None:
    """Kernel-model status of a causal paged prefill planned without the window (page-size-1
    layout as recorded; fa2/fa3 as the wrapper was built; GPU: H200)."""
    case, _ = plan_case(plan, geometry(PAGED, plan), window, backend if backend in ("fa2", "fa3") else "auto")
    if case is None:
        return None
    r = simulate(case)
    return {"statuses": r.statuses, "max_extra_keys_per_query": max(int(q.extra_keys().max()) for q in r.requests)}


def consequence(param: str, cls_name: str, backend: str, n_outside: int | None, kind: str = "mismatch") -> str:
    if param == "logits_soft_cap":
        where = "decode.py:1055" if cls_name == DECODE else "prefill.py:2036"
        return f"soft cap compiled out (use_logits_soft_cap=False at plan, {where}; variants.cuh:47,72): logits uncapped"
    if n_outside == 0:
        return "window not compiled in, but no key visible in this call lies outside the window (KV trim / custom mask)"
    how = {"fa2": "tile-granular leak (fa2; split-KV: undefined)",
           "fa3": "plain causal (fa3)"}.get(backend, "plain causal where auto resolves to fa3 (sm90), "
                                                     "tile-granular leak where it resolves to fa2")
    if kind == "dropped":
        return (f"window never reaches FlashInfer (neither plan nor forward carries it): plain causal; "
                f"{n_outside} (row, key) pairs outside the window visible")
    return f"window mask compiled out (use_sliding_window=False at plan): {how}; {n_outside} (row, key) pairs outside the window visible"


# ----------------------------------------------------------------------------- analysis
def analyze(run: ap.PathRun) -> list[Finding]:
    """Findings of one driven path: per wrapper, each forward vs the plan before it (a replay:
    the replayed plan vs the captured forward)."""
    return [f for p in ac.pairs(run) for f in _compare(run, p.cls, p.backend, p.wrapper, p.plan, p.fwd, p.stage)]


def _compare(run, cls, backend, wid, plan_rec, fwd_rec, stage) -> list[Finding]:
    """``plan_rec`` / ``fwd_rec``: (index, bound arguments, (method, names passed))."""
    found = []
    plan, fwd = plan_rec[1], fwd_rec[1]

    def calls(param):  # the recorded calls that show it: plan then forward
        return {"plan_call": call_text(plan_rec[2][0], plan, plan_rec[2][1], param),
                "forward_call": call_text(fwd_rec[2][0], fwd, fwd_rec[2][1] | (
                    {param} if fwd_rec[2][0].startswith("run") else set()), param)}  # run(): the planned value
    causal = bool(fwd.get("causal", True)) if cls != DECODE else True
    wrapper = f"{cls}#{wid} ({backend})"
    pw, fw_ = int(plan["window_left"]), int(fwd["window_left"])
    lw = run.layer_window
    kind = "mismatch" if pw != fw_ else ("dropped" if lw >= 0 and pw < 0 else None)
    if kind:
        w = fw_ if kind == "mismatch" else lw
        ev = {**calls("window_left"), "plan_call_custom_mask": plan.get("custom_mask") is not None,
              "forward_causal": causal}
        n = pairs_outside_window(cls, plan, causal, w) if w >= 0 and pw < 0 else None
        ev["pairs_outside_window"] = n
        ev["qo_lens"], ev["kv_lens"] = geometry(cls, plan)
        if cls == PAGED and causal and plan.get("custom_mask") is None and w >= 0 and pw < 0:
            ev["kernel_model"] = kernel_model_of(plan, w, backend)
        effect = "wrong" if (n is None or n > 0) else "none"
        found.append(Finding(run.path, run.layer.name, "window_left", pw, fw_, lw, wrapper, kind, stage, effect,
                             consequence("window_left", cls, backend, n, kind), ev))
    pc, fc, lc = _cap(plan["logits_soft_cap"]), _cap(fwd["logits_soft_cap"]), run.layer_cap
    kind = "mismatch" if pc != fc else ("dropped" if lc > 0 and pc == 0 else None)
    if kind:
        found.append(Finding(run.path, run.layer.name, "logits_soft_cap", plan["logits_soft_cap"],
                             fwd["logits_soft_cap"], lc, wrapper, kind, stage, "wrong" if max(fc, lc) > 0 and pc == 0 else "none",
                             consequence("logits_soft_cap", cls, backend, None), calls("logits_soft_cap")))
    return found


# ----------------------------------------------------------------------------- whole audit
WHAT_IF_TEXT = {"patched": "PR #31501's fix applied in-process", "unpatched": "PR #31501's fix removed in-process"}


@dataclass
class AuditResult:
    what_if: str | None  # None: the release as it is; "patched" / "unpatched": an in-process what-if
    release: dict  # sglang version, backend file, its state (unfixed / fixed / unknown), where it came from
    findings: list[Finding]
    driven: list[dict]  # path, layer, calls recorded, what each plan carried, keys (and live) verdicts
    not_driven: list[dict]  # path, layer, status (absent | sglang raised | harness), why
    mode: str = "model"  # live: every driven call also executed on real FlashInfer
    device: str = "cpu"  # where sglang's tensors lived

    @property
    def label(self) -> str:
        return self.what_if or "as installed"

    def to_dict(self) -> dict:
        return {"what_if": self.what_if, "release": self.release, "mode": self.mode, "device": self.device,
                "findings": [f.to_dict() for f in self.findings], "driven": self.driven, "not_driven": self.not_driven}


def release_info() -> dict:
    """The importable sglang: version, its backend file (the source the audit reads) and that
    file's state, classified from its structure (``patch.classify``)."""
    import sglang  # lazy: optional and slow to import

    from swa_repro.sglang import harness
    from swa_repro.sglang.patch.classify import classify

    from swa_repro.sglang import fix

    path = harness.backend_module().__file__
    fixes = {}
    try:
        text = open(path).read()
        state = classify(text).state
        fixes = {n: s.state for n, s in fix.states(text).items()}  # `swa-repro patch --fix` (0.5.14+)
    except Exception as e:  # a file the classifier cannot read is "unknown", said why
        state = f"unknown ({type(e).__name__})"
    return {"sglang": sglang.__version__, "backend_file": str(path), "state": state, "fix_states": fixes}


def run_audit(what_if: str | None = None, *, paths=None, layers=None, mode: str = "model",
              live_budget_s: float | None = None, device: str | None = None, executor=None) -> AuditResult:
    """Every path x layer configuration of the importable sglang, as it is (or a what-if). Each
    driven run gets its key-level verdict (``audit.keys``: for the layer's window and for one key
    less, HF's inclusive window when a model passes ``sliding_window`` unchanged); ``mode="live"``
    also executes every call on real FlashInfer (``audit.live``) within ``live_budget_s`` (or on
    ``executor``: ``audit.live.model_executor()`` runs the same pipeline on CPU)."""
    if what_if not in ap.WHAT_IFS:
        raise UsageError(f"what-if {what_if!r}: use patched or unpatched")
    device = device or ap.audit_device()
    runs = [ap.drive(path, cfg, what_if=what_if, device=device) for path in paths or ap.PATHS
            for cfg in layers or ap.LAYER_CONFIGS]
    live, warmed, deadline = None, None, None
    if mode == "live":
        from swa_repro.sglang.audit import live as live  # CUDA hosts only: imports flashinfer

        executor = executor or live.flashinfer_executor(device)
        deadline = None if live_budget_s is None else time.monotonic() + live_budget_s
        warmed = live.warm([r for r in runs if not r.error], executor, deadline=deadline)
    findings, driven, not_driven = [], [], []
    for run in runs:
        if run.error:
            not_driven.append({"path": run.path, "layer": run.layer.name, "status": run.status, "why": run.error})
            continue
        keys = ak.keys_of_run(run)
        d = {"path": run.path, "layer": run.layer.name, "plans": plan_texts(run),
             "calls": sum(c.method != "__init__" for c in run.trace.calls), "keys": keys, "key_verdict": ak.verdict(keys)}
        if run.layer_window > 0:  # the same calls judged against one key less (HF's inclusive window)
            d["keys_window_minus_1"] = ak.keys_of_run(run, run.layer_window - 1)
        if live is not None:
            d["live"] = live.live_of_run(run, executor, deadline=deadline,
                                         skip=live.unwarmed(warmed, getattr(executor, "backend", None)))
        driven.append(d)
        findings += analyze(run)
    res = AuditResult(what_if, release_info(), findings, driven, not_driven, mode, device)
    if warmed is not None:
        res.release["live_warmup"] = warmed
    return res


def key_table(doc: dict) -> list[dict]:
    """One row per driven path x layer: the key-level verdict and, in live mode, what the real
    kernel's output measured (``None``: not measured). The CLI and notebook 05 print this."""
    rows = []
    for d in doc["driven"]:
        ks, lv = d.get("keys", {}), d.get("live") or {}
        ran = bool(lv.get("executed"))
        rows.append({"path": d["path"], "layer": d["layer"], "verdict": d.get("key_verdict"),
                     "queries": sum(s["queries"] for s in ks.values()),
                     "queries_with_extra": sum(s["queries_with_extra"] for s in ks.values()),
                     "max_extra_per_query": max((s["max_extra_per_query"] for s in ks.values()), default=0),
                     "missing_keys": sum(s["missing_keys"] for s in ks.values()),
                     "foreign_keys": sum(s["foreign_keys"] for s in ks.values()),
                     "live_rows": lv.get("rows") if ran else None,
                     "live_wrong_rows": lv.get("wrong_rows") if ran else None,
                     "predicted_wrong_rows": lv.get("predicted_wrong_rows") if ran else None,
                     "max_err": lv.get("max_err_intended") if ran else None,
                     "max_err_uncapped": lv.get("max_err_uncapped") if ran else None,
                     "model_agrees": lv.get("model_agrees") if ran else None,
                     "live_errors": "; ".join(lv.get("errors", [])) or None})
    return rows


def incomplete(doc: dict) -> list[str]:
    """The runs an audit did not drive although the release has the path (absent paths aside), and
    driven runs without the plan() calls a "fixed" class reads: an audit with any is incomplete and
    must not read as "no finding"."""
    out = [f"{d['path']}/{d['layer']}: {d['status']}: {d['why']}" for d in doc["not_driven"] if d["status"] != "absent"]
    out += [f"{d['path']}/{d['layer']}: driven, but no plan() call recorded" for d in doc["driven"] if not d.get("plans")]
    return out + ["no path x layer run was driven"] * (not doc["driven"])


def header(release: dict, what_if: str | None, origin: str = "installed") -> str:
    """The first line of every audit: which release, where its source is, what state it is in."""
    from swa_repro.sglang.patch.classify import state_text

    line = f"sglang {release['sglang']} ({origin}, {release['backend_file']}): backend {state_text(release['state'])}"
    if release.get("fixes"):
        fx = release["fixes"]
        line = (f"PATCHED COPY: {line}; with `swa-repro patch --fix {','.join(fx['fixes'])}` applied to a copy "
                f"(sha256 {fx['original_sha256'][:12]} -> {fx['fixed_sha256'][:12]}), not as it ships")
    return f"WHAT-IF: {line}; audited with {WHAT_IF_TEXT[what_if]}, not as it ships" if what_if else line
