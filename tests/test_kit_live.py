"""``swa_repro.sglang.fix.kit_live``: scripts/gpu_kit.sh's returned logs -> the summary and README rows
committed with them. Read off unittest's own report and the script's verdict lines, never guessed."""

from __future__ import annotations

import json

from swa_repro.sglang.fix import kit_live

LOG = """== kit-triton depth on /tmp/site-triton-depth:/tmp/site-shipped (expected to FAIL)
test_projected_swa_attention_cases (__main__.TestKitSWACases.test_projected_swa_attention_cases) ... ok
test_runner_mode_spec_verify_cases (__main__.TestKitSWACases.test_runner_mode_spec_verify_cases) ...
2026-12-06 07:00:00 INFO something logged between
test_spec_verify_past_window (__main__.TestKitSWACases.test_spec_verify_past_window) ... ok
======================================================================
FAIL: test_runner_mode_spec_verify_cases (__main__.TestKitSWACases.test_runner_mode_spec_verify_cases) (case='runner_eagle_verify_swa_tree', backend='triton', topk=2, spec_kind='eagle')
----------------------------------------------------------------------
AssertionError: Tensor-likes are not close!
Ran 3 tests in 12.5s

FAILED (failures=1)
== kit-triton depth: FAIL, as expected, after 130s
== kit-triton shipped on /tmp/site-shipped-kit:/tmp/site-shipped (expected to PASS)
test_projected_swa_attention_cases (__main__.TestKitSWACases.test_projected_swa_attention_cases) ... ok
"""

GPU = """date -u: 2026-12-06T07:10:00Z
nvidia-smi -L:
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)
driver: 580.159.04
torch: 2.11.0+cu130 cuda 13.0
git rev-parse HEAD: abc
code digest: 0123456789abcdef
steps: install,patch,jit,triton,kit,regress,bench; flashinfer 0.7.2, sglang 0.5.23; exit status 1
fa3: skipped: sglang's FA3 backend needs sgl_kernel's compiled flash-attention ops
seconds per step (name, start, end, seconds, exit status; from the script's start):
install\t0\t12\t12\t0
jit\t15\t290\t275\t0
commands, in the order started (file names: under artifacts/gpu_kit, returned flat):
"""


def test_sections_read_unittests_report_and_the_scripts_verdict():
    s = kit_live.sections(LOG)
    depth = s["kit-triton", "depth"]
    assert depth["want"] == "FAIL" and depth["got"] == "FAIL" and depth["as_expected"] is True
    assert depth["ran"] == 3 and depth["seconds_at_end"] == 130
    assert depth["status"] == {"test_projected_swa_attention_cases": "pass", "test_runner_mode_spec_verify_cases": "fail",
                               "test_spec_verify_past_window": "pass"}
    assert depth["cases"] == {"test_runner_mode_spec_verify_cases": ["runner_eagle_verify_swa_tree topk=2"]}
    cut = s["kit-triton", "shipped"]  # no end line: the call ran out of time, no verdict invented
    assert cut["got"] is None and cut["as_expected"] is None


def test_summary_and_rows_of_a_call_folder(tmp_path, capsys):
    (tmp_path / "gpu.txt").write_text(GPU)
    (tmp_path / "kit-triton.log").write_text(LOG)
    (tmp_path / "jit-warm.json").write_text('{"fa3-swa": 120.5}')
    doc = kit_live.summarize(tmp_path)
    m = doc["machine"]
    assert m["gpu"] == "NVIDIA H100 80GB HBM3" and m["driver"] == "580.159.04" and m["code_digest"] == "0123456789abcdef"
    assert m["fa3"].startswith("skipped: sglang's FA3") and m["seconds"] == {"install": 12, "jit": 275}
    assert doc["missing"] == ["kit-flashinfer.log", "regress.log"] and doc["jit"] == {"fa3-swa": 120.5}
    assert doc["all_as_expected"] is False  # the cut section has no verdict
    rows = kit_live.readme_rows(doc, "`bash scripts/gpu_kit.sh`")
    assert "**not every run as expected**" in rows[0] and "missing: kit-flashinfer.log, regress.log" in rows[0]
    assert any("**FAIL** (as expected: FAIL), 2/3 tests pass; failing cases: runner_eagle_verify_swa_tree topk=2"
               in r for r in rows)
    assert any("**no verdict**" in r for r in rows)
    assert kit_live.main([str(tmp_path)]) == 1
    assert json.loads(capsys.readouterr().out.split("\n| ")[0])["call"] == tmp_path.name
    out = tmp_path / "summary.json"
    assert kit_live.main([str(tmp_path), "--out", str(out)]) == 1 and json.loads(out.read_text())["runs"]
    assert kit_live.main([str(tmp_path), "--out", str(out)]) == 2  # exists: refused, one line
    assert capsys.readouterr().err.count("\n") == 1
    assert kit_live.main([str(tmp_path / "nowhere")]) == 2
