"""story.py on the kernel model, and against recordings written to a temp dir from a CPU
stand-in kernel (never committed: they only exercise the comparison and its failure modes)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from swa_repro.core.case import Case
from swa_repro.core.mode import ModeInfo
from swa_repro.core.reference import intended_mask
from swa_repro.kernel.model import simulate
from swa_repro.kernel.probe import RANDOM_ATOL as TOL
from swa_repro.kernel.probe import mask_attention_fn, model_masks, probe_from_attention_fn
from swa_repro.notebook import calls, plots, story, tables
from swa_repro.notebook.show import table

MODEL = ModeInfo("model", "test")
TEST_PROVENANCE = {"gpu": "CPU stand-in (pytest)", "driver": None, "torch": torch.__version__, "flashinfer": None,
                   "sglang": None, "date_utc": "test", "command": "pytest"}


def probe_with_masks(case, masks, attn_wrap=None):
    fn = mask_attention_fn(case, masks)
    return probe_from_attention_fn(case, attn_wrap(fn) if attn_wrap else fn, repeats=2, random_runs=1)


def write_and_load(tmp_path, results):
    from swa_repro.evidence.recordings import load_recordings, write_recording

    for r in results:
        write_recording(r, tmp_path / r.case.flashinfer_version, TEST_PROVENANCE)
    return load_recordings(tmp_path)


def intended_masks(case):
    return [np.broadcast_to(intended_mask(p, e, case.window_left), (case.num_qo_heads, e, p + e)).copy()
            for p, e in zip(case.prefix_lens, case.extend_lens)]


def test_cases_and_fix():
    bug, fix = story.seed_case(), story.seed_case(True)
    assert (bug.prefix_lens, bug.extend_lens, bug.window_left, bug.page_size) == ((0, 0, 0), (6, 8, 12), 4, 16)
    assert (bug.plan_window_left, fix.plan_window_left) == (-1, 4)
    assert (bug.name, fix.name) == ("seed_bug", "seed_fix")
    assert story.with_fix(fix, False) == bug
    g = story.gqa_case()
    assert (g.num_qo_heads, g.num_kv_heads, g.prefix_lens, g.extend_lens, g.window_left) == (32, 8, (200,), (100,), 64)
    assert g.name == "gqa4_bug" and story.gqa_case(window=32, num_kv_heads=None).window_left == 32
    # a parameters cell's None keeps the shared shape, a value replaces it
    assert story.seed_case(window_left=None, extend_lens=None) == bug
    assert story.seed_case(window_left=8).with_(window_left=4) == bug
    assert story.long_case().extend_lens == (32768,) and story.long_case(extend=64).extend_lens == (64,)
    # the seed is exactly the committed recording case, so recordings of it are found
    from swa_repro.evidence.cases import BY_NAME

    assert BY_NAME["seed_bug"] == bug and BY_NAME["seed_fix"] == fix


def test_table_formats_plain_rows():
    text = table([{"a": 1, "b": [1, 2]}, {"a": float("nan"), "c": "x"}])
    lines = text.splitlines()
    assert lines[0].split() == ["a", "b", "c"] and "1,2" in lines[2] and "nan" in lines[3]
    assert table([]) == "(no rows)"


def test_typed_rows_get_their_labels_only_when_shown():
    """Rows are indexed by attribute; the display labels (with the mode, one column per recorded
    version, optional columns) appear only in the table text."""
    rows = [tables.RowError("model", 0, 1, "leak", 2, 0.5, {"0.6.12": 0.4}),
            tables.RowError("model", 0, 2, "leak", 0, 0.01, {"0.6.12": 0.02})]
    assert rows[0].err == 0.5 and rows[0].gpu_err["0.6.12"] == 0.4
    header = table(rows).splitlines()[0].split("  ")
    assert [h.strip() for h in header if h.strip()] == ["req", "row", "status", "extra keys", "err (model)",
                                                        "err (GPU, fi 0.6.12)"]
    un = tables.BackendRow("live", "c_fa3_bug", "fa3", "fa3", -1, ["leak"], [3], True, None, "unavailable: no sm90")
    assert "wrong rows (live)" in table([un]) and "unavailable: no sm90" in table([un])
    assert "recorded status" not in table([un])  # live mode: no recordings column at all


def test_verdict_model_without_recordings():
    v = story.verdict(MODEL, story.seed_case(), [])
    assert v.bug_present_without_window and v.fixed_with_window
    assert v.without_window.status == ["leak"] * 3 and v.with_window.status == ["exact"] * 3
    assert v.without_window.recordings_agree is None
    assert "rests on the kernel model alone" in v.sentence and v.sentence.startswith("Bug PRESENT")


def test_forward_vs_run_and_row_errors_model():
    bug = story.seed_case()
    fwd, run = tables.forward_vs_run(bug, "model")
    assert fwd.returned and run.asserted and "outcome" in table([run]) and "AssertionError" in table([run])
    assert all(r.returned for r in tables.forward_vs_run(story.seed_case(True), "model"))
    rows = tables.row_error_table(bug, "model")
    assert len(rows) == sum(bug.extend_lens)
    wrong = [(r.req, r.row) for r in rows if not r.err <= TOL]
    extra = [(r.req, r.row) for r in rows if r.extra_keys > 0]
    assert wrong == extra and len(wrong) == 11  # rows 5.. of each request see key p-5
    assert all(r.err <= TOL for r in tables.row_error_table(story.seed_case(True), "model"))


def test_module_plan_and_backend_tables():
    bug = story.seed_case()
    mods = tables.module_table([bug, story.with_fix(bug, True)], "model")
    assert [m.effective_use_sliding_window for m in mods] == [False, True]
    assert "use_swa_False" in mods[0].effective_module and "use_swa_True" in mods[1].effective_module
    assert "module (live)" not in table(mods)  # model mode: the live columns are left out
    split = Case((4000,), (64,), window_left=128, name="split_long_bug")
    (p_bug, p_fix) = tables.plan_table([split, story.with_fix(split, True)])
    assert p_bug.split_kv and p_bug.chunks_planned != p_bug.chunks_written and p_bug.status == ["undefined"]
    assert p_fix.chunks_planned == p_fix.chunks_written and p_fix.status == ["exact"]
    tiles = Case((64, 0), (100, 20), window_left=8, num_qo_heads=8, num_kv_heads=2, name="tiles_bug")
    bt = {r.case: r for r in tables.backend_table(tiles, "model", backends=("fa2", "fa3"))}
    assert bt["tiles_fa3_bug"].plain_causal and not bt["tiles_fa2_bug"].plain_causal
    assert sum(bt["tiles_fa2_fix"].wrong_rows) == 0 and sum(bt["tiles_fa2_bug"].wrong_rows) > 0
    assert bt["tiles_fa2_bug"].recorded == {} and "no recording" in table([bt["tiles_fa2_bug"]])


def test_compare_and_verdict_with_recordings(tmp_path):
    bug = story.seed_case()
    fix = story.with_fix(bug, True)
    recs = write_and_load(tmp_path, [probe_with_masks(bug, model_masks(bug)), probe_with_masks(fix, model_masks(fix))])
    assert [r.case.name for r in recs] == ["seed_bug", "seed_fix"]
    rows = story.compare_model_to_recording(recs[0])
    assert [r.agree for r in rows] == [True] * 3 and rows[0].evidence == "intervals equal"
    v = story.verdict(MODEL, bug, recs)
    assert v.without_window.recordings_agree and v.with_window.recordings_agree
    assert "agree with the model" in v.sentence and len(v.evidence) == 2
    assert story.matching_recordings(bug.with_(flashinfer_version="0.6.12"), recs) == [recs[0]]
    fig = plots.plot_case(bug, simulate(bug, tiles=True), recs[0])
    assert "recording" in fig.axes[2].get_title() and "difference: recording" in fig.axes[3].get_title()


def test_compare_detects_a_wrong_model(tmp_path):
    """A 'kernel' that applies the intended window disagrees with the model of the bug case."""
    bug = story.seed_case()
    (rec,) = write_and_load(tmp_path, [probe_with_masks(bug, intended_masks(bug))])
    rows = story.compare_model_to_recording(rec)
    assert [r.agree for r in rows] == [False] * 3
    assert rows[2].rows_differing == 7
    v = story.verdict(MODEL, bug, [rec])
    assert v.without_window.recordings_agree is False and "DISAGREE" in v.sentence


@pytest.mark.parametrize("corrupt, agree", [(False, False), (True, True)])
def test_undefined_needs_evidence_in_the_recording(tmp_path, corrupt, agree):
    """Model says undefined (split-KV): the recording must show NaN / missing keys / instability."""
    # a small split-KV case: 4 SMs make the no-window plan split 300 keys into 128-key chunks
    case = Case((284,), (16,), window_left=16, num_qo_heads=2, num_kv_heads=2, head_dim=64, sm_count=4,
                name="small_split_bug")
    assert simulate(case).statuses == ["undefined"]

    def nan_rows(fn):
        def wrapped(batch, repeat=0):
            o = fn(batch, repeat)
            o[-3:] = float("nan")
            return o
        return wrapped

    (rec,) = write_and_load(tmp_path, [probe_with_masks(case, model_masks(case), nan_rows if corrupt else None)])
    (row,) = story.compare_model_to_recording(rec)
    assert row.model == "undefined" and row.agree is agree
    assert ("NaN" in row.evidence) is corrupt


def test_live_branches_with_a_stand_in_kernel(monkeypatch):
    """The live code paths (verdict, forward/run, module table) wired to ``live.run_live``; here
    run_live is replaced by the model wrapper so the plumbing is tested without a GPU."""
    from swa_repro.kernel import live

    def fake_run_live(case, seed=0, api="forward"):
        r = calls.model_call(case, api, seed)
        p = simulate(case).plan
        return live.LiveResult(case, api, "stand-in", {"uri": f"stand-in use_swa_{case.plan_window_left >= 0}",
                                                       "use_sliding_window": case.plan_window_left >= 0},
                               {"cta_tile_q": p.cta_tile_q, "split_kv": p.split_kv}, r.error,
                               r.err_vs_reference, r.err_vs_reference, [])

    monkeypatch.setattr(live, "run_live", fake_run_live)
    v = story.verdict(ModeInfo("live", "stand-in"), story.seed_case())
    assert v.bug_present_without_window and v.fixed_with_window
    assert v.without_window.wrong_rows == [1, 3, 7] and v.with_window.wrong_rows == [0, 0, 0]
    assert "real kernel planned without window_left gets 11 rows wrong" in v.sentence
    fwd, run = tables.forward_vs_run(story.seed_case(), "live")
    assert fwd.returned and run.asserted
    (row,) = tables.module_table([story.seed_case(True)], "live")
    assert row.live_use_sliding_window is True and row.live_cta_tile_q == row.cta_tile_q == 16
    assert "module (live)" in table([row]) and "module " not in table([row]).splitlines()[0].replace("module (live)", "")


# Notebook 02 runs once in make test: test_notebooks_use_recordings_and_fail_on_a_wrong_one's run (stand-in
# recordings) holds what the run here held (model mode said, every check passing, its figures saved and shown
# inline). The run here, on the committed recordings, re-proved in a notebook what test_recordings.py holds
# (the model against every committed recording) and drew one figure per recorded case: 18 plot_case figures,
# ~2.8 s each on 2 cores, 55 of its 58 s from an empty cache (cProfile: matplotlib's savefig). It is in the
# release matrix (make test-matrix).
@pytest.mark.slow
# 00_overview's headless model-mode run is test_artifact_sets' (`swa-repro run 00 --mode model`), which holds the
# same: one run of notebook 00 in the suite, not two
@pytest.mark.parametrize("name", ["01_plan_with_and_without_window_left",
                                  pytest.param("02_masks_and_cta_skips", marks=pytest.mark.matrix)])
def test_notebook_runs_in_model_mode(tmp_path, name):
    """The notebook end to end under papermill (the project's runner), headless, in model mode:
    it must say its mode, pass all its checks, and save its figures."""
    from swa_repro.notebook.places import NOTEBOOKS_DIR
    from swa_repro.notebook.runner import ensure_kernel, run_one

    r = run_one(NOTEBOOKS_DIR / f"{name}.py", tmp_path, "model", {}, ensure_kernel(), 900)
    assert r["status"] == "ok", r["error"]
    assert r["mode"] == "model" and r["checks_failed"] == 0 and r["checks_passed"] >= 2
    assert r["figures"] and all((tmp_path / f).stat().st_size > 10_000 for f in r["figures"])
    html = (tmp_path / f"{name}.html").read_text()
    assert "Mode: model" in html and "data:image/png;base64" in html  # figures shown inline, not just saved
    if name.startswith("02"):  # and a figure per committed recorded case not drawn above
        assert any("_rec_" in f for f in r["figures"])


@pytest.mark.slow
def test_notebooks_use_recordings_and_fail_on_a_wrong_one(tmp_path):
    """With recordings present the notebooks compare model and recording (and draw both); a
    recording the model does not explain makes the papermill run fail, not print a warning.
    The recordings here come from a CPU stand-in kernel, written to a temp dir only."""
    from swa_repro.notebook.places import NOTEBOOKS_DIR
    from swa_repro.notebook.runner import ensure_kernel, run_one

    bug, fix = story.seed_case(), story.seed_case(True)
    good, bad = tmp_path / "good", tmp_path / "bad"
    other = Case((5,), (20,), window_left=4, num_qo_heads=4, num_kv_heads=2, head_dim=64, name="other_bug")
    write_and_load(good, [probe_with_masks(c, model_masks(c)) for c in (bug, fix, other)])
    write_and_load(bad, [probe_with_masks(bug, intended_masks(bug))])  # a "kernel" without the bug
    kernel = ensure_kernel()
    for d in ("out_good", "out_bad"):
        (tmp_path / d).mkdir()

    out = tmp_path / "out_good"
    r = run_one(NOTEBOOKS_DIR / "02_masks_and_cta_skips.py", out, "model", {"recordings_dir": str(good)}, kernel, 900)
    assert r["status"] == "ok", r["error"]
    # make test's one run of notebook 02: what test_notebook_runs_in_model_mode holds of a run (its run of 02 on
    # the committed recordings is in the release matrix)
    assert r["mode"] == "model" and r["checks_failed"] == 0 and r["checks_passed"] >= 2
    assert r["figures"] and all((out / f).stat().st_size > 10_000 for f in r["figures"])
    html = (out / "02_masks_and_cta_skips.html").read_text()
    assert "Mode: model" in html and "data:image/png;base64" in html  # figures shown inline, not just saved
    assert "02_masks_and_cta_skips_rec_0_7_2_post1_other_bug.png" in r["figures"]  # not drawn above: own figure
    assert not any("rec_0_7_2_post1_seed" in f for f in r["figures"])  # the seed's is drawn next to its model
    checks = json.loads((out / "02_masks_and_cta_skips.checks.json").read_text())
    assert sum("vs recording" in it["what"] and it["ok"] for it in checks["items"]) == 7  # 3 + 3 + 1 requests
    assert sum("equals the real kernel" in it["what"] and it["ok"] for it in checks["items"]) == 2

    r = run_one(NOTEBOOKS_DIR / "00_overview.py", tmp_path / "out_bad", "model", {"recordings_dir": str(bad)}, kernel, 900)
    assert r["status"] == "failed" and r["checks_failed"] == 1
    assert "kernel model equals the GPU recording(s) of seed_bug" in r["error"]
