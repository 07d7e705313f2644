"""The fuzz report: totals, disagreements (each with its reproducer), axes covered; JSON and a
short printed table. Built the same way from a live run and from replayed recordings."""

from __future__ import annotations

from collections import Counter

from swa_repro.evidence.fuzz_cases import axes_covered
from swa_repro.evidence.fuzz_compare import compare_case
from swa_repro.evidence.fuzz_store import FuzzRun

REPORT_FORMAT = "swa-repro-fuzz-report/1"
MAX_PRINTED = 20  # disagreements printed; the JSON has all


def build_report(runs: list[FuzzRun], mode: str, provenance: dict, extra: dict | None = None) -> dict:
    comps, failed, by_version = [], [], {}
    for run in runs:
        v = by_version.setdefault(run.flashinfer_version, {"runs": [], "cases": 0, "cases_failed": 0, "requests": 0,
                                                          "comparisons": 0, "agreements": 0, "disagreements": 0})
        v["runs"].append(run.path.name)
        for fc in run.cases:
            v["cases"] += 1
            if fc.observed is None:
                v["cases_failed"] += 1
                failed.append({"version": run.flashinfer_version, "case_index": fc.index, "case_name": fc.case.name,
                               "error": fc.entry.get("error")})
                continue
            c = compare_case(fc.case, fc.observed, fc.index)
            comps.append((run, fc, c))
            for k in ("requests", "comparisons", "agreements"):
                v[k] += getattr(c, k)
            v["disagreements"] += len(c.disagreements)
    cases = [fc.case for _, fc, _ in comps]
    planned = [bool((fc.entry.get("plan_info") or {}).get("split_kv")) for _, fc, _ in comps]
    disagreements = [{"version": run.flashinfer_version, "run": run.path.name, **d}
                     for run, _, c in comps for d in c.disagreements]
    return {
        "format": REPORT_FORMAT, "mode": mode,
        "cases": len(comps) + len(failed), "cases_compared": len(comps), "cases_failed": len(failed),
        "requests": sum(c.requests for *_, c in comps),
        "comparisons": sum(c.comparisons for *_, c in comps),
        "agreements": sum(c.agreements for *_, c in comps),
        "disagreement_count": len(disagreements),
        "by_version": by_version,
        "statuses": {"model": dict(Counter(s for *_, c in comps for s in c.model_statuses)),
                     "kernel": dict(Counter(s for *_, c in comps for s in c.kernel_statuses))},
        "axes_covered": axes_covered(cases, {"split_kv_planned": planned,
                                             "flashinfer_version": [run.flashinfer_version for run, _, _ in comps]}),
        "disagreements": disagreements, "failed": failed,
        "recordings": [str(r.path) for r in runs],
        "recording_provenance": {r.path.name: r.doc.get("provenance") for r in runs},
        "provenance": provenance, **(extra or {}),
    }


def format_report(rep: dict) -> str:
    lines = [f"fuzz ({rep['mode']}): {rep['cases']} cases ({rep['cases_failed']} failed to probe), "
             f"{rep['requests']} requests, {rep['comparisons']} request x head comparisons: "
             f"{rep['agreements']} agree, {rep['comparisons'] - rep['agreements']} disagree "
             f"({rep['disagreement_count']} disagreeing requests)"]
    for v, s in rep["by_version"].items():
        lines.append(f"  flashinfer {v}: {s['cases']} cases, {s['requests']} requests, "
                     f"{s['agreements']}/{s['comparisons']} agree, {s['disagreements']} disagreements")
    lines.append(f"  statuses  model {rep['statuses']['model']}  kernel {rep['statuses']['kernel']}")
    lines.append("  axes covered (cases per value):")
    for axis, counts in rep["axes_covered"].items():
        lines.append(f"    {axis:20s} " + "  ".join(f"{k}:{n}" for k, n in counts.items()))
    for d in rep["disagreements"][:MAX_PRINTED]:
        lines += [f"DISAGREE {d['version']} {d['case_name']} request {d['request']}: {d['kind']} "
                  f"(model {d['model_status']}, kernel {d['kernel_status']}): {d['detail']}",
                  f"  reproduce: {d['reproduce']}"]
    if len(rep["disagreements"]) > MAX_PRINTED:
        lines.append(f"... {len(rep['disagreements']) - MAX_PRINTED} more disagreements in the JSON report")
    for f in rep["failed"][:MAX_PRINTED]:
        lines.append(f"FAILED {f['version']} {f['case_name']}: {f['error']}")
    return "\n".join(lines)
