"""``swa-repro run``'s ``summary.json``: what a reader of the output folder trusts, so it never says
"ok" for a set the run is still replacing or left half done.

Before the first notebook starts, the summary says ``"status": "running"`` and ``"ok": false`` (a
run killed outright leaves that); at the end it says ``"done"``; Ctrl-C (KeyboardInterrupt, also
with ``--jobs 2``, whose kernels are stopped) writes ``"interrupted"`` with every notebook not
finished listed as failed, and the run ends with one line and exit status 130. Every write is
``core.outputs.write_atomic``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from swa_repro.core.outputs import write_atomic

NAME = "summary.json"
INTERRUPTED = 130  # the shell's status for SIGINT


def earlier(out: Path) -> list[dict]:
    """The notebooks' entries of the run before this one in ``out`` (its ``notebooks``, and what a
    ``running`` or ``interrupted`` summary kept of the run before it under ``earlier``), read before
    this run's ``running`` summary replaces them: ``artifacts.reusable`` reuses a set from them only
    if its files are still whole and its own."""
    try:
        last = json.loads((out / NAME).read_text())
        return [r for r in last["notebooks"] + last.get("earlier", []) if isinstance(r, dict)]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def write(out: Path, head: dict, results: list, names: list[str], status: str) -> dict:
    """The summary of ``names`` with the ``results`` finished so far; unless the run is ``done``, it is
    not ok, and every notebook without a result counts as failed."""
    have = {r["notebook"] for r in results}
    failed = [r["notebook"] for r in results if r["status"] != "ok"] + \
        [n for n in names if n not in have and status != "done"]
    summary = {**head, "status": status, "ok": status == "done" and not failed, "failed": failed,
               "notebooks": results}
    write_atomic(out / NAME, (json.dumps(summary, indent=1) + "\n").encode())
    return summary


def progress(r: dict) -> str:
    """One notebook's result as the run prints it when the notebook ends."""
    checks = ("no checks" if r["checks_passed"] is None
              else f"checks {r['checks_passed']} ok {r['checks_failed']} failed")
    line = f"{r['status']:<6} mode={r['mode'] or '?'}  {checks}  {r['seconds']:.1f}s"
    line += "  (reused: notebook, parameters, code and data unchanged)" if r.get("reused") else ""
    return line + (f"\n      error: {r['error'].splitlines()[0][:300]}" if r["error"] else "")


def longest_first(paths: list[Path], out: Path) -> list[int]:
    """Indices of ``paths`` to start in: longest first by the seconds of the last run into ``out``
    (its summary.json), so the slowest notebook does not start last; unknown ones keep their place
    after the known. Only the start order changes, never the results' order."""
    try:
        last = {r["notebook"]: float(r["seconds"]) for r in json.loads((out / NAME).read_text())["notebooks"]}
    except (OSError, ValueError, KeyError, TypeError):
        last = {}
    return sorted(range(len(paths)), key=lambda i: (paths[i].stem not in last, -last.get(paths[i].stem, 0.0), i))


def interrupted(out: Path, head: dict, results: list, names: list[str]) -> int:
    """Ctrl-C: the set marked interrupted, one line, exit 130."""
    write(out, head, results, names, "interrupted")
    print(f"swa-repro run: interrupted: {out / NAME} marks the run interrupted ({len(results)}/{len(names)} "
          "notebooks finished); run it again", file=sys.stderr)
    return INTERRUPTED


def stop_kernels() -> None:
    """Ctrl-C with ``--jobs 2``: the worker threads wait on their kernels, so the kernels (this
    process's children) are ended, by pid, and each thread's notebook fails at once instead of
    running on (the terminal's SIGINT only interrupts a kernel's cell; the next cell then ran)."""
    try:
        import psutil  # ipykernel's own dependency
    except ImportError:
        return
    kids = psutil.Process().children(recursive=True)
    for k in kids:
        try:
            k.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(kids, timeout=5)
    for k in alive:
        try:
            k.kill()
        except psutil.Error:
            pass
