"""REPORT.md's "CPU: bootstrap and make repro" section, from ``benchmarks/results/cpu_workflow.json``
(written by ``python -m benchmarks.cpu_workflow``; ``reported`` entries are numbers quoted from an
issue, never re-measured, and say so)."""

from __future__ import annotations

import re

WORKFLOW_COMMAND = "python -m benchmarks.cpu_workflow --bootstrap --suite --repro"
REPRO_LIMIT_S, MAKE_TEST_LIMIT_S = 90.0, 300.0
LABELS = {"bootstrap": "`make venv` from nothing (empty uv cache: every download)",
          "suite_make": "test suite as `make test` runs it", "suite_serial": "test suite, one process (`-q`)"}


def _runs(wf) -> dict:
    return (wf or {}).get("runs", {})


def _load(rec) -> str:
    b, a = rec.get("loadavg_before"), rec.get("loadavg_after")
    return "–" if not b else f"{b[0]:.1f} -> {a[0]:.1f}" if a else f"{b[0]:.1f}"


def _failed(rec) -> list[str]:
    return [n["notebook"] for n in rec.get("notebooks", []) if n.get("status") != "ok"]


def _repro_keys(wf) -> list[str]:
    return sorted(k for k in _runs(wf) if k.startswith("repro_jobs"))


def repro_run(wf):
    """``(seconds or None, how)`` of the model-mode run with the most notebooks at a time, or None
    when there is none. A run with a failed notebook did not do all the work: not a measurement."""
    keys = _repro_keys(wf)
    if not keys:
        return None
    rec = max((_runs(wf)[k] for k in keys), key=lambda r: r.get("jobs", 1))
    how = (f"`{re.split(r' (?:--output|OUTPUT=)', rec['command'])[0]}`, {rec.get('jobs')} notebooks at a time, {rec.get('cpu_count')} "
           f"cores, {rec.get('date')}; load average {_load(rec)} (1 min, start -> end)")
    if _failed(rec):
        return None, f"not measured: {', '.join(_failed(rec))} failed in that run ({how})"
    return rec["wall_s"], how


def make_test_from_nothing(wf):
    """``(bootstrap + suite seconds or None, how)``: `make test` on an empty checkout is exactly
    the two, one after the other."""
    b, s = _runs(wf).get("bootstrap"), _runs(wf).get("suite_make")
    if not (b and s):
        return None, f"not measured yet: run `{WORKFLOW_COMMAND}`"
    if b.get("returncode") != 0:
        return None, f"not measured: the bootstrap failed (exit {b.get('returncode')})"
    c = s.get("counts", {})
    tests = ", ".join(f"{n} {k}" for k, n in c.items())
    pk = f"{b['packages']} packages, " if b.get("packages") else ""
    return b["wall_s"] + s["wall_s"], (f"bootstrap {b['wall_s']:.0f} s ({pk}load {_load(b)}) + "
                                       f"suite {s['wall_s']:.0f} s (`pytest {s.get('pytest_args')}`: {tests}; "
                                       f"load {_load(s)}), {s.get('cpu_count')} cores, {s.get('date')}")


def _verdict(v, limit) -> str:
    return "not measured" if v is None else ("PASS" if v <= limit else "FAIL")


def render_workflow(wf) -> list[str]:
    lines = ["## CPU: bootstrap and make repro", ""]
    if not wf:
        return lines + [f"Not measured yet: run `{WORKFLOW_COMMAND}`.", ""]
    for (v, how), what, limit in ((repro_run(wf) or (None, "not measured yet"), "`make repro MODE=model`", REPRO_LIMIT_S),
                                  (make_test_from_nothing(wf), "`make test` from nothing", MAKE_TEST_LIMIT_S)):
        shown = "" if v is None else f" {v:.0f} s,"
        lines.append(f"- **{_verdict(v, limit)}** {what} <= {limit:.0f} s:{shown} {how}")
    lines += ["", "Every wall time below comes with the machine's 1-minute load average before and after: this "
              "2-core machine was shared with other jobs, and a number measured under load says so.", "",
              "| measurement | wall s | load | date | command / note |", "|---|---|---|---|---|"]
    for r in wf.get("reported", []):
        lines.append(f"| {r['what']} | {r['wall_s']:.0f} | – | – | reported in {r['source']}, not re-measured |")
    for key, rec in _runs(wf).items():
        what = LABELS.get(key) or (f"model-mode run, {rec.get('jobs')} at a time" + (" (before)" if "before" in key else ""))
        note = rec.get("note") or ""
        lines.append(f"| {what} | {rec['wall_s']:.0f} | {_load(rec)} | {rec.get('date', '–')} | "
                     f"`{rec['command']}`{'; ' + note if note else ''} |")
    return lines + [""] + _notebook_table(wf) + _artifact_table(wf)


def _notebook_table(wf) -> list[str]:
    keys = [k for k in _runs(wf) if k.startswith("repro_")]
    if not keys:
        return []
    names = list(dict.fromkeys(n["notebook"] for k in keys for n in _runs(wf)[k].get("notebooks", [])))
    sec = {(k, n["notebook"]): n for k in keys for n in _runs(wf)[k].get("notebooks", [])}
    lines = ["Seconds per notebook (wall, each in its own kernel; with several at a time they share the cores):", "",
             "| notebook | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name in names:
        cells = [sec.get((k, name)) for k in keys]
        lines.append(f"| {name} | " + " | ".join("–" if c is None else f"{c['seconds']:.0f}"
                                                 + ("" if c.get("status") == "ok" else " (failed)") for c in cells) + " |")
    return lines + [""]


def _artifact_table(wf) -> list[str]:
    keys = [k for k in _runs(wf) if "artifacts" in _runs(wf)[k]]
    if not keys:
        return []
    lines = ["What the run wrote (MB): every file, notebook 04's replay traces among them, the figures, and the "
             "largest executed notebook or HTML page:", "",
             "| run | total | traces/ | PNG figures | largest page |", "|---|---|---|---|---|"]
    for k in keys:
        a = _runs(wf)[k]["artifacts"]
        name, size = a["largest_page"]
        lines.append(f"| {k} | {a['total_bytes'] / 1e6:.1f} | {a['traces_bytes'] / 1e6:.1f} | {a['png_bytes'] / 1e6:.1f} "
                     f"| {name} {size / 1e6:.2f} |")
    return lines + [""]
