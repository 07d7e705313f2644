"""Notebook 02's view of ``swa-repro fuzz``: cases, agreement and the axes covered.

Only committed real-kernel runs (``recordings/fuzz/<version>/``, written by ``swa-repro fuzz
--mode live`` on a GPU, :mod:`swa_repro.evidence.fuzz`) are evidence about the kernel. When there
are none the view says so, and how to make one. It may also run the CPU self-test (the kernel
model's own masks stand in for the kernel, ``fuzz.selftest_probe``): that checks the pipeline
(draw, probe, store, read back, compare) and proves nothing about the kernel, and is labelled so.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from swa_repro.core.case import Case
from swa_repro.core.versions import FLASHINFER_VERSIONS, version_key
from swa_repro.evidence import fuzz_cases as fc

HOW_TO_RECORD = ("on a CUDA machine: `swa-repro fuzz --mode live --cases 200` (or, air-gapped, "
                 "`bash scripts/gpu_fuzz.sh VERSION:60:fa2,fa3,auto:128` with the bundles of `swa-repro bundle`), "
                 "then commit recordings/fuzz/<version>/")
SELFTEST_LABEL = ("PIPELINE SELF-TEST, not kernel evidence: the kernel model's own masks stand in for the kernel "
                  "(`swa-repro fuzz --mode selftest`), so agreement here only shows the fuzz machinery works")


@dataclass
class FuzzView:
    kind: str  # "recorded" (real-kernel runs replayed through the model) | "none"
    headline: str
    report: dict | None = None  # fuzz_report.build_report of the committed runs
    coverage: list[dict] = field(default_factory=list)  # coverage_rows of the committed runs
    selftest: dict | None = None  # the same report of a CPU self-test, when asked for
    notes: list[str] = field(default_factory=list)

    @property
    def is_kernel_evidence(self) -> bool:
        return self.kind == "recorded"


def committed_runs(root=None) -> list:
    """Every committed fuzz run under ``root`` (default ``recordings/fuzz``), all versions."""
    from swa_repro.evidence.fuzz import FUZZ_ROOT
    from swa_repro.evidence.fuzz_store import find_runs, load_run

    root = Path(root) if root else FUZZ_ROOT
    return [load_run(p) for v in sorted(root.glob("[0-9]*")) if v.is_dir() for p in find_runs(v)]


def fuzz_view(root=None, *, selftest_cases: int = 0, seed: int = 0) -> FuzzView:
    """The committed real-kernel fuzz runs through the model, or a plain "none yet" with how to
    make one; plus, if ``selftest_cases``, a small labelled CPU self-test."""
    from swa_repro.evidence.fuzz import FUZZ_ROOT
    from swa_repro.evidence.fuzz_report import build_report

    where = Path(root) if root else FUZZ_ROOT
    runs = committed_runs(where)
    if runs:
        rep = build_report(runs, "model", {"source": "committed recordings"})
        versions = ", ".join(sorted(rep["by_version"], key=version_key))
        head = (f"real-kernel fuzz runs committed under {where} (flashinfer {versions}): {rep['cases']} cases, "
                f"{rep['agreements']}/{rep['comparisons']} request x head comparisons agree with the kernel model, "
                f"{rep['disagreement_count']} disagreeing requests, {rep['cases_failed']} cases failed to probe")
        view = FuzzView("recorded", head, rep, coverage_rows(runs))
        missing = unbacked_versions(runs)
        if missing:
            view.notes.append(f"no real-kernel fuzz run committed yet for flashinfer {', '.join(missing)}: "
                              f"modelled from source alone. To make one, {HOW_TO_RECORD}.")
    else:
        view = FuzzView("none", f"NOTE: no real-kernel fuzz run is committed yet (nothing under {where}/<version>/), "
                                f"so there is no fuzz evidence about the kernel. To make one, {HOW_TO_RECORD}.")
    if selftest_cases:
        view.selftest = selftest_report(selftest_cases, seed)
    return view


def selftest_report(cases: int, seed: int = 0) -> dict:
    """``swa-repro fuzz --mode selftest`` in memory: CPU, the model standing in for the kernel;
    the run goes through storage and back (a temp dir), exactly as a live run does."""
    from swa_repro.evidence import fuzz as fz

    max_len, max_tokens, max_batch = fz.LIMITS["selftest"]
    drawn = fc.generate(seed, cases, max_len=max_len, max_tokens=max_tokens, max_batch=max_batch)
    version = Case.__dataclass_fields__["flashinfer_version"].default
    drawn = fc.for_device(drawn, flashinfer_version=version, sm_count=132, arch=(9, 0))
    doc = {"mode": "selftest", "flashinfer_version": version, "provenance": {"source": "CPU self-test"},
           "args": {"seed": seed, "cases": cases, "max_len": max_len, "max_tokens": max_tokens, "max_batch": max_batch}}
    with tempfile.TemporaryDirectory(prefix="swa-repro-fuzz-selftest-") as tmp:
        rep, _ = fz.run_and_store(drawn, fz.selftest_probe, Path(tmp) / "selftest", doc, log=lambda *_: None)
    return rep


def coverage_rows(runs) -> list[dict]:
    """Per flashinfer version: what its committed real-kernel runs covered and where they ran,
    read from each run's own args and provenance."""
    by = {}
    for run in runs:
        by.setdefault(run.flashinfer_version, []).append(run)
    rows = []
    for v, rs in sorted(by.items(), key=lambda kv: version_key(kv[0])):
        cases = [Case.from_dict(e["case"]) for r in rs for e in r.doc["cases"] if "error" not in e]
        plans = sorted({f"{c.backend}:{fc.plan_variant(c)}" for c in cases})
        prov = [r.doc["provenance"] for r in rs]
        rows.append({"flashinfer": v, "backends": ",".join(sorted({c.backend for c in cases})),
                     "head dims": ",".join(map(str, sorted({c.head_dim for c in cases}))),
                     "plans": " ".join(plans), "gpu": ", ".join(sorted({p["gpu"] for p in prov})),
                     "date": ", ".join(sorted({p["date_utc"][:10] for p in prov}))})
    return rows


def unbacked_versions(runs) -> list[str]:
    """Modelled versions with no committed real-kernel fuzz run: their model rests on source alone."""
    have = {r.flashinfer_version for r in runs}
    return [v for v in FLASHINFER_VERSIONS if v not in have]


def totals_rows(rep: dict) -> list[dict]:
    """One row per flashinfer version: cases, requests, request x head agreement."""
    return [{"flashinfer": v, "cases": s["cases"], "failed to probe": s["cases_failed"], "requests": s["requests"],
             "agree": f"{s['agreements']}/{s['comparisons']}", "disagreeing requests": s["disagreements"]}
            for v, s in sorted(rep["by_version"].items(), key=lambda kv: version_key(kv[0]))]


def axes_rows(rep: dict) -> list[dict]:
    """One row per fuzz axis: the values drawn and how many cases had each."""
    return [{"axis": a, "values (cases)": "  ".join(f"{k}:{n}" for k, n in counts.items())}
            for a, counts in rep["axes_covered"].items()]


def print_view(view: FuzzView) -> None:
    """What notebook 02 prints: the headline, then per report its totals and axes tables."""
    from swa_repro.notebook.show import show

    print(view.headline)
    for label, rep in (("committed real-kernel runs", view.report), (SELFTEST_LABEL, view.selftest)):
        if rep is None:
            continue
        print(f"\n{label}:")
        show(totals_rows(rep))
        if rep is view.report and view.coverage:
            print()
            show(view.coverage)
        print()
        show(axes_rows(rep), max_width=120)
        for d in rep["disagreements"][:10]:
            print(f"DISAGREE {d['version']} {d['case_name']} request {d['request']}: {d['kind']} -> {d['reproduce']}")
    for note in view.notes:
        print(f"\nNOTE: {note}")
