"""Recording format round trip (synthetic data in tmp_path only) and the committed case list."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from swa_repro.cli import main as swa
from swa_repro.core.case import Case
from swa_repro.core.versions import FLASHINFER_VERSIONS
from swa_repro.evidence import cases as rc
from swa_repro.evidence.recordings import groups_agree, load_recording, load_recordings, write_recording
from swa_repro.kernel.model import simulate
from swa_repro.kernel.probe import mask_attention_fn, model_masks, probe_from_attention_fn

GQA = Case(prefix_lens=(40, 0), extend_lens=(70, 9), num_qo_heads=8, num_kv_heads=2, head_dim=64,
           page_size=16, window_left=8, name="synthetic_gqa_bug")
SYNTHETIC = {"note": "SYNTHETIC TEST DATA from a CPU attention stand-in; not GPU evidence", "gpu": None}


def _synthetic(case, masks=None):
    return probe_from_attention_fn(case, mask_attention_fn(case, masks or model_masks(case)), repeats=2,
                                   source="synthetic CPU stand-in")


def test_round_trip_group0(tmp_path):
    res = _synthetic(GQA)
    path = write_recording(res, tmp_path / "0.7.2.post1", SYNTHETIC)
    doc = json.loads(path.read_text())
    assert doc["groups_agree"] is True and doc["heads_stored"] == "group0"
    assert doc["model_at_record"]["statuses"] == simulate(GQA).statuses
    rec = load_recordings(tmp_path)
    assert len(rec) == 1 and rec[0].case == GQA and rec[0].name == GQA.name
    assert rec[0].provenance == SYNTHETIC and rec[0].statuses == res.statuses
    for rr, pr, mr in zip(rec[0].requests, res.requests, simulate(GQA).requests):
        assert rr.lo.shape == (pr.lo.shape[0], GQA.group_size) and rr.lo.dtype == np.int32
        qo_heads = rr.intervals.per_qo_head(GQA.num_qo_heads)
        np.testing.assert_array_equal(qo_heads.lo, pr.lo)
        np.testing.assert_array_equal(qo_heads.hi, pr.hi)
        assert rr.intervals.equals(mr.intervals) and rr.intervals.equals(pr.intervals)  # tests/test_recordings.py
        np.testing.assert_array_equal(rr.mask(), pr.mask())
        np.testing.assert_array_equal(rr.err_vs_model, pr.err_vs_model)
        assert (rr.status, rr.reason) == (pr.status, pr.reason)


def test_groups_that_disagree_store_all_heads(tmp_path):
    masks = model_masks(GQA)
    masks[0] = masks[0].copy()
    masks[0][5, 30, :] = False  # qo head 5 (KV group 1), row 30 sees nothing
    res = _synthetic(GQA, masks)
    assert not groups_agree(GQA, res.requests[0])
    path = write_recording(res, tmp_path / "0.6.12", SYNTHETIC)
    rec = load_recording(path)
    assert rec.doc["heads_stored"] == "all" and rec.requests[0].lo.shape[1] == 8
    assert rec.requests[0].lo[30, 5] == -1 and rec.requests[0].count[30, 5] == 0


def test_loader_rejects_foreign_json(tmp_path):
    (tmp_path / "0.6.12").mkdir()
    (tmp_path / "0.6.12" / "x.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="format"):
        load_recordings(tmp_path)


def test_loader_reads_only_version_folders(tmp_path):
    """replay/ and logs/ beside the version folders hold other evidence, not probes."""
    (tmp_path / "replay").mkdir()
    (tmp_path / "replay" / "r.json").write_text('{"provenance": {}, "traces": []}')
    assert load_recordings(tmp_path) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_record_without_cuda_is_usage_error(tmp_path, capsys):
    assert swa(["record", "--cases", "seed_bug", "--out", str(tmp_path)]) == 2
    assert "CUDA" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_record_list_and_unknown_case(capsys):
    assert swa(["record", "--list"]) == 0
    out = capsys.readouterr().out
    assert "seed_bug" in out and "modules to JIT-build" in out
    assert swa(["record", "--cases", "nope", "--list"]) == 2
    assert "unknown case(s) nope" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the committed cases
def test_case_list_coverage():
    cs = rc.CASES
    assert len(cs) >= 12 and len(rc.BY_NAME) == len(cs)
    assert {c.group_size for c in cs} >= {1, 2, 4, 8}
    assert {c.head_dim for c in cs} >= {64, 128, 256}
    assert {c.page_size for c in cs} >= {1, 16}
    assert any(max(c.prefix_lens) > 0 for c in cs) and any(max(c.prefix_lens) == 0 for c in cs)
    assert any(c.batch_size == 1 for c in cs) and any(c.batch_size > 2 for c in cs)
    assert {c.backend for c in cs} == {"fa2", "fa3", "auto"}
    assert {c.plan_window_left == -1 for c in cs} == {True, False}
    assert any(c.disable_split_kv for c in cs)
    seed = rc.BY_NAME["seed_bug"]
    assert (seed.prefix_lens, seed.extend_lens, seed.window_left, seed.num_qo_heads, seed.page_size) == \
        ((0, 0, 0), (6, 8, 12), 4, 4, 16)
    assert rc.BY_NAME["seed_fix"].plan_window_left == 4


def test_case_list_model_predictions():
    sims = {c.name: simulate(c) for c in rc.CASES}
    undefined = [n for n, s in sims.items() if "undefined" in s.statuses]
    assert len(undefined) >= 2
    assert any(s.plan and s.plan.split_kv and "undefined" not in s.statuses for s in sims.values())
    assert any(s.plan and not s.plan.split_kv and not c.disable_split_kv and c.resolved_backend == "fa2"
               for c, s in zip(rc.CASES, sims.values()))
    for c in rc.CASES:
        if c.plan_window_left >= 0:
            assert set(sims[c.name].statuses) == {"exact"}, c.name
    assert len(rc.modules_needed()) <= 6


def test_risky_cases_run_last():
    order = [c.name for c in rc.risky_last(rc.CASES)]
    first_undefined = min(i for i, n in enumerate(order) if "undefined" in simulate(rc.BY_NAME[n]).statuses)
    assert all("undefined" in simulate(rc.BY_NAME[n]).statuses for n in order[first_undefined:])


def test_flashinfer_version_strings_are_exact():
    assert "0.7.2.post1" in FLASHINFER_VERSIONS and "0.6.12" in FLASHINFER_VERSIONS
    assert rc.BY_NAME["seed_bug"].with_(flashinfer_version="0.6.12").flashinfer_version == "0.6.12"
