"""What each step of `scripts/gpu_fix.sh` cost on the H200, cold and warm, read from what it committed.

Source (written on the GPU by the script itself): each call's ``gpu.txt`` under
``recordings/sglang-live/fix-<release>/call-*/``: its steps, ``jit cache at start: N built libraries``
(0: a cold call, nothing built yet) and the ``seconds per step`` rows (name, start, end, seconds, exit
status; seconds from the script's start). Steps run side by side, so a row's seconds include waiting on
a module another step was building.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX_ROOT = ROOT / "recordings" / "sglang-live"
STEPS = re.compile(r"^steps: ([\w,]+);", re.M)
JIT = re.compile(r"^jit cache at start: (\d+) built libraries", re.M)
ROWS = "seconds per step"
JIT_DONE = re.compile(r"^== jit: exit status \d+: (\{.*\})$", re.M)


def helper_seconds(call_dir: Path) -> float | None:
    """The helper builds' own seconds (``jit_warm``'s JSON in the call's log): their steps.tsv row ends
    when the script collected them, at its end."""
    for log in Path(call_dir).glob("gpu_fix-*.log"):
        if m := JIT_DONE.search(log.read_text()):
            vals = [v for v in json.loads(m[1]).values() if isinstance(v, (int, float))]
            return max(vals) if vals else None
    return None


def calls(root=FIX_ROOT, pattern: str = "fix-*/call-*/gpu.txt") -> list[dict]:
    """One dict per call that recorded its steps' seconds, in the order of its folder name."""
    out = []
    for g in sorted(Path(root).glob(pattern)):
        text = g.read_text()
        if ROWS not in text:
            continue
        rows = [ln.split("\t") for ln in text.split(ROWS, 1)[1].splitlines()[1:] if ln.count("\t") == 4]
        steps, jit = STEPS.search(text), JIT.search(text)
        out.append({"call": f"{g.parent.parent.name}/{g.parent.name}", "steps": steps[1] if steps else "?",
                    "helpers_s": helper_seconds(g.parent),
                    "jit_at_start": int(jit[1]) if jit else None,
                    "rows": [{"step": r[0], "start": int(r[1]), "end": int(r[2]), "seconds": int(r[3]),
                              "rc": int(r[4])} for r in rows]})
    return out


def render_fix(root=FIX_ROOT) -> list[str]:
    lines = ["## GPU: `scripts/gpu_fix.sh` per step, cold and warm", ""]
    cs = calls(root)
    if not cs:
        return lines + ["Not measured yet: run `bash scripts/gpu_fix.sh install,patch,after,regress` on the H200.", ""]
    lines += ["Cold: the call found no built FlashInfer module (`jit cache at start` 0); warm: the same machine "
              "right after, its modules kept. Seconds from the script's start; steps in one call run side by "
              "side (the regression test and the helper builds beside the audit), so a step's seconds include "
              "waiting on a module another step was building. A kit call's fp16 modules are not among the libraries a "
              "bf16 call left, so its kit builds cold. Limit per call: 600 s.", "",
              "| call | steps | JIT cache | step | start s | end s | seconds | exit |", "|---|---|---|---|---|---|---|---|"]
    for c in cs:
        cache = "?" if c["jit_at_start"] is None else ("cold" if c["jit_at_start"] == 0 else f"warm ({c['jit_at_start']} libs)")
        for i, r in enumerate(sorted(c["rows"], key=lambda r: (r["start"], r["step"]))):
            head = f"| {c['call']} | {c['steps']} | {cache} |" if i == 0 else "| | | |"
            secs = r["seconds"]
            if r["step"] == "jit_helpers" and c["helpers_s"] is not None:
                secs = f"{c['helpers_s']:g} (built; collected at the end)"
            lines.append(f"{head} {r['step']} | {r['start']} | {r['end']} | {secs} | {r['rc']} |")
    lines += ["", "Before this change (as issue #23 measured it on a cold H200 at a470123): `install,patch,after` "
              "573 s, the regression test after it 126 s per site spent in JIT and stopped; run again warm, "
              "206 s shipped + 173 s fixed.", ""]
    return lines


FAMILY_ROOT = ROOT / "recordings" / "family-live"


def render_family_live(root=FAMILY_ROOT) -> list[str]:
    """``scripts/gpu_family.sh`` per call: its steps' seconds and, per site, the live phase (the JIT
    warm-up, then executing and judging every driven call) from the family child's own JSON."""
    from swa_repro.sglang.audit import family_evidence as fe

    cs = calls(root, "*/call-*/gpu.txt")
    lines = ["## GPU: `scripts/gpu_family.sh` (issue #25), per call", ""]
    if not cs:
        return lines + ["Not measured yet: run `OUT=$OUT bash scripts/gpu_family.sh` on the GPU.", ""]
    lines += [("Both sites run at once (their JIT builds share one cache), so each waits on the other's builds. "
               "Live: seconds of the child's live phase, of which the warm-up (the JIT wave); judged: runs whose "
               "calls all ran before the live budget's end. Limit per call: 600 s."), "",
              "| call | steps | seconds per step | shipped: live (warm-up) / judged | fixed: live (warm-up) / judged |",
              "|---|---|---|---|---|"]
    for c in cs:
        folder = Path(root) / c["call"]
        steps = ", ".join(f"{r['step']} {r['seconds']}" for r in sorted(c["rows"], key=lambda r: (r["start"], r["step"])))
        site = []
        for s in fe.SITES:
            doc = fe.load(folder, s)
            lv, rs = doc.get("live") or {}, fe.runs(doc)
            warm = [v for v in (lv.get("warmup") or {}).values() if isinstance(v, (int, float))]
            site.append(f"{lv.get('seconds')} ({max(warm) if warm else 0:g}) / {sum(r.judged for r in rs)} of {len(rs)}")
        lines.append(f"| {c['call']} | {c['steps']} | {steps} | {site[0]} | {site[1]} |")
    return lines + [""]
