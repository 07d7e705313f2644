"""vLLM live step (issue #27): the CPU model of what each kernel is told, held to a reference built
here from the same tensors; the cache-write port; the recording of real FlashInfer; the per-request
split and the report. The release driven end to end on the CPU model is `matrix` (a vLLM wheel and
minutes of float64); on a GPU it is scripts/gpu_vllm.sh."""

from __future__ import annotations

import json
import math
import sys
import types

import pytest


def _paged(kv_len: int, heads: int, dim: int, page: int, layout: str, seed: int = 0):
    """A cache of shuffled pages holding ``kv_len`` keys -> (cache, k, v, page list)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(kv_len, heads, dim, generator=g) for _ in range(2))
    n = math.ceil(kv_len / page)
    order = torch.randperm(n + 2, generator=g)[:n]
    cache = torch.zeros(n + 2, 2, page, heads, dim)
    for i, p in enumerate(order.tolist()):
        rows = slice(i * page, min((i + 1) * page, kv_len))
        cache[p, 0, : rows.stop - rows.start], cache[p, 1, : rows.stop - rows.start] = k[rows], v[rows]
    if layout == "HND":
        cache = cache.transpose(2, 3).contiguous()
    return cache, k, v, order.to(torch.int32)


def _reference(q, k, v, window: int, scale: float, cap: float):
    """Written out here: softmax(scale * q.k, capped) over keys p - window .. p of the last rows."""
    import torch

    n, rows = k.shape[0], q.shape[0]
    out = torch.zeros(rows, q.shape[1], q.shape[2], dtype=torch.float64)
    for r in range(rows):
        p = n - rows + r
        lo = 0 if window < 0 else max(0, p - window)
        s = torch.einsum("hd,khd->hk", q[r].double(), k[lo:p + 1].double()) * scale
        if cap:
            s = cap * torch.tanh(s / cap)
        out[r] = torch.einsum("hk,khd->hd", torch.softmax(s, -1), v[lo:p + 1].double())
    return out


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("window", [-1, 5])
@pytest.mark.parametrize("q_len", [1, 3])
def test_the_decode_model_attends_what_it_is_told_and_takes_no_cap(layout, window, q_len):
    """XQA / trtllm-gen decode modelled: the window and bmm1_scale it is given, never a cap."""
    import torch

    from swa_repro.vllm.audit.live_kernels import told_decode

    lens = [23, 9]
    caches = [_paged(n, 2, 8, 4, layout, seed=i) for i, n in enumerate(lens)]
    # one cache holding both requests: the second request's pages shifted past the first's
    cache = torch.cat([c[0] for c in caches])
    tables = torch.zeros(2, 8, dtype=torch.int32)
    tables[0, :len(caches[0][3])] = caches[0][3]
    tables[1, :len(caches[1][3])] = caches[1][3] + caches[0][0].shape[0]
    q = torch.randn(2 * q_len, 2, 8, generator=torch.Generator().manual_seed(7)) * 4
    out = told_decode(q, cache, None, tables, torch.tensor(lens), max(lens), bmm1_scale=0.3, window_left=window,
                      kv_layout=layout, q_len_per_req=q_len)
    for b, (_, k, v, _) in enumerate(caches):
        ref = _reference(q[b * q_len:(b + 1) * q_len], k, v, window, 0.3, 0.0)
        assert torch.allclose(out[b * q_len:(b + 1) * q_len].double(), ref, atol=1e-5)
        assert not torch.allclose(ref, _reference(q[b * q_len:(b + 1) * q_len], k, v, window, 0.3, 2.0), atol=1e-3)


@pytest.mark.parametrize("planned_window, planned_cap", [(5, 2.0), (-1, 0.0)])
def test_the_wrapper_models_run_what_their_plan_compiled(planned_window, planned_cap):
    """The recorded paged-prefill and decode models attend with the window and cap their plan gave
    the module (``paths.told``'s rule), each request over its own pages."""
    import torch

    from swa_repro.vllm.audit import env as standins
    from swa_repro.vllm.audit.live_kernels import ToldDecode, ToldPaged

    rec = standins.Recorder()
    lens, q_lens = [13, 6], [4, 2]
    cache, k, v, pages = _paged(lens[0], 2, 8, 4, "NHD")
    cache2, k2, v2, pages2 = _paged(lens[1], 2, 8, 4, "NHD", seed=1)
    both = torch.cat([cache, cache2])
    indices = torch.cat([pages, pages2 + cache.shape[0]])
    indptr = torch.tensor([0, len(pages), len(pages) + len(pages2)], dtype=torch.int32)
    last = torch.tensor([(n - 1) % 4 + 1 for n in lens], dtype=torch.int32)
    q = torch.randn(sum(q_lens), 2, 8, generator=torch.Generator().manual_seed(3)) * 3
    paged = standins.recording_wrapper("BatchPrefillWithPagedKVCacheWrapper", ToldPaged, rec)(torch.zeros(8))
    paged.plan(torch.tensor([0, 4, 6], dtype=torch.int32), indptr, indices, last, 2, 2, 8, 4, causal=True,
               sm_scale=0.4, window_left=planned_window, logits_soft_cap=planned_cap)
    out = paged.run(q, both)
    for (lo, hi), kk, vv in (((0, 4), k, v), ((4, 6), k2, v2)):
        ref = _reference(q[lo:hi], kk, vv, planned_window, 0.4, planned_cap)
        assert torch.allclose(out[lo:hi].double(), ref, atol=1e-5)
    decode = standins.recording_wrapper("BatchDecodeWithPagedKVCacheWrapper", ToldDecode, rec)(torch.zeros(8))
    decode.plan(indptr, indices, last, 2, 2, 8, 4, window_left=planned_window, logits_soft_cap=planned_cap,
                sm_scale=0.4)
    out = decode.run(q[[3, 5]], both)
    for row, (i, kk, vv) in enumerate(((3, k, v), (5, k2, v2))):
        assert torch.allclose(out[row].double(), _reference(q[i:i + 1], kk, vv, planned_window, 0.4, planned_cap)[0],
                              atol=1e-5)
    assert [c["method"] for c in rec.calls] == ["__init__", "plan", "run", "__init__", "plan", "run"]


def test_a_window_set_after_plan_does_not_reach_the_modelled_module():
    """A wrapper planned without a window runs without one, whatever is set on it later (a
    ``fast_decode_plan`` replay sets values, never the module)."""
    import torch

    from swa_repro.vllm.audit import env as standins
    from swa_repro.vllm.audit.live_kernels import ToldDecode

    cache, k, v, pages = _paged(13, 1, 4, 4, "NHD")
    rec = standins.Recorder()
    w = standins.recording_wrapper("BatchDecodeWithPagedKVCacheWrapper", ToldDecode, rec)(torch.zeros(8))
    w.plan(torch.tensor([0, len(pages)], dtype=torch.int32), pages, torch.tensor([1], dtype=torch.int32), 1, 1, 4, 4,
           window_left=-1, sm_scale=0.5)
    standins.fast_decode_plan(rec)(w, torch.tensor([0, len(pages)]), pages, torch.tensor([1]), 1, 1, 4, 4,
                                   window_left=3, sm_scale=0.5)
    q = torch.randn(1, 1, 4) * 3
    out = w.run(q, cache, window_left=3)
    assert torch.allclose(out.double(), _reference(q, k, v, -1, 0.5, 0.0), atol=1e-5)
    assert not torch.allclose(out.double(), _reference(q, k, v, 3, 0.5, 0.0), atol=1e-3)


def test_the_cache_write_port_puts_each_token_at_its_slot():
    """vLLM's reshape_and_cache_flash, registered in torch: token t to block slot // B, offset slot % B
    of the views the release passes (strided views of one cache)."""
    import torch

    from swa_repro.vllm.audit.live_kernels import register_cache_op

    register_cache_op()
    register_cache_op()  # once is enough; twice is harmless
    cache = torch.zeros(3, 2, 4, 8)  # (blocks, heads, block, 2 * dim): vLLM's (B, H, N, 2*hs)
    kc, vc = cache.transpose(1, 2).split(4, dim=-1)
    key, value = torch.randn(5, 2, 4), torch.randn(5, 2, 4)
    slots = torch.tensor([9, 0, 3, 4, 11])
    torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, kc, vc, slots, "auto", torch.ones(()), torch.ones(()))
    for t, s in enumerate(slots.tolist()):
        assert torch.equal(cache[s // 4, :, s % 4, :4], key[t]) and torch.equal(cache[s // 4, :, s % 4, 4:], value[t])
    assert int((cache != 0).any(-1).any(1).sum()) == 5
    with pytest.raises(NotImplementedError, match="bf16"):
        torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, kc, vc, slots, "fp8", torch.ones(()), torch.ones(()))


@pytest.mark.parametrize("cap, dim, scale", [(50.0, 256, 1 / 16), (30.0, 128, 128 ** -0.5)])
def test_the_amplitude_brings_the_logits_to_twice_the_cap(cap, dim, scale):
    import torch

    from swa_repro.vllm.audit.live import amplitude

    a = amplitude(scale, dim, cap)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4000, dim, generator=g) * a, torch.randn(4000, dim, generator=g) * a
    std = float(((q * k).sum(-1) * scale).std())
    assert abs(std / (2 * cap) - 1) < 0.1
    assert amplitude(scale, dim, None) == 1.0


def test_each_request_is_judged_against_the_kernel_that_ran_it():
    """Decodes first (the metadata's count), the prefill kernel after; a direct call's missing cap is none."""
    from swa_repro.vllm.audit.live import told_per_request

    dec = {"target": "xqa_batch_decode_with_kv_cache", "method": "call",
           "args": {"window_left": 7, "bmm1_scale": 0.5}}
    pre = {"target": "BatchPrefillWithPagedKVCacheWrapper", "method": "run",
           "args": {"planned_window_left": 7, "planned_logits_soft_cap": 50.0, "planned_sm_scale": 0.5}}
    asked = {"window_left": 7, "logits_soft_cap": 50.0, "sm_scale": 0.5}
    got = told_per_request({"calls": [dec, pre], "num_decodes": 2}, 3, asked)
    assert [g["kernel"] for g in got] == ["xqa_batch_decode_with_kv_cache"] * 2 + ["BatchPrefillWithPagedKVCacheWrapper"]
    assert [g["logits_soft_cap"] for g in got] == [0.0, 0.0, 50.0]
    only = told_per_request({"calls": [pre], "num_decodes": 0}, 2, asked)
    assert {g["kernel"] for g in only} == {"BatchPrefillWithPagedKVCacheWrapper"}


def test_real_flashinfer_is_recorded_and_still_runs(monkeypatch):
    """``install_real`` over a flashinfer-shaped package: its classes become recording subclasses in
    every module that has them, its functions recorders that call the real one."""
    from swa_repro.vllm.audit import env as standins
    from swa_repro.vllm.audit.live_kernels import install_real

    ran = []

    class Paged:
        def __init__(self, workspace, kv_layout="NHD"):
            self._window_left, self._logits_soft_cap, self._sm_scale = -1, None, None

        def plan(self, qo_indptr, window_left=-1, logits_soft_cap=None, sm_scale=None):
            self._window_left, self._logits_soft_cap, self._sm_scale = window_left, logits_soft_cap, sm_scale

        def run(self, q, cache, out=None):
            ran.append("run")
            return q

    def xqa(query, window_left=-1, bmm1_scale=1.0):
        ran.append("xqa")
        return query

    root, dec, pre = (types.ModuleType(n) for n in ("flashinfer", "flashinfer.decode", "flashinfer.prefill"))
    root.BatchPrefillWithPagedKVCacheWrapper = pre.BatchPrefillWithPagedKVCacheWrapper = Paged
    dec.xqa_batch_decode_with_kv_cache = xqa
    root.decode, root.prefill = dec, pre
    for m in (root, dec, pre):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    rec = standins.Recorder()
    got = install_real(rec)
    w = root.BatchPrefillWithPagedKVCacheWrapper(None)
    assert isinstance(w, Paged) and pre.BatchPrefillWithPagedKVCacheWrapper is got["BatchPrefillWithPagedKVCacheWrapper"]
    w.plan([0, 1], window_left=4, logits_soft_cap=30.0, sm_scale=0.5)
    assert w.run("q", "cache") == "q"
    assert dec.xqa_batch_decode_with_kv_cache("q", window_left=4, bmm1_scale=0.5) == "q"
    assert ran == ["run", "xqa"]
    from swa_repro.vllm.audit.paths import told

    calls = {c["target"]: c for c in rec.calls if c["method"] in ("run", "call")}
    assert told(calls["BatchPrefillWithPagedKVCacheWrapper"])["logits_soft_cap"] == 30.0
    assert told(calls["xqa_batch_decode_with_kv_cache"])["logits_soft_cap"] == "not passed"


def _doc(rows, device="cpu"):
    return {"vllm": "0.33.0", "device": device, "arch": [9, 0], "flashinfer": "x", "kernels": "k", "torch": "t",
            "families": {"gemma2": {"family": {}, "rows": rows}}}


def _row(layer, path, wrong=0, off_asked=0, off_hf=0, agrees=True):
    return {"layer": layer, "path": path, "asked": {"window_left": 7, "logits_soft_cap": 50.0},
            "kernels": [{"kernel": "xqa", "told_window_left": 7, "told_logits_soft_cap": 0.0}],
            "cap": {"wrong_rows": wrong, "told_agrees": agrees, "requests": [{"rows": 3, "max_err_asked": 0.5}]},
            "keys": {"rows_off_asked": off_asked, "rows_off_hf": off_hf}}


def test_the_report_words_come_from_the_numbers():
    from swa_repro.vllm.audit.live_report import render, verdict

    fam = _doc([_row("full", "decode", wrong=3), _row("sliding", "decode", off_hf=2),
                {"layer": "sliding", "path": "prefill", "not_run": "the live budget ran out"}])["families"]["gemma2"]
    assert verdict(fam) == ("3 wrong rows; 2 rows attend other keys than transformers' mask; every kernel does what "
                            "it is told; 1 paths not run")
    clean = _doc([_row("full", "decode")])["families"]["gemma2"]
    assert verdict(clean).startswith("every row as the layers ask; keys as transformers' mask")
    text = "\n".join(render({"shipped": _doc([_row("full", "decode", wrong=3, agrees=False)])}))
    assert "3 of 3 rows wrong" in text and "**the kernel does not do what it is told**" in text


def test_merge_orders_rows_and_refuses_two_sites(tmp_path):
    from swa_repro.vllm.audit.live_report import main, merge

    a = _doc([_row("full", "spec_decode"), _row("sliding", "decode")])
    b = _doc([_row("full", "decode"), _row("full", "prefill")])
    m = merge([a, b])
    assert [(r["layer"], r["path"]) for r in m["families"]["gemma2"]["rows"]] == [
        ("full", "decode"), ("full", "spec_decode"), ("full", "prefill"), ("sliding", "decode")]
    with pytest.raises(ValueError, match="device"):
        merge([a, _doc([], device="NVIDIA H100")])
    files = []
    for i, d in enumerate((a, b)):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps(d))
    assert main(["--merge", str(tmp_path / "m.json"), *map(str, files)]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["merged_from"] == 2


def _live(overlay, deps, tmp_path, name, families, paths, arch="9.0"):
    import subprocess

    out = tmp_path / f"{name}.json"
    p = subprocess.run([sys.executable, "-m", "swa_repro.vllm.audit.live", "--overlay", str(overlay), "--deps", str(deps),
                        "--out", str(out), "--families", families, "--paths", paths, "--device", "cpu",
                        "--arch", arch, "--repeats", "1"], check=False, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    return {(f, r["layer"], r["path"]): r for f, fam in json.loads(out.read_text())["families"].items()
            for r in fam["rows"]}


@pytest.mark.matrix
def test_release_033_on_the_cpu_model_sm90_drops_gemma2s_cap_in_xqa_and_the_fix_keeps_it(tmp_path):
    """vLLM 0.33.0's own backend on sm90, its outputs against a reference from the batch's own
    tensors: XQA's decode rows are wrong for Gemma-2 (no cap) while the kernel does what it is told;
    Cohere2's sliding layer attends one key more than transformers' mask (layer != HF) and exactly
    its own window; with --fix cap-route Gemma-2's decode runs on the decode wrapper with its cap."""
    from swa_repro.vllm.fix.fixes import fixed_overlay
    from swa_repro.vllm.provision import provision

    overlay, _ = provision("0.33.0")
    shipped = _live(overlay, overlay / ".deps", tmp_path, "shipped", "gemma2", "decode,cuda_graph_decode")
    shipped.update(_live(overlay, overlay / ".deps", tmp_path, "cohere2", "cohere2", "decode"))
    for kind in ("full", "sliding"):
        for path in ("decode", "cuda_graph_decode"):
            g = shipped[("gemma2", kind, path)]
            assert [k["kernel"] for k in g["kernels"]] == ["xqa_batch_decode_with_kv_cache"]
            assert g["cap"]["wrong_rows"] == 3 and g["cap"]["told_agrees"] and g["keys"]["rows_off_asked"] == 0
        c = shipped[("cohere2", kind, "decode")]
        assert c["cap"]["wrong_rows"] == 0 and c["keys"]["rows_off_asked"] == 0
        assert c["keys"]["rows_off_hf"] == (2 if kind == "sliding" else 0)  # the 6000 and 4097 requests
    assert shipped[("gemma2", "full", "cuda_graph_decode")]["stages"].keys() == {"capture", "replay"}
    fixed = _live(fixed_overlay("0.33.0", overlay), overlay / ".deps", tmp_path, "fixed", "gemma2", "decode")
    for kind in ("full", "sliding"):
        g = fixed[("gemma2", kind, "decode")]
        assert [k["kernel"] for k in g["kernels"]] == ["BatchDecodeWithPagedKVCacheWrapper"]
        assert g["kernels"][0]["told_logits_soft_cap"] == 50.0 and g["cap"]["wrong_rows"] == 0


def test_an_interrupt_keeps_what_was_judged_and_says_the_rest(monkeypatch):
    """The step's timeout (SIGINT) mid-path: the paths judged before stay, this one and every later
    one are rows saying so, and the document is still returned (to be written)."""
    from swa_repro.vllm.audit import live
    from swa_repro.vllm.audit import paths as vp

    drive = types.SimpleNamespace(fam={})
    built = (drive, None, {"window_left": 7, "logits_soft_cap": None, "sm_scale": 0.5, "sinks": False})
    monkeypatch.setattr(vp, "prepare", lambda *a, **k: ({None: None}, "L", [("full", built), ("sliding", built)]))
    calls = []

    def run_path(*a, **k):
        calls.append(a[6])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"path": a[6]}

    monkeypatch.setattr(live, "run_path", run_path)
    monkeypatch.setattr(live, "STOPPED", [])
    fam = {"layers": {"full": {"hf_window_left": -1}, "sliding": {"hf_window_left": 7}}, "hf_cap": None}
    doc = live.family(None, fam, None, "cpu", (9, 0), ["decode", "mixed", "prefill"], 0, 1, None)
    assert calls == ["decode", "mixed"]
    assert [r.get("not_run") for r in doc["rows"]] == [None] + ["interrupted by the step's timeout"] * 5
