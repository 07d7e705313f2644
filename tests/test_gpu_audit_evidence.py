"""The committed live audit of sglang 0.5.15.post1 on an H200 (recordings/sglang-live/), held to
the CPU audit and to its own key-level predictions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIVE = ROOT / "recordings" / "sglang-live"
AUDIT = LIVE / "audit-live-sglang-0.5.15.post1-flashinfer-0.6.12.json"
CHECK = LIVE / "sglang-check-live-sglang-0.5.15.post1-flashinfer-0.6.12.json"


@pytest.fixture(scope="module")
def live():
    d = json.loads(AUDIT.read_text())
    return d, d["runs"][0]


def test_the_gpu_audit_drove_every_run_on_gpu_tensors(live):
    d, r = live
    assert d["mode"] == "live" and r["device"] == "cuda" and r["release"]["sglang"] == "0.5.15.post1"
    assert len(r["driven"]) == 36 and r["not_driven"] == [] and d["incomplete"] == [[]]


def test_every_live_call_ran_and_the_key_level_prediction_matches_the_kernel(live):
    for dr in live[1]["driven"]:
        lv = dr["live"]
        assert lv["executed"] == lv["calls"] > 0 and not lv["errors"], dr["path"]
        assert lv["model_agrees"] is True, (dr["path"], dr["layer"], lv["max_err_predicted"])
        assert (lv["wrong_rows"] > 0) == (lv["predicted_wrong_rows"] > 0), (dr["path"], dr["layer"])


def test_a_dropped_soft_cap_runs_uncapped_on_the_real_kernel(live):
    """Full layers with cap 50: the output matches the *uncapped* reference and misses the capped one."""
    from swa_repro.sglang.audit.live import ATOL

    capped = [dr for dr in live[1]["driven"] if dr["layer"] == "full_cap50"]
    assert len(capped) == 9
    for dr in capped:
        assert dr["live"]["max_err_uncapped"] <= ATOL < dr["live"]["max_err_intended"], dr["path"]


def test_sglang_check_live_met_its_expectation_without_calling_the_stub():
    d = json.loads(CHECK.read_text())
    assert d["mode"] == "live" and d["expectation_met"] is True and d["sglang"] == "0.5.15.post1"
    assert d["stubs"] and all(s["called"] == [] for s in d["stubs"])
    failed = [r for r in d["results"] if not r["passed"]]
    assert failed and all(not r["patched"] for r in failed)  # unpatched fails, patched passes


def test_live_notebooks_03_to_05_ran_on_the_gpu_and_passed():
    s = json.loads((ROOT / "docs" / "live" / "summary-03-05.json").read_text())
    assert s["mode"] == "live" and s["ok"] and [n["notebook"][:2] for n in s["notebooks"]] == ["03", "04", "05"]
    assert all(n["checks_failed"] == 0 and n["checks_passed"] > 0 for n in s["notebooks"])


@pytest.mark.slow
def test_the_cpu_audit_derives_what_the_gpu_audit_recorded(live):
    """Same release, same inputs: the CPU audit (model mode) must find the same keys and cells."""
    pytest.importorskip("sglang")
    import sglang

    if sglang.__version__ != "0.5.15.post1":
        pytest.skip("the evidence is for sglang 0.5.15.post1")
    from swa_repro.sglang.audit import core as audit
    from swa_repro.sglang.audit import table as audit_table

    cpu = audit.run_audit().to_dict()
    gpu = live[1]
    key = lambda d: {(x["path"], x["layer"]): (x["key_verdict"], x["keys"]) for x in d["driven"]}  # noqa: E731
    assert key(cpu) == key(gpu)
    assert audit_table.cells(cpu) == audit_table.cells(gpu)


# ----------------------------------------------------------------------------- sglang 0.5.23 as shipped (#18)
FIX = LIVE / "fix-0.5.23"


@pytest.fixture(scope="module")
def live23():
    import lzma

    d = json.loads(lzma.decompress((FIX / "audit-live-before.json.xz").read_bytes()))
    return d, d["runs"][0]


def test_0523_as_shipped_ran_every_run_live_and_the_model_agrees(live23):
    d, r = live23
    assert d["mode"] == "live" and r["device"] == "cuda" and r["release"]["sglang"] == "0.5.23"
    assert set(r["release"]["fix_states"].values()) == {"applied", "needed"}  # the file as shipped
    assert len(r["driven"]) == 36 and r["not_driven"] == [] and d["incomplete"] == [[]]
    for dr in r["driven"]:
        lv = dr["live"]
        assert lv["executed"] == lv["calls"] > 0 and not lv["errors"], dr["path"]
        assert lv["model_agrees"] is True, (dr["path"], dr["layer"])
        assert (lv["wrong_rows"] > 0) == (lv["predicted_wrong_rows"] > 0), (dr["path"], dr["layer"])


def test_0523_every_finding_class_holds_on_the_real_kernel(live23):
    """Each class the CPU release table says holds in 0.5.23 shows wrong rows on the H200, and the
    sliding-window keys the CPU table reads per path are the ones read live (same recorded calls)."""
    from swa_repro.sglang.audit import table

    d, r = live23
    row = table.committed_row("0.5.23")
    assert {k: c["state"] for k, c in d["classes"][0].items()} == {k: c["state"] for k, c in row["cells"].items()}
    assert table.key_cells(r) == row["keys"]
    for key, c in d["classes"][0].items():
        if c["state"] == "holds":
            cls = table.CLASSES[key]
            wrong = [dr for dr in r["driven"] if dr["path"] in cls.paths and dr["live"]["wrong_rows"] > 0]
            assert wrong, key
