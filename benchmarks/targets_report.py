"""REPORT.md's "Issue #24 targets" section, from ``benchmarks/results/issue24_targets.json``.

That file is written by ``bash benchmarks/measure_targets.sh`` (a fresh clone, the real make
commands, timed), which ends with::

    python benchmarks/targets_report.py collect WORK --out benchmarks/results/issue24_targets.json

reading what the script left in ``WORK`` (per step ``NAME.meta``: the command, its start and end,
its exit status and the load average around it; ``NAME.log``: its output; ``NAME.summary.json``:
``make repro``'s summary). :func:`render_targets24` turns the file into the section: each target
with its limit, the measured seconds and a verdict, and the 10 slowest tests of the run's
``pytest --durations=10``. A verdict is PASS only for a step that was measured, ran on the
target's 2 cores, exited 0 with every test or notebook passing, and took no longer than the limit;
otherwise it says which of those it was not. Standard library only: the script may run it with
any Python >= 3.11.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "issue24_targets.json"
COMMAND = "bash benchmarks/measure_targets.sh"
TARGET_CORES = 2
# (step, what, limit in seconds or None: measured for reference, no target)
TARGETS = [
    ("make_test_from_nothing", "`make test` from nothing: a fresh clone, no venv, empty caches", 300.0),
    ("suite_warm", "the suite warm: `make test` again in that clone (venv and caches warm)", 240.0),
    ("repro_cold", "`make repro` cold: its first run in the clone (empty swa-repro and bytecode caches)", None),
    ("repro_warm", "`make repro` warm: the second run", 90.0),
]
STEPS = [t[0] for t in TARGETS]
TESTS = ("make_test_from_nothing", "suite_warm")
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(call|setup|teardown)\s+(\S.*?)\s*$")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)")


# ----------------------------------------------------------------------------- collect (after the script)
def parse_pytest(text: str) -> dict:
    """From pytest's output: ``counts`` of its final line, ``durations`` (the ``--durations`` table,
    slowest first: seconds, phase, test id)."""
    lines = text.splitlines()
    finals = [ln for ln in lines if re.search(r"\b\d+ (passed|failed|errors?)\b", ln) and re.search(r" in [\d.]+s", ln)]
    counts = {k.rstrip("s") if k.startswith(("error", "warning")) else k: int(n)
              for n, k in COUNT.findall(finals[-1])} if finals else {}
    durations, inside = [], False
    for ln in lines:
        if re.search(r"slowest( \d+)? durations", ln):
            inside = True
        elif inside and (m := DURATION.match(ln)):
            durations.append({"seconds": float(m.group(1)), "phase": m.group(2), "test": m.group(3)})
        elif inside and durations and ln.strip() and not ln.lstrip().startswith("("):
            inside = False  # the table ended (pytest's "(N durations < 0.005s hidden ...)" note is in it)
    return {"counts": counts, "durations": durations}


def _meta(path: Path) -> dict:
    out = {}
    for ln in path.read_text().splitlines():
        k, sep, v = ln.partition("=")
        if sep:
            out[k] = v
    return out


def _floats(text: str | None) -> list[float] | None:
    try:
        return [float(x) for x in (text or "").split()] or None
    except ValueError:
        return None


def _cpu() -> str | None:
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def collect(work: Path) -> dict:
    """The measurement file's document from what ``measure_targets.sh`` left in ``work``."""
    work = Path(work)
    run = _meta(work / "run.meta") if (work / "run.meta").exists() else {}
    doc = {"provenance": {
        "command": COMMAND, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": platform.node(),
        "cpu": _cpu(), "cores": int(run["cores"]) if run.get("cores", "").isdigit() else None,
        "commit": run.get("commit"), "source_dirty": bool(run.get("source_dirty")),
        "uv_cache": run.get("uv_cache"), "python": platform.python_version()}, "steps": {}}
    for name in STEPS:
        if not (work / f"{name}.meta").exists():
            continue  # not run (the script stopped before it): not measured
        m = _meta(work / f"{name}.meta")
        log = (work / f"{name}.log").read_text(errors="replace") if (work / f"{name}.log").exists() else ""
        try:
            wall = round(float(m["end"]) - float(m["start"]), 2)
        except (KeyError, ValueError):
            wall = None
        rc = m.get("returncode", "")
        rec = {"command": m.get("command"), "wall_s": wall, "returncode": int(rc) if rc.lstrip("-").isdigit() else rc,
               "loadavg_before": _floats(m.get("loadavg_before")), "loadavg_after": _floats(m.get("loadavg_after")),
               "output_tail": log[-3000:]}
        if name in TESTS:
            rec.update(parse_pytest(log))
        summary = work / f"{name}.summary.json"
        if summary.exists():
            s = json.loads(summary.read_text())
            rec["mode"] = s.get("mode")
            rec["notebooks"] = [{k: n.get(k) for k in ("notebook", "status", "seconds", "checks_passed", "checks_failed")}
                                for n in s.get("notebooks", [])]
        doc["steps"][name] = rec
    return doc


def write(path: Path, doc: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- verdicts and the section
def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _load(rec) -> str:
    b, a = rec.get("loadavg_before"), rec.get("loadavg_after")
    return "load –" if not b else f"load {b[0]:.1f} -> {a[0]:.1f}" if a else f"load {b[0]:.1f}"


def verdict(doc: dict | None, step: str, limit: float | None) -> tuple[float | None, str, str]:
    """``(seconds or None, verdict, how)`` of one target. PASS needs all of: a record of the step
    with its seconds, the target's core count, exit 0, every test (every notebook) passing, and
    seconds within the limit."""
    rec = ((doc or {}).get("steps") or {}).get(step)
    if not rec:
        return None, "not measured yet", f"run `{COMMAND}`"
    wall = rec.get("wall_s")
    if not _num(wall):
        return None, "not measured", "no wall time in the record"
    how = [f"`{rec.get('command')}`", _load(rec)]
    why_not = []
    if rec.get("returncode") != 0:
        why_not.append(f"it failed (exit {rec.get('returncode')})")
    if step in TESTS:
        c = rec.get("counts") or {}
        how.append(", ".join(f"{n} {k}" for k, n in c.items()) or "no pytest summary")
        bad = sum(c.get(k, 0) for k in ("failed", "error"))
        if bad or not c.get("passed"):
            why_not.append(f"{bad} tests failed or errored" if bad else "no test passed")
    nbs = rec.get("notebooks")
    if step.startswith("repro"):
        failed = [n.get("notebook") for n in nbs or [] if n.get("status") != "ok"]
        how.append(f"{len(nbs)} notebooks, mode {rec.get('mode')}" if nbs else "no summary.json")
        if failed or not nbs:
            why_not.append(f"notebooks failed: {', '.join(map(str, failed))}" if failed else "no notebook ran")
    cores = ((doc or {}).get("provenance") or {}).get("cores")
    if why_not:
        return wall, "FAIL", "; ".join(why_not + how)
    if limit is None:
        return wall, "no target", "; ".join(how)
    if cores != TARGET_CORES:
        return wall, f"not comparable ({cores} cores)", "; ".join([f"the target is for {TARGET_CORES} cores"] + how)
    return wall, "PASS" if wall <= limit else "FAIL", "; ".join(how)


def slowest(doc: dict | None) -> tuple[str | None, list[dict]]:
    """The run whose ``--durations=10`` table the report shows (the warm suite's, else the first
    run's) and its rows, slowest first."""
    steps = (doc or {}).get("steps") or {}
    for step in ("suite_warm", "make_test_from_nothing"):
        rows = (steps.get(step) or {}).get("durations") or []
        if rows:
            return step, sorted(rows, key=lambda r: -r["seconds"])[:10]
    return None, []


def render_targets24(doc: dict | None) -> list[str]:
    lines = ["## Issue #24 targets: a fresh clone, the real make commands", ""]
    if doc is None:
        lines += [f"Not measured yet: `benchmarks/results/{RESULTS.name}` is missing. `{COMMAND}` measures every "
                  "target below once, on a quiet 2-core machine (`taskset -c 0,1` on a bigger one).", ""]
    else:
        p = doc.get("provenance") or {}
        dirty = " (the checkout had uncommitted changes; the clone has the commit only)" if p.get("source_dirty") else ""
        lines += [f"`{p.get('command')}` at commit {str(p.get('commit'))[:12]}{dirty}, {p.get('date')}, on "
                  f"{p.get('cpu')} ({p.get('cores')} cores), uv cache {p.get('uv_cache')}.", ""]
    lines += ["| target | limit | measured | verdict | how |", "|---|---|---|---|---|"]
    for step, what, limit in TARGETS:
        v, verdict_, how = verdict(doc, step, limit)
        lines.append(f"| {what} | {'–' if limit is None else f'<= {limit:g} s'} | "
                     f"{'–' if v is None else f'{v:.0f} s'} | {verdict_} | {how} |")
    lines.append("")
    step, rows = slowest(doc)
    lines += ["### The 10 slowest tests", ""]
    if not rows:
        return lines + [f"Not measured yet: from `pytest --durations=10` of `{COMMAND}`.", ""]
    lines += [f"From `pytest --durations=10` of the `{step}` run:", "", "| # | seconds | phase | test |", "|---|---|---|---|"]
    lines += [f"| {i} | {r['seconds']:.1f} | {r['phase']} | `{r['test']}` |" for i, r in enumerate(rows, 1)]
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="the measurement file from measure_targets.sh's folder")
    c.add_argument("work", type=Path)
    c.add_argument("--out", type=Path, default=RESULTS)
    r = sub.add_parser("render", help="print the section")
    r.add_argument("--results", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    if a.cmd == "collect":
        doc = collect(a.work)
        write(a.out, doc)
        for step, what, limit in TARGETS:
            v, verdict_, _ = verdict(doc, step, limit)
            print(f"{step}: {'–' if v is None else f'{v:.0f} s'} {verdict_}")
        print(f"wrote {a.out}")
        return 0
    doc = json.loads(a.results.read_text()) if a.results.exists() else None
    print("\n".join(render_targets24(doc)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
