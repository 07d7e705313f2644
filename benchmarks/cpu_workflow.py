"""CPU benchmark of the two user commands: `make repro MODE=model` and `make test` from nothing.

    python -m benchmarks.cpu_workflow --repro             # swa-repro run --mode model (default jobs), per notebook
    python -m benchmarks.cpu_workflow --repro --jobs 1    # the same, one notebook at a time
    python -m benchmarks.cpu_workflow --suite             # the test suite as `make test` runs it (--serial: also without -n)
    python -m benchmarks.cpu_workflow --bootstrap         # `make venv` into a fresh venv with an EMPTY uv cache
                                                          # (downloads the whole pinned stack, ~3.5 GB: run it once)

Each measurement is added to ``benchmarks/results/cpu_workflow.json`` under its own key (earlier
ones are kept), with the load average before and after: this machine may be shared, and a
number measured under load says so. ``make test`` from nothing is the bootstrap plus the suite
as the Makefile runs it; the report (``benchmarks/report.py``) holds both against their targets.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import WORKFLOW_RESULTS, command_line, cpu_provenance, load_json, write_json_atomic  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def loadavg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def timed(cmd: list[str], *, env=None, timeout_s: float = 3600, cwd=REPO) -> dict:
    """Wall time of ``cmd`` with the load average around it; the output's tail for the record."""
    rec = {"command": shlex.join(cmd), "loadavg_before": loadavg()}
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", str(e)
    rec.update(wall_s=round(time.perf_counter() - t, 2), loadavg_after=loadavg(), returncode=rc,
               output_tail=out[-1500:])
    m = re.search(r"Resolved (\d+) packages", out)  # uv's line, far above the tail
    if m:
        rec["packages"] = int(m.group(1))
    return rec


def artifact_sizes(out: Path) -> dict:
    """Bytes under ``out``: in all, the traces (notebook 04's replay input), and the largest
    executed notebook / HTML page."""
    files = [p for p in out.rglob("*") if p.is_file()]
    size = lambda ps: sum(p.stat().st_size for p in ps)  # noqa: E731
    pages = {p.name: p.stat().st_size for p in files if p.suffix in (".ipynb", ".html") and p.parent == out}
    return {"total_bytes": size(files), "traces_bytes": size([p for p in files if "traces" in p.parts]),
            "png_bytes": size([p for p in files if p.suffix == ".png"]), "pages_bytes": pages,
            "largest_page": max(pages.items(), key=lambda kv: kv[1], default=(None, 0))}


def bench_repro(jobs: int | None) -> dict:
    """`make repro MODE=model` into a scratch directory, cold: an empty bytecode cache (the
    Makefile's PYTHONPYCACHEPREFIX pointed at a new folder), as the first run after `make venv`
    is. Wall time, per notebook."""
    with tempfile.TemporaryDirectory(prefix="swa-repro-workflow-") as tmp:
        cmd = ["make", "-s", "repro", "MODE=model", f"OUTPUT={tmp}/out", f"PYTHONPYCACHEPREFIX={tmp}/pycache",
               f"VENV={Path(sys.executable).parents[1]}"] + ([] if jobs is None else [f"RUN_ARGS=--jobs {jobs}"])
        rec = timed(cmd)
        out = Path(tmp) / "out"
        summary = load_json(out / "summary.json") or {}
        rec["notebooks"] = [{k: n.get(k) for k in ("notebook", "status", "seconds", "error")}
                            for n in summary.get("notebooks", [])]
        rec["jobs"] = jobs or _default_jobs()
        rec["artifacts"] = artifact_sizes(out)
    return rec


def _default_jobs() -> int:
    from swa_repro.notebook.runner import default_jobs

    return default_jobs()


def makefile_pytest_args() -> str:
    """The Makefile's default PYTEST_ARGS (what `make test` runs)."""
    m = re.search(r"^PYTEST_ARGS\s*\?=\s*(.*)$", (REPO / "Makefile").read_text(), re.M)
    return m.group(1).strip() if m else "-q"


def bench_suite(args: str) -> dict:
    """The whole suite through `make test` (its environment too); passed/failed counts from
    pytest's last line."""
    rec = timed(["make", "-s", "test", f"PYTEST_ARGS={args} -p no:cacheprovider", f"VENV={Path(sys.executable).parents[1]}"])
    last = rec["output_tail"].strip().splitlines()[-1] if rec["output_tail"].strip() else ""
    rec["pytest_args"] = args
    rec["counts"] = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", last)}
    return rec


def bench_bootstrap() -> dict:
    """`make venv` into a fresh venv, uv's cache an empty folder and pip's cache off: the install
    of the whole pinned stack from nothing (downloads included), as a first `make test` does."""
    with tempfile.TemporaryDirectory(prefix="swa-repro-bootstrap-") as tmp:
        env = {**os.environ, "UV_CACHE_DIR": str(Path(tmp) / "uv-cache"), "PIP_NO_CACHE_DIR": "1"}
        return timed(["make", "venv", f"VENV={Path(tmp) / 'venv'}"], env=env)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repro", action="store_true", help="time swa-repro run --mode model")
    ap.add_argument("--jobs", type=int, default=None, help="--jobs for the repro run (default: the runner's)")
    ap.add_argument("--suite", action="store_true", help="time the suite as `make test` runs it")
    ap.add_argument("--serial", action="store_true", help="with --suite: also one process (-q), to show what -n saves")
    ap.add_argument("--bootstrap", action="store_true", help="time make venv from nothing (empty uv cache, ~3.5 GB)")
    ap.add_argument("--out", type=Path, default=WORKFLOW_RESULTS)
    a = ap.parse_args(argv)
    doc = load_json(a.out) or {}
    doc.setdefault("runs", {})
    prov = cpu_provenance(command_line())
    steps = []
    if a.bootstrap:
        steps.append(("bootstrap", bench_bootstrap))
    if a.repro:
        steps.append((f"repro_jobs{a.jobs or _default_jobs()}", lambda: bench_repro(a.jobs)))
    if a.suite:
        make_args = makefile_pytest_args()
        steps.append(("suite_make", lambda: bench_suite(make_args)))
        if a.serial and make_args != "-q":
            steps.append(("suite_serial", lambda: bench_suite("-q")))
    if not steps:
        ap.error("nothing to measure: give --repro, --suite and/or --bootstrap")
    for key, fn in steps:
        print(f"{key} ...", flush=True)
        rec = {**fn(), "date": prov["date"], "cpu": prov["cpu"], "cpu_count": prov["cpu_count"]}
        doc["runs"][key] = rec
        print(f"{key}: {rec['wall_s']:.1f} s (exit {rec['returncode']}), load {rec['loadavg_before']} -> "
              f"{rec['loadavg_after']}", flush=True)
        write_json_atomic(a.out, doc)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
