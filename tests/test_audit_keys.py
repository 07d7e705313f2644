"""The audit on the device sglang dispatches to, its key-level verdicts and its live judging (on CPU)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from conftest import skip_module_unless
import torch

skip_module_unless("sglang")

from swa_repro.cli import main  # noqa: E402
from swa_repro.core.reference import visible  # noqa: E402
from swa_repro.engine.tolerance import ATOL, RTOL  # noqa: E402
from swa_repro.sglang.audit import calls as ac  # noqa: E402
from swa_repro.sglang.audit import core as audit  # noqa: E402
from swa_repro.sglang.audit import env  # noqa: E402
from swa_repro.sglang.audit import keys as audit_keys  # noqa: E402
from swa_repro.sglang.audit import live as audit_live  # noqa: E402
from swa_repro.sglang.audit import paths as ap  # noqa: E402

SWA, FULL = ap.LayerConfig(8, 0.0), ap.LayerConfig(-1, 0.0)


@pytest.fixture(scope="module")
def runs():
    return {(p, c.name): ap.drive(p, c) for p in ("extend_paged", "extend_ragged_no_prefix", "target_verify_eagle",
                                                  "target_verify_dflash") for c in (SWA, FULL)}


# ----------------------------------------------------------------------------- the device
def test_the_audit_follows_the_platform(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ap.audit_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ap.audit_device() == "cpu"


def _force_cuda_dispatch(monkeypatch):
    """What a GPU host does to sglang at import: CUDA kernels for the KV write (memory_pool.py:93, :146)."""
    import sglang.jit_kernel.kvcache  # noqa: F401
    from sglang.srt.mem_cache import memory_pool

    monkeypatch.setattr(memory_pool, "_is_cuda", True)
    monkeypatch.setattr(memory_pool, "can_use_store_cache", lambda n: True)


def test_cpu_tensors_under_cuda_dispatch_reproduce_the_gpu_failure(monkeypatch):
    """Without the check, sglang's CUDA store path raises on the audit's CPU tensors (the false
    all-clear seen on the H200): the regression the check below guards against."""
    _force_cuda_dispatch(monkeypatch)
    monkeypatch.setattr(ap, "dispatch_mismatch", lambda device: None)
    run = ap.drive("extend_paged", SWA, device="cpu")
    assert run.status == "sglang raised" and "memory_pool.py" in run.error


def test_a_dispatch_mismatch_is_named_and_the_audit_exits_1(monkeypatch, capsys):
    _force_cuda_dispatch(monkeypatch)
    monkeypatch.setattr(ap, "audit_device", lambda: "cpu")
    run = ap.drive("extend_paged", SWA)
    assert run.status == "harness" and "memory_pool._is_cuda=True" in run.error
    assert main(["audit", "--mode", "model", "--paths", "extend_paged"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("audit incomplete") and "no path x layer run was driven" in err
    assert sum("extend_paged/" in ln and "memory_pool._is_cuda=True" in ln for ln in err.splitlines()) == 4


def test_incomplete_names_every_undriven_path_but_absent_ones():
    d = {"driven": [{"path": "decode", "layer": "swa8", "plans": ["P.plan(window_left=8)"]}], "not_driven": [
        {"path": "target_verify_dflash", "layer": "swa8", "status": "absent", "why": "no DFlash"},
        {"path": "target_verify_eagle", "layer": "swa8", "status": "sglang raised", "why": "TypeError"}]}
    assert audit.incomplete(d) == ["target_verify_eagle/swa8: sglang raised: TypeError"]
    assert audit.incomplete({"driven": [], "not_driven": []}) == ["no path x layer run was driven"]
    # a run said driven with no plan() call recorded is no evidence (issue #43: a damaged cache entry)
    assert audit.incomplete({"driven": [{"path": "decode", "layer": "swa8", "plans": []}], "not_driven": []}) == [
        "decode/swa8: driven, but no plan() call recorded"]


# ----------------------------------------------------------------------------- keys
def _requests(run):
    (p,) = [p for p in ac.pairs(run) if p.cls == "BatchPrefillWithPagedKVCacheWrapper"]
    return audit_keys.call_keys(p, run.snapshot, run.layer_window)


def test_paged_only_keys_are_the_last_window_plus_extend_tokens(runs):
    """sglang trims the SWA wrapper's KV to the last W + extend keys (flashinfer_backend.py:1698-1704):
    the key positions, read back through req_to_token, say so."""
    for rk in _requests(runs["extend_paged", "swa8"]):
        seq = int(rk.q_pos[-1]) + 1
        assert rk.k_pos.tolist() == list(range(max(seq - 8 - len(rk.rows), 0), seq))


def test_eagle_verify_reads_the_first_keys_of_the_request_not_the_last(runs):
    """EAGLE's generate_attn_arg_prefill gets no kv_start_idx (flashinfer_backend.py:1880-1887,
    eagle_info.py:113-121), so its SWA wrapper reads positions 0.. instead of the window; DFlash's
    gets it (:1871-1878) and reads the window."""
    eagle, dflash = _requests(runs["target_verify_eagle", "swa8"]), _requests(runs["target_verify_dflash", "swa8"])
    assert eagle[0].k_pos.tolist() == list(range(0, 12))  # committed 20 + 4 drafts: the window is 12..23
    assert dflash[0].k_pos.tolist() == list(range(12, 24))
    stages = audit_keys.keys_of_run(runs["target_verify_eagle", "swa8"])
    assert stages["eager"]["missing_keys"] > 0 and audit_keys.verdict(stages) == "extra"


def test_extra_keys_against_an_independent_window_rule(runs):
    """Unpatched paged fa2 is a tile-granular leak; a ragged call without the window is plain
    causal: extra keys = causal keys outside ``visible`` (core.reference), counted here directly."""
    run = runs["extend_ragged_no_prefix", "swa8"]
    (p,) = ac.pairs(run)
    expect = 0
    for rk in audit_keys.call_keys(p, run.snapshot, 8):
        q, k = rk.q_pos[:, None], rk.k_pos[None, :]
        expect += int(((k <= q) & ~visible(q, k, 8)).sum())
    assert audit_keys.keys_of_run(run)["eager"]["extra_keys"] == expect > 0
    assert audit_keys.verdict(audit_keys.keys_of_run(runs["extend_ragged_no_prefix", "full"])) == "exact"


# ----------------------------------------------------------------------------- live judging
def causal_executor(snap):
    """A kernel that ignores every window: plain causal over the call's KV (what fa3 does unplanned)."""
    from swa_repro.core.reference import masked_attention

    def execute(trace, p, ws):
        fwd = p.fwd[1]
        out = torch.zeros(fwd["q"].shape)
        for rk in audit_keys.call_keys(p, snap, -1):  # window -1: every causal key is "intended"
            k, v = audit_live._kv(p, fwd, rk.k_index)
            out[rk.rows] = masked_attention(fwd["q"][rk.rows], k, v, rk.intended, 0.125).float()
        return out, "causal"  # audit.live.Executor's (output, backend ran)
    return execute


@pytest.mark.parametrize("path", ["extend_paged", "extend_ragged_no_prefix"])
def test_live_judging_counts_the_rows_a_windowless_kernel_gets_wrong(runs, path):
    run = runs[path, "swa8"]
    s = audit_live.live_of_run(run, causal_executor(run.snapshot))
    expect = sum(int((((rk.k_pos[None] <= rk.q_pos[:, None]) & ~rk.intended).any(1)).sum())
                 for p in ac.pairs(run) for rk in audit_keys.call_keys(p, run.snapshot, 8))
    assert s["executed"] == 1 and s["wrong_rows"] == expect > 0 and s["backends"] == ["causal"]
    assert s["max_err_uncapped"] == s["max_err_intended"] > ATOL


def test_live_judging_on_the_kernel_model_agrees_with_the_key_level_prediction(runs):
    s = audit_live.live_of_run(runs["extend_paged", "swa8"], audit_live.model_executor())
    assert s["model_agrees"] is True and s["wrong_rows"] == s["predicted_wrong_rows"] == 29
    assert audit_live.live_of_run(runs["extend_paged", "full"], audit_live.model_executor())["wrong_rows"] == 0


def _ragged_call(qo: int = 300, w: int = 40, seed: int = 0):
    """A ragged fa2 call planned without the window and run with ``w`` on the kernel-model stand-in (the
    ragged prefix extend of 0.5.23 on an A100), as a Pair with its tensors: ``(pair, output, snapshot)``."""
    from swa_repro.kernel.wrappers import RaggedModelWrapper

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(qo, h, 64, generator=g).to(torch.bfloat16) for h in (4, 2, 2))
    ind = torch.tensor([0, qo], dtype=torch.int32)
    wrapper = RaggedModelWrapper(torch.empty(16, dtype=torch.uint8), "NHD", backend="fa2")
    wrapper.begin_forward(ind, ind, 4, 2, 64, q_data_type=torch.bfloat16, disable_split_kv=True)
    out = wrapper.forward(q, k, v, causal=True, window_left=w)
    plan = {"qo_indptr": ind, "kv_indptr": ind, "num_qo_heads": 4, "num_kv_heads": 2, "head_dim_qk": 64,
            "window_left": -1, "disable_split_kv": True, "fixed_split_size": None, "causal": True, "sm_scale": None,
            "logits_soft_cap": None}
    fwd = {"q": q, "k": k, "v": v, "window_left": w, "causal": True, "logits_soft_cap": None}
    p = ac.Pair("eager", env.RAGGED, "auto", 0, (0, plan, ("begin_forward", set())),
                        (1, fwd, ("forward", set())))
    return p, out, {"positions": torch.arange(qo)}


def test_the_live_judge_predicts_with_the_backend_that_ran():
    """A wrapper built with ``auto`` that FlashInfer ran as fa2 (an A100; the H100 run's sm80 class):
    predicted with fa2's CTA leak the model explains every row; read as the recorded ``auto`` (held as
    plain causal, as until 2026-12-05) it does not. Either way the rows past the window are wrong."""
    p, out, snap = _ragged_call()
    as_ran = audit_live.judge(p, out, snap, 40, 0.0, ran="fa2")
    recorded = audit_live.judge(p, out, snap, 40, 0.0)
    assert as_ran.wrong_rows == recorded.wrong_rows > 0
    assert as_ran.max_err_predicted <= ATOL and as_ran.max_excess_predicted <= ATOL
    assert recorded.max_err_predicted > ATOL
    assert as_ran.predicted_wrong_rows == as_ran.wrong_rows < recorded.predicted_wrong_rows


def test_the_model_agrees_within_a_bf16_ulp_of_the_reference_not_beyond():
    """``model_agrees``: every element within ``ATOL + RTOL * |reference|`` (torch.isclose's rule). An
    output 0.9 bf16 ulp off a large reference agrees though it is past ATOL alone; 0.1 off does not."""
    from swa_repro.core.reference import masked_attention

    p, _, snap = _ragged_call(w=1000)  # a window past the prompt: every causal key is intended
    fwd = dict(p.fwd[1], v=p.fwd[1]["v"].double() * 40)  # outputs of tens, as an uncapped Gemma-2 call's
    big = ac.Pair(p.stage, p.cls, p.backend, p.wrapper, p.plan, (p.fwd[0], fwd, p.fwd[2]))
    qo = len(snap["positions"])
    causal = torch.arange(qo)[None, :] <= torch.arange(qo)[:, None]  # what a window of 1000 leaves
    ref = masked_attention(fwd["q"], fwd["k"], fwd["v"], causal.numpy(), 1 / 8)
    for out, agrees in ((ref * (1 + 0.9 * RTOL), True), (ref + 0.1, False)):
        o = audit_live.judge(big, out, snap, 1000, 0.0, ran="fa2")
        assert o.max_err_predicted > ATOL
        assert audit_live.summarize([o])["model_agrees"] is agrees, (o.max_err_predicted, o.max_excess_predicted)


def test_the_jit_warm_up_stops_waiting_at_the_deadline_and_says_so(runs):
    """A GPU step out of time still writes what it ran: a build past the live budget is left running
    (``audit.live.warm_calls``), not waited for until the step is killed with nothing written."""
    import threading
    import time

    run, released = runs["extend_paged", "swa8"], threading.Event()

    def building(trace, p, ws):
        released.wait(10)
        return None, None
    t = time.monotonic()
    got = audit_live.warm_calls([(run, building)], deadline=t + 0.3)
    assert time.monotonic() - t < 5 and got and set(got.values()) == {"still building at the live time budget's end"}
    released.set()
    done = audit_live.warm_calls([(run, lambda trace, p, ws: (None, None))], deadline=time.monotonic() + 30)
    assert all(isinstance(v, float) for v in done.values())


def test_a_build_left_running_does_not_hold_the_process_at_exit(runs):
    """The warm-up's threads are daemons: a ``ThreadPoolExecutor``'s are joined at interpreter exit,
    and on the H100 of 2026-12-06 both sites' processes, their JSON written, waited on fa3 builds until
    the step's timeout killed them."""
    import threading
    import time

    run, released = runs["extend_paged", "swa8"], threading.Event()
    before = set(threading.enumerate())

    def building(trace, p, ws):
        released.wait(10)
        return None, None
    try:
        audit_live.warm_calls([(run, building)], deadline=time.monotonic() + 0.2)
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        assert left and all(t.daemon for t in left), [(t.name, t.daemon) for t in left]
    finally:
        released.set()


def test_a_call_whose_module_did_not_build_is_said_not_run_and_the_others_run(runs):
    """``audit.live.unwarmed``: the judged pass skips a call whose module the warm-up left building (its
    first call would wait on the build past every deadline: on the H100 of 2026-12-06 no call after it
    ran) or failed, with the warm-up's words, and still runs the calls whose module built."""
    building, built = runs["extend_ragged_no_prefix", "swa8"], runs["extend_paged", "swa8"]
    sig_building, sig_built = (repr(audit_live.module_signature(r.trace, ac.pairs(r)[0])) for r in (building, built))
    assert sig_building != sig_built
    skip = audit_live.unwarmed({sig_building: "still building at the live time budget's end", sig_built: 0.1})
    model, ran = audit_live.model_executor(), []

    def counted(trace, p, ws):
        ran.append(p.cls)
        return model(trace, p, ws)
    said = audit_live.live_of_run(building, counted, skip=skip)
    assert ran == [] and said["executed"] == 0
    assert said["errors"] == ["not run: its module's warm-up: still building at the live time budget's end"]
    judged = audit_live.live_of_run(built, counted, skip=skip)
    assert ran == [ac.pairs(built)[0].cls] and judged["executed"] == 1 and not judged["errors"]


def test_the_reference_in_row_blocks_is_the_whole_calls(runs, monkeypatch):
    """``audit.live._err`` judges ROW_BLOCK rows at a time (a 4096 window's call in one piece ran a GPU
    out of memory): blocks of 3 rows give the same per-row errors as one block."""
    run = runs["extend_paged", "swa8"]
    (p,) = ac.pairs(run)
    out, _ = audit_live.model_executor()(run.trace, p, {})
    whole = audit_live.judge(p, out, run.snapshot, 8, 0.0)
    monkeypatch.setattr(audit_live, "ROW_BLOCK", 3)
    blocked = audit_live.judge(p, out, run.snapshot, 8, 0.0)
    assert whole.rows > 3 and whole.wrong_rows > 0
    # Counts exactly; the float64 maxima to rounding: a reduction over 3 rows and over all of them may
    # take another BLAS kernel (seen: max_excess_predicted 1e-17 apart in the 17th digit).
    for k, v in dataclasses.asdict(whole).items():
        b = getattr(blocked, k)
        if isinstance(v, float) and isinstance(b, float):
            assert math.isclose(b, v, rel_tol=1e-9, abs_tol=1e-12), k
        else:
            assert b == v, k
