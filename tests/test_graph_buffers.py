"""FlashInfer's CUDA-graph-mode buffer rules in every CPU stand-in (``kernel.graph_buffers``, #40 point 1).

Oracles: the packed layout written out by hand; the rules read in the installed flashinfer's own
``prefill.py`` at the lines ``graph_buffers`` cites (0.6.12, the base venv's); and two wrappers built
as sglang 0.5.23 builds its CUDA-graph verify wrappers (one ``custom_mask_buf``, a ``mask_indptr_buf``
each: flashinfer_backend.py:1134-1138, :1182-1186), whose runs must read what was planned last.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from swa_repro.engine.standins import PagedStandIn, RaggedStandIn
from swa_repro.kernel import graph_buffers as gb
from swa_repro.sglang.fix.upstream_cpu import PlanTimePaged

WS = torch.zeros(8, dtype=torch.uint8)
QO, KV = 2, 5  # one request: 2 queries over 5 keys (page size 1)


def test_pack_is_flashinfers_little_endian_per_segment():
    bits = torch.tensor([1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1], dtype=torch.bool)
    packed, indptr = gb.pack_segments(bits, [0, 9, 12])  # 9 bits -> 2 bytes, 3 bits -> 1 byte
    assert packed.tolist() == [0b1, 0b1, 0b101] and indptr.tolist() == [0, 2, 3]
    assert gb.unpack_segments(packed, indptr, [9, 3]).tolist() == bits.tolist()


def _lines(path: Path, a: int, b: int) -> str:
    return "".join(path.read_text().splitlines(keepends=True)[a - 1: b])


def test_the_cited_lines_hold_the_rules_in_the_installed_flashinfer():
    flashinfer = pytest.importorskip("flashinfer")
    if flashinfer.__version__ != "0.6.12":
        pytest.skip(f"the lines are checked against 0.6.12, not {flashinfer.__version__}")
    src = Path(flashinfer.__file__).with_name("prefill.py")
    assert "self._custom_mask_buf = custom_mask_buf" in _lines(src, 1672, 1672)
    assert "self._paged_kv_indices_buf[: len(paged_kv_indices)].copy_(" in _lines(src, 1962, 1970)
    graph = _lines(src, 1972, 1987)
    assert "self._custom_mask_buf[: len(packed_custom_mask)].copy_(" in graph
    assert "self._mask_indptr_buf.copy_(mask_indptr" in graph
    eager = _lines(src, 1999, 2008)
    assert "self._custom_mask_buf = packed_custom_mask.to(" in eager and "self._custom_mask_buf = None" in eager
    assert "if self._custom_mask_buf is not None:" in _lines(src, 2375, 2375)
    assert 'bitorder="little"' in _lines(src, 1888, 1901)
    ragged = _lines(src, 3019, 3030)
    assert "self._custom_mask_buf[: len(packed_custom_mask)] = packed_custom_mask" in ragged
    assert "self._custom_mask_buf = None" not in ragged  # an eager ragged plan without a mask keeps its old one


def _mask(keep_last: bool) -> torch.Tensor:
    """(QO, KV): causal, and the first key hidden from the last query unless ``keep_last``."""
    m = torch.ones(QO, KV, dtype=torch.bool).tril(KV - QO)
    m[-1, 0] = keep_last
    return m.reshape(-1)


def _wrappers(cls, graph: bool, shared: bool = True):
    """Two paged wrappers as sglang's ``_create_prefill_wrappers`` builds them (graph), or eager."""
    if not graph:
        return [cls(WS, "NHD") for _ in range(2)]
    mask = torch.zeros(64, dtype=torch.uint8)
    out = []
    for _ in range(2):
        out.append(cls(WS, "NHD", use_cuda_graph=True, qo_indptr_buf=torch.zeros(2, dtype=torch.int32),
                       paged_kv_indptr_buf=torch.zeros(2, dtype=torch.int32),
                       paged_kv_indices_buf=torch.zeros(16, dtype=torch.int32),
                       paged_kv_last_page_len_buf=torch.zeros(1, dtype=torch.int32),
                       custom_mask_buf=mask if shared else mask.clone(),
                       mask_indptr_buf=torch.zeros(2, dtype=torch.int32)))
    return out


def _plan(w, mask, window=-1):
    """int32 indices, as sglang plans them over its int32 buffers (graph_buffers.check_index_dtypes)."""
    i32 = torch.int32
    w.plan(torch.tensor([0, QO], dtype=i32), torch.tensor([0, KV], dtype=i32), torch.arange(KV, dtype=i32),
           torch.tensor([1], dtype=i32), 1, 1, 4, 1, custom_mask=mask, window_left=window)


@pytest.mark.parametrize("graph, shared, reads_own", [(False, True, True), (True, False, True), (True, True, False)])
def test_a_graph_wrapper_reads_the_mask_planned_last_into_its_buffer(graph, shared, reads_own):
    w0, w1 = _wrappers(PagedStandIn, graph, shared)
    _plan(w0, _mask(keep_last=False), window=3)  # the windowed mask first, as the fix plans wrapper 0
    _plan(w1, _mask(keep_last=True))
    w0.run(torch.zeros(QO, 1, 4), torch.zeros(KV, 2, 1, 4))
    got = gb.paged_reads(w0)["custom_mask"]
    assert torch.equal(got, _mask(keep_last=not reads_own))
    assert (w0.run_reads is None) == (not graph)
    if graph:
        assert torch.equal(w0.run_reads["custom_mask"], got)


def test_plan_time_stand_in_attends_what_the_shared_buffer_holds():
    """Exact attention of wrapper 0's queries: over the shared buffer's mask in graph mode, its own eager."""
    torch.manual_seed(0)
    q, kv = torch.randn(QO, 1, 4), torch.randn(KV, 2, 1, 4)
    outs = {}
    for graph in (False, True):
        w0, w1 = _wrappers(PlanTimePaged, graph)
        _plan(w0, _mask(keep_last=False))
        _plan(w1, _mask(keep_last=True))
        outs[graph] = w0.run(q, kv)
    assert torch.equal(outs[False][0], outs[True][0])  # row 0: the same mask in both
    assert not torch.allclose(outs[False][1], outs[True][1])  # row 1 sees key 0 only through wrapper 1's mask
    s = (q[1, 0] @ kv[:, 0, 0].T) / math.sqrt(4)
    want = torch.softmax(s.double(), -1) @ kv[:, 1, 0].double()
    assert torch.allclose(outs[True][1, 0].double(), want, atol=1e-2)


def test_graph_mode_refuses_a_mask_without_a_buffer_and_eager_forgets_it():
    w = PagedStandIn(WS, "NHD", use_cuda_graph=True, qo_indptr_buf=torch.zeros(2, dtype=torch.int32),
                     paged_kv_indptr_buf=torch.zeros(2, dtype=torch.int32),
                     paged_kv_indices_buf=torch.zeros(16, dtype=torch.int32),
                     paged_kv_last_page_len_buf=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="custom_mask_buf must be initialized"):
        _plan(w, _mask(True))
    e = PagedStandIn(WS, "NHD")
    _plan(e, _mask(True))
    _plan(e, None)
    assert e._custom_mask_buf is None and gb.paged_reads(e)["custom_mask"] is None  # causal kernel again
    r = RaggedStandIn(WS, "NHD")
    r.plan(torch.tensor([0, QO]), torch.tensor([0, KV]), 1, 1, 4, custom_mask=_mask(True))
    r.plan(torch.tensor([0, QO]), torch.tensor([0, KV]), 1, 1, 4)
    assert r._custom_mask_buf is not None  # the ragged wrapper keeps it (prefill.py:3021-3030)


INDEX = ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len")


def _graph_pair():
    """A recorded CUDA-graph forward of two wrappers sharing one mask buffer, and its effective call."""
    import types

    from swa_repro.sglang.audit import calls as ac
    from swa_repro.sglang.trace import Trace, record_class

    trace = Trace()
    make = record_class(PagedStandIn, trace, "BatchPrefillWithPagedKVCacheWrapper")
    w0, w1 = _wrappers(make, graph=True)
    _plan(w0, _mask(keep_last=False))
    _plan(w1, _mask(keep_last=True))
    w0.forward(torch.zeros(QO, 1, 4), torch.zeros(KV, 2, 1, 4), causal=True)
    run = types.SimpleNamespace(trace=trace, graph_stage=dict.fromkeys(range(len(trace.calls)), "capture"))
    (p,) = ac.pairs(run)
    return trace, p


def test_the_audit_judges_and_the_live_step_replans_a_graph_forward_on_what_its_run_read():
    """The recorder keeps what a graph wrapper's run read (``Call.reads``); ``audit.calls.pairs`` judges
    the forward on it and ``audit.live`` re-plans a fresh wrapper with it (the fresh one shares no
    buffer): wrapper 0 planned its own mask, its run read wrapper 1's."""
    from swa_repro.sglang.audit import live

    trace, p = _graph_pair()
    assert torch.equal(trace.calls[p.plan[0]].kwargs["custom_mask"], _mask(keep_last=False))  # what it planned
    assert torch.equal(p.plan[1]["custom_mask"], _mask(keep_last=True))  # what its run read

    made = []

    class Spy(PagedStandIn):
        def _plan(self, a):
            super()._plan(a)
            made.append(a.custom_mask)

    live._execute(lambda cls: Spy, trace, p, "cpu", {})
    assert len(made) == 1 and torch.equal(made[0], _mask(keep_last=True))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_a_graph_runs_reads_keep_their_buffers_dtype_and_are_not_refilled_by_a_later_plan(dtype):
    """Oracle: the dtype the buffers were built with (sglang 0.5.23's int32, flashinfer_backend.py:474-487),
    the IdType FlashInfer's kernel reads them as (0.7.2 csrc/batch_prefill_paged.cuh:76-84)."""
    w0, w1 = _wrappers(PagedStandIn, graph=True, shared=False)
    for w in (w0, w1):
        for attr in ("_qo_indptr_buf", "_paged_kv_indptr_buf", "_paged_kv_indices_buf",
                     "_paged_kv_last_page_len_buf", "_mask_indptr_buf"):
            setattr(w, attr, getattr(w, attr).to(dtype))
    ids = torch.arange(KV, dtype=dtype)
    w0.plan(torch.tensor([0, QO], dtype=dtype), torch.tensor([0, KV], dtype=dtype), ids,
            torch.tensor([1], dtype=dtype), 1, 1, 4, 1, custom_mask=_mask(True))
    w0.run(torch.zeros(QO, 1, 4), torch.zeros(KV, 2, 1, 4))
    reads = gb.paged_reads(w0)
    assert {n: reads[n].dtype for n in INDEX} == dict.fromkeys(INDEX, dtype)
    assert {n: w0.run_reads[n].dtype for n in INDEX} == dict.fromkeys(INDEX, dtype)
    w0.plan(torch.tensor([0, QO], dtype=dtype), torch.tensor([0, KV], dtype=dtype), ids.flip(0),
            torch.tensor([1], dtype=dtype), 1, 1, 4, 1, custom_mask=_mask(True))
    assert reads["paged_kv_indices"][:KV].tolist() == list(range(KV))  # what the run read, not the buffer now


def test_the_effective_call_and_its_live_replan_keep_the_int32_indices_sglang_planned():
    """``audit.calls.pairs`` puts the reads in place of the plan's arguments: the int32 the buffers hold,
    as sglang planned them; the live step re-plans a fresh wrapper with them, int32 (a module built for
    the int32 buffers: 0.7.2 prefill.py:2985 picks IdType from ``paged_kv_indptr.dtype``)."""
    from swa_repro.sglang.audit import live

    trace, p = _graph_pair()
    assert {n: p.plan[1][n].dtype for n in INDEX} == dict.fromkeys(INDEX, torch.int32)
    made = []

    class Spy(PagedStandIn):
        def _plan(self, a):
            super()._plan(a)
            made.append({n: getattr(a, n).dtype for n in INDEX})

    live._execute(lambda cls: Spy, trace, p, "cpu", {})
    assert made == [dict.fromkeys(INDEX, torch.int32)]


def test_the_live_replan_refuses_int64_reads_over_int32_buffers_before_it_plans():
    """The consumer checks, it does not repair: reads of another dtype than the buffers (a trace of the
    old int64 reads) are refused before the plan is issued (``graph_buffers.check_index_dtypes``), never
    cast behind the caller's back."""
    from dataclasses import replace

    from swa_repro.sglang.audit import live

    trace, p = _graph_pair()
    wide = {k: v.long() if k in INDEX else v for k, v in p.plan[1].items()}
    planned = []

    class Spy(PagedStandIn):
        def _plan(self, a):
            planned.append(a)

    with pytest.raises(ValueError, match=r"paged_kv_indptr of torch.int64 over the torch.int32 .*illegal"):
        live._execute(lambda cls: Spy, trace, replace(p, plan=(p.plan[0], wide, p.plan[2])), "cpu", {})
    assert planned == []
