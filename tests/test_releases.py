"""Any release, one command: the release table is re-derived from recorded calls, other releases
run their own code in a subprocess, bad versions are one line, doctor reads the table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import skip_module_unless

skip_module_unless("sglang")

from swa_repro.cli import main  # noqa: E402
from swa_repro.sglang import provision  # noqa: E402
import shutil  # noqa: E402
from swa_repro.engine.provenance import TABLE_DIR  # noqa: E402
from swa_repro.sglang.audit import core as audit  # noqa: E402
from swa_repro.sglang.audit import table as at  # noqa: E402
from swa_repro.sglang.overlay_run import foreign_modules  # noqa: E402

TABLE = TABLE_DIR / "releases.json"


@pytest.fixture(scope="module")
def installed_run():
    return audit.run_audit().to_dict()  # every path x layer, as installed


# ----------------------------------------------------------------------------- the committed table
def test_table_has_the_required_releases_every_class_and_provenance():
    t = json.loads(TABLE.read_text())
    assert set(at.REQUIRED) <= {r["sglang"] for r in t["rows"]}
    assert list(t["classes"]) == list(at.CLASSES)
    assert {"command", "date", "python", "torch", "base_flashinfer"} <= set(t["provenance"])
    for r in t["rows"]:
        for k, c in r["cells"].items():
            assert c["state"] in ("holds", "fixed", "absent", "not driven"), (r["sglang"], k)
            assert c["evidence"], (r["sglang"], k)  # every verdict names its recorded call or reason
    md = (TABLE_DIR / "releases.md").read_text()
    assert md == at.markdown(t)  # the markdown is the JSON's rendering, nothing edited by hand


def test_installed_release_row_is_re_derived(installed_run):
    """The installed release audited in this process (not an overlay) gives the committed row."""
    row = at.committed_row(installed_run["release"]["sglang"])
    assert row is not None, "the installed release is not in docs/audit/releases.json"
    assert at.cells(installed_run) == row["cells"]
    assert installed_run["release"]["state"] == row["backend_state"]


def test_installed_0_5_15_post1_has_the_paged_only_window(installed_run):
    c = at.cell(installed_run, "paged_only_window")
    assert c["state"] == "holds"
    assert any("BatchPrefillWithPagedKVCacheWrapper.begin_forward(window_left not passed) then "
               "forward(window_left=8)" in e for e in c["evidence"])


# ----------------------------------------------------------------------------- cells from synthetic runs
def _run(findings=(), driven=(), not_driven=()):
    return {"findings": list(findings), "driven": list(driven), "not_driven": list(not_driven)}


def test_cell_states_come_from_the_run():
    f = {"path": "extend_paged", "layer": "swa8", "parameter": "window_left", "effect": "wrong", "kind": "mismatch",
         "wrapper": "BatchPrefillWithPagedKVCacheWrapper#0 (fa2)", "stage": "eager", "plan_value": -1,
         "forward_value": 8, "layer_value": 8,
         "evidence": {"plan_call": "plan(window_left not passed)", "forward_call": "forward(window_left=8)"}}
    d = {"path": "extend_paged", "layer": "swa8", "plans": ["P.plan(window_left=8, logits_soft_cap not passed)"]}
    assert at.cell(_run([f], [d]), "paged_only_window")["state"] == "holds"
    fixed = at.cell(_run([], [d]), "paged_only_window")
    assert fixed == {"state": "fixed", "evidence": ["extend_paged/swa8: P.plan(window_left=8, logits_soft_cap not passed)"]}
    gone = {"path": "target_verify_dflash", "layer": "swa8", "status": "absent", "why": "no DFlash verify"}
    assert at.cell(_run(not_driven=[gone]), "dflash_verify_window") == {"state": "absent",
                                                                        "evidence": ["no DFlash verify"]}
    raised = dict(gone, status="sglang raised", why="TypeError (raised in the release's own x.py:1)")
    assert at.cell(_run(not_driven=[raised]), "dflash_verify_window")["state"] == "not driven"
    assert at.cell(_run([dict(f, effect="none")], [d]), "paged_only_window")["state"] == "fixed"


# ----------------------------------------------------------------------------- bad input, provisioning
@pytest.mark.parametrize("version,msg", [("foo", "give a release number"), ("0.4.0", "0.5.10 and later")])
def test_bad_version_is_one_line_exit_2(capsys, version, msg):
    assert main(["audit", "--sglang", version]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


@pytest.mark.network
def test_unknown_release_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path))
    assert main(["audit", "--sglang", "0.5.99"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not on the package index" in err[0]


def test_cache_and_installer(tmp_path, monkeypatch):
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path))
    assert provision.overlay_dir("0.5.16") == tmp_path / "sglang" / "0.5.16"
    cmd = provision.installer(tmp_path / "x", "0.5.16")
    assert cmd[-1] == "sglang==0.5.16" and "--no-deps" in cmd and "--target" in cmd
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no uv next to it
    assert provision.installer(tmp_path / "x", "0.5.16")[:3] == [str(tmp_path / "python"), "-m", "pip"]
    assert provision._refusal("9", "error: failed to fetch: dns error").startswith("cannot reach the package index")


def test_foreign_modules_are_named(tmp_path):
    """The installed sglang, seen from a pretend overlay, is foreign: the check can fail."""
    assert "sglang" in foreign_modules(tmp_path) and foreign_modules(Path(sys.modules["sglang"].__file__).parent) == []


# ----------------------------------------------------------------------------- another release, its own code
@pytest.mark.network
@pytest.mark.slow
@pytest.mark.matrix  # `make test-matrix`: the same code path as 0.5.23's audit (test_sglang_fix), on another release
def test_sglang_0_5_16_audits_its_own_code(capsys):
    """0.5.16 has PR #31501: no paged-only window; every other cell as the committed table says."""
    assert main(["audit", "--sglang", "0.5.16", "--json"]) == 1  # affected: exit 1 (core.exit_status)
    doc = json.loads(capsys.readouterr().out)
    (run,), (classes,) = doc["runs"], doc["classes"]
    rel = run["release"]
    assert rel["sglang"] == "0.5.16" and rel["state"] == "fixed" and rel["origin"] == "overlay"
    assert rel["backend_file"].startswith(rel["overlay"]) and rel["sglang_modules_from_overlay"] > 100
    assert run["what_if"] is None and classes["paged_only_window"]["state"] == "fixed"
    assert classes == at.committed_row("0.5.16")["cells"]


# ----------------------------------------------------------------------------- doctor
def test_doctor_has_one_line_per_finding_class(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "backend     PR #31501 not applied (the paged-only prefill, extend_paged, plans no window" in out
    assert "from docs/audit/releases.md; re-derive: `swa-repro audit`" in out
    lines = [ln for ln in out.splitlines() if "`swa-repro audit --paths" in ln]
    assert len(lines) == len(at.CLASSES)
    paged = next(ln for ln in lines if "paged-only window" in ln)
    assert "affected" in paged and "not affected" not in paged and "--paths extend_paged`" in paged
