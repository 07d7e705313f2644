"""matrix: model x prompt cells, leak grid, backend matrix with recordings, flashinfer #4972 probe."""

from __future__ import annotations

import types

import numpy as np
import pytest

from swa_repro.notebook import matrix
from swa_repro.core.case import Case
from swa_repro.kernel.model import fa2_cta_tile_q, simulate


def spec(window_left=127, qo=64, kv=8, head_dim=64, name="gptoss_like"):
    return types.SimpleNamespace(name=name, window_left=window_left, num_qo_heads=qo, num_kv_heads=kv,
                                 head_dim=head_dim, has_window=window_left >= 0, window_rule="test")


def test_sglang_case_trims_the_prefix_to_the_window():
    c = matrix.sglang_case(spec(), 1024, 4096)
    assert c.prefix_lens == (127,) and c.extend_lens == (1024,) and c.page_size == 1 and c.plan_window_left == -1
    assert matrix.sglang_case(spec(), 1024, 4096, plan_window_left=0).plan_window_left == 127


def test_leaking_cell_reports_the_tile_bound_and_a_real_output_error():
    cell = matrix.model_cell(spec(), 1024, 0)
    g = 8
    assert cell.status == "leak"
    assert cell.max_leak == fa2_cta_tile_q(1024 * g, 64) // g - 1  # rows of one CTA tile, less its first
    assert 0 < cell.mean_leak < cell.max_leak and cell.err is not None and cell.err > 1e-3


def test_cells_without_leak_have_zero_error_and_windowless_models_are_said():
    cell = matrix.model_cell(spec(window_left=4095, qo=8, kv=4, head_dim=256), 1024, 0)
    assert (cell.status, cell.max_leak, cell.err) == ("exact", 0, 0.0)
    assert matrix.model_cell(spec(window_left=-1), 1024, 0).status == "no window"
    assert matrix.model_cell(spec(head_dim=96), 1024, 0).status == "not modelled"


def test_leak_grid_is_zero_inside_the_window_and_matches_simulate():
    grid = matrix.leak_grid((127, 4095), (64, 1024), num_qo_heads=8, num_kv_heads=4, head_dim=128)
    assert grid[1, 0] == 0 and grid[1, 1] == 0  # prompt fits in the window
    r = simulate(Case(prefix_lens=(0,), extend_lens=(1024,), num_qo_heads=8, num_kv_heads=4, head_dim=128,
                      page_size=1, window_left=127, flashinfer_version="0.6.12")).requests[0]
    assert r.status == "undefined" and np.isnan(grid[0, 1])  # one long request: split-KV, plan/run disagree
    d = simulate(Case(prefix_lens=(0,), extend_lens=(1024,), num_qo_heads=8, num_kv_heads=4, head_dim=128,
                      page_size=1, window_left=127, disable_split_kv=True, flashinfer_version="0.6.12")).requests[0]
    assert d.status == "leak" and d.extra_keys().max() > 0


def test_backend_matrix_cells_and_recordings_side_by_side():
    base = Case(prefix_lens=(0,), extend_lens=(300,), window_left=64, page_size=16)
    fake = types.SimpleNamespace(case=base.with_(backend="fa2", disable_split_kv=True, flashinfer_version="0.6.12",
                                                 name="rec", sm_count=114),
                                 statuses=["leak"], name="rec")
    rows = matrix.backend_matrix(base, [fake])
    assert len(rows) == 3 * 2 * 2
    assert {r["model"] for r in rows if r["resolved"] == "fa3"} == {"leak"}
    hit = [r for r in rows if r["recording"]]
    assert len(hit) == 1 and hit[0]["backend"] == "fa2" and hit[0]["split_kv"] == "off" and hit[0]["recorded"] == "leak"
    assert any(r["model"] == "undefined" for r in rows if r["backend"] == "fa2" and r["split_kv"] == "on")


def test_recordings_load_or_say_why():
    recs, note = matrix.load_recordings_or_empty()
    assert isinstance(recs, list) and note


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CPU behaviour")
def test_probe_4972_says_it_needs_cuda():
    p = matrix.probe_4972()
    assert (p.ran, p.detected, p.why) == (False, None, "not run: needs CUDA")


@pytest.mark.gpu
def test_probe_4972_on_the_installed_flashinfer():
    p = matrix.probe_4972()
    assert p.ran and isinstance(p.detected, bool) and p.max_err is not None
    assert "split_kv=" in p.why
    if p.detected:  # the report: the wrong rows are the first query tile
        assert all(isinstance(r, int) and r < 128 for r in p.bad_rows if r != "...")
