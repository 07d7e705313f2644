"""sglang's real FlashInferAttnBackend on CPU: unpatched leaks past the window, patched is exact;
only the wrapper classes and the Triton kv-indices kernel are replaced, and only inside the run."""

from __future__ import annotations

import os

import pytest

from conftest import skip_module_unless
import torch

from swa_repro.core.case import Case

skip_module_unless("sglang", reason="the harness drives sglang's own backend: install sglang==0.5.15.post1")

from swa_repro.sglang import harness as H  # noqa: E402

# several query tiles (CTA_TILE_Q 128 = 32 rows x 4 heads), a prefix longer than the window, GQA
LONG = Case((0, 150), (96, 40), num_qo_heads=8, num_kv_heads=2, head_dim=64, page_size=16, window_left=32, name="long")
SHORT = Case((0, 0, 0), (3, 4, 5), window_left=4, name="upstream_no_prefix_3_4_5")


@pytest.fixture(scope="module")
def long_runs():
    return {p: H.run_case(LONG, p, "model") for p in (False, True)}


def test_unpatched_fails_the_long_case_patched_passes(long_runs):
    un, pa = long_runs[False], long_runs[True]
    assert not un.passed and un.max_abs_err > 0.05
    assert pa.passed and pa.max_abs_err < pa.atol
    assert set(pa.model.statuses) == {"exact"} and "leak" in un.model.statuses
    assert un.why["max_extra_keys_per_row"] > 0 and un.why["first_leaking_row"]["position"] >= 1
    assert len(un.outputs) == 2 and un.outputs[0].shape == (96, 8, 64)


def test_plan_kwargs_sglang_issues(long_runs):
    """The SWA wrapper (the one forward() is called on) is planned without window_left unpatched,
    with the layer's window patched; the full-attention wrapper never gets one; page_size 1."""
    for patched, want in ((False, None), (True, 32)):
        tr = long_runs[patched].trace
        fwd = tr.calls[H.swa_forward_index(tr)]
        assert fwd.kwargs["window_left"] == 32  # forward(window_left=W) either way
        plans = {k["wrapper"]: k for k in long_runs[patched].plan_kwargs}
        assert plans[fwd.wrapper].get("window_left") == want
        assert all("window_left" not in k for w, k in plans.items() if w != fwd.wrapper)
        call = next(c for c in tr.calls if c.method == "begin_forward" and c.wrapper == fwd.wrapper)
        assert call.args[7] == 1  # page_size
        # sglang trimmed each request's paged KV to the last W + extend keys (:1698-1704)
        assert (call.args[1][1:] - call.args[1][:-1]).tolist() == [96, 40 + 32]


def test_no_prefix_short_case_passes_both_ways():
    for p in (False, True):
        r = H.run_case(SHORT, p, "model")
        assert r.passed, (p, r.max_abs_err, r.why)
    assert not H.reaches_past_window(SHORT)


def test_deterministic_route_plans_fixed_split():
    r = H.run_case(Case((0,), (12,), window_left=4, name="d"), False, "model", route="deterministic")
    assert not r.passed
    kws = [k for k in r.plan_kwargs]
    assert kws and all(k["fixed_split_size"] == 4096 for k in kws)  # SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE default
    assert not any(c.cls.endswith("RaggedKVCacheWrapper") and c.method != "__init__" for c in r.trace.calls)


def test_everything_is_restored_after_a_run(long_runs):
    fb = H.backend_module()
    for n in H.WRAPPER_NAMES:
        assert n not in fb.__dict__ or not getattr(fb.__dict__[n], "__name__", "").startswith("Model")
    assert type(fb.create_flashinfer_kv_indices_triton).__name__ == "JITFunction"
    assert os.environ.get("SGLANG_FLASHINFER_USE_PAGED") is None
    cls = fb.FlashInferIndicesUpdaterPrefill
    assert not hasattr(cls.call_begin_forward, "__swa_repro_state__")


def test_torch_kv_indices_matches_the_triton_kernel_contract():
    req_to_token = torch.arange(40, dtype=torch.int32).reshape(2, 20) + 100
    out = torch.full((12,), -1, dtype=torch.int32)
    H.TorchKvIndices()[(2,)](req_to_token, torch.tensor([1, 0]), torch.tensor([3, 5]), torch.tensor([0, 3, 8]),
                             torch.tensor([2, 10]), out, 20)
    assert out[:8].tolist() == [122, 123, 124, 110, 111, 112, 113, 114] and out[8:].eq(-1).all()


def test_reaches_past_window():
    assert H.reaches_past_window(Case((4,), (2,), window_left=4))  # row 1 at pos 5 would see key 0
    assert not H.reaches_past_window(Case((3,), (2,), window_left=4))
    assert not H.reaches_past_window(Case((9,), (1,), window_left=4))  # one row: the trim is exact


@pytest.mark.gpu
def test_live_unpatched_fails_patched_passes():
    un, pa = H.run_case(LONG, False, "live"), H.run_case(LONG, True, "live")
    assert not un.passed and pa.passed
