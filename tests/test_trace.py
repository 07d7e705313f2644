"""Traces: every wrapper call recorded by value, saved and loaded intact; replay needs CUDA."""

from __future__ import annotations

import pytest
import torch

from swa_repro.cli import main
from swa_repro.core.batch import build_paged_batch, random_inputs
from swa_repro.core.case import Case
from swa_repro.core.errors import UsageError
from swa_repro.kernel.wrappers import ModelPagedPrefillWrapper
from swa_repro.sglang.trace import Trace, decode, encode, record_class, replay

CASE = Case((0, 9), (6, 3), num_qo_heads=4, num_kv_heads=4, head_dim=64, page_size=16, window_left=4)


def _record(plan_window_left: int, device="cpu", cls=ModelPagedPrefillWrapper):
    qs, ks, vs = random_inputs(CASE, seed=0)
    pb = build_paged_batch(qs, ks, vs, CASE.page_size, seed=0).to(device)
    tr = Trace(meta={"case": "t"})
    make = record_class(cls, tr, "BatchPrefillWithPagedKVCacheWrapper")
    w = make(torch.empty(1 << 20, dtype=torch.uint8, device=device), "NHD", backend="fa2")
    kw = {"window_left": plan_window_left} if plan_window_left >= 0 else {}
    w.begin_forward(pb.qo_indptr, pb.kv_indptr, pb.kv_indices, pb.last_page_len, 4, 4, 64, 16,
                    q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, **kw)
    out = w.forward(pb.q, (pb.k_cache, pb.v_cache), causal=True, window_left=4)
    return tr, pb, out, w


def test_round_trip(tmp_path):
    tr, pb, out, w = _record(-1)
    assert [c.method for c in tr.calls] == ["__init__", "begin_forward", "forward"]
    assert tr.calls[0].args[0]["__workspace__"] == 1 << 20  # the workspace by size, not by bytes
    p = tr.save(tmp_path / "t.pt")
    back = Trace.load(p)
    assert back.meta == {"case": "t"}
    assert [(c.wrapper, c.cls, c.method) for c in back.calls] == [(c.wrapper, c.cls, c.method) for c in tr.calls]
    assert torch.equal(back.calls[1].args[2], pb.kv_indices)
    assert decode(back.calls[1].kwargs)["q_data_type"] is torch.bfloat16
    assert torch.equal(back.calls[2].result, out)
    k, v = decode(back.calls[2].args[1])
    assert torch.equal(k, pb.k_cache) and torch.equal(v, pb.v_cache)
    # the proxy forwards attribute reads to the wrapper
    assert w.is_cuda_graph_enabled is False and w._window_left == 4


def test_plan_kwargs_show_window_absent_vs_present():
    assert "window_left" not in Trace.plan_kwargs(_record(-1)[0])[0]
    assert Trace.plan_kwargs(_record(4)[0])[0]["window_left"] == 4


def test_arguments_are_copied_before_the_call():
    tr, pb, _, w = _record(4)
    pb.kv_indices.zero_()  # sglang reuses its index buffers between batches
    assert not torch.equal(tr.calls[1].args[2], pb.kv_indices)


def test_a_raising_call_is_recorded_with_its_error():
    tr, pb, _, w = _record(-1)
    w.begin_forward(pb.qo_indptr, pb.kv_indptr, pb.kv_indices, pb.last_page_len, 4, 4, 64, 16)
    with pytest.raises(AssertionError):
        w.run(pb.q, (pb.k_cache, pb.v_cache), window_left=4)
    assert tr.calls[-1].method == "run" and tr.calls[-1].error.startswith("AssertionError")


def test_encode_decode_nested():
    x = {"a": (1, torch.float16, [torch.arange(3)]), "b": None}
    y = decode(encode(x))
    assert y["a"][0] == 1 and y["a"][1] is torch.float16 and torch.equal(y["a"][2][0], torch.arange(3))


def test_shared_workspace_is_reallocated_once():
    ws = torch.empty(64, dtype=torch.uint8)
    a, b, c = encode(ws, workspace=True), encode(ws, workspace=True), encode(torch.empty(64, dtype=torch.uint8), workspace=True)
    cache = {}
    da, db = decode(a, workspaces=cache), decode(b, workspaces=cache)
    assert da is db and da.numel() == 64 and not da.any()
    assert (decode(c, workspaces=cache) is da) == (c["id"] == a["id"])


def test_load_refuses_other_files(tmp_path):
    p = tmp_path / "x.pt"
    torch.save({"hello": 1}, p)
    with pytest.raises(ValueError, match="not a swa-repro trace"):
        Trace.load(p)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_replay_without_cuda_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(UsageError, match="needs a CUDA device"):
        replay(_record(-1)[0])
    p = _record(-1)[0].save(tmp_path / "t.pt")
    assert main(["replay", str(p)]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA device" in err and len(err.strip().splitlines()) == 1
    assert main(["replay", str(tmp_path / "missing.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("plan_window_left", [-1, 4])
def test_replay_model_trace_on_real_flashinfer(plan_window_left):
    """The model's recorded prediction matches the real kernel fed the same calls."""
    tr, *_ = _record(plan_window_left)
    reps = replay(tr, atol=2e-2)
    assert reps and all(r.ok for r in reps), [(r.method, r.why, r.max_abs_vs_recorded) for r in reps]
