"""The model wrapper keeps FlashInfer's plan/forward/run contract and computes what the kernel
model predicts: exact with the window at plan, the tile-granular leak without it, NaN when undefined."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from swa_repro.core.batch import build_paged_batch, random_inputs
from swa_repro.core.case import Case
from swa_repro.kernel.wrappers import DecodeModelWrapper, ModelPagedPrefillWrapper, RaggedModelWrapper
from swa_repro.core.reference import intended_mask, masked_attention, reference_attention

WS = torch.empty(16, dtype=torch.uint8)


def _planned(case: Case, plan_window_left: int, seed=0, causal=False):
    qs, ks, vs = random_inputs(case, seed=seed)
    pb = build_paged_batch(qs, ks, vs, case.page_size, seed=seed)
    w = ModelPagedPrefillWrapper(WS, "NHD", backend="fa2")
    w.begin_forward(pb.qo_indptr, pb.kv_indptr, pb.kv_indices, pb.last_page_len, case.num_qo_heads,
                    case.num_kv_heads, case.head_dim, case.page_size, window_left=plan_window_left, causal=causal,
                    q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    return w, pb, (qs, ks, vs)


def _ref(case, qs, ks, vs):
    return torch.cat(reference_attention(case.prefix_lens, case.extend_lens, case.window_left, qs, ks, vs))


CASE = Case((0, 5, 40), (12, 2, 40), num_qo_heads=8, num_kv_heads=2, head_dim=64, page_size=16, window_left=4)


def test_run_with_window_after_plan_without_it_raises():
    """prefill.py:2317: the window is fixed at plan."""
    w, pb, _ = _planned(CASE, -1)
    assert w._module["use_sliding_window"] is False
    with pytest.raises(AssertionError):
        w.run(pb.q, (pb.k_cache, pb.v_cache), window_left=4)


def test_run_before_plan_and_wrong_q_raise():
    w = ModelPagedPrefillWrapper(WS, "NHD", backend="fa2")
    with pytest.raises(AssertionError, match="plan info"):
        w.run(torch.zeros(3, 8, 64), (torch.zeros(1, 16, 2, 64), torch.zeros(1, 16, 2, 64)))
    w, pb, _ = _planned(CASE, 4)
    with pytest.raises(ValueError, match="qo_indptr"):
        w.run(pb.q[:-1], (pb.k_cache, pb.v_cache))


def test_forward_overwrites_window_and_leaks_as_the_formula_says():
    """Deprecated forward(window_left=W) sets self._window_left (prefill.py:2136), so run()'s assert
    passes; with the mask compiled out each CTA of CTA_TILE_Q packed rows starts at the window start
    of its first row, kv_start = max(0, kv_len - qo_len + t*CTA/g - W), and every row attends from
    there to its causal limit (the GUIDE's measured formula, built here without the kernel model)."""
    w, pb, (qs, ks, vs) = _planned(CASE, -1)
    out = w.forward(pb.q, (pb.k_cache, pb.v_cache), causal=True, window_left=4)
    assert w._window_left == 4 and w._module["use_sliding_window"] is False
    g, cta = CASE.group_size, w.last_model.plan.cta_tile_q
    expect = []
    for p, e, q, k, v in zip(CASE.prefix_lens, CASE.extend_lens, qs, ks, vs):
        kv = p + e
        masks = np.zeros((CASE.num_qo_heads, e, kv), bool)
        for row in range(e):
            for h in range(CASE.num_qo_heads):
                t = (row * g + h % g) // cta
                start = max(0, kv - e + (t * cta) // g - 4)
                masks[h, row, start: kv - e + row + 1] = True
        expect.append(masked_attention(q, k, v, masks))
    expect = torch.cat(expect)
    assert torch.allclose(out.double(), expect, atol=8e-3)
    ref = _ref(CASE, qs, ks, vs)
    assert (out.double() - ref).abs().max() > 0.1  # and it is not the windowed answer
    assert w.last_model.statuses[0] == "leak" and w.last_model.statuses[1] == "leak"


def test_plan_with_window_is_exact():
    w, pb, (qs, ks, vs) = _planned(CASE, 4, causal=True)
    out = w.run(pb.q, (pb.k_cache, pb.v_cache), window_left=4)
    assert out.dtype == torch.bfloat16
    assert (out.double() - _ref(CASE, qs, ks, vs)).abs().max() < 1e-2
    assert set(w.last_model.statuses) == {"exact"}


def test_undefined_request_is_nan():
    """Split-KV sized at plan for no window, run for a window: not a function of the inputs."""
    case = Case((200,), (16,), num_qo_heads=8, num_kv_heads=8, head_dim=64, page_size=1, window_left=16)
    w, pb, _ = _planned(case, -1)
    out = w.forward(pb.q, (pb.k_cache, pb.v_cache), causal=True, window_left=16)
    assert w.last_model.statuses == ["undefined"]
    assert torch.isnan(out.float()).all()


def test_page_size_one_tuple_of_3d_buffers_like_sglang():
    """sglang hands the pool's (k_buffer, v_buffer), each (tokens, H, D), with page_size 1."""
    case = CASE.with_(page_size=1)
    qs, ks, vs = random_inputs(case, seed=3)
    pb = build_paged_batch(qs, ks, vs, 1, seed=3)
    w = ModelPagedPrefillWrapper(WS, "NHD", backend="fa2")
    w.plan(pb.qo_indptr, pb.kv_indptr, pb.kv_indices, pb.last_page_len, 8, 2, 64, 1, window_left=4,
           causal=True, q_data_type="bfloat16")
    out = w.run(pb.q, (pb.k_cache[:, 0], pb.v_cache[:, 0]))
    assert (out.double() - _ref(case, qs, ks, vs)).abs().max() < 1e-2


def test_unsupported_inputs_are_refused_not_guessed():
    w = ModelPagedPrefillWrapper(WS, "NHD", backend="fa2")
    z = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="custom mask"):
        w.plan(z, z, z[:1], torch.ones(1, dtype=torch.int32), 4, 4, 128, 1, custom_mask=torch.ones(1, dtype=bool))
    with pytest.raises(NotImplementedError):
        ModelPagedPrefillWrapper(WS, "NHD", use_cuda_graph=True)


def _ragged(case: Case, plan_window_left: int, backend: str, seed: int = 1, **plan):
    """A ragged stand-in planned over ``case`` (no prefix) and run through the deprecated forward with
    the case's window: ``(output, qs, ks, vs)``."""
    qs, ks, vs = random_inputs(case, seed=seed)
    r = RaggedModelWrapper(WS, "NHD", backend=backend)
    ind = torch.tensor([0, *np.cumsum(case.extend_lens)], dtype=torch.int32)
    r.begin_forward(ind, ind, case.num_qo_heads, case.num_kv_heads, case.head_dim, window_left=plan_window_left,
                    q_data_type=torch.bfloat16, **plan)
    o = r.forward(torch.cat(qs), torch.cat(ks), torch.cat(vs), causal=True, window_left=case.window_left)
    return o, qs, ks, vs


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_ragged_stand_in_is_exact_with_the_window_planned(backend):
    case = Case((0, 0), (7, 9), num_qo_heads=4, num_kv_heads=2, head_dim=64, window_left=3)
    o, qs, ks, vs = _ragged(case, 3, backend)
    assert (o.double() - _ref(case, qs, ks, vs)).abs().max() < 1e-2


def test_ragged_stand_in_planned_without_the_window_is_causal_on_fa3():
    """The module is picked at plan (prefill.py:3129-3130): fa3 without the window module ignores the
    forward's window entirely."""
    case = Case((0,), (300,), num_qo_heads=4, num_kv_heads=2, head_dim=64, window_left=40)
    o, qs, ks, vs = _ragged(case, -1, "fa3")
    causal = _ref(case.with_(window_left=-1), qs, ks, vs)
    assert (o.double() - causal).abs().max() < 1e-2 and (o.double() - _ref(case, qs, ks, vs)).abs().max() > 0.1


def test_ragged_stand_in_planned_without_the_window_starts_each_fa2_cta_at_its_first_rows_window():
    """fa2's ragged kernel starts CTA ``t`` at key ``kv + t * CTA_TILE_Q / group - qo - W`` with the
    run's ``W`` (flashinfer 0.7.2 prefill.cuh:3037-3039) and applies no per-element window when the
    plan compiled none; rows pack as ``row * group + head % group``. CTA_TILE_Q is 128 here (packed
    query length 600 > 64 at head_dim 64: utils.cuh FA2DetermineCtaTileQ); no split-KV (disabled)."""
    qo, w, g = 300, 40, 2
    case = Case((0,), (qo,), num_qo_heads=4, num_kv_heads=2, head_dim=64, window_left=w)
    o, qs, ks, vs = _ragged(case, -1, "fa2", disable_split_kv=True)
    r, j, h = np.arange(qo)[None, :, None], np.arange(qo)[None, None, :], np.arange(4)[:, None, None]
    start = np.maximum(qo + ((r * g + h % g) // 128 * 128) // g - qo - w, 0)
    mask = (j <= r) & (j >= start)  # (Hq, qo, kv)
    want = masked_attention(qs[0], ks[0], vs[0], mask, 1.0 / math.sqrt(64))
    assert (o.double() - want).abs().max() < 1e-2
    assert (o.double() - _ref(case, qs, ks, vs)).abs().max() > 0.1  # and it is not the window


def test_decode_stand_in_is_exact():
    case = Case((0, 0), (7, 9), num_qo_heads=4, num_kv_heads=2, head_dim=64, window_left=3)
    qs, ks, vs = random_inputs(case, seed=1)

    d = DecodeModelWrapper(WS, "NHD", backend="fa2")
    pb = build_paged_batch([q[-1:] for q in qs], ks, vs, 4, seed=2)
    d.plan(pb.kv_indptr, pb.kv_indices, pb.last_page_len, 4, 2, 64, 4, window_left=3, q_data_type=torch.bfloat16)
    o = d.forward(pb.q, (pb.k_cache, pb.v_cache), window_left=3)
    want = torch.cat([masked_attention(q[-1:], k, v, intended_mask(k.shape[0] - 1, 1, 3)) for q, k, v in zip(qs, ks, vs)])
    assert (o.double() - want).abs().max() < 1e-2
    assert math.isfinite(float(o.float().sum()))
