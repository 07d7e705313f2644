"""Checks that each PR series of ``docs/upstream/pr-*`` is bisectable, on a CPU (issue #40, point 6).

For each series, alone, from 0.5.23 as shipped: a hard-linked copy of the release's overlay (every
edited file replaced by a new one, so the cached overlay is never written), the series' committed
patches applied one commit at a time with the project's strict applier (``upstream_diff.plus_side``,
``patch -p1`` without fuzz; a new file is the patch's plus side), and after each commit:

* ``ruff format --check`` (sglang's formatter, default config) on every Python file it touches;
* in a child (``upstream_cpu``: FlashInfer's wrappers replaced by plan-time stand-ins with their
  graph-mode buffer rules) the series' registered test as it stands at that commit and the kit's
  own FlashInfer cases (``tests/sglang_kit_flashinfer_cases.py``: sglang's swa/test_flashinfer.py and
  dense/test_flashinfer.py cases), every case must pass;
* ``before``: the same test and kit with the commit's fix left out (its sglang/srt files at the
  commit before): the test methods the commit adds must fail there, or they test nothing (but
  those checking the kit's own expectation, ``KIT_ONLY``, and those the stand-ins cannot judge,
  ``NOT_ON_CPU``).

``python -m swa_repro.sglang.fix.pr_check [--series a,b] [--out FILE]`` prints one line per commit
and exits 1 when a commit does not hold. Each child run is cached by content (``core.cache``).
Slow (one child per commit and state: minutes): ``make test-matrix`` runs it
(tests/test_upstream_pr_check.py); ``make test`` checks the structure only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from swa_repro.core.outputs import write_atomic
from swa_repro.sglang.fix import pr_tests
from swa_repro.sglang.fix.pr_tests import NOT_ON_CPU
from swa_repro.sglang.fix.upstream_diff import ROOT, VERSION, plus_side

DOCS = ROOT / "docs" / "upstream"
KIT_CASES = ROOT / "tests" / "sglang_kit_flashinfer_cases.py"


def patch_files(patch: str) -> dict[str, tuple[bool, str]]:
    """A ``git format-patch`` file -> ``{repository path: (new file?, its unified diff)}``."""
    body = patch.split("\n---\n", 1)[1].rsplit("\n--\n", 1)[0] + "\n"
    out, cur, new = {}, None, False
    chunk: list[str] = []
    for ln in body.splitlines(keepends=True):
        if ln.startswith(("diff --git ", "new file mode ")):
            new = new or ln.startswith("new file mode ")
            continue
        if ln.startswith("--- "):
            if cur is not None:
                out[cur] = (out[cur][0], "".join(chunk))
            chunk, cur = [ln], None
            continue
        if ln.startswith("+++ b/") and cur is None:
            cur = ln[len("+++ b/"):].rstrip("\n")
            out[cur] = (new, "")
            new = False
        chunk.append(ln)
    if cur is not None:
        out[cur] = (out[cur][0], "".join(chunk))
    return out


def site_path(site: Path, repo_path: str) -> Path:
    """Where a repository path lives in the check's tree: the package in the overlay copy, the
    repository's tests beside it (``repo/``)."""
    if repo_path.startswith("python/sglang/"):
        return site / repo_path.removeprefix("python/")
    return site.parent / "repo" / repo_path


def apply_patch(site: Path, patch: str, keep=lambda path: True) -> list[str]:
    """Apply ``patch``'s files that ``keep`` names; returns their repository paths."""
    done = []
    for path, (new, diff) in patch_files(patch).items():
        if not keep(path):
            continue
        f = site_path(site, path)
        text = plus_side("", diff) if new else plus_side(f.read_text(), diff)
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{f.name}.pr-check")
        tmp.write_text(text)
        os.replace(tmp, f)  # a new inode: the overlay's hard-linked file keeps its text
        done.append(path)
    return done


def copy_overlay(overlay: Path, dst: Path) -> Path:
    shutil.copytree(overlay, dst, copy_function=os.link, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def ruff_bad(texts: dict[str, str]) -> list[str]:
    """The paths whose text ``ruff format --isolated --check`` would rewrite."""
    bad = []
    for path, text in texts.items():
        r = subprocess.run([sys.executable, "-m", "ruff", "format", "--isolated", "--check", "-"], input=text, check=False,
                           capture_output=True, text=True)
        if r.returncode not in (0, 1):
            raise RuntimeError(f"ruff format failed: {r.stderr.strip()[:300]}")
        if r.returncode:
            bad.append(path)
    return bad


def run_tests(site: Path, files: list[Path], work: Path) -> dict:
    """``upstream_cpu`` in a child on ``site`` over ``files``, cached by the content of everything
    it reads that a series changes (the edited package files, the test files) and the code."""
    from swa_repro.core.cache import cached, code_hash, interpreter
    from swa_repro.engine.child import child_env, run_module
    from swa_repro.sglang.fix import kit_edits as ke
    from swa_repro.sglang.provision import content_digest, provision

    def run() -> dict:
        out = work / "result.json"
        rc, _, err = run_module("swa_repro.sglang.fix.upstream_cpu", [str(site), str(out), *map(str, files)],
                                child_env(), work)
        if rc != 0 or not out.is_file():
            raise RuntimeError(f"upstream_cpu failed on {site}: {err[-2000:]}")
        return json.loads(out.read_text())

    sha = lambda b: hashlib.sha256(b).hexdigest()
    from swa_repro.sglang.fix import FIXES

    edited = sorted({f"sglang/{f.file}" for f in FIXES.values()} | set(ke.FILES))
    parts = {"overlay": content_digest(provision(VERSION)[0]), "edited": {p: sha((site / p).read_bytes()) for p in edited},
             "test_files": {f.name: sha(f.read_bytes()) for f in files}, "code": code_hash(), "interpreter": interpreter()}
    return cached("pr-check", parts, run)[0]


def _is_fix(path: str) -> bool:
    return path.startswith("python/sglang/srt/")


def check_series(pr, overlay: Path, work: Path, note=print, before: bool = True) -> list[dict]:
    """Each commit of series ``pr`` (``pr_series.PR``), applied in order on a fresh copy of
    ``overlay`` per state; one dict per commit."""
    from swa_repro.sglang.fix.pr_series import test_path

    names = (DOCS / pr.dir / "series").read_text().split()
    patches = [(DOCS / pr.dir / n).read_text() for n in names]
    out = []
    for k, name in enumerate(names, 1):
        row = {"commit": name}
        for label, keep_last in (("after", lambda p: True), ("before", lambda p: not _is_fix(p))):
            if label == "before" and not (before and pr.steps[k - 1].tests):
                continue
            d = work / f"{pr.key}-{k}-{label}"
            site = copy_overlay(overlay, d / "site")
            for p in patches[:k - 1]:
                apply_patch(site, p)
            touched = apply_patch(site, patches[k - 1], keep_last)
            if label == "after":
                row["touched"] = touched
                row["ruff"] = ruff_bad({p: site_path(site, p).read_text() for p in touched if p.endswith(".py")})
            test = site_path(site, test_path(pr))
            files = [test] if test.is_file() else []
            row[label] = run_tests(site, files + ([KIT_CASES] if label == "after" else []), d)
            shutil.rmtree(d, ignore_errors=True)
        note(f"{pr.dir} {name}: {verdict(pr, k, row) or 'ok'}")
        out.append(row)
    return out


# Test methods that check the kit's own expectation (they pass wherever the commit's kit piece is).
KIT_ONLY = {m for m, meth in pr_tests.METHODS.items() if not meth.gpu}


def failing(doc: dict) -> set[str]:
    """``test file: test[params]`` of every test and subtest that did not pass (but ``NOT_ON_CPU``'s)."""
    return {f"{f}: {k}" for f, r in doc.items() for part in ("tests", "subtests") for k, v in r[part].items()
            if v != "pass" and k.split("[", 1)[0] not in NOT_ON_CPU}


def verdict(pr, k: int, row: dict) -> str:
    """'' when commit ``k`` holds: ruff-clean, every test passes, its added tests fail without its fix."""
    problems = []
    if row["ruff"]:
        problems.append(f"ruff format rewrites {', '.join(row['ruff'])}")
    bad = failing(row["after"])
    if bad:
        problems.append(f"{len(bad)} failing: {', '.join(sorted(bad)[:4])}")
    added = list(pr.steps[k - 1].tests)
    if "before" in row and added:
        tests = row["before"].get(pr.test, {}).get("tests", {})
        if added == ["cohere2"]:
            added = list(tests)
        passed = [m for m in added if tests.get(m) == "pass" and m not in NOT_ON_CPU and m not in KIT_ONLY]
        if passed:
            problems.append(f"pass without the fix (test nothing): {', '.join(passed)}")
    return "; ".join(problems)


def check(keys=None, note=print, before: bool = True) -> dict:
    from swa_repro.sglang.fix.pr_series import PRS
    from swa_repro.sglang.provision import provision

    overlay = provision(VERSION)[0]
    out = {}
    with tempfile.TemporaryDirectory(prefix="pr-check-") as tmp:
        for pr in PRS:
            if keys is None or pr.key in keys:
                rows = check_series(pr, overlay, Path(tmp), note, before)
                out[pr.dir] = [{**r, "verdict": verdict(pr, k, r) or "ok"} for k, r in enumerate(rows, 1)]
    return out


def main(argv=None) -> int:
    from swa_repro.sglang.fix.pr_series import PRS

    p = argparse.ArgumentParser(prog="python -m swa_repro.sglang.fix.pr_check", description=__doc__.splitlines()[0])
    p.add_argument("--series", default=",".join(pr.key for pr in PRS), help="comma-separated keys (default: all)")
    p.add_argument("--out", type=Path, help="write the per-commit results here (JSON)")
    p.add_argument("--no-before", action="store_true", help="skip the without-the-fix runs")
    p.add_argument("--record", action="store_true", help="record the run in docs/upstream/pr-check.json "
                   "(every series; the README shows it)")
    a = p.parse_args(argv)
    keys = [k for k in a.series.split(",") if k]
    unknown = set(keys) - {pr.key for pr in PRS}
    if unknown:
        print(f"error: --series: unknown {', '.join(sorted(unknown))}; choose from "
              f"{','.join(pr.key for pr in PRS)}", file=sys.stderr)
        return 2
    if a.record and (set(keys) != {pr.key for pr in PRS} or a.no_before):
        print("error: --record checks every series with the without-the-fix runs: drop --series and --no-before",
              file=sys.stderr)
        return 2
    res = check(keys, before=not a.no_before)
    if a.out:
        write_atomic(a.out, json.dumps(res, indent=1).encode())
    if a.record:
        import datetime

        from swa_repro.sglang.fix.pr_readme import record

        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, check=False,
                                text=True).stdout.strip() or "unknown"
        for f in record(DOCS, res, commit, datetime.date.today().isoformat()):
            print(f"wrote {f}")
    return 0 if all(r["verdict"] == "ok" for rows in res.values() for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
