"""Notebooks 03/04's fix sections (``notebook.fix_view``): their tables held against a reading of
the audit documents written here, field by field, not through ``audit.table``."""

from __future__ import annotations

import pytest

from swa_repro.core.errors import UsageError
from swa_repro.notebook import fix_view as FV
from swa_repro.sglang import provision
from swa_repro.sglang.audit.table import CLASSES
from swa_repro.sglang.fix import FIXES, apply_fixes, states
from swa_repro.sglang.fix.fixes import ORDER

SWA_PATHS = ("extend_paged", "extend_ragged_no_prefix", "target_verify_eagle")


def keys(queries, extra, missing=0):
    return {"eager": {"calls": 1, "queries": queries, "queries_with_extra": extra, "extra_keys": extra,
                      "max_extra_per_query": 3 if extra else 0, "missing_keys": missing, "foreign_keys": 0}}


def driven(path, layer, plan, k=None):
    d = {"path": path, "layer": layer, "plans": [f"W.begin_forward({plan})"], "calls": 1}
    if k is not None:
        d.update(keys=k, key_verdict="exact" if not (k["eager"]["queries_with_extra"] or k["eager"]["missing_keys"])
                 else "extra")
    return d


def finding(path, layer, parameter):
    return {"path": path, "layer": layer, "parameter": parameter, "effect": "wrong", "kind": "mismatch",
            "plan_value": None, "forward_value": 8, "layer_value": 8, "wrapper": "W#0 (fa2)", "stage": "eager",
            "evidence": {"plan_call": f"begin_forward({parameter} not passed)", "forward_call": "forward(...)"}}


def doc(fixed: bool) -> dict:
    """A release as shipped (ragged no-prefix and EAGLE windows dropped, decode's cap dropped) or
    with the fixes; DFlash verify is not in this release."""
    win = "window_left=8" if fixed else "window_left not passed"
    cap = "logits_soft_cap=50.0" if fixed else "logits_soft_cap not passed"
    return {"release": {"sglang": "0.0.0", "fixes": {"fixes": list(ORDER)}} if fixed else {"sglang": "0.0.0"},
            "findings": [] if fixed else [finding("extend_ragged_no_prefix", "swa8", "window_left"),
                                          finding("target_verify_eagle", "swa8", "window_left"),
                                          finding("decode", "full_cap50", "logits_soft_cap")],
            "driven": [driven("extend_paged", "swa8", "window_left=8", keys(36, 0)),
                       driven("extend_ragged_no_prefix", "swa8", win, keys(36, 0 if fixed else 18)),
                       driven("extend_ragged_no_prefix", "swa8_cap50", win, keys(36, 0)),
                       driven("target_verify_eagle", "swa8", win, keys(8, 0 if fixed else 7, 0 if fixed else 37)),
                       driven("decode", "full_cap50", cap)],
            "not_driven": [{"path": "target_verify_dflash", "layer": "all", "status": "absent", "why": "no DFlash"}]}


def test_class_rows_read_each_class_off_the_findings():
    rows = {r.key: r for r in FV.class_rows(doc(False), doc(True), ("ragged_no_prefix_window", "soft_cap_decode"))}
    assert list(rows) == list(CLASSES)
    assert {k for k, r in rows.items() if r.chosen} == {"ragged_no_prefix_window", "soft_cap_decode"}
    assert {k for k, r in rows.items() if r.before == "holds"} == \
        {"ragged_no_prefix_window", "eagle_verify_window", "soft_cap_decode"}  # one finding each in doc(False)
    assert not any(r.after == "holds" for r in rows.values())  # doc(True) has no finding
    assert rows["dflash_verify_window"].before == rows["dflash_verify_window"].after == "absent"
    nop = rows["ragged_no_prefix_window"]
    assert nop.after == "fixed" and "window_left=8" in nop.evidence
    assert rows["soft_cap_decode"].after == "fixed" and "logits_soft_cap=50.0" in rows["soft_cap_decode"].evidence


def test_key_rows_take_each_paths_worst_sliding_window_layer():
    rows = {r.path: r for r in FV.key_rows(doc(False), doc(True))}
    assert list(rows) == list(SWA_PATHS)  # decode was driven on a full layer only: no keys
    assert (rows["extend_paged"].before_verdict, rows["extend_paged"].after_verdict) == ("exact", "exact")
    nop = rows["extend_ragged_no_prefix"]  # swa8 sees extra keys, swa8_cap50 none: the path reads extra
    assert nop.before_verdict == "extra" and nop.before_cell["queries_with_extra"] == 18 and nop.after == "exact"
    eagle = rows["target_verify_eagle"]
    assert eagle.before_cell["missing_keys"] == 37 and "37 missing" in eagle.before and "7/8 q" in eagle.before
    assert FV.window_paths(("ragged_no_prefix_window", "soft_cap_decode")) == {"extend_ragged_no_prefix"}
    assert FV.window_paths(ORDER) >= set(SWA_PATHS)
    assert [FV.held_exact(r, ("soft_cap_decode",)) for r in rows.values()] == [True, False, False]  # exact before
    assert all(FV.held_exact(r, ORDER) for r in rows.values())
    fig = FV.keys_figure(list(rows.values()), "t")
    grid = fig.axes[0].images[0].get_array()
    assert grid.shape == (2, 3) and grid[0, 1] == 0.5 and grid[0, 2] == 7 / 8 and not grid[1].any()


def test_a_release_that_cannot_be_provisioned_is_one_line(monkeypatch):
    def refuse(version):
        raise UsageError(f"cannot reach the package index to install sglang=={version} (no network?)")

    monkeypatch.setattr(provision, "provision", refuse)
    rel = FV.load_release("0.5.23", "soft_cap_cuda_graph")
    assert rel.text is None and rel.skipped.startswith(FV.SKIP) and "\n" not in rel.skipped
    assert rel.names == ("soft_cap_prefill", "soft_cap_decode", "soft_cap_cuda_graph")  # what it requires, first
    with pytest.raises(UsageError, match="unknown"):
        FV.load_release("0.5.23", "no_such_fix")


def test_a_file_the_fixes_refuse_is_one_line(monkeypatch, tmp_path):
    (tmp_path / FV.FILE).parent.mkdir(parents=True)
    (tmp_path / FV.FILE).write_text("class FlashInferAttnBackend:\n    pass\n")  # none of the fixes' anchors
    monkeypatch.setattr(provision, "provision", lambda version: (tmp_path, {}))
    rel = FV.load_release("0.5.23", "all")
    assert rel.text and rel.fixed is None and rel.skipped.startswith(FV.SKIP) and "\n" not in rel.skipped
    assert {r.state for r in FV.state_rows(rel)} == {"unknown"} and FV.file_unchanged(rel)


def test_apply_commands_patch_in_place_only_where_the_release_is_installed():
    rel = FV.Release("0.5.23", ORDER, "", "/cache/0.5.23/" + FV.FILE)
    here, there = FV.apply_commands(rel, "0.5.23"), FV.apply_commands(rel, "0.5.15.post1")
    # the names chosen, never `all` (which also applies the family fixes the view did not choose)
    assert all(f"--fix {','.join(ORDER)} " in c and "--source" not in c for c in here)
    assert "--source /cache/0.5.23/" in there[0] and "--out" in there[0] and "--source" not in there[1]
    assert "--fix soft_cap_decode " in FV.apply_commands(FV.Release("0.5.23", ("soft_cap_decode",)), None)[0]


def test_each_step_diff_is_one_fix_on_a_real_release():
    from conftest import release_overlay

    release_overlay("0.5.23")  # installed if the cache lacks it (a skip only without any way to get it)
    rel = FV.load_release("0.5.23", "all")
    shipped = states(rel.text)
    for (name, diff), row in zip(FV.step_diffs(rel), FV.state_rows(rel)):
        assert row.fix == name and row.state == shipped[name].state
        assert bool(diff) == (shipped[name].state == "needed" and not FIXES[name].requires), name
        assert FIXES[name].summary in FV.diff_text(name, diff)
    assert FV.file_unchanged(rel) and rel.fixed == apply_fixes(rel.text, ORDER)  # the classes this runner audits


def test_audit_pair_says_its_overlay_once_and_whether_each_audit_was_cached(monkeypatch):
    """Notebook 04 printed the overlay line twice (one per audit): now one line for both."""
    from swa_repro.sglang.audit import release as R

    def fake(version, *, fixes=None, note=print, **kw):
        note(f"sglang {version}: overlay /x/{version} (cached); auditing it in a subprocess")
        d = doc(bool(fixes))
        d["release"].update(overlay=f"/x/{version}", child_seconds=20.0,
                            result_cache={"cache": "hit" if fixes else "miss"})
        return d

    monkeypatch.setattr(R, "audit_release", fake)
    lines = []
    before, after = FV.audit_pair(FV.Release("0.5.23", ORDER), note=lines.append)
    assert len(lines) == 1 and lines[0].count("/x/0.5.23") == 1, lines
    assert "as shipped: audited now in 20.0 s" in lines[0] and "with the fixes: cached result" in lines[0]
    assert "fixes" in after["release"] and "fixes" not in before["release"]


def test_findings_table_is_a_real_table_with_every_cell_whole():
    """Notebook 04's findings: an HTML table, no cell cut (the text table cut at 90 characters)."""
    rows = FV.class_rows(doc(False), doc(True), ("ragged_no_prefix_window",))
    long = "W.begin_forward(window_left=8) " * 6  # longer than any width a text table kept
    rows = [r.__class__(**{**r.__dict__, "evidence": long}) if r.key == "ragged_no_prefix_window" else r for r in rows]
    html = FV.frame(rows).to_html()
    assert html.count("<tr") == len(rows) + 1 and "<th" in html
    assert long.strip() in html and "..." not in html


def test_a_family_fix_is_refused_with_where_to_run_it():
    from swa_repro.core.errors import UsageError

    with pytest.raises(UsageError, match=r"commandr_window_hook need a model family's layers: run notebook 07"):
        FV.load_release("0.5.23", "soft_cap_decode,commandr_window_hook")
