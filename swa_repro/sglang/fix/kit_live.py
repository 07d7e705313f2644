"""scripts/gpu_kit.sh's returned files -> a summary to commit beside them (#40's GPU record of the kit).

A call of gpu_kit.sh returns ``gpu.txt`` (date, GPU, driver, torch, code digest, the FA3 line, seconds per
step), ``kit-flashinfer.log``, ``kit-triton.log``, ``regress.log`` and ``jit-warm.json``. Each log holds one
section per site, headed ``== <run> <site> on <path> (expected to PASS|FAIL)`` and ended ``== <run> <site>:
<PASS|FAIL|ERROR ...>, as expected|NOT as expected``; between them unittest's ``-v`` report, read as
``upstream_live.regress_results`` reads it (its names and ``FAIL:`` / ``ERROR:`` heads, not the ``ok``
after a name). ``python -m swa_repro.sglang.fix.kit_live CALL_DIR`` prints the summary JSON and the
README rows (the recordings/sglang-live/fix-0.5.23/README.md way: one row per call, one per run); with
``--out FILE`` it writes the JSON (a new file; ``--force`` replaces it). Nothing is judged here that the
call did not judge: the verdicts are the script's, the counts unittest's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from swa_repro.sglang.fix.upstream_live import _BAD, _RAN, _TEST

LOGS = ("kit-flashinfer.log", "kit-triton.log", "regress.log")
_HEAD = re.compile(r"^== (kit-\w+|regress) (\w+) on (\S+) \(expected to (PASS|FAIL)\)")
_END = re.compile(r"^== (kit-\w+|regress) (\w+): (PASS|FAIL|ERROR[^,]*|\(dry run[^)]*\)), (as expected|NOT as "
                  r"expected|)[, ]*(?:after (\d+)s)?")
_GPU = {"date": r"^date -u: (.+)$", "driver": r"^driver: (.+)$", "torch": r"^torch: (.+)$",
        "code_digest": r"^code digest: (\S+)", "fa3": r"^fa3: (skipped: .+)$", "steps": r"^steps: ([^;]+);"}


def sections(log: str) -> dict:
    """``{(run, site): {"path", "want", "got", "as_expected", "ran", "status", "cases"}}``; a section
    without its end line (the call ran out of time) has ``got`` None."""
    out, cur = {}, None
    for line in log.splitlines():
        if m := _HEAD.match(line):
            cur = out.setdefault((m.group(1), m.group(2)), {
                "path": m.group(3), "want": m.group(4), "got": None, "as_expected": None, "seconds_at_end": None,
                "ran": None, "status": {}, "cases": {}})
        elif cur is None:
            continue
        elif m := _END.match(line):
            cur.update(got=m.group(3), as_expected=m.group(4) == "as expected",
                       seconds_at_end=int(m.group(5)) if m.group(5) else None)
            cur = None
        elif m := _BAD.match(line):
            cur["status"][m.group(2)] = m.group(1).lower()
            if m.group(3):
                cur["cases"].setdefault(m.group(2), []).append(m.group(3) + (f" topk={m.group(4)}" if m.group(4)
                                                                            else ""))
        elif m := _RAN.match(line):
            cur["ran"] = (cur["ran"] or 0) + int(m.group(1))
        elif m := _TEST.search(line):
            cur["status"].setdefault(m.group(1), "pass")
    return out


def machine(gpu_txt: str) -> dict:
    """gpu.txt's head: date, GPU (nvidia-smi -L's first GPU line), driver, torch, digest, FA3's line."""
    out = {k: (m.group(1).strip() if (m := re.search(p, gpu_txt, re.MULTILINE)) else None) for k, p in _GPU.items()}
    gpu = re.search(r"^GPU 0: (.+?) \(UUID", gpu_txt, re.MULTILINE)
    out["gpu"] = gpu.group(1) if gpu else None
    steps = gpu_txt.split("seconds per step", 1)[1].split("commands,", 1)[0] if "seconds per step" in gpu_txt else ""
    out["seconds"] = {r[0]: int(r[3]) for r in (ln.split("\t") for ln in steps.splitlines()) if len(r) == 5}
    return out


def summarize(call: Path) -> dict:
    """The call folder's files -> one summary (missing files are said missing, not guessed)."""
    gpu = call / "gpu.txt"
    doc = {"call": call.name, "machine": machine(gpu.read_text()) if gpu.is_file() else None, "runs": [],
           "missing": [f for f in ("gpu.txt", *LOGS) if not (call / f).is_file()]}
    for f in LOGS:
        if (call / f).is_file():
            for (run, site), s in sections((call / f).read_text()).items():
                bad = sorted(t for t, v in s["status"].items() if v != "pass")
                doc["runs"].append({"run": run, "site": site, "file": f, **s, "failed_tests": bad})
    jit = call / "jit-warm.json"
    doc["jit"] = json.loads(jit.read_text() or "null") if jit.is_file() else None
    doc["all_as_expected"] = bool(doc["runs"]) and all(r["as_expected"] for r in doc["runs"])
    return doc


def _cell(r: dict) -> str:
    if r["got"] is None:
        return "**no verdict** (the section has no end: stopped)"
    n = len(r["status"])
    cases = sorted({c for cs in r["cases"].values() for c in cs})
    tail = f"; failing cases: {', '.join(cases)}" if cases else ""
    return (f"**{r['got']}** ({'as' if r['as_expected'] else 'NOT as'} expected: {r['want']}), "
            f"{n - len(r['failed_tests'])}/{n} tests pass{tail}")


def readme_rows(doc: dict, command: str) -> list[str]:
    """The call's row for the README's calls table, then a table of its runs."""
    m = doc["machine"] or {}
    head = (f"| `{doc['call']}/` | {command} | {m.get('gpu') or 'GPU ?'}, driver {m.get('driver')}, torch "
            f"{m.get('torch')}, code digest `{m.get('code_digest')}`; steps {m.get('steps')}; "
            f"{'every run as expected' if doc['all_as_expected'] else '**not every run as expected**'}"
            f"{'; missing: ' + ', '.join(doc['missing']) if doc['missing'] else ''}; {m.get('fa3') or ''} |")
    rows = ["| run | site | verdict |", "|---|---|---|"]
    rows += [f"| {r['run']} | {r['site']} (`{r['path']}`) | {_cell(r)} |" for r in doc["runs"]]
    return [head, "", *rows]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m swa_repro.sglang.fix.kit_live", description=__doc__.splitlines()[0])
    p.add_argument("call", type=Path, help="the folder holding one gpu_kit.sh call's returned files")
    p.add_argument("--command", default="`bash scripts/gpu_kit.sh`", help="the command line, for the README row")
    p.add_argument("--out", type=Path, help="write the summary JSON here (a new file)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    a = p.parse_args(argv)
    if not a.call.is_dir() or not any((a.call / f).is_file() for f in ("gpu.txt", *LOGS)):
        print(f"error: {a.call}: no gpu_kit.sh files there (gpu.txt, {', '.join(LOGS)}); give the call's folder",
              file=sys.stderr)
        return 2
    doc = summarize(a.call)
    text = json.dumps(doc, indent=1) + "\n"
    if a.out:
        from swa_repro.core.errors import UsageError
        from swa_repro.core.outputs import new_file, write_atomic

        try:
            write_atomic(new_file(a.out, "--out", force=a.force), text.encode())
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    print("\n".join(readme_rows(doc, a.command)))
    return 0 if doc["all_as_expected"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
