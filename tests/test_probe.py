"""The probe's decoding, driven on CPU by attention with known masks (swa_repro.kernel.probe.mask_attention_fn).

The same decoding code reads the real kernel on CUDA (probe_case); here the "kernel" is float64
attention rounded to bf16 with the kernel model's masks or hand-made ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from swa_repro.core.case import Case
from swa_repro.core.intervals import ceil_div
from swa_repro.kernel.model import simulate
from swa_repro.core.reference import intended_mask
from swa_repro.kernel.probe import mask_attention_fn, model_masks, probe_from_attention_fn, probe_layout, slot_positions

SEED = Case(prefix_lens=(0, 0, 0), extend_lens=(6, 8, 12), window_left=4, head_dim=64, page_size=16)
GQA = Case(prefix_lens=(70, 5), extend_lens=(90, 20), num_qo_heads=8, num_kv_heads=2, head_dim=64,
           page_size=16, window_left=16)  # CTA_TILE_Q 128 -> 32 queries per tile: tile-granular leak


def _intended_masks(case):
    return [intended_mask(p, e, case.window_left) for p, e in zip(case.prefix_lens, case.extend_lens)]


@pytest.mark.parametrize("case", [SEED, GQA, SEED.with_(page_size=1), GQA.with_(plan_window_left=16)],
                         ids=["seed", "gqa", "seed_page1", "gqa_fix"])
def test_recovers_model_intervals_per_head(case):
    """Exact recovery of every (row, qo head) interval, incl. GQA head-in-group mapping."""
    model = simulate(case)
    res = probe_from_attention_fn(case, mask_attention_fn(case, model_masks(case)), repeats=2)
    cols = np.arange(case.num_qo_heads) % case.group_size
    for pr, mr in zip(res.requests, model.requests):
        np.testing.assert_array_equal(pr.lo, mr.lo[:, cols])
        np.testing.assert_array_equal(pr.hi, mr.hi[:, cols])
        np.testing.assert_array_equal(pr.count, mr.hi[:, cols] - mr.lo[:, cols] + 1)
        assert pr.contiguous.all() and pr.consistent.all() and pr.repeat_equal.all() and not pr.nan.any()
        assert pr.random_equal.all()
        assert np.nanmax(pr.err_vs_model) < 0.02  # the stand-in computes with the model's masks
        assert pr.intervals.equals(mr.intervals)
        np.testing.assert_array_equal(pr.mask(), mr.mask())
    assert res.statuses == model.statuses
    assert res.launches == 2 * ceil_div(max(case.kv_lens), case.head_dim) + 2


def test_intended_masks_give_exact_and_small_reference_error():
    res = probe_from_attention_fn(SEED, mask_attention_fn(SEED, _intended_masks(SEED)))
    assert res.statuses == ["exact"] * 3
    assert all(np.nanmax(r.err_vs_reference) < 0.02 for r in res.requests)
    assert res.summary()["status"] == ["exact"] * 3


def test_leak_is_leak_with_large_reference_error():
    res = probe_from_attention_fn(SEED, mask_attention_fn(SEED, model_masks(SEED)))
    assert res.statuses == ["leak"] * 3  # few queries: plain causal attention
    r = res.requests[2]
    np.testing.assert_array_equal(r.lo, np.zeros_like(r.lo))
    assert np.nanmax(r.err_vs_reference) > 0.1


def test_non_contiguous_mask_is_undefined():
    masks = _intended_masks(SEED)
    masks[2] = masks[2].copy()
    masks[2][10, 7] = False  # a hole inside row 10's window [6, 10]
    res = probe_from_attention_fn(SEED, mask_attention_fn(SEED, masks))
    r = res.requests[2]
    assert not r.contiguous[10].any() and r.contiguous[np.arange(12) != 10].all()
    assert (r.lo[10] == 6).all() and (r.hi[10] == 10).all() and (r.count[10] == 4).all()
    assert res.statuses == ["exact", "exact", "undefined"]
    assert "non-contiguous" in res.reasons[2]


def _wrap(fn, hook):
    def attn(batch, repeat=0):
        o = fn(batch, repeat).clone()
        hook(o, batch, repeat)
        return o
    return attn


def test_nan_rows_are_flagged():
    def hook(o, batch, repeat):
        o[3, 1, :] = float("nan")  # request 0, row 3, head 1, every launch

    res = probe_from_attention_fn(SEED, _wrap(mask_attention_fn(SEED, _intended_masks(SEED)), hook))
    r = res.requests[0]
    assert r.nan[3, 1] and r.nan.sum() == 1
    assert res.statuses == ["undefined", "exact", "exact"]
    assert "NaN" in res.reasons[0]
    assert np.isnan(r.err_vs_reference[3])


def test_run_to_run_difference_is_flagged():
    def hook(o, batch, repeat):
        if repeat == 1:
            o[6 + 2, 0, 0] += 0.5  # request 1, row 2: only the second run differs

    res = probe_from_attention_fn(SEED, _wrap(mask_attention_fn(SEED, _intended_masks(SEED)), hook))
    r = res.requests[1]
    assert not r.repeat_equal[2, 0] and r.repeat_equal.sum() == r.repeat_equal.size - 1
    assert not r.random_equal[2] and r.random_equal.sum() == 7
    assert res.statuses == ["exact", "undefined", "exact"]


def test_bitwise_digest_sees_negative_zero():
    """-0.0 == 0.0 numerically; only the bitwise digest can tell the runs apart."""
    def hook(o, batch, repeat):
        if repeat == 1 and batch.q.abs().sum() == 0:  # probe launches only
            o[0, 0, 5] = -0.0  # row 0 sees key 0 only: slot 5 is a zero output

    res = probe_from_attention_fn(SEED, _wrap(mask_attention_fn(SEED, _intended_masks(SEED)), hook))
    assert not res.requests[0].repeat_equal[0, 0]


def test_inconsistent_values_are_flagged():
    def hook(o, batch, repeat):
        if batch.q.abs().sum() == 0:
            o[7, 2] *= 2  # request 1 row 1: visible keys carry 2/count instead of 1/count

    res = probe_from_attention_fn(SEED, _wrap(mask_attention_fn(SEED, _intended_masks(SEED)), hook))
    assert not res.requests[1].consistent[1, 2]
    assert res.statuses[1] == "undefined" and "inconsistent" in res.reasons[1]


def test_random_data_mismatch_is_undefined():
    """A kernel whose random-data output disagrees with its probed mask is not trusted."""
    def hook(o, batch, repeat):
        if batch.q.abs().sum() > 0:
            o[-1] += 1.0

    res = probe_from_attention_fn(SEED, _wrap(mask_attention_fn(SEED, _intended_masks(SEED)), hook))
    assert res.statuses == ["exact", "exact", "undefined"]
    assert "probed mask" in res.reasons[2]


def test_slot_positions_cover_every_key_once():
    case = GQA.with_(page_size=16)
    b = probe_layout(case)
    pos = slot_positions(b, case.kv_lens)
    vals = pos[pos >= 0]
    assert len(vals) == sum(case.kv_lens)
    for i, kv in enumerate(case.kv_lens):
        pages = b.kv_indices[b.kv_indptr[i]:b.kv_indptr[i + 1]].long()
        np.testing.assert_array_equal(pos[pages].reshape(-1)[:kv].numpy(), np.arange(kv))


def test_bad_attention_shape_is_reported():
    with pytest.raises(ValueError, match="shape"):
        probe_from_attention_fn(SEED, lambda batch, repeat: batch.q[:, :1], repeats=1)


@pytest.mark.gpu
@pytest.mark.parametrize("plan_w", [-1, 4])
def test_probe_real_kernel_seed_case(plan_w):
    from swa_repro.kernel.probe import probe_case

    case = Case(prefix_lens=(0, 0, 0), extend_lens=(6, 8, 12), window_left=4, plan_window_left=plan_w)
    res = probe_case(case)
    assert res.plan_info["use_sliding_window"] is (plan_w >= 0)
    assert res.statuses == simulate(case).statuses
