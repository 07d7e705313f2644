"""sglang's own ``FlashInferAttnBackend`` driven down the paged-only sliding-window prefill path.

What runs is sglang 0.5.15.post1's code (``srt/layers/attention/flashinfer_backend.py``):
``FlashInferAttnBackend.__init__`` (:300) -> ``init_forward_metadata`` (:769, EXTEND branch:
``use_ragged = False`` at :824 because ``SGLANG_FLASHINFER_USE_PAGED=1`` is read at :383 into
``self.use_paged``, or because deterministic inference is on, :366) ->
``FlashInferIndicesUpdaterPrefill.update_sliding_window`` (:1653: wrapper 0 gets the last
``W + extend`` keys of each request, :1698-1704) -> ``call_begin_forward`` (:1822, the paged
``begin_forward`` at :1960) -> ``RadixAttention.forward`` -> ``forward_extend`` (:1100, the
deprecated ``prefill_wrapper_paged.forward(..., window_left=layer.sliding_window_size)`` at :1138).

Only two kinds of thing are replaced, inside :func:`sglang_env` and restored on exit:

* the three FlashInfer wrapper *classes* in the backend module's namespace: by the model
  wrappers (``mode="model"``, no CUDA) or by the real flashinfer classes (``mode="live"``), both
  behind ``trace.record_class`` so every wrapper call is recorded;
* without CUDA, the Triton kernel ``create_flashinfer_kv_indices_triton``
  (``srt/layers/attention/triton_ops/kv_indices.py:9``) by :class:`TorchKvIndices`, its torch port.

The window: sglang's ``RadixAttention.sliding_window_size`` is handed to FlashInfer unchanged as
``window_left`` (flashinfer_backend.py:1138-1156), i.e. ``W`` keys to the left of the query plus the
query itself (``W + 1`` keys; also the kit's reference, ``key_start = query_pos - window``,
dense_attention.py:826). Models convert the HF ``config.sliding_window`` (a key *count*) to
``sliding_window - 1`` (models/gemma2.py:52, gemma3_causal.py:55, gpt_oss.py:121). So ``W`` here
is ``Case.window_left`` and the reference is ``reference.visible`` with that window, computed on
the full sequences, not on sglang's trimmed KV.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as md
import math
import types
from dataclasses import dataclass, field

import numpy as np
import torch

from swa_repro.core.batch import random_inputs
from swa_repro.core.case import Case
from swa_repro.core.errors import CaseError, UsageError
from swa_repro.core.intervals import ceil_div
from swa_repro.core.mode import resolve_mode
from swa_repro.core.reference import reference_attention
from swa_repro.kernel import wrappers as mw
from swa_repro.kernel.model import ModelResult, simulate
from swa_repro.sglang.patch import classify, files, swap
from swa_repro.sglang.trace import Trace, decode, record_class

# sglang itself (and flashinfer, live mode only) is imported inside the functions that drive it:
# both are optional and slow to import, and importing this module must not need them.

MODULE = "sglang.srt.layers.attention.flashinfer_backend"
WRAPPER_NAMES = ("BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
                 "BatchDecodeWithPagedKVCacheWrapper")
MODEL_CLASSES = dict(zip(WRAPPER_NAMES, (mw.ModelPagedPrefillWrapper, mw.RaggedModelWrapper, mw.DecodeModelWrapper)))
ROUTES = ("paged", "deterministic")
ATOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-4}


class TorchKvIndices:
    """``create_flashinfer_kv_indices_triton[grid](...)`` in torch, both signatures: the historical
    one (srt/layers/attention/triton_ops/kv_indices.py:9-44: for each request, copy
    ``req_to_token[req, start : start + len]`` to ``kv_indices[indptr[i]:]``) and 0.5.23's
    (sglang/kernels/ops/attention/kv_indices.py:59-74: ``ENTRY_PAGE_SIZE`` entries per slot,
    ``TOKEN_BLOCK_PARALLEL``, ``token_mapping``; a 2-D grid)."""

    def __getitem__(self, grid):
        bs = int(grid[0])

        def launch(req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices, stride,
                   ENTRY_PAGE_SIZE=1, TOKEN_BLOCK_PARALLEL=False, token_mapping=None):
            for pid in range(bs):
                req, off = int(req_pool_indices[pid]), int(kv_indptr[pid])
                start = int(kv_start_idx[pid]) if kv_start_idx is not None else 0  # `if kv_start_idx:` (:27)
                n = int(page_kernel_lens[pid])
                pos = torch.arange(start, start + n, device=req_to_token.device)
                row = req_to_token.reshape(-1)[req * int(stride):]
                if ENTRY_PAGE_SIZE == 1:
                    ids = row[pos].long()
                else:
                    ids = row[pos // ENTRY_PAGE_SIZE].long() * ENTRY_PAGE_SIZE + pos % ENTRY_PAGE_SIZE
                if token_mapping is not None:
                    ids = torch.where(ids >= 0, token_mapping[ids.clamp(min=0)].long(), ids)
                kv_indices[off: off + n] = ids.to(kv_indices.dtype)

        return launch


def backend_module():
    return importlib.import_module(MODULE)


@contextlib.contextmanager
def _namespace(module, values: dict):
    """Set names in ``module``'s namespace; restore (or delete) them on exit."""
    missing = object()
    saved = {k: module.__dict__.get(k, missing) for k in values}
    try:
        for k, v in values.items():
            setattr(module, k, v)
        yield
    finally:
        for k, v in saved.items():
            if v is missing:
                module.__dict__.pop(k, None)
            else:
                setattr(module, k, v)


@contextlib.contextmanager
def sglang_env(mode: str, trace: Trace, gpu: mw.GpuSpec | None = None, route: str = "paged"):
    """Everything the run needs around sglang's code, restored on exit: recorded wrapper classes
    (+ the torch kv-indices port without CUDA), the paged-only env flag, single-rank parallel
    sizes (as the kit's dense_attention.py:30 does), a fresh module workspace global."""
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_parallel

    if route not in ROUTES:
        raise CaseError(f"route {route!r} unknown: use one of {', '.join(ROUTES)}")
    fb = backend_module()
    if mode == "model":
        names = {n: record_class(MODEL_CLASSES[n], trace, n, gpu=gpu or mw.GpuSpec()) for n in WRAPPER_NAMES}
        names["create_flashinfer_kv_indices_triton"] = TorchKvIndices()
    elif mode == "live":
        import flashinfer

        names = {n: record_class(getattr(flashinfer, n), trace, n) for n in WRAPPER_NAMES}
    else:
        raise CaseError(f"mode {mode!r} unknown: use model or live")
    names["global_workspace_buffer"] = None  # the module caches one (:390); don't leak it across modes
    ws = envs.SGLANG_FLASHINFER_WORKSPACE_SIZE
    with contextlib.ExitStack() as st:
        st.enter_context(_namespace(fb, names))
        st.enter_context(envs.SGLANG_FLASHINFER_USE_PAGED.override(route == "paged"))
        st.enter_context(ws.override(ws.get()))  # deterministic __init__ .set()s it (:381)
        st.enter_context(get_parallel().override(attn_tp_size=1, attn_cp_size=1))
        yield fb


# ----------------------------------------------------------------------------- building sglang's objects
def model_runner(case: Case, *, dtype, device, route: str, max_context_len: int):
    """The fields ``FlashInferAttnBackend.__init__`` and its two indices updaters read
    (flashinfer_backend.py:300-470, :1290-1305, :1558-1580), nothing else."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.test.kits.attention_unittest.mock_server_args import make_mock_server_args

    server_args = make_mock_server_args(  # a real ServerArgs with its defaults (the kit's helper)
        enable_deterministic_inference=(route == "deterministic"), enable_mis=False, dllm_algorithm=None,
        enable_two_batch_overlap=False, enable_dp_attention=False)
    bs = case.batch_size
    req_to_token_pool = ReqToTokenPool(size=bs, max_context_len=max_context_len, device=device,
                                       enable_memory_saver=False)
    token_to_kv_pool = MHATokenToKVPool(  # as the kit's MockModelRunner (dense_attention.py:385)
        size=case.page_size + bs * max_context_len + case.page_size, page_size=case.page_size, dtype=dtype,
        head_num=case.num_kv_heads, head_dim=case.head_dim, layer_num=1, device=device,
        enable_memory_saver=False, enable_alt_stream=False)
    model_config = types.SimpleNamespace(
        num_attention_heads=case.num_qo_heads, get_num_kv_heads=lambda tp: case.num_kv_heads // tp,
        head_dim=case.head_dim, context_len=max_context_len, is_multimodal=False, is_encoder_decoder=False,
        hf_config=types.SimpleNamespace(architectures=["SwaReproForCausalLM"]))
    return types.SimpleNamespace(
        req_to_token_pool=req_to_token_pool, token_to_kv_pool=token_to_kv_pool,
        token_to_kv_pool_allocator=types.SimpleNamespace(get_kvcache=lambda: token_to_kv_pool),
        is_draft_worker=False, server_args=server_args, model_config=model_config, kv_cache_dtype=dtype,
        dtype=dtype, device=device, sliding_window_size=case.window_left)


def _inputs(case: Case, runner, layer, *, dtype, device, seed: int, max_context_len: int, kit=None):
    """Seeded q/k/v (batch.random_inputs), the kit's shuffled-page token layout and ForwardBatch
    (dense_attention.py make_loc_fn, _make_forward_batch), prefix K/V written into the pool.
    ``kit``: another module with those names (the audit's ``releases_kit.kit_module()``)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if kit is None:
        from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit

    qs, ks, vs = random_inputs(case, seed=seed, dtype=dtype)
    kcase = kit.DenseAttentionCase(
        name=case.name or "swa", backend="flashinfer", forward_mode=ForwardMode.EXTEND,
        num_heads=case.num_qo_heads, num_kv_heads=case.num_kv_heads, page_size=case.page_size,
        prefix_lens=case.prefix_lens, extend_lens=case.extend_lens, sliding_window_size=case.window_left)
    loc_fn = kit.make_loc_fn("shuffled_pages", batch_size=case.batch_size, seq_lens=kcase.seq_lens,
                             prefix_lens=case.prefix_lens, page_size=case.page_size,
                             max_context_len=max_context_len, seed=seed)
    batch = kit._make_forward_batch(kcase, runner, max_context_len=max_context_len, device=device, loc_fn=loc_fn)
    locs = [loc_fn(i, p) for i, n in enumerate(case.prefix_lens) for p in range(n)]
    if locs:
        runner.token_to_kv_pool.set_kv_buffer(
            layer, torch.tensor(locs, dtype=torch.int64, device=device),
            torch.cat([k[:p] for k, p in zip(ks, case.prefix_lens)]).to(device),
            torch.cat([v[:p] for v, p in zip(vs, case.prefix_lens)]).to(device))
    q = torch.cat(qs).to(device)
    k_new = torch.cat([k[p:] for k, p in zip(ks, case.prefix_lens)]).to(device)
    v_new = torch.cat([v[p:] for v, p in zip(vs, case.prefix_lens)]).to(device)
    return (qs, ks, vs), batch, (q, k_new, v_new)


# ----------------------------------------------------------------------------- one run
@dataclass
class HarnessResult:
    case: Case
    patched: bool
    mode: str
    route: str
    outputs: list  # per request (extend, Hq, D), the backend's dtype
    reference: list  # per request (extend, Hq, D) float64, full sequences, the layer's window
    max_abs_err: float  # nan if any output is NaN
    passed: bool
    trace: Trace
    plan_kwargs: list  # what sglang gave each paged prefill wrapper's plan()
    model: ModelResult | None  # kernel model of the SWA wrapper's run, rebuilt from the trace
    why: dict = field(default_factory=dict)
    atol: float = 2e-2

    def row(self) -> dict:
        err = self.max_abs_err
        return {"case": self.case.name, "patched": self.patched, "max_abs_err": None if math.isnan(err) else err,
                "passed": self.passed, "why": self.why}


def run_case(case_spec, patched: bool, mode: str = "model", *, route: str = "paged", seed: int = 0,
             dtype=torch.bfloat16, gpu: mw.GpuSpec | None = None) -> HarnessResult:
    """Run one sliding-window EXTEND batch through sglang's FlashInfer backend, with the backend's
    two methods swapped to the fixed (``patched=True``) or original (False) form. ``route``:
    ``paged`` (SGLANG_FLASHINFER_USE_PAGED=1) or ``deterministic`` (enable_deterministic_inference,
    which also plans with fixed_split_size=4096). Inputs are seeded bf16 randn; ``passed`` is
    ``max |output - reference| <= atol`` (2e-2 for bf16) with no NaN."""
    case = case_spec if isinstance(case_spec, Case) else Case.from_dict(dict(case_spec))
    if case.window_left < 0:
        raise CaseError("the harness drives a sliding-window layer: give window_left >= 0")
    mode = resolve_mode(mode).mode  # auto -> live | model; live without CUDA/flashinfer: UsageError
    device = "cuda" if mode == "live" else "cpu"
    trace = Trace(meta={"case": case.name, "case_dict": case.to_dict(), "patched": patched, "mode": mode,
                        "route": route, "seed": seed, "dtype": str(dtype).removeprefix("torch.")})
    max_ctx = ceil_div(max(case.kv_lens), case.page_size) * case.page_size
    with sglang_env(mode, trace, gpu, route) as fb, \
            (swap.patched(fb) if patched else swap.unpatched(fb)), torch.no_grad():
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        runner = model_runner(case, dtype=dtype, device=device, route=route, max_context_len=max_ctx)
        backend = fb.FlashInferAttnBackend(runner)
        layer = RadixAttention(case.num_qo_heads, case.head_dim, case.head_dim ** -0.5, case.num_kv_heads,
                               layer_id=0, sliding_window_size=case.window_left)
        (qs, ks, vs), batch, (q, k, v) = _inputs(case, runner, layer, dtype=dtype, device=device, seed=seed,
                                                 max_context_len=max_ctx)
        with forward_context(ForwardContext(attn_backend=backend)):
            backend.init_forward_metadata(batch)
            o = layer(q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1), batch)
    o = o.view(-1, case.num_qo_heads, case.head_dim).cpu()
    outs = list(torch.split(o, list(case.extend_lens)))
    ref = reference_attention(case.prefix_lens, case.extend_lens, case.window_left, qs, ks, vs,
                              sm_scale=case.head_dim ** -0.5)
    errs = [(a.double() - r).abs() for a, r in zip(outs, ref)]
    err = max(float(e.max()) for e in errs)
    if any(torch.isnan(a.float()).any() for a in outs):  # Python's max() would not propagate a NaN
        err = float("nan")
    atol = ATOL.get(dtype, 2e-2)
    fwd = swa_forward_index(trace)
    if fwd is not None:
        trace.meta["reference"] = {"call": fwd, "output": torch.cat(ref).float(),
                                   "qo_indptr": [0, *np.cumsum(case.extend_lens).tolist()]}
    if gpu is None and mode == "live":
        gpu = mw.GpuSpec.detect()
    model = model_of_trace(trace, gpu)
    res = HarnessResult(case, patched, mode, route, outs, ref, err, bool(err <= atol), trace,
                        trace.plan_kwargs(), model, atol=atol)
    res.why = explain(res, errs)
    return res


def swa_forward_index(trace: Trace) -> int | None:
    """Index of the paged prefill forward whose output is the layer's (the only forward issued)."""
    idx = [i for i, c in enumerate(trace.calls) if c.cls == WRAPPER_NAMES[0] and c.method in ("forward", "run")]
    return idx[-1] if idx else None


def model_of_trace(trace: Trace, gpu: mw.GpuSpec | None = None) -> ModelResult | None:
    """The kernel model of the recorded SWA prefill: replay the recorded plan + forward into a
    :class:`kernel.wrappers.ModelPagedPrefillWrapper` and read the Case it builds (works for live
    traces too: it needs only the recorded arguments)."""
    fwd = swa_forward_index(trace)
    if fwd is None:
        return None
    c = trace.calls[fwd]
    plans = [p for p in trace.calls[:fwd] if p.wrapper == c.wrapper and p.method in ("plan", "begin_forward")]
    if not plans:
        return None
    w = mw.ModelPagedPrefillWrapper(torch.empty(0), "NHD", backend="fa2", gpu=gpu)
    w.plan(*decode(plans[-1].args), **decode(plans[-1].kwargs))
    kw = decode(c.kwargs)
    window = kw.get("window_left", -1) if c.method == "forward" else kw.get("window_left", w._window_left)
    return simulate(w.case(int(window)))


def explain(res: HarnessResult, errs) -> dict:
    """Which keys leaked: from the kernel model (extra keys per row, first leaking row, in absolute
    positions of the full sequence) and from the measured error (first row above tolerance)."""
    why = {}
    m = res.model
    if m is not None:
        why["plan_window_left"] = m.case.plan_window_left
        why["status"] = m.statuses
        extra = [r.extra_keys() for r in m.requests]
        why["max_extra_keys_per_row"] = int(max((int(e.max()) for e in extra), default=0))
        first = next(((i, int(np.argmax(e > 0))) for i, e in enumerate(extra) if (e > 0).any()), None)
        if first is not None:
            i, row = first
            why["first_leaking_row"] = {"request": i, "row": row, "position": res.case.prefix_lens[i] + row,
                                        "extra_keys": int(extra[i][row])}
    bad = next(((i, int(torch.nonzero((e.nan_to_num(float("inf")) > res.atol).reshape(e.shape[0], -1).any(1))[0]))
                for i, e in enumerate(errs) if (e.nan_to_num(float("inf")) > res.atol).any()), None)
    if bad is not None:
        why["first_bad_row"] = {"request": bad[0], "row": bad[1], "position": res.case.prefix_lens[bad[0]] + bad[1]}
    return why


def reaches_past_window(case: Case) -> bool:
    """Geometry only, no model: some query of the KV sglang hands to the paged wrapper (the last
    ``W + extend`` keys, :1698-1704) has a key outside its window. Row 0 of a request never does
    (the trim starts exactly at its window), row ``i >= 1`` does iff ``prefix + i > W``."""
    return any(e >= 2 and p + e - 1 > case.window_left for p, e in zip(case.prefix_lens, case.extend_lens))


# The releases the harness is written against (its runner comes from the release's own
# test kit, sglang/test/kits/attention_unittest/mock_server_args.py, which 0.5.16 dropped).
HARNESS_RELEASES = ("0.5.15.post1",)


def require_harness_release() -> str:
    """The installed sglang's version, or a one-line UsageError saying what to run instead."""
    try:
        v = md.version("sglang")
    except md.PackageNotFoundError:
        raise UsageError("sglang is not installed: `make venv` installs the pinned baseline "
                         f"(sglang {HARNESS_RELEASES[-1]})") from None
    if v not in HARNESS_RELEASES:
        raise UsageError(f"the sglang harness drives {', '.join(HARNESS_RELEASES)} and sglang {v} is installed: "
                         f"audit {v} with `swa-repro audit` (as installed) or `swa-repro audit --sglang {v}`, "
                         f"or run this in the project's venv (sglang {HARNESS_RELEASES[-1]}, `make venv`)")
    return v


def sglang_info() -> dict:
    """Where sglang is and what state its backend file is in (via swa_repro.sglang.patch)."""
    import sglang

    path = files.installed_path()
    try:
        fi = md.version("flashinfer-python")
    except md.PackageNotFoundError:
        fi = None
    return {"sglang": sglang.__version__, "backend_file": str(path),
            "state": classify.classify(path.read_text()).state, "flashinfer_python": fi}
