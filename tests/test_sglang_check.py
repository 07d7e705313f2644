"""`swa-repro sglang-check`: the matrix meets its expectation in model mode; the kit's own SWA
cases fail unpatched where the window is crossed and pass patched."""

from __future__ import annotations

import json

import pytest

from conftest import skip_module_unless

skip_module_unless("sglang", reason="sglang-check drives sglang's own backend: install sglang==0.5.15.post1")

from swa_repro.cli import main  # noqa: E402
from swa_repro.sglang import check as C  # noqa: E402
from swa_repro.sglang.harness import reaches_past_window  # noqa: E402


def test_matrix_expectation():
    """Geometry: the no-prefix 3/4/5 case stays inside the window, every other case crosses it
    (the prefix 4 and 5 requests of the prefix case too: row 1 at position 5/6 has key 0/1 in
    sglang's trimmed KV), so unpatched must fail them."""
    past = {c.name: reaches_past_window(c) for c in C.MATRIX}
    assert past == {"upstream_no_prefix_3_4_5": False, "upstream_prefix_3_4_5": True,
                    "upstream_no_prefix_6_8_12": True, "gqa_batch_tiles": True, "gqa_long_prefix_split_kv": True}


def test_cli_json_runs_both_states_and_routes(capsys, tmp_path):
    rc = main(["sglang-check", "--mode", "model", "--cases", "upstream_no_prefix_6_8_12", "--json",
               "--trace-dir", str(tmp_path)])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["expectation_met"] and doc["mode"] == "model"
    rows = {(r["route"], r["patched"]): r for r in doc["results"]}
    assert set(rows) == {("paged", False), ("paged", True), ("deterministic", False), ("deterministic", True)}
    for route in ("paged", "deterministic"):
        un, pa = rows[(route, False)], rows[(route, True)]
        assert not un["passed"] and un["max_abs_err"] > 0.1 and un["window_left_at_plan"] is None
        assert un["why"]["first_leaking_row"] == {"request": 0, "row": 5, "position": 5, "extra_keys": 1}
        assert pa["passed"] and pa["max_abs_err"] < 2e-2 and pa["window_left_at_plan"] == 4
    assert len(list(tmp_path.glob("*.pt"))) == 4
    assert set(doc) >= {"sglang", "backend_file", "state", "results"}


def test_unknown_case_is_a_usage_error(capsys):
    assert main(["sglang-check", "--mode", "model", "--cases", "nope"]) == 2
    assert "unknown case" in capsys.readouterr().err


def test_peer_suite_kit_swa_cases():
    names = {"swa_extend_no_prefix_window_edges", "swa_extend_prefix_window_edges"}
    un = {r["case"]: r["passed"] for r in C.peer_suite("model", False, names)}
    pa = {r["case"]: r["passed"] for r in C.peer_suite("model", True, names)}
    assert un == {"swa_extend_no_prefix_window_edges": True, "swa_extend_prefix_window_edges": False}
    assert pa == {"swa_extend_no_prefix_window_edges": True, "swa_extend_prefix_window_edges": True}


@pytest.mark.slow
@pytest.mark.parametrize("name,params", [
    ("03_apply_backend_patch", {}),
    ("04_rerun_checks", {"cases": ["upstream_no_prefix_3_4_5", "upstream_no_prefix_6_8_12"], "save_traces": True}),
])
def test_notebook_runs_in_model_mode(tmp_path, name, params):
    """Under papermill (the project's runner), headless, model mode: says its mode, every check
    passes; 04 also saves its mask figures and, asked to, one trace per run."""
    from swa_repro.notebook.places import NOTEBOOKS_DIR
    from swa_repro.notebook.runner import ensure_kernel, run_one

    r = run_one(NOTEBOOKS_DIR / f"{name}.py", tmp_path, "model", params, ensure_kernel(), 900)
    assert r["status"] == "ok", r["error"]
    assert r["mode"] == "model" and r["checks_failed"] == 0 and r["checks_passed"] >= 8
    html = (tmp_path / f"{name}.html").read_text()
    assert "Mode: model" in html
    for noise in ("TqdmWarning", "IProgress not found", "Triton is not supported", "support AWQ", "support GGUF"):
        assert noise not in html, f"third-party noise in {name}: {noise}"
    if name.startswith("03"):  # the lines the text is about, not ~200 lines of sglang source
        assert html.count("# lines ") >= 2 and "wrapper_paged.begin_forward(" in html  # two excerpts
        assert "num_accept_tokens = getattr(spec_info" not in html  # update_sliding_window's first lines: not shown
    if name.startswith("04"):
        assert html.count("sglang 0.5.23: overlay ") == 1  # one line for both audits
        assert "<table id=\"T_" in html and "as shipped" in html and "with the fixes" in html  # the findings, an HTML table
        # the two mask figures and the fixes' key heatmap
        assert sorted(f.rsplit("_", 2)[-2] + "_" + f.rsplit("_", 2)[-1] for f in r["figures"]) == [
            "fix_keys.png", "patched_masks.png", "unpatched_masks.png"]
        assert len(list((tmp_path / "traces").glob("*.pt"))) == 2 * 3  # 2 cases x 2 states + deterministic x 2


@pytest.mark.gpu
def test_live_matrix_and_peer_suite(capsys):
    """Real FlashInfer kernels behind sglang's code: the same expectation holds."""
    rc = main(["sglang-check", "--mode", "live", "--cases", "upstream_prefix_3_4_5,upstream_no_prefix_6_8_12",
               "--peer", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["expectation_met"] and doc["mode"] == "live", doc


@pytest.mark.parametrize("installed", ["0.5.23", "0.5.10"])
def test_another_installed_release_gets_one_line_pointing_at_the_audit(monkeypatch, installed):
    """The harness is written against 0.5.15.post1's test kit; another installed release is told
    what runs it (the audit) instead of failing inside the harness."""
    from swa_repro.core.errors import UsageError
    from swa_repro.sglang import harness
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: installed)
    with pytest.raises(UsageError, match=rf"sglang {installed} is installed: audit {installed} with .*--sglang {installed}"):
        harness.require_harness_release()
    monkeypatch.setattr(metadata, "version", lambda name: "0.5.15.post1")
    assert harness.require_harness_release() == "0.5.15.post1"
