"""docs/upstream: the committed diffs are what the generator makes of sglang 0.5.23's file and apply
to it. The regression test and the kit diffs, and their CPU runs: tests/test_upstream_kit.py; the
git-am series and git apply: tests/test_upstream_series.py."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from swa_repro.sglang.fix import ALL, apply_fixes
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.fix.upstream_diff import REPO_PATH, TEST, VERSION, diffs, plus_side, unified
from swa_repro.sglang.fix.upstream_live import (live_fix_set, live_lines, regress_lines, regress_results,
                                                stale_live)
from swa_repro.sglang.patch.classify import REL_PATH

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "upstream"
TEST_FILE = DOCS / TEST


@pytest.fixture(scope="module")
def text():
    from conftest import release_overlay

    overlay = release_overlay(VERSION)
    return (overlay / "sglang" / REL_PATH).read_text()


def test_committed_diffs_are_regenerated(text):
    made = diffs(text)
    for name, d in made.items():
        p = DOCS / f"{name}.diff"
        if d is None:
            assert not p.exists(), f"{p.name}: nothing to change in {VERSION}, but a diff is committed"
        else:
            assert p.read_text() == d, f"{p.name} is stale: run python -m swa_repro.sglang.fix.upstream"
    assert made["paged_only_window"] is None and made["soft_cap_cuda_graph"] is None
    readme = (DOCS / "README.md").read_text()
    assert "Do not edit: regenerate." in readme and "already fixed upstream (PR #31501)" in readme


@pytest.mark.parametrize("name", [*ORDER, "all"])
def test_each_diff_applies_to_the_release_file(text, name):
    p = DOCS / f"{name}.diff"
    if not p.exists():
        pytest.skip(f"no diff for {name}")
    d = p.read_text()
    assert d.startswith(f"--- a/{REPO_PATH}\n+++ b/{REPO_PATH}\n")
    want = apply_fixes(text, ORDER if name == "all" else (name,))
    assert plus_side(text, d) == want
    ast.parse(want)


def test_plus_side_refuses_a_diff_of_another_file(text):
    d = (DOCS / "all.diff").read_text()
    removed = next(ln[1:] for ln in d.splitlines(keepends=True)[2:] if ln.startswith("-"))
    assert removed in text
    with pytest.raises(ValueError):
        plus_side(text.replace(removed, removed.rstrip("\n") + "  # edited\n", 1), d)


def test_regression_test_imports_only_sglang_torch_flashinfer_stdlib():
    tree = ast.parse(TEST_FILE.read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert roots - {"sglang", "torch", "flashinfer"} <= set(sys.stdlib_module_names)
    assert "swa_repro" not in TEST_FILE.read_text()


def test_a_live_recording_of_another_all_diff_is_said_to_predate_it(text):
    """The H200 run of the fixed file counts for today's all.diff only if its fix.diff makes the same file."""
    assert stale_live(text, unified(text, apply_fixes(text, ORDER))) is None
    assert stale_live(text, unified(text, apply_fixes(text, ALL))) is None  # what patch --fix all ran
    also = live_fix_set(text, unified(text, apply_fixes(text, ALL)))  # ... and the README says so
    assert also and "`sm100_no_cutlass_window`" in also
    assert live_fix_set(text, unified(text, apply_fixes(text, ORDER))) is None
    assert "predates" in stale_live(text, unified(text, apply_fixes(text, ("soft_cap_decode",))))
    assert stale_live(text, None) is None


def test_live_section_renders_a_recording():
    doc = json.loads((REPO / "recordings/sglang-live/audit-live-sglang-0.5.15.post1-flashinfer-0.6.12.json").read_text())
    lines = live_lines(doc, doc)
    assert lines[0].startswith("Recorded on NVIDIA H200 (sglang 0.5.15.post1;"), lines[0]  # the card, from mode_why
    assert lines[2].startswith("| path | layer | as shipped | with all.diff |")
    rows = [ln for ln in lines[4:] if ln.startswith("| ")]
    assert len(rows) == 36 and all(ln.count("wrong, max err") == 2 for ln in rows)
    alone = live_lines(doc, None)  # the fixed file's run not recorded: said, and its column says so
    assert any("not recorded yet" in ln for ln in alone)
    assert all(ln.endswith("| not recorded |") for ln in alone if ln.startswith("| ") and "wrong" in ln)
    assert live_lines(None, None)[0].startswith("Not yet run.")


def test_regress_results_reads_unittests_own_report(tmp_path):
    """Real ``unittest -v`` runs (pass, fail, error, a failing subtest case, and log lines between a
    name and its verdict), two files per site, framed as scripts/gpu_fix.sh frames each site's run,
    read back test by test, with the failing cases named and the runs' counts summed."""
    t, k = tmp_path / "t.py", tmp_path / "k.py"
    t.write_text("import sys, unittest\n"
                 "class T(unittest.TestCase):\n"
                 "    def test_a_ok(self): print('INFO - flashinfer.jit: Building JIT module x', file=sys.stderr)\n"
                 "    def test_b_fail(self): self.fail('off the reference')\n"
                 "    def test_c_error(self): raise RuntimeError('boom')\n"
                 "unittest.main()\n")
    k.write_text("import unittest\n"
                 "class K(unittest.TestCase):\n"
                 "    def test_kit(self):\n"
                 "        for case in ('edges', 'past_window'):\n"
                 "            with self.subTest(case=case, topk=2): self.assertEqual(case, 'edges')\n"
                 "unittest.main()\n")
    p, q = (subprocess.run([sys.executable, str(f), "-v"], capture_output=True, text=True) for f in (t, k))
    assert p.returncode == q.returncode == 1
    log = ("== regress shipped on /tmp/site-shipped (expected to FAIL)\n" + p.stdout + p.stderr + q.stderr +
           "== regress shipped: FAIL, as expected, after 9s\n== regress fixed on /tmp/site-fixed (expected to PASS)\n"
           + p.stderr.replace("test_b_fail", "test_d").replace("FAIL: test_d", "ok").replace("ERROR: test_c_error", "ok"))
    got = regress_results(log)
    assert got["shipped"] == {"ran": 4, "status": {"test_a_ok": "pass", "test_b_fail": "fail", "test_c_error": "error",
                                                   "test_kit": "fail"},
                              "cases": {"test_kit": ["past_window topk=2"]}}
    assert got["fixed"]["ran"] == 3 and got["fixed"]["status"]["test_a_ok"] == "pass" and got["fixed"]["cases"] == {}
    lines = regress_lines(log, {"mode": "live", "results": [{"status": "passed"}] * 3 + [{"status": "failed"}]})
    assert "| test_b_fail | **fail** | - |" in lines and "| test_kit | **fail** (past_window topk=2) | - |" in lines
    assert any("3 passed, 1 failed, 0 errors" in ln for ln in lines)
    assert regress_lines(None, None) == []


# ----------------------------------------------------------------------------- sglang's conventions
def _ruff_clean(code: str) -> str | None:
    """``ruff format --check`` (the pinned ruff, sglang's default config) on ``code``: None if clean,
    else ruff's diff."""
    r = subprocess.run([sys.executable, "-m", "ruff", "format", "--diff", "--isolated", "-"], input=code,
                       capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr
    return None if r.returncode == 0 else r.stdout


def test_the_shipped_file_is_ruff_clean(text):
    """The premise: 0.5.23's file passes sglang's formatter, so a hunk ruff rewrites is ours."""
    assert _ruff_clean(text) is None


@pytest.mark.parametrize("name", [*ORDER, "all"])
def test_each_diff_is_ruff_clean(text, name):
    p = DOCS / f"{name}.diff"
    if not p.exists():
        pytest.skip(f"no diff for {name}")
    bad = _ruff_clean(plus_side(text, p.read_text()))
    assert bad is None, f"ruff format rewrites {name}.diff's file:\n{bad}"
