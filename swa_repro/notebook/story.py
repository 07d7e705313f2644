"""Small helpers notebooks 00-02 call so that each cell reads like a sentence.

Everything returns plain dicts and lists (no pandas) and :func:`table` prints them. The verdict is
computed on this machine: in ``live`` mode by running the real kernel both ways against the
float64 reference, in ``model`` mode by the kernel model plus every committed GPU recording of
the same case. Nothing here prints an expected value it did not compute.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from swa_repro.core.case import Case
from swa_repro.kernel.model import ModelResult, simulate
from swa_repro.kernel.probe import RANDOM_ATOL as TOL  # bf16 output vs float64 attention with the same mask
from swa_repro.core.reference import intended_interval

SEED_SHAPES = dict(prefix_lens=(0, 0, 0), extend_lens=(6, 8, 12), window_left=4, num_qo_heads=4,
                   num_kv_heads=4, head_dim=128, page_size=16)


# ----------------------------------------------------------------------------- cases
def with_fix(case: Case, fix: bool) -> Case:
    """The same shapes planned without ``window_left`` (the bug) or with it (sglang PR #31501)."""
    base = case.name.removesuffix("_bug").removesuffix("_fix") or "case"
    return case.with_(plan_window_left=case.window_left if fix else -1, name=f"{base}_{'fix' if fix else 'bug'}")


def seed_case(fix: bool = False, **shapes) -> Case:
    """The seed case: three fresh requests of 6/8/12 tokens, window 4, 4/4 heads, page 16
    (``recording_cases.py``'s ``seed_bug`` / ``seed_fix``)."""
    return with_fix(Case(name="seed", **{**SEED_SHAPES, **shapes}), fix)


def gqa_case(fix: bool = False, *, num_qo_heads=32, num_kv_heads=8, prefix=200, extend=100, window=64,
             **kw) -> Case:
    """A GQA request with a prefix spanning several CTA query tiles."""
    kw.setdefault("name", f"gqa{num_qo_heads // num_kv_heads}")
    return with_fix(Case(prefix_lens=(prefix,), extend_lens=(extend,), num_qo_heads=num_qo_heads,
                         num_kv_heads=num_kv_heads, window_left=window, **kw), fix)


def for_machine(case: Case, mode: str) -> Case:
    """In live mode, the case as this GPU runs it (installed flashinfer version, SM count, arch),
    as ``swa-repro record`` does, so the model drawn next to the real kernel is the model of
    *this* kernel; in model mode, unchanged."""
    if mode != "live":
        return case
    from swa_repro.core.case import FLASHINFER_VERSIONS
    from swa_repro.kernel.live import installed_flashinfer_version

    p = torch.cuda.get_device_properties(0)
    kw = dict(sm_count=p.multi_processor_count, arch=tuple(torch.cuda.get_device_capability(0)))
    v = installed_flashinfer_version()
    if v in FLASHINFER_VERSIONS:
        kw["flashinfer_version"] = v
    else:
        print(f"NOTE: flashinfer {v} is not modelled; the model is that of {case.flashinfer_version}")
    return case.with_(**kw)


# ----------------------------------------------------------------------------- tables
def table(rows: list[dict], cols: list[str] | None = None, max_width: int = 60) -> str:
    """Plain fixed-width text table of a list of dicts."""
    if not rows:
        return "(no rows)"
    cols = cols or list(dict.fromkeys(k for r in rows for k in r))
    cell = lambda v: _fmt(v)[:max_width]  # noqa: E731
    w = {c: max(len(c), *(len(cell(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(w[c]) for c in cols), "  ".join("-" * w[c] for c in cols)]
    lines += ["  ".join(cell(r.get(c, "")).ljust(w[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def show(rows, cols=None, max_width: int = 60) -> None:
    print(table(rows, cols, max_width))


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return ",".join(_fmt(x) for x in v)
    return "" if v is None else str(v)


def _maxf(a) -> float:
    a = np.asarray(a, np.float64)
    return float("nan") if a.size == 0 or np.isnan(a).any() else float(a.max())


# ----------------------------------------------------------------------------- recordings
def load_recordings_or_empty(root=None) -> tuple[list, str]:
    """``(recordings, note)``; the note says plainly when there are none."""
    from swa_repro.evidence.recordings import DEFAULT_ROOT, load_recordings

    recs = load_recordings(root)
    where = root or DEFAULT_ROOT
    if not recs:
        return [], (f"no GPU recordings committed under {where}: model-only; "
                    "run `swa-repro record` on a CUDA machine and commit recordings/")
    versions = sorted({r.case.flashinfer_version for r in recs})
    return recs, f"{len(recs)} GPU recordings under {where} (flashinfer {', '.join(versions)})"


def matching_recordings(case: Case, recordings) -> list:
    """Recordings of exactly ``case`` (names ignored), of any flashinfer version."""
    return [r for r in recordings if r.case == case.with_(flashinfer_version=r.case.flashinfer_version)]


def provenance_line(rec) -> str:
    p = rec.provenance
    fi = p.get("flashinfer")
    fi = fi.get("version") if isinstance(fi, dict) else fi
    return (f"{rec.case.name}: {p.get('gpu', '?')}, driver {p.get('driver', '?')}, torch {p.get('torch', '?')}, "
            f"flashinfer {fi or rec.case.flashinfer_version}, sglang {p.get('sglang', '?')}, "
            f"{p.get('date_utc', p.get('date', '?'))}: `{p.get('command', '?')}`")


def _rec_by_qo_head(req, field: str, hq: int, g: int) -> np.ndarray:
    if hasattr(req, "by_qo_head"):
        return np.asarray(req.by_qo_head(field))
    a = np.asarray(getattr(req, field))
    return a if a.shape[1] == hq else a[:, np.arange(hq) % g]


def _model_by_qo_head(r, hq: int, g: int):
    cols = np.arange(hq) % g
    lo, hi = r.lo[:, cols].astype(np.int64), r.hi[:, cols].astype(np.int64)
    empty = lo > hi  # the probe writes -1 for a row that sees nothing
    return np.where(empty, -1, lo), np.where(empty, -1, hi)


def compare_model_to_recording(recording, model: ModelResult | None = None) -> list[dict]:
    """One row per request. Where the model says exact or leak: the recorded per-(row, head)
    intervals must equal the model's exactly and the recording's status must be the model's.
    Where the model says undefined: the recording must show missing keys, NaN, or run-to-run
    differences (the model makes no claim about the values)."""
    case = recording.case
    model = model or simulate(case)
    hq, g = case.num_qo_heads, case.group_size
    rows = []
    for i, (r, rq) in enumerate(zip(model.requests, recording.requests)):
        plo, phi = _rec_by_qo_head(rq, "lo", hq, g), _rec_by_qo_head(rq, "hi", hq, g)
        mlo, mhi = _model_by_qo_head(r, hq, g)
        ilo, ihi = intended_interval(r.prefix_len, r.extend_len, case.window_left)
        missing = bool(((plo > ilo[:, None]) | (phi < ihi[:, None]) | (plo < 0)).any())
        nan = bool(np.asarray(rq.nan).any())
        unstable = not bool(np.asarray(rq.repeat_equal).all())
        rnd = getattr(rq, "random_equal", None)
        unstable = unstable or (rnd is not None and not bool(np.asarray(rnd).all()))
        rec_status = recording.statuses[i] if not callable(recording.statuses) else recording.statuses()[i]
        row = {"case": case.name, "req": i, "flashinfer": case.flashinfer_version, "model": r.status,
               "recording": rec_status}
        if r.status == "undefined":
            row["rows_differing"] = int(((plo != mlo) | (phi != mhi)).any(1).sum())
            row["evidence"] = ", ".join(w for w, f in (("missing keys", missing), ("NaN", nan),
                                                        ("differs run to run", unstable)) if f) or "none"
            row["agree"] = missing or nan or unstable
        else:
            diff = (plo != mlo) | (phi != mhi)
            row["rows_differing"] = int(diff.any(1).sum())
            row["evidence"] = "intervals equal" if not diff.any() else f"first differing row {int(np.argmax(diff.any(1)))}"
            row["agree"] = (not diff.any()) and rec_status == r.status
        rows.append(row)
    return rows


def model_vs_recordings(recordings) -> list[dict]:
    """:func:`compare_model_to_recording` over every recording (the model of each one's version)."""
    return [row for rec in recordings for row in compare_model_to_recording(rec)]


# ----------------------------------------------------------------------------- model runs
def _model_wrapper(case: Case):
    from swa_repro.kernel.wrappers import GpuSpec, ModelPagedPrefillWrapper

    gpu = GpuSpec(sm_count=case.sm_count, arch=case.arch, flashinfer_version=case.flashinfer_version)
    return ModelPagedPrefillWrapper(torch.empty(1, dtype=torch.uint8), "NHD", backend=case.backend, gpu=gpu)


def model_call(case: Case, api: str = "forward", seed: int = 0) -> dict:
    """sglang's calls on the CPU stand-in wrapper: ``plan(window_left=case.plan_window_left)`` then
    ``forward(window_left=W)`` or ``run(window_left=W)``; per-row max error vs the reference."""
    from swa_repro.core.batch import build_paged_batch, random_inputs
    from swa_repro.kernel.probe import LAYOUT_SEED, interval_attention, intended_intervals, row_max_abs

    qs, ks, vs = random_inputs(case, seed=seed)
    b = build_paged_batch(qs, ks, vs, case.page_size, seed=LAYOUT_SEED)
    w = _model_wrapper(case)
    w.plan(b.qo_indptr, b.kv_indptr, b.kv_indices, b.last_page_len, case.num_qo_heads, case.num_kv_heads,
           case.head_dim, case.page_size, causal=True, window_left=case.plan_window_left,
           q_data_type=torch.bfloat16, disable_split_kv=case.disable_split_kv,
           fixed_split_size=case.fixed_split_size if case.fixed_split_size > 0 else None)
    out = {"api": api, "error": None, "err_vs_reference": [], "module": dict(w._module)}
    try:
        if api == "forward":
            o = w.forward(b.q, (b.k_cache, b.v_cache), causal=True, window_left=case.window_left)
        else:
            o = w.run(b.q, (b.k_cache, b.v_cache), window_left=case.window_left)
    except AssertionError as e:
        import traceback

        fr = traceback.extract_tb(e.__traceback__)[-1]
        out["error"] = f"AssertionError at {fr.filename.rsplit('/', 1)[-1]}:{fr.lineno}: {fr.line}"
        return out
    qi = b.qo_indptr.tolist()
    for i, (lo, hi) in enumerate(intended_intervals(case)):
        out["err_vs_reference"].append(row_max_abs(o[qi[i]:qi[i + 1]], interval_attention(qs[i], ks[i], vs[i], lo, hi)))
    return out


def call(case: Case, mode: str, api: str = "forward", seed: int = 0) -> dict:
    """One plan + forward/run, on the real kernel (live) or the model wrapper (model)."""
    if mode == "live":
        from swa_repro.kernel.live import run_live

        r = run_live(case, seed=seed, api=api)
        return {"api": api, "error": r.error, "err_vs_reference": list(r.err_vs_reference), "module": r.module,
                "plan_info": r.plan_info, "err_vs_model": list(r.err_vs_model)}
    return model_call(case, api, seed)


def module_uri(case: Case) -> str:
    """The JIT module ``plan()`` selects for ``case``, named by flashinfer's own
    ``get_batch_prefill_uri`` when flashinfer imports (it does on CPU), else by its key."""
    try:
        from swa_repro.kernel.live import module_key
        from swa_repro.kernel.live import module_uri as uri

        k = module_key(case)
        return uri(k[0], k[1:])
    except Exception:
        return f"batch_prefill ({case.resolved_backend}) ... use_swa_{case.plan_window_left >= 0} ..."


def module_table(cases, mode: str) -> list[dict]:
    """Per case: module chosen at plan (``use_sliding_window``), CTA_TILE_Q, split_kv, statuses."""
    rows = []
    for c in cases:
        m = simulate(c)
        s = m.summary()
        row = {"case": c.name, "backend": m.backend, "plan window_left": c.plan_window_left,
               "run window_left": c.window_left, "use_sliding_window": s["use_sliding_window"],
               "cta_tile_q": s["cta_tile_q"], "split_kv": s["split_kv"], "status (model)": m.statuses}
        if mode == "live":
            r = call(c, "live")
            row.update({"module (live)": r["module"].get("uri"), "use_sliding_window (live)": r["module"].get("use_sliding_window"),
                        "cta_tile_q (live)": r["plan_info"].get("cta_tile_q"), "split_kv (live)": r["plan_info"].get("split_kv")})
        else:
            row["module"] = module_uri(c)
        rows.append(row)
    return rows


def forward_vs_run(case: Case, mode: str, seed: int = 0) -> list[dict]:
    """sglang's ``forward(window_left=W)`` vs ``run(window_left=W)`` after the same plan."""
    rows = []
    for api in ("forward", "run"):
        r = call(case, mode, api, seed)
        rows.append({"case": case.name, "api": f"{api}(window_left={case.window_left})",
                     "outcome": r["error"] or "returned",
                     "max err vs reference": [_maxf(e) for e in r["err_vs_reference"]] or None})
    return rows


def row_error_table(case: Case, mode: str, seed: int = 0, recordings=()) -> list[dict]:
    """Per request and row: max |o - reference| of ``forward()``; recorded GPU errors alongside."""
    r = call(case, mode, "forward", seed)
    m = simulate(case)
    recs = matching_recordings(case, recordings) if mode == "model" else []
    rows = []
    for i, err in enumerate(r["err_vs_reference"]):
        for q, e in enumerate(err):
            row = {"req": i, "row": q, "status": m.requests[i].status,
                   "extra keys": int(m.requests[i].extra_keys()[q]), f"err ({mode})": float(e)}
            for rec in recs:
                row[f"err (GPU, fi {rec.case.flashinfer_version})"] = float(rec.requests[i].err_vs_reference[q])
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- verdict
def verdict(mode_info, case: Case | None = None, recordings=(), seed: int = 0) -> dict:
    """Is the bug present without plan-time ``window_left`` and gone with it, on this machine?

    live: the real kernel, ``plan`` then ``forward(window_left=W)``, each row against the float64
    reference (tolerance ``TOL``; NaN is wrong). model: the kernel model's statuses, held to every
    committed recording of the same case (:func:`compare_model_to_recording`)."""
    mode = getattr(mode_info, "mode", mode_info)
    base = case or seed_case()
    out = {"mode": mode, "shapes": base.with_(name="").to_dict(), "evidence": []}
    for fix in (False, True):
        c = with_fix(base, fix)
        key = "with_window" if fix else "without_window"
        m = simulate(c)
        if mode == "live":
            r = call(c, "live", "forward", seed)
            wrong = [int((~(np.asarray(e) <= TOL)).sum()) for e in r["err_vs_reference"]]
            out[key] = {"case": c.name, "source": f"real kernel, {r['module'].get('uri')}",
                        "wrong_rows": wrong, "max_err": [_maxf(e) for e in r["err_vs_reference"]],
                        "model_status": m.statuses, "correct": sum(wrong) == 0}
        else:
            agree = [row for rec in matching_recordings(c, recordings) for row in compare_model_to_recording(rec)]
            out[key] = {"case": c.name, "source": "kernel model", "status": m.statuses,
                        "correct": all(s == "exact" for s in m.statuses),
                        "recordings": sorted({row["flashinfer"] for row in agree}),
                        "recording_status": {rec.case.flashinfer_version: list(rec.statuses)
                                             for rec in matching_recordings(c, recordings)},
                        "recordings_agree": all(row["agree"] for row in agree) if agree else None}
            for rec in matching_recordings(c, recordings):
                out["evidence"].append(provenance_line(rec))
    out["bug_present_without_window"] = not out["without_window"]["correct"]
    out["fixed_with_window"] = out["with_window"]["correct"]
    out["sentence"] = verdict_sentence(out)
    return out


def verdict_sentence(v: dict) -> str:
    wo, wi = v["without_window"], v["with_window"]
    if v["mode"] == "live":
        how = (f"On this GPU the real kernel planned without window_left gets {sum(wo['wrong_rows'])} rows wrong "
               f"(max err {wo['max_err']}); planned with it, {sum(wi['wrong_rows'])} rows wrong.")
    else:
        recs = [x for x in (wo, wi) if x.get("recordings")]
        backing = ("; GPU recordings (flashinfer " + ", ".join(sorted({f for x in recs for f in x["recordings"]}))
                   + (") agree with the model" if all(x["recordings_agree"] for x in recs) else ") DISAGREE with the model")
                   ) if recs else "; no GPU recording matches this case, so this rests on the kernel model alone"
        how = (f"Kernel model: without window_left at plan the requests are {', '.join(wo['status'])}; "
               f"with it {', '.join(wi['status'])}{backing}.")
    word = "PRESENT" if v["bug_present_without_window"] else "ABSENT"
    fix = "the plan-time window fixes it" if v["fixed_with_window"] else "the plan-time window does NOT fix it"
    return f"Bug {word} without plan-time window_left, {fix}. {how}"


def evidence_for(case: Case, mode: str, recordings=()) -> tuple[object | None, str]:
    """What the real kernel did for ``case``: a live probe (live mode) or the first committed
    recording of it (model mode), with one line saying which, or ``(None, why not)``."""
    if mode == "live":
        from swa_repro.kernel.probe import probe_case

        p = probe_case(case)
        return p, f"{case.name}: live probe of {p.source} on this GPU"
    recs = matching_recordings(case, recordings)
    if not recs:
        return None, f"{case.name}: no GPU recording of this case; the figure shows the model only"
    return recs[0], "recorded on " + provenance_line(recs[0])


def plan_table(cases) -> list[dict]:
    """The fa2 plan of each case (model): CTA_TILE_Q, split-KV, and per request the KV chunks the
    plan sized (merge_indptr, scheduler.cuh:101) vs the chunks the kernel writes with the run's
    window (prefill.cuh:2727-2728). A mismatch is the split-KV ``undefined`` status."""
    rows = []
    for c in cases:
        m = simulate(c)
        p = m.plan
        rows.append({"case": c.name, "kv_lens": c.kv_lens, "extend_lens": c.extend_lens,
                     "cta_tile_q": p.cta_tile_q if p else None, "split_kv": p.split_kv if p else False,
                     "kv_chunk_size": p.kv_chunk_size if p and p.split_kv else None,
                     "chunks planned": [r.num_chunks_plan for r in m.requests],
                     "chunks written": [r.num_chunks_run for r in m.requests], "status": m.statuses})
    return rows


def backend_table(base: Case, mode: str, backends=("fa2", "fa3", "auto"), seed: int = 0, recordings=()) -> list[dict]:
    """Each backend planned without and with ``window_left``: the model's status and extra keys,
    the rows that come out wrong (live: real kernel; model: model wrapper) and, in model mode,
    the statuses of committed recordings of the same shapes; a backend this GPU cannot run says why."""
    rows = []
    stem = base.name.removesuffix("_bug").removesuffix("_fix") or "case"
    for b in backends:
        for fix in (False, True):
            c = with_fix(base.with_(backend=b, name=f"{stem}_{b}"), fix)
            m = simulate(c)
            row = {"case": c.name, "backend": b, "resolves to": c.resolved_backend, "plan window_left": c.plan_window_left,
                   "status (model)": m.statuses, "max extra keys (model)": [int(r.extra_keys().max()) for r in m.requests],
                   "plain causal (model)": all(bool((r.lo == 0).all()) for r in m.requests)}
            try:
                r = call(c, mode, "forward", seed)
                row[f"wrong rows ({mode})"] = [int((~(np.asarray(e) <= TOL)).sum()) for e in r["err_vs_reference"]]
            except Exception as e:  # e.g. fa3 on a GPU that is not sm90
                row[f"wrong rows ({mode})"] = f"unavailable: {type(e).__name__}: {e}"[:120]
            if mode == "model":
                row["recorded status"] = "; ".join(f"fi {r.case.flashinfer_version}: {','.join(r.statuses)}"
                                                   for r in matching_recordings(c, recordings)) or "no recording"
            rows.append(row)
    return rows


def model_for(case: Case, evidence=None) -> ModelResult:
    """The kernel model (with tile map) of exactly what ``evidence`` ran, e.g. a recording made
    with another flashinfer version than ``case`` names; of ``case`` when there is none."""
    return simulate(evidence.case if evidence is not None else case, tiles=True)
