"""``swa-repro sglang-check --kit-only``: sglang's own attention kit on a release as it is on disk.

The row/exit contract runs on a stand-in kit (no sglang import); the CPU kit on a release's overlay
provisions it from PyPI once (cached under .cache/), hence the ``network`` mark on those.
"""

from __future__ import annotations

import json
import types
import unittest

import pytest

from conftest import run_cli
from swa_repro.sglang import kit


def _case(name, mode="EXTEND", window=None):
    return types.SimpleNamespace(name=name, forward_mode=types.SimpleNamespace(name=mode),
                                 sliding_window_size=window)


OUTCOMES = {"ok": None, "bad": AssertionError("Tensor-likes are not close!\nGreatest absolute difference: 0.2 "
                                              "Greatest relative difference: 9"),
            "skip": unittest.SkipTest("flashinfer backend is not available"), "boom": RuntimeError("no driver")}


def _fake_kit():
    def run(tc, case, **kw):
        assert kw == {"head_dim": 64, "hidden_size": 256, "device": "cuda"}
        if OUTCOMES[case.name] is not None:
            raise OUTCOMES[case.name]
    cases = [_case(n) for n in OUTCOMES]
    return types.SimpleNamespace(run_dense_attention_case=run, make_dense_cases=lambda b: cases[:2],
                                 make_swa_no_prefix_input_config_cases=lambda b: cases[2:3],
                                 make_swa_prefix_input_config_cases=lambda b: cases[3:])


@pytest.mark.parametrize("name, status, message", [
    ("ok", "passed", None), ("bad", "failed", "Tensor-likes are not close! Greatest absolute difference: 0.2"),
    ("skip", "skipped", "flashinfer backend is not available"), ("boom", "error", "RuntimeError: no driver")])
def test_one_row_per_case(name, status, message, monkeypatch):
    monkeypatch.setattr(kit, "load_kit", _fake_kit)
    rows, setup = kit.run_kit("live")
    assert setup is None and [r["case"] for r in rows] == list(OUTCOMES)
    row = next(r for r in rows if r["case"] == name)
    assert row["status"] == status and row.get("message") == message


def _doc(*statuses):
    rows = [{"case": f"c{i}", "forward_mode": "EXTEND", "sliding_window_size": None, "status": s}
            for i, s in enumerate(statuses)]
    return {"sglang": "0.5.23", "backend_file": "/x/flashinfer_backend.py", "sha256": "0" * 12,
            "fixes": {"paged_only_window": {"state": "applied", "why": ""}}, "mode": "live", "substitution": "none",
            "case_sets": ["make_dense_cases(\"flashinfer\")"], "results": rows,
            "ok": all(s in ("passed", "skipped") for s in statuses)}


@pytest.mark.parametrize("statuses, rc", [(("passed", "skipped"), 0), (("passed", "failed"), 1), (("error",), 1)])
def test_exit_status(statuses, rc, monkeypatch, capsys):
    from swa_repro.cli import main

    monkeypatch.setattr(kit, "installed_doc", lambda mode: _doc(*statuses))
    assert main(["sglang-check", "--kit-only", "--json"]) == rc
    doc = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in doc["results"]] == list(statuses)
    assert main(["sglang-check", "--kit-only"]) == rc
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("sglang 0.5.23: /x/flashinfer_backend.py sha256 000000000000; fixes: paged_only_window=applied")
    assert len([ln for ln in out if ln.startswith("  c")]) == len(statuses)


@pytest.mark.parametrize("argv, must_mention", [
    (["--sglang", "0.5.12"], "ships sglang/test/kits/attention_unittest from 0.5.13"),
    (["--sglang", "nope"], "give a release number"),
    (["--sglang", "0.5.23", "--fix", "bogus"], "--fix: unknown bogus"),
    (["--fix", "all"], "give --sglang VERSION too")])
def test_bad_input_is_one_line_exit_2(argv, must_mention):
    r = run_cli("sglang-check", "--kit-only", "--mode", "model", *argv, timeout=120)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr and must_mention in lines[0], r.stderr


@pytest.mark.network
# 0.5.14's run (the kit's one real failure on CPU) is in `make test-matrix`: the same code path as
# 0.5.23's on another release (its overlay, ~17 s from nothing: issue #24); the failing path's exit
# status is test_exit_status's, and a kit case failing on a real release is test_upstream_kit's.
@pytest.mark.parametrize("version, fix, rc, failing", [
    ("0.5.23", "all", 0, []),
    pytest.param("0.5.14", None, 1, ["swa_extend_prefix_window_edges"], marks=pytest.mark.matrix)])
def test_cpu_kit_on_a_release(version, fix, rc, failing, capsys):
    """0.5.23 with every fix passes all 14 kit cases on CPU; 0.5.14 as shipped fails the SWA prefix
    case (paged-only prefill without the plan-time window, fixed by PR #31501 in 0.5.16). The CLI runs
    in this process (the release's kit in its child, forked from this worker's warm server); the
    subprocess CLI is test_bad_input_is_one_line_exit_2's."""
    from swa_repro.cli import main

    got = main(["sglang-check", "--kit-only", "--mode", "model", "--json", "--sglang", version,
                *(["--fix", fix] if fix else [])])
    out, err = capsys.readouterr()
    assert got == rc, err[-2000:]
    doc = json.loads(out)
    assert doc["sglang"] == version and doc["sglang_modules_from_overlay"] > 0
    assert len(doc["results"]) == 14 and {r["forward_mode"] for r in doc["results"]} == {"EXTEND", "DECODE"}
    assert [r["case"] for r in doc["results"] if r["status"] != "passed"] == failing
    assert all(f["state"] == ("applied" if fix else "needed") for f in doc["fixes"].values() if f["state"] != "unknown")
