"""Issues #25's and #27's performance targets for the per-family audits, timed with the real CLI on this machine.

    python -m benchmarks.family_audit [--release 0.5.23] [--vllm 0.34.0] [--table-out DIR] [--nice 19]

Each timing is a fresh ``swa-repro`` process computing every cell (the one-release run with the
result cache off, ``SWA_REPRO_NO_CACHE=1``; the table with it on and cold for this code, since a
cell's key holds the code's hash: the cells it wrote are counted, and later tests read them); the
overlays and the release's bytecode are the cache's, as on any second run. The load average before
and after (1, 5, 15 min) is recorded: another job on the machine makes the numbers pessimistic,
never optimistic.

The CPU seconds of every process (user + sys) are recorded beside the wall time: on a loaded machine
they say what the run itself costs. Every process: this one is the children's subreaper (Linux
``PR_SET_CHILD_SUBREAPER``) and reaps what the CLI's tree leaves behind (a fork server the CLI did not
wait for, a fork of it), so their CPU is counted too; before, such orphans went to init and their
seconds were lost (``/usr/bin/time`` of 0.5.23's row: 30 CPU-s, a fifth of what its tree used).
With the result cache off nothing of the audit is reused: the release's config classes, the column
plan (``arch_cells.plan``), every cell and the ServerArgs facts are computed; only the overlays and the
release's bytecode (``pycache/``) come from the cache.

* ``one_release``: ``swa-repro audit --sglang X --model all --gpu sm90`` (every family of one release
  at its real window, 4096 for most), target 60 s on 2 cores;
* ``release_row``: ``swa-repro audit --release-table --model all --gpu sm90,sm100,sm80 --releases X`` with
  the result cache off: one release's row of the family table as the full table computes it (the 8
  families and every other sliding-window architecture the release serves, 3 GPU classes: the release's
  config classes, the family child and the ServerArgs child beside it, forked from one fork server the
  command's threads share, which preloads what earlier ones learned, ``engine.forkserver``), target 60 s on
  2 cores (issue #41: "one release <= 60 s"). For 0.5.23 (``family_fix.FIXED_RELEASE``) the command
  also builds the table's companion (every family with ``--fix all``: one more child), so its time is
  the row and the companion together;
* ``full_table``: ``swa-repro audit --release-table --model all --gpu sm90,sm100,sm80 --releases
  <every supported release> --jobs 2`` (one child per release for all families and GPU classes),
  target 600 s on 2 cores. With ``--table-out docs/audit`` the timed run is also the regeneration;
* ``vllm_one_release``: ``swa-repro audit --vllm X --model all --gpu sm90,sm100,sm80`` (issue #27: one
  vLLM release, every family and GPU class, every path and serving option), target 60 s on 2 cores.

Writes ``benchmarks/results/family_audit.json``; ``python -m benchmarks.report`` renders it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.targets_report import _cpu  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "family_audit.json"
# every release the audit supports (docs/audit/releases.md's rows)
RELEASES = ("0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14",
            "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
GPUS = "sm90,sm100,sm80"
# (step, what, limit in seconds)
TARGETS = [("one_release", "one release's family audit, every family at its real window (4096 for most), "
                           "`--model all --gpu sm90`", 60.0),
           ("release_row", ("one release's row of the family table (issue #41): the 8 families and every other "
                            "sliding-window architecture x 3 GPU classes, `--release-table --releases 0.5.23` (with the "
                            "companion table of 0.5.23 --fix all)"), 60.0),
           ("full_table", "the whole family table: every family x 18 releases x 3 GPU classes, `--jobs 2`", 600.0),
           ("vllm_one_release", "one vLLM release's audit (issue #27): every family x 3 GPU classes, every path "
                                "and serving option, `--vllm 0.34.0 --model all --gpu sm90,sm100,sm80`", 60.0)]


def _cells() -> set:
    from swa_repro.core.cache import cache_root

    return set((cache_root() / "results" / "family-cell").glob("*.json"))


def subreaper() -> bool:
    """This process adopts its descendants' orphans (Linux), so :func:`timed` can reap and count them."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_orphans() -> None:
    """Wait for every adopted orphan (the run's own child is already reaped): their CPU joins RUSAGE_CHILDREN."""
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


def timed(argv: list[str], nice: int, no_cache: bool = True) -> dict:
    """One CLI run: wall seconds, exit status, CPU seconds, load average around it. ``no_cache``:
    the result cache off; else on, and the cells it wrote are counted (a cold run writes every one)."""
    env = {k: v for k, v in os.environ.items() if k != "SWA_REPRO_NO_CACHE"}
    if no_cache:
        env["SWA_REPRO_NO_CACHE"] = "1"
    cells = _cells()
    cmd = (["nice", "-n", str(nice)] if nice else []) + [sys.executable, "-m", "swa_repro.cli", *argv]
    before, t0, r0 = os.getloadavg(), time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    reap_orphans()
    wall, r1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    tail = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()][-3:]
    return {"command": "swa-repro " + " ".join(argv), "nice": nice, "wall_s": round(wall, 1), "returncode": p.returncode,
            "cpu_s": round(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, 1),
            "result_cache": "off" if no_cache else f"on: {len(_cells() - cells)} cells computed and written",
            "loadavg_before": [round(x, 2) for x in before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "output_tail": tail}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", default="0.5.23", help="the release of the one-release timing")
    ap.add_argument("--vllm", default="0.34.0", help="the vLLM release of the vLLM timing")
    ap.add_argument("--table-out", type=Path, help="where the full table goes (default: a temporary folder)")
    ap.add_argument("--nice", type=int, default=0, help="run the CLI under nice -n N (pessimistic timings)")
    ap.add_argument("--only", choices=[t[0] for t in TARGETS], help="time one target, keep the other's record")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    subreaper()
    old = json.loads(a.out.read_text()) if a.out.is_file() else {}
    runs = dict(old.get("runs", {}))
    for k in ([a.only] if a.only else [t[0] for t in TARGETS]):  # a re-measured target keeps its earlier runs
        if k in runs:
            runs[f"{k}_earlier"] = [runs[k], *runs.get(f"{k}_earlier", [])][:5]
    if a.only in (None, "one_release"):
        runs["one_release"] = timed(["audit", "--sglang", a.release, "--model", "all", "--gpu", "sm90"], a.nice)
    if a.only in (None, "release_row"):
        with tempfile.TemporaryDirectory() as tmp:
            runs["release_row"] = timed(["audit", "--release-table", "--model", "all", "--gpu", GPUS, "--releases",
                                         a.release, "--out", tmp], a.nice)
    if a.only in (None, "full_table"):
        with tempfile.TemporaryDirectory() as tmp:
            out = a.table_out or Path(tmp)
            runs["full_table"] = timed(["audit", "--release-table", "--model", "all", "--gpu", GPUS, "--releases",
                                        ",".join(RELEASES), "--jobs", "2", "--out", str(out)], a.nice,
                                      no_cache=False)
    if a.only in (None, "vllm_one_release"):
        runs["vllm_one_release"] = timed(["audit", "--vllm", a.vllm, "--model", "all", "--gpu", GPUS], a.nice)
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    now, command = datetime.now(timezone.utc).isoformat(timespec="seconds"), \
        "python -m benchmarks.family_audit " + " ".join(argv or sys.argv[1:])
    for k in ([a.only] if a.only else [t[0] for t in TARGETS]):  # each run says when, at which commit, by what
        runs[k].update(date=now, commit=commit, by=command, cpu=_cpu() or "unknown")
    doc = {"provenance": {"date": now, "commit": commit, "cpu": _cpu() or "unknown", "cpu_count": os.cpu_count(),
                          "python": platform.python_version(), "command": command},
           "runs": runs}
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    for k, r in runs.items():
        if k.endswith("_earlier"):  # the earlier runs of a target: a list, rendered by REPORT.md
            continue
        print(f"{k}: {r['wall_s']} s (exit {r['returncode']}; load {r['loadavg_before']} -> {r['loadavg_after']})")
    return 0


def render(doc: dict | None) -> list[str]:
    """REPORT.md's issue #25 section: each target, its limit, the measured seconds, a verdict
    (PASS only for a run that exited 0 on 2 cores within the limit) and the load around it."""
    lines = ["## Issues #25 and #27 targets: the per-family audits (sglang, vLLM)", ""]
    if not doc:
        return lines + ["Not measured yet: run `python -m benchmarks.family_audit`.", ""]
    pv = doc["provenance"]
    lines += [f"`python -m benchmarks.family_audit` on {pv['cpu']} ({pv['cpu_count']} cores; the latest run's "
              "machine, each run's where it recorded one); every cell computed "
              "(overlays and bytecode cached); each run's commit and date in its row.", "",
              "| target | limit | measured | verdict | how |", "|---|---|---|---|---|"]
    for key, what, limit in TARGETS:
        r = doc["runs"].get(key)
        if r is None:
            lines.append(f"| {what} | <= {limit:.0f} s | – | not measured | – |")
            continue
        ok = r["returncode"] in (0, 1)  # 1: the audit ran and says some path was not driven (named in its output)
        verdict = ("PASS" if r["wall_s"] <= limit else "FAIL") if ok and pv["cpu_count"] == 2 else \
            ("not on 2 cores" if ok else f"exit {r['returncode']}")
        lb, la = r["loadavg_before"], r["loadavg_after"]
        lines.append(f"| {what} | <= {limit:.0f} s | {r['wall_s']:.0f} s | {verdict} | `{r['command']}`"
                     f"{' under nice -n ' + str(r['nice']) if r.get('nice') else ''}; exit {r['returncode']}; "
                     f"{r['cpu_s']:.0f} CPU-s (user + sys, every process); result cache {r['result_cache']}; "
                     f"load average {lb[0]:.1f} -> {la[0]:.1f} (1 min, start -> end); "
                     f"{r.get('date', pv['date'])} at {r.get('commit', pv['commit'])} (`{r.get('by', pv['command'])}`)"
                     f"{'; on ' + r['cpu'] if r.get('cpu') else ''} |")
    for key, what, limit in TARGETS:
        for r in doc["runs"].get(f"{key}_earlier", []):
            lines.append(f"| (earlier run) {what} | <= {limit:.0f} s | {r['wall_s']:.0f} s | – | {r['cpu_s']:.0f} CPU-s; "
                         f"load average {r['loadavg_before'][0]:.1f} -> {r['loadavg_after'][0]:.1f}; "
                         f"{r.get('date', '?')} at {r.get('commit', '?')} |")
    return lines + [""]


if __name__ == "__main__":
    sys.exit(main())
