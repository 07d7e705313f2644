"""The JIT cost of the live fuzz, read from what `scripts/gpu_fuzz.sh` committed.

Sources (all written on the GPU by the project's own commands): the prebuild logs'
``JIT: N modules in W s wall, C s CPU: {uri: s}`` line (``swa-repro fuzz --prebuild-only``), the
scripts' own logs (``== gpu_fuzz STAMP: ... (budget ..., JIT_JOBS ..., FLASHINFER_CUDA_ARCH_LIST ...)``
and ``== done after Ns``), and each recording's ``jit_prebuild.library_bytes``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "recordings" / "fuzz" / "logs"
JIT_LINE = re.compile(r"^JIT: (\d+) modules in ([\d.]+) s wall, ([\d.]+) s CPU", re.M)
PREBUILD = re.compile(r"prebuild-(?P<version>.+)-(?P<stamp>\d{8}T\d{6}Z)\.log$")
HEADER = re.compile(r"^== gpu_fuzz (\S+): (.*) \(budget (\d+)s, JIT_JOBS (\d+), FLASHINFER_CUDA_ARCH_LIST (\S+)\)", re.M)
DONE = re.compile(r"^== done after (\d+)s", re.M)


def prebuilds(logs=LOGS) -> list[dict]:
    """One row per prebuild log that reached its JIT line (a build cut off by a call's budget has none)."""
    rows = []
    for p in sorted(Path(logs).glob("prebuild-*.log")):
        m, j = PREBUILD.search(p.name), JIT_LINE.search(p.read_text())
        if m and j:
            rows.append({"version": m["version"], "stamp": m["stamp"], "modules": int(j[1]),
                         "wall_s": float(j[2]), "cpu_s": float(j[3])})
    return rows


def calls(logs=LOGS) -> list[dict]:
    """One row per `gpu_fuzz.sh` run: its versions, settings and how long it ran."""
    out = []
    for p in sorted(Path(logs).glob("gpu_fuzz-*.log")):
        text = p.read_text()
        h, d = HEADER.search(text), DONE.search(text)
        if h:
            out.append({"stamp": h[1], "versions": h[2].split(), "budget_s": int(h[3]), "jit_jobs": int(h[4]),
                        "arch_list": h[5], "seconds": int(d[1]) if d else None})
    return out


def library_mib(fuzz_root=LOGS.parent) -> dict:
    """``{version: (libraries found, MiB)}`` of the built modules' shared libraries, as each
    recording's ``jit_library_bytes`` found them when it was made."""
    from swa_repro.evidence.fuzz_store import find_runs

    out = {}
    for d in sorted(Path(fuzz_root).glob("[0-9]*")):
        for p in find_runs(d):
            sizes = json.loads(p.read_text()).get("jit_prebuild", {}).get("library_bytes") or {}
            if sizes:
                out[d.name] = (len(sizes), sum(sizes.values()) / 2**20)
    return out


def render_jit(logs=LOGS) -> list[str]:
    lines = ["## GPU: JIT cost of the live fuzz (`scripts/gpu_fuzz.sh`)", ""]
    builds, runs, libs = prebuilds(logs), calls(logs), library_mib(Path(logs).parent)
    if not runs:
        return lines + ["Not measured yet: run `bash scripts/gpu_fuzz.sh VERSION[:CASES...]` on the H200.", ""]
    lines += ["Each call builds one version's modules at once (`fuzz --prebuild-only --jit-workers 64 --jit-jobs "
              "JIT_JOBS`: ninja's `MAX_JOBS` = JIT_JOBS / modules), for the GPU's own arch, and starts the next "
              "version's build as soon as this one's ends, niced, beside this version's fuzz. A build the budget "
              "cuts off is left running in its own session, so a back-to-back call on the warm machine finds it "
              "done or waits on its locks. `FLASHINFER_CUDA_ARCH_LIST` is set to the device's arch, which is "
              "also flashinfer's default (compilation_context.py:59-75 in 0.6.7.post2, :90-106 in 0.6.18): "
              "it documents the build and saves nothing on a one-GPU machine.", "",
              "| call | versions | budget s | JIT_JOBS | arch | ran s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['stamp']} | {' '.join(r['versions'])} | {r['budget_s']} | {r['jit_jobs']} | {r['arch_list']} | "
              f"{r['seconds'] if r['seconds'] is not None else '–'} |" for r in runs]
    total = sum(r["seconds"] or 0 for r in runs)
    lines += ["", f"The calls ran {total} s in all (device time also counts each machine start and transfer).", "",
              "| version | call | modules | wall s | CPU s | cores busy | s per module | libraries (.so) |",
              "|---|---|---|---|---|---|---|---|"]
    from swa_repro.core.versions import version_key

    for b in sorted(builds, key=lambda b: (version_key(b["version"]), b["stamp"])):
        lib = libs.get(b["version"])
        cold = b["cpu_s"] >= 1
        busy = f"{b['cpu_s'] / b['wall_s']:.1f}" if cold and b["wall_s"] else "–"
        per = f"{b['wall_s'] / b['modules']:.0f}" if cold else "–"
        note = "" if cold else " (waited on a build begun in the previous call)"
        lines.append(f"| {b['version']} | {b['stamp']} | {b['modules']} | {b['wall_s']:.1f}{note} | {b['cpu_s']:.0f} | "
                     f"{busy} | {per} | {f'{lib[0]} found, {lib[1]:.1f} MiB' if lib else '–'} |")
    lines += ["", "Before (as issue #16 reports them, same H200, not re-measured here): `MAX_JOBS` 6 for each of 4 "
              "parallel builds; 0.7.2 fa2 at 3 head dims, 6 modules: JIT 92 s; 0.6.14 fa2+fa3 at hd128, 4 modules: "
              "JIT 237 s; 0.6.14 and 0.7.2 in one 300 s call: fa3 still building at 248 s, nothing fuzzed. "
              "Carrying built modules between calls was not needed: a warm machine keeps them, and one version's "
              "libraries (above) would take most of a call's 64 MiB.", ""]
    return lines
