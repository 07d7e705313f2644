"""The live re-issue of a CUDA-graph verify call (``audit.live._execute``): the fresh wrapper is planned
with index tensors of the dtype sglang planned and its buffers hold, as FlashInfer's kernel needs.

The H100 call of 2026-12-06 (recordings/family-live/0.5.23/call-20261206T1653-h100-checkpoints-sm90-warm)
died of "an illegal memory access" on the warm-up of the two custom-mask ``use_cuda_graph`` signatures:
the re-issued plan was handed what the run read from the buffers as int64 (``graph_buffers.paged_reads``),
over sglang's int32 buffers. FlashInfer picks the module's IdType from the plan's ``paged_kv_indptr.dtype``
(0.7.2 prefill.py:2985), casts the int64 into the int32 buffers with ``copy_`` (:2799-2807) and its kernel
reads each buffer as ``IdType*`` unchecked (csrc/batch_prefill_paged.cuh:76-84). Oracle: the dtypes of
the buffers sglang 0.5.23 allocates (flashinfer_backend.py:474-479, :485-487, :1107-1111: int32), as the
recorded constructor holds them, and the recorded plan's own dtypes.
"""

from __future__ import annotations

import pytest
import torch

from swa_repro.kernel import graph_buffers
from swa_repro.kernel.wrappers import unpack_paged_kv_cache
from swa_repro.sglang.audit.env import PAGED

INDEX = ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len")


def _paged(graph: bool, dtype=torch.int32):
    from swa_repro.sglang.audit.env import STAND_INS

    bufs = {"qo_indptr_buf": torch.zeros(3, dtype=dtype), "paged_kv_indptr_buf": torch.zeros(3, dtype=dtype),
            "paged_kv_indices_buf": torch.zeros(16, dtype=dtype), "paged_kv_last_page_len_buf": torch.zeros(2, dtype=dtype),
            "custom_mask_buf": torch.zeros(64, dtype=torch.uint8), "mask_indptr_buf": torch.zeros(3, dtype=dtype)}
    return STAND_INS[PAGED](torch.zeros(1024, dtype=torch.uint8), "NHD", use_cuda_graph=graph, **(bufs if graph else {}))


def _plan(w, dtype):
    w.plan(torch.tensor([0, 2, 4], dtype=dtype), torch.tensor([0, 1, 2], dtype=dtype), torch.tensor([0, 1], dtype=dtype),
           torch.tensor([3, 3], dtype=dtype), 2, 1, 8, 4, custom_mask=torch.ones(12, dtype=torch.bool),
           causal=True, q_data_type=torch.bfloat16)


def test_a_graph_wrapper_planned_int64_over_int32_buffers_is_refused_with_the_buffer_named():
    with pytest.raises(ValueError, match=r"paged_kv_indptr of torch.int64 over the torch.int32 qo_indptr_buf.*illegal"):
        _plan(_paged(True), torch.int64)
    _plan(_paged(True), torch.int32)  # sglang's own: int32 over int32
    _plan(_paged(True, torch.int64), torch.int64)  # one IdType throughout: what the kernel reads is what was built
    _plan(_paged(False), torch.int64)  # eager: plan rebinds the buffers to its own tensors (prefill.py:2836-2845)


@pytest.fixture(scope="module")
def graph_run():
    pytest.importorskip("sglang")
    from conftest import release_overlay

    from swa_repro.sglang.audit import paths as ap

    release_overlay("0.5.23")
    run = ap.drive("cuda_graph_verify", ap.LayerConfig(8, 0.0))
    assert run.status == "driven", run.error
    return run


@pytest.mark.slow
def test_the_reissued_graph_plan_has_the_dtypes_sglang_planned_and_its_buffers_hold(graph_run, monkeypatch, capsys):
    from swa_repro.sglang.audit import calls as ac
    from swa_repro.sglang.audit import live
    from swa_repro.sglang.audit.env import STAND_INS

    planned = []

    class Seen(STAND_INS[PAGED]):
        def plan(self, *args, **kwargs):
            planned.append((self, kwargs))
            return super().plan(*args, **kwargs)

        begin_forward = plan  # sglang plans through it (the stand-in's alias binds the base plan)

    monkeypatch.setenv(live.ANNOUNCE_ENV, "1")
    ex = live.Executor(lambda cls: Seen if cls == PAGED else STAND_INS[cls], "cpu")
    graph = [p for p in ac.pairs(graph_run) if getattr(graph_run.trace.calls[p.fwd[0]], "reads", None) is not None]
    assert {p.stage for p in graph} == {"capture", "replay"}
    for p in graph:
        ex(graph_run.trace, p, {})
    assert len(planned) == len(graph)
    for p, (w, kw) in zip(graph, planned):
        c = graph_run.trace.calls[p.plan[0]]
        recorded = ac.bind(p.cls, c.method, c.args, c.kwargs)
        for name in INDEX:
            assert kw[name].dtype == recorded[name].dtype == torch.int32, name
            assert getattr(w, f"_{name}_buf").dtype == torch.int32
        assert kw["paged_kv_indices"].tolist() == p.plan[1]["paged_kv_indices"].tolist()  # what the run read, kept
        # the other bounds the kernel relies on hold (the candidates ruled out): batch size, index and mask
        # buffers long enough, every page read inside the cache given at forward, q's rows = qo_indptr[-1]
        qo, ip, last = kw["qo_indptr"], kw["paged_kv_indptr"], kw["paged_kv_last_page_len"]
        assert len(qo) == len(w._qo_indptr_buf) and len(kw["paged_kv_indices"]) <= len(w._paged_kv_indices_buf)
        k_cache, _ = unpack_paged_kv_cache(p.fwd[1]["paged_kv_cache"])
        assert int(kw["paged_kv_indices"][: int(ip[-1])].max()) < k_cache.shape[0]
        assert p.fwd[1]["q"].shape[0] == int(qo[-1])
        sizes = [q * k for q, k in zip((qo[1:] - qo[:-1]).tolist(), graph_buffers.kv_lens(ip, last, kw["page_size"]))]
        assert len(kw["custom_mask"]) == sum(sizes) and sum(-(-n // 8) for n in sizes) <= len(w._custom_mask_buf)
    lines = [ln.split()[1:] for ln in capsys.readouterr().err.splitlines() if ln.startswith("live: ")]
    assert [ln[0] for ln in lines] == ["launching", "returned"] * len(graph)
    assert all(ln[1] == "cuda_graph_verify" and PAGED in ln for ln in lines)
    assert [int(ln[-2].removeprefix("forward=#")) for ln in lines] == [p.fwd[0] for p in graph for _ in (0, 1)]


def test_no_launch_line_unless_asked(monkeypatch, capsys):
    import types

    from swa_repro.sglang.audit import live

    monkeypatch.delenv(live.ANNOUNCE_ENV, raising=False)
    p = types.SimpleNamespace(stage="capture", cls=PAGED, wrapper=7, plan=(1,), fwd=(2,), backend="fa2")
    live.announce(types.SimpleNamespace(meta={"path": "x"}), p, "launching")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(live.ANNOUNCE_ENV, "1")
    live.announce(types.SimpleNamespace(meta={"path": "x"}), p, "launching")
    assert capsys.readouterr().err.startswith("live: launching x ")


def test_the_graph_buffers_rule_names_every_buffer_the_kernel_reads_as_idtype():
    name, attrs = graph_buffers.ID_BUFFERS["paged"]
    assert name == "paged_kv_indptr" and {a.removeprefix("_").removesuffix("_buf") for a in attrs} == {
        *INDEX, "mask_indptr"}


def test_the_h100_calls_built_the_graph_verify_signature_as_a_module_of_its_own():
    """The evidence, read from the returned files: in the cold sm90 call the CUDA-graph verify signatures were
    still building when their eager twins (the same FlashInfer module key but for the index dtype: the
    mask and use_cuda_graph pick no module, prefill.py:2975-2990) were built, with the plain module of
    their head_dim; in the warm call right after, their warm-up raised the illegal memory access."""
    import ast
    import json
    import lzma

    from conftest import REPO

    base = REPO / "recordings/family-live/0.5.23"
    warm = {}
    for call in ("call-20261206T1644-h100-checkpoints-sm90", "call-20261206T1653-h100-checkpoints-sm90-warm"):
        doc = json.loads(lzma.decompress((base / call / "family-live-shipped.json.xz").read_bytes()))
        warm[call[:18]] = {ast.literal_eval(k): v for k, v in doc["live"]["warmup"].items()}
    cold, hot = warm["call-20261206T1644"], warm["call-20261206T1653"]
    for hd in (128, 256):
        graph, eager, plain = ((PAGED, "fa2", False, False, m, g, False, hd) for m, g in ((True, True), (True, False),
                                                                                           (False, False)))
        assert cold[graph].startswith("still building") and abs(cold[eager] - cold[plain]) < 1  # one module, one build
        assert isinstance(cold[eager], float)
        assert "illegal memory access" in hot[graph] or "BatchPrefillWithPagedKVCache failed" in hot[graph]
