"""live.py: CPU-checkable parts (plan-info decoding, module keys, clear errors) + real-kernel runs (gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swa_repro.core.errors import UsageError
from swa_repro.core.case import Case
from swa_repro.kernel.model import simulate
from swa_repro.kernel.live import FA2_PLAN_FIELDS, module_key, plan_info_dict, require_cuda, run_live

SEED = Case(prefix_lens=(0, 0, 0), extend_lens=(6, 8, 12), window_left=4)


def test_fa2_plan_info_names_cta_tile_q_and_split_kv():
    vec = list(range(15))
    vec[3], vec[14] = 64, 1
    d = plan_info_dict(vec, "fa2")
    assert d["cta_tile_q"] == 64 and d["split_kv"] is True and d["raw"] == vec
    assert FA2_PLAN_FIELDS[3] == "cta_tile_q" and FA2_PLAN_FIELDS[14] == "split_kv"


def test_fa3_plan_info_has_no_cta_tile_q():
    d = plan_info_dict([0] * 8 + [1], "fa3")
    assert d["same_schedule_for_all_heads"] == 1 and d["split_kv"] is False and d["cta_tile_q"] is None


def test_unknown_plan_info_is_kept_raw():
    assert plan_info_dict(None, "fa2") == {"raw": None}
    assert plan_info_dict([1, 2, 3], "fa2") == {"raw": [1, 2, 3]}


def test_module_key_follows_plan_window_not_forward_window():
    """plan() passes `window_left >= 0` as use_sliding_window (prefill.py:2035 / :3689)."""
    assert module_key(SEED)[8] is False
    assert module_key(SEED.with_(plan_window_left=4))[8] is True
    assert module_key(SEED.with_(backend="auto"))[0] == "fa3"  # sm90 default arch
    assert module_key(SEED.with_(head_dim=64))[5:7] == (64, 64)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_no_cuda_is_a_usage_error():
    with pytest.raises(UsageError, match="CUDA"):
        require_cuda()
    with pytest.raises(UsageError, match="CUDA"):
        run_live(SEED)


def test_bad_api_is_a_usage_error():
    with pytest.raises(UsageError, match="api"):
        run_live(SEED, api="call")


@pytest.mark.gpu
def test_forward_after_plan_without_window_leaks_like_the_model():
    res = run_live(SEED, api="forward")
    assert res.error is None and res.module["use_sliding_window"] is False
    assert "use_swa_False" in res.module["uri"]
    assert all(np.nanmax(e) < 0.05 for e in res.err_vs_model)
    assert simulate(SEED).statuses == ["leak"] * 3 and max(np.nanmax(e) for e in res.err_vs_reference) > 0.1


@pytest.mark.gpu
def test_run_with_window_after_plan_without_it_asserts():
    res = run_live(SEED, api="run")
    assert res.error and res.error.startswith("AssertionError") and "window_left" in res.error


@pytest.mark.gpu
def test_plan_with_window_is_exact():
    res = run_live(SEED.with_(plan_window_left=4), api="run")
    assert res.error is None and res.module["use_sliding_window"] is True
    assert all(np.nanmax(e) < 0.05 for e in res.err_vs_reference)


# ----------------------------------------------------------------------------- fake flashinfer on CPU
def _fake_flashinfer(case):
    """A stand-in ``flashinfer`` with the real wrapper's plan/forward/run contract (module chosen
    at plan from ``window_left >= 0``; forward overwrites the window; run asserts it), computing
    through the kernel model's masks of ``case`` with ``window_left`` as planned."""
    import types

    from swa_repro.kernel.probe import mask_attention_fn, model_masks

    fi = types.ModuleType("flashinfer")
    fi.__version__ = "0.7.2.post1"
    prefill = types.ModuleType("flashinfer.prefill")

    def get_batch_prefill_module(backend, *args):
        return types.SimpleNamespace(backend=backend, swa=args[7])

    def get_batch_prefill_uri(backend, *args):
        return f"batch_prefill_hd{args[4]}_use_swa_{args[7]}" + ("_sm90" if backend == "fa3" else "")

    class Wrapper:
        def __init__(self, ws, layout="NHD", use_cuda_graph=False, backend="auto"):
            self._float_workspace_buffer, self._backend = ws, backend

        def plan(self, qo, kvp, kvi, last, hq, hk, d, ps, causal=False, window_left=-1, q_data_type=None,
                 kv_data_type=None, disable_split_kv=False, **kw):
            if self._backend == "auto":
                self._backend = "fa3"
            self._cached_module = prefill.get_batch_prefill_module(  # the module global, as prefill.py does
                self._backend, q_data_type, kv_data_type, q_data_type, kvp.dtype, d, d, 0, window_left >= 0, False, False)
            self._plan_info = [0, 0, 0, 16] + [0] * 10 + [0] if self._backend == "fa2" else [0] * 9
            self._window_left = window_left
            self._fn = mask_attention_fn(case, model_masks(case))

        def forward(self, q, kv, causal=False, window_left=-1):
            self._window_left = window_left
            return self.run(q, kv)

        def run(self, q, kv, window_left=None):
            window_left = self._window_left if window_left is None else window_left
            assert window_left == self._window_left
            b = self._batch._replace_caches(q, *kv)
            return self._fn(b, 0)

    prefill.get_batch_prefill_module = get_batch_prefill_module
    prefill.get_batch_prefill_uri = get_batch_prefill_uri
    fi.prefill = prefill
    fi.BatchPrefillWithPagedKVCacheWrapper = Wrapper
    return fi, prefill, Wrapper


@pytest.fixture
def fake_fi(monkeypatch):
    import sys

    from swa_repro.kernel import live
    from swa_repro.core.batch import PagedBatch

    def install(case, layout):
        fi, prefill, wrapper = _fake_flashinfer(case)
        monkeypatch.setitem(sys.modules, "flashinfer", fi)
        monkeypatch.setitem(sys.modules, "flashinfer.prefill", prefill)
        monkeypatch.setattr(live.KernelRunner, "needs_cuda", False)
        monkeypatch.setattr(PagedBatch, "_replace_caches", lambda self, q, k, v: PagedBatch(
            q, k, v, layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.last_page_len, layout.page_size),
            raising=False)
        wrapper._batch = layout
        return prefill

    return install


@pytest.mark.parametrize("plan_w,backend", [(-1, "fa2"), (4, "fa2"), (-1, "auto")])
def test_runner_and_probe_wiring_on_fake_flashinfer(fake_fi, plan_w, backend):
    from swa_repro.kernel.live import KernelRunner
    from swa_repro.kernel.probe import probe_case, probe_layout

    case = Case(prefix_lens=(3, 0), extend_lens=(9, 5), window_left=4, plan_window_left=plan_w, backend=backend,
                head_dim=64)
    layout = probe_layout(case)
    prefill = fake_fi(case, layout)
    runner = KernelRunner(case, layout)
    assert prefill.get_batch_prefill_module.__name__ == "get_batch_prefill_module"  # spy removed after plan
    d = runner.describe()
    assert d["use_sliding_window"] is (plan_w >= 0) and d["module"].endswith(
        f"use_swa_{plan_w >= 0}" + ("_sm90" if backend == "auto" else ""))
    assert d["backend"] == case.resolved_backend and d["split_kv"] is False
    assert d["cta_tile_q"] == (16 if backend == "fa2" else None)
    res = probe_case(case, runner=runner)
    assert res.statuses == simulate(case).statuses and res.plan_info == d
    assert set(res.timings) >= {"jit_build", "plan", "probe", "random"}
    # after forward(window_left=4) the wrapper's window is 4, so run(window_left=4) passes (prefill.py:2136)
    runner.run(layout.q, layout.k_cache, layout.v_cache, api="run")
    fresh = KernelRunner(case, layout)
    if plan_w == -1:  # plan without the window, then run(window_left=4): run()'s consistency assert
        from swa_repro.kernel.live import _describe_exception

        with pytest.raises(AssertionError) as ei:
            fresh.run(layout.q, layout.k_cache, layout.v_cache, api="run")
        text = _describe_exception(ei.value)
        assert text.startswith("AssertionError") and "assert window_left == self._window_left" in text
    else:
        fresh.run(layout.q, layout.k_cache, layout.v_cache, api="run")


@pytest.mark.parametrize("suffixes", [None, {("equal", "full"): "_pkv_equal", ("independent", "paged"): "_pkv_ind"}])
def test_jit_library_bytes_counts_suffixed_builds(tmp_path, monkeypatch, suffixes):
    """0.7.2+ build an fa2 module under its uri plus a stride-mode suffix; those count, and a
    longer uri that merely starts with this one (fa3's ``..._sm90``) does not."""
    jit_env = pytest.importorskip("flashinfer.jit.env")
    modules = pytest.importorskip("flashinfer.jit.attention.modules")
    from swa_repro.kernel.live import jit_library_bytes

    monkeypatch.setattr(jit_env, "FLASHINFER_JIT_DIR", tmp_path)
    if suffixes is None:
        monkeypatch.delattr(modules, "_BATCH_PREFILL_MODULE_URI_SUFFIX", raising=False)
    else:
        monkeypatch.setattr(modules, "_BATCH_PREFILL_MODULE_URI_SUFFIX", suffixes, raising=False)
    names = {"m": 10, "m_sm90": 1000} | ({"m_pkv_equal": 200, "m_pkv_ind": 3000} if suffixes else {})
    for name, size in names.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.so").write_bytes(b"x" * size)
    assert jit_library_bytes(["m", "absent"]) == {"m": 10 + (200 + 3000 if suffixes else 0)}
