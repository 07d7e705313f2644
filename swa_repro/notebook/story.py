"""The cases notebooks 00-02 look at, what the real kernel did for them (a live probe or a
committed recording), and the verdict on this machine.

The verdict is computed here: in ``live`` mode by running the real kernel both ways against the
float64 reference, in ``model`` mode by the kernel model plus every committed GPU recording of
the same case. Nothing here prints an expected value it did not compute. Results are typed rows
(``show.Row``); display labels are applied only when shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from swa_repro.core.case import Case
from swa_repro.kernel.model import ModelResult, simulate
from swa_repro.notebook.calls import call
from swa_repro.notebook.show import Row, col

SEED_SHAPES = dict(prefix_lens=(0, 0, 0), extend_lens=(6, 8, 12), window_left=4, num_qo_heads=4,
                   num_kv_heads=4, head_dim=128, page_size=16)
GQA_SHAPES = dict(prefix_lens=(200,), extend_lens=(100,), window_left=64, num_qo_heads=32, num_kv_heads=8)
LONG_SHAPES = dict(prefix_lens=(0,), extend_lens=(32768,), window_left=4096)


# ----------------------------------------------------------------------------- cases
def with_fix(case: Case, fix: bool) -> Case:
    """The same shapes planned without ``window_left`` (the bug) or with it (sglang PR #31501)."""
    base = case.name.removesuffix("_bug").removesuffix("_fix") or "case"
    return case.with_(plan_window_left=case.window_left if fix else -1, name=f"{base}_{'fix' if fix else 'bug'}")


def _given(kw: dict) -> dict:
    """Overrides a notebook's parameters cell passes: ``None`` means "keep the shared shape"."""
    return {k: v for k, v in kw.items() if v is not None}


def seed_case(fix: bool = False, **overrides) -> Case:
    """The seed case: three fresh requests of 6/8/12 tokens, window 4, 4/4 heads, page 16
    (``evidence/cases.py``'s ``seed_bug`` / ``seed_fix``); any ``overrides`` not None replace
    those shapes."""
    return with_fix(Case(name="seed", **{**SEED_SHAPES, **_given(overrides)}), fix)


def _one_request(prefix=None, extend=None, window=None) -> dict:
    return _given(dict(prefix_lens=None if prefix is None else (prefix,),
                       extend_lens=None if extend is None else (extend,), window_left=window))


def gqa_case(fix: bool = False, *, prefix=None, extend=None, window=None, **overrides) -> Case:
    """A GQA request (32 query / 8 KV heads) with a prefix of 200 and 100 new tokens, window 64:
    its prefix spans several CTA query tiles. Arguments not None replace those shapes."""
    kw = {**GQA_SHAPES, **_one_request(prefix, extend, window), **_given(overrides)}
    kw.setdefault("name", f"gqa{kw['num_qo_heads'] // kw['num_kv_heads']}")
    return with_fix(Case(**kw), fix)


def long_case(fix: bool = False, *, extend=None, window=None, **overrides) -> Case:
    """One fresh request of 32768 tokens, window 4096, the seed's heads: drawn reduced.
    Arguments not None replace those shapes."""
    kw = {**SEED_SHAPES, **LONG_SHAPES, **_one_request(None, extend, window), **_given(overrides)}
    return with_fix(Case(name="long", **kw), fix)


def shapes_line(case: Case) -> str:
    """The shapes a case runs with, printed by the notebook: a heading that stated them would go
    stale when a parameter changes the case."""
    prefix, extend = ("/".join(map(str, lens)) for lens in (case.prefix_lens, case.extend_lens))
    return (f"{case.name}: prefix {prefix}, extend {extend}, window {case.window_left}, "
            f"{case.num_qo_heads}/{case.num_kv_heads} heads, head_dim {case.head_dim}, page {case.page_size}")


def for_machine(case: Case, mode: str) -> Case:
    """In live mode, the case as this GPU runs it (installed flashinfer version, SM count, arch),
    as ``swa-repro record`` does, so the model drawn next to the real kernel is the model of
    *this* kernel; in model mode, unchanged."""
    if mode != "live":
        return case
    from swa_repro.core.versions import FLASHINFER_VERSIONS
    from swa_repro.kernel.live import installed_flashinfer_version

    p = torch.cuda.get_device_properties(0)
    kw = dict(sm_count=p.multi_processor_count, arch=tuple(torch.cuda.get_device_capability(0)))
    v = installed_flashinfer_version()
    if v in FLASHINFER_VERSIONS:
        kw["flashinfer_version"] = v
    else:
        print(f"NOTE: flashinfer {v} is not modelled; the model is that of {case.flashinfer_version}")
    return case.with_(**kw)


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



# ----------------------------------------------------------------------------- model vs recording
@dataclass(frozen=True)
class Comparison(Row):
    """One request of one recording (or live probe) held to the kernel model."""
    case: str = col("case")
    req: int = col("req")
    flashinfer: str = col("flashinfer")
    model: str = col("model")
    recording: str = col("recording")
    rows_differing: int = col("rows_differing")
    evidence: str = col("evidence")
    agree: bool = col("agree")


def compare_model_to_recording(recording, model: ModelResult | None = None) -> list[Comparison]:
    """One row per request. Where the model says exact or leak: the recorded per-(row, head)
    intervals must equal the model's exactly and the recording's status must be the model's.
    Where the model says undefined: the recording must show missing keys, NaN, or run-to-run
    differences (the model makes no claim about the values)."""
    case = recording.case
    model = model or simulate(case)
    hq = case.num_qo_heads
    rows = []
    for i, (r, rq) in enumerate(zip(model.requests, recording.requests)):
        got, want = rq.intervals.per_qo_head(hq), r.intervals.per_qo_head(hq)  # (qo, Hq) each
        diff = (got.lo != want.lo) | (got.hi != want.hi)
        if r.status == "undefined":
            missing = bool(got.diff(case.window_left)[1].any())
            nan = bool(np.asarray(rq.nan).any())
            unstable = not (bool(np.asarray(rq.repeat_equal).all()) and bool(np.asarray(rq.random_equal).all()))
            evidence = ", ".join(w for w, f in (("missing keys", missing), ("NaN", nan),
                                                ("differs run to run", unstable)) if f) or "none"
            agree = missing or nan or unstable
        else:
            evidence = "intervals equal" if not diff.any() else f"first differing row {int(np.argmax(diff.any(1)))}"
            agree = (not diff.any()) and rq.status == r.status
        rows.append(Comparison(case.name, i, case.flashinfer_version, r.status, rq.status,
                               int(diff.any(1).sum()), evidence, bool(agree)))
    return rows


def model_vs_recordings(recordings) -> list[Comparison]:
    """:func:`compare_model_to_recording` over every recording (the model of each one's version)."""
    return [row for rec in recordings for row in compare_model_to_recording(rec)]


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


def model_for(case: Case, evidence=None) -> ModelResult:
    """The kernel model (with tile map) of exactly what ``evidence`` ran, e.g. a recording made
    with another flashinfer version than ``case`` names; of ``case`` when there is none."""
    return simulate(evidence.case if evidence is not None else case, tiles=True)


def kv_start_formula(case: Case, req: int, n_tiles: int, cta_tile_q: int) -> np.ndarray:
    """``(n_tiles,)`` each CTA's first key, ``max(0, kv_len - qo_len + t*CTA_TILE_Q/g - W)``: the
    guide's measured formula (prefill.cuh:2441-2442), written out independently of the model."""
    kv, qo, g, w = case.kv_lens[req], case.extend_lens[req], case.group_size, case.window_left
    return np.array([max(0, kv - qo + (t * cta_tile_q) // g - w) for t in range(n_tiles)])


# ----------------------------------------------------------------------------- verdict
@dataclass(frozen=True)
class Side:
    """One way of planning (without or with ``window_left``) and what it gave on this machine."""
    case: str
    source: str  # "kernel model" or the real kernel's module
    status: list  # the kernel model's per-request statuses
    correct: bool
    wrong_rows: list | None = None  # live: per request, rows over the tolerance
    max_err: list | None = None  # live
    recordings: list = field(default_factory=list)  # model: flashinfer versions recorded and compared
    recording_status: dict = field(default_factory=dict)  # model: flashinfer version -> statuses
    recordings_agree: bool | None = None  # model: None when no recording matches


@dataclass(frozen=True)
class Verdict:
    mode: str
    shapes: dict
    without_window: Side
    with_window: Side
    evidence: list  # provenance line of every recording the verdict rests on

    @property
    def bug_present_without_window(self) -> bool:
        return not self.without_window.correct

    @property
    def fixed_with_window(self) -> bool:
        return self.with_window.correct

    @property
    def sentence(self) -> str:
        wo, wi = self.without_window, self.with_window
        if self.mode == "live":
            how = (f"On this GPU the real kernel planned without window_left gets {sum(wo.wrong_rows)} rows wrong "
                   f"(max err {wo.max_err}); planned with it, {sum(wi.wrong_rows)} rows wrong.")
        else:
            recs = [x for x in (wo, wi) if x.recordings]
            backing = ("; GPU recordings (flashinfer " + ", ".join(sorted({f for x in recs for f in x.recordings}))
                       + (") agree with the model" if all(x.recordings_agree for x in recs) else ") DISAGREE with the model")
                       ) if recs else "; no GPU recording matches this case, so this rests on the kernel model alone"
            how = (f"Kernel model: without window_left at plan the requests are {', '.join(wo.status)}; "
                   f"with it {', '.join(wi.status)}{backing}.")
        word = "PRESENT" if self.bug_present_without_window else "ABSENT"
        fix = "the plan-time window fixes it" if self.fixed_with_window else "the plan-time window does NOT fix it"
        return f"Bug {word} without plan-time window_left, {fix}. {how}"


def _side(c: Case, mode: str, recordings, seed: int) -> Side:
    m = simulate(c)
    if mode == "live":
        r = call(c, "live", "forward", seed)
        return Side(c.name, f"real kernel, {r.module.get('uri')}", m.statuses, sum(r.wrong_rows) == 0,
                    r.wrong_rows, r.max_err)
    recs = matching_recordings(c, recordings)
    rows = [row for rec in recs for row in compare_model_to_recording(rec)]
    return Side(c.name, "kernel model", m.statuses, all(s == "exact" for s in m.statuses),
                recordings=sorted({row.flashinfer for row in rows}),
                recording_status={rec.case.flashinfer_version: list(rec.statuses) for rec in recs},
                recordings_agree=all(row.agree for row in rows) if rows else None)


def verdict(mode_info, case: Case | None = None, recordings=(), seed: int = 0) -> Verdict:
    """Is the bug present without plan-time ``window_left`` and gone with it, on this machine?

    live: the real kernel, ``plan`` then ``forward(window_left=W)``, each row against the float64
    reference (tolerance ``calls.TOL``; NaN is wrong). model: the kernel model's statuses, held to
    every committed recording of the same case (:func:`compare_model_to_recording`)."""
    mode = getattr(mode_info, "mode", mode_info)
    base = case or seed_case()
    wo, wi = (_side(with_fix(base, fix), mode, recordings, seed) for fix in (False, True))
    evidence = [] if mode == "live" else [provenance_line(rec) for c in (wo, wi)
                                          for rec in matching_recordings(with_fix(base, c is wi), recordings)]
    return Verdict(mode, base.with_(name="").to_dict(), wo, wi, evidence)


def show_case(case: Case, mode: str, recordings, save, figure_name: str, checks):
    """Notebook 02's view of one case: the model (with tile map) and the real kernel's effective
    mask, if any, in one figure; the model held to that evidence as a check, or a note that
    there is none. Returns ``(model, evidence)``."""
    from swa_repro.notebook import plots
    from swa_repro.notebook.show import show

    evidence, why = evidence_for(case, mode, recordings)
    print(why)
    model = model_for(case, evidence)
    plots.publish(plots.plot_case(case, model, evidence), figure_name, save)
    if evidence is not None:
        rows = compare_model_to_recording(evidence, model)
        show(rows)
        checks.expect(all(r.agree for r in rows), f"{case.name}: kernel model equals the real kernel ({why[:60]})")
    elif mode == "model":
        print(f"NOTE: {case.name}: no GPU recording, model-vs-kernel check skipped (not passed)")
    return model, evidence
