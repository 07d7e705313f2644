"""The H200 part of ``docs/upstream/README.md``: the recorded live audits before and after the
fixes, the regression test's log on each site and sglang's kit, read from
``recordings/sglang-live/fix-0.5.23/`` (``scripts/gpu_fix.sh``'s files), and whether that recording
is of today's ``all.diff``.
"""

from __future__ import annotations

import functools
import json
import lzma
import re
from pathlib import Path

from swa_repro.sglang.fix import ALL, apply_fixes
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.fix.upstream_diff import LIVE, ROOT, TEST, VERSION, plus_side

def load_live(path: Path) -> dict | None:
    return json.loads(lzma.decompress(path.read_bytes())) if path.is_file() else None


_SITE = re.compile(r"^== regress (shipped|fixed) on ")
_TEST = re.compile(r"\b(test_\w+) \(__main__\.")
_BAD = re.compile(r"^(FAIL|ERROR): (test_\w+) \([^)]*\)(?: \(case='([^']*)'(?:.*\btopk=(\d+))?)?")
_RAN = re.compile(r"^Ran (\d+) tests? in ")


def regress_results(log: str) -> dict:
    """``scripts/gpu_fix.sh``'s regress.log -> ``{site: {"ran": N, "status": {test: pass|fail|error},
    "cases": {test: [subtest case that failed]}}}``. Read off unittest's own report (``-v`` names
    every test; its summary heads each failure with ``FAIL:`` / ``ERROR:``, a subtest's with its
    ``case=``), not off the ``ok`` after a name: log lines of the run can come between. A site runs
    more than one test file (the registered test, then sglang's kit cases): ``ran`` is their sum."""
    out, cur = {}, None
    for line in log.splitlines():
        if m := _SITE.match(line):
            cur = out.setdefault(m.group(1), {"ran": None, "status": {}, "cases": {}})
        elif cur is None:
            continue
        elif m := _BAD.match(line):
            cur["status"][m.group(2)] = m.group(1).lower()
            if m.group(3):  # a subtest: its case, and the draft tree's topk where the case has one
                case = m.group(3) + (f" topk={m.group(4)}" if m.group(4) else "")
                cur["cases"].setdefault(m.group(2), []).append(case)
        elif m := _RAN.match(line):
            cur["ran"] = (cur["ran"] or 0) + int(m.group(1))
        elif m := _TEST.search(line):
            cur["status"].setdefault(m.group(1), "pass")
    return out


def regress_lines(log: str | None, kit: dict | None, stale: bool = False) -> list[str]:
    """The regression test on each site and sglang's own kit on the fixed file, as recorded;
    ``stale``: recorded with earlier fixes (:func:`stale_live`), when the test was the former
    hand-written ``test_flashinfer_plan_time_params.py``, not today's file in sglang's layout."""
    out = []
    if log is not None:
        res = regress_results(log)
        which = (f"The regression test as recorded with the fixes of then (the former hand-written "
                 f"`{Path(TEST).name}`, before it moved to `{TEST}` on the kit)") if stale else f"`{TEST}`"
        then = "" if stale else (", then sglang's own FlashInfer kit tests re-expressed "
                                 "(`tests/sglang_kit_flashinfer_cases.py`), each site's kit edited")
        out += ["", f"{which}{then}, on CUDA (regress.log), per test: **fail** / **error** (the failing "
                "subtest cases) / pass.", "",
                "| test | as shipped | with all.diff |", "|---|---|---|"]

        def cell(site, t):
            r = res.get(site, {})
            st, failed = r.get("status", {}).get(t, "-"), r.get("cases", {}).get(t)
            return f"**{st}** ({', '.join(failed)})" if failed else (f"**{st}**" if st in ("fail", "error") else st)

        tests = sorted({t for r in res.values() for t in r["status"]})
        out += [f"| {t} | {cell('shipped', t)} | {cell('fixed', t)} |" for t in tests]
        for site, r in sorted(res.items()):
            bad = sum(v != "pass" for v in r["status"].values())
            out.append(f"\n{site}: {r['ran']} ran, {bad} failed or errored.")
    if kit is not None:
        n = {s: sum(r["status"] == s for r in kit["results"]) for s in ("passed", "failed", "skipped", "error")}
        out += ["", f"sglang's own attention kit (`swa-repro sglang-check --mode live --kit-only`, kit-after.json) "
                f"on the fixed file: {n['passed']} passed, {n['failed']} failed, {n['error']} errors, "
                f"{n['skipped']} skipped ({kit['mode']})."]
    return out


def live_lines(before: dict | None, after: dict | None) -> list[str]:
    """Per path x layer, the real kernel's wrong rows and max error before and after the fixes."""
    if before is None:
        return [f"Not yet run. On an H200 with sglang {VERSION} and its flashinfer pin installed, record "
                f"`swa-repro audit --mode live --json` as shipped and after applying `all.diff` (`swa-repro patch "
                f"apply --fix all --in-place`), as {LIVE.relative_to(ROOT)}/audit-live-before.json.xz and "
                "audit-live-after.json.xz (`bash scripts/gpu_fix.sh` does all of it), then regenerate this file. "
                f"The regression test ({TEST}) is run there as well."]
    from swa_repro.sglang.audit.core import key_table

    def rows(doc):
        return {(t["path"], t["layer"]): t for t in key_table(doc["runs"][0])}

    def fmt(t):
        if t is None or t["live_rows"] is None:
            return "not run" if t and t["live_errors"] else "-"
        err = "-" if t["max_err"] is None else f"{t['max_err']:.3g}"
        return f"{t['live_wrong_rows']}/{t['live_rows']} wrong, max err {err}"

    b, a = rows(before), rows(after) if after is not None else {}
    rel = before["runs"][0]["release"]
    dev = before['runs'][0].get('device', 'cuda')
    why = before.get("mode_why") or ""  # "CUDA device NVIDIA H200 and flashinfer 0.7.2 are usable: ..."
    if why.startswith("CUDA device ") and " and " in why:
        dev = why.removeprefix("CUDA device ").split(" and ")[0]  # the card, not just "cuda"
    out = [f"Recorded on {dev} (sglang {rel['sglang']}; "
           f"{LIVE.relative_to(ROOT)}/README.md has the machine and the command); rows: the real kernel's "
           "output rows off the float64 reference over the keys the layer intends, with its cap.", ""]
    if after is None:
        out += [f"**After the fixes: not recorded yet.** No `audit-live-after.json.xz` in {LIVE.relative_to(ROOT)}: "
                "the CPU audit above is the only verdict on the fixed file so far. Record it with "
                "`bash scripts/gpu_fix.sh install,patch,after,regress` on an H200, then regenerate this file.", ""]
    out += ["| path | layer | as shipped | with all.diff |", "|---|---|---|---|"]
    out += [f"| {p} | {ly} | {fmt(b.get((p, ly)))} | {fmt(a.get((p, ly))) if after is not None else 'not recorded'} |"
            for p, ly in sorted({*b, *a})]
    return out


@functools.lru_cache(maxsize=4)
def _recorded_fixes(text: str, live_diff: str) -> tuple | None:
    """The fix set whose file the recorded ``fix.diff`` makes of ``text``: ``ORDER`` (``all.diff``),
    ``ALL`` (``patch --fix all``: ``all.diff`` plus the family fixes that edit the same file, which
    gpu_fix.sh's patch step applies) or None (neither: made by earlier fixes). Computed once for
    :func:`stale_live` and :func:`live_fix_set` both."""
    try:
        got = plus_side(text, live_diff)
        return next((names for names in (ORDER, ALL) if got == apply_fixes(text, names)), None)
    except (ValueError, IndexError):
        return None


def stale_live(text: str, live_diff: str | None) -> str | None:
    """Why the recorded H200 run of the fixed file is not a run of today's ``all.diff`` (None: it
    is, or there is no recorded diff): the file its ``fix.diff`` makes is neither ``all.diff``'s nor
    what ``patch --fix all`` makes of the backend (:func:`_recorded_fixes`)."""
    if live_diff is None or _recorded_fixes(text, live_diff) is not None:
        return None
    return (f"**The with-all.diff column predates today's `all.diff`:** the file it ran ({LIVE.relative_to(ROOT)}/fix.diff) "
            "is not the one `all.diff` makes now, so it says nothing about the fixes changed since. Re-record with "
            "`bash scripts/gpu_fix.sh` on an H200, then regenerate this file.")


def live_fix_set(text: str, live_diff: str | None) -> str | None:
    """Which edits the recorded fixed file carries, where it is more than ``all.diff``: the GPU's
    patch step runs ``patch apply --fix all``, which also applies the family fixes that edit the
    backend (their branches may be for another GPU class than the one it ran on)."""
    if live_diff is None or _recorded_fixes(text, live_diff) != ALL:  # ORDER first: ALL here makes more than it
        return None
    from swa_repro.sglang.fix import states

    extra = [n for n, st in states(text, ALL).items() if n not in ORDER and st.state == "needed"]
    return (f"The fixed site ran `swa-repro patch apply --fix all --in-place` ({LIVE.relative_to(ROOT)}/fix.diff): "
            f"`all.diff`'s edits and, in the same file, {', '.join(f'`{n}`' for n in extra)} "
            "(the family fixes' backend side; see families.md for where each branch is taken).")
