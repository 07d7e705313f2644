"""What the audit replaces around sglang's backend, inside :func:`audit_env` only (restored on exit):

* the three FlashInfer wrapper classes, by :class:`PagedStandIn` / :class:`RaggedStandIn` /
  :class:`DecodeStandIn`: flashinfer 0.6.12's call contract (``kernel.signatures``, the same
  signatures and plan/forward/run state rules as the model wrappers) with zero outputs. The audit
  reads the *calls*, never these outputs;
* flashinfer's ``fast_decode_plan`` (decode.py:2898) and ``merge_state`` (sglang's
  ``_safe_merge_state``, :105), absent without flashinfer;
* the Triton kv-indices kernel, in every sglang module that binds it (``releases.release_env``);
* sglang's ``fast_prefill_plan`` (0.5.14+), like ``fast_decode_plan`` (``releases.fast_prefill_plan``);
* on a CPU host only (``device="cpu"``): ``torch`` *as the backend module sees it*:
  ``device="cuda"`` buffers (decode's kv indices, :1500; ``init_cuda_graph_state``, :860) land on
  the CPU and ``torch.cuda.get_device_properties`` reports an H200's 132 SMs; and the Triton
  kv-indices kernel by its torch port. On a GPU host sglang's own torch and Triton kernel run.
"""

from __future__ import annotations

import contextlib
import types

import torch

from swa_repro.kernel.signatures import DECODE_ATTRS, DecodeSignature, PagedPrefillSignature, RaggedPrefillSignature
from swa_repro.sglang import harness
from swa_repro.sglang.trace import Trace, record_class

PAGED, RAGGED, DECODE = harness.WRAPPER_NAMES


def _zeros(q, head_dim, return_lse):
    """A zero output ``(tokens, heads, head_dim)`` in q's dtype (+ a zero LSE ``(tokens, heads)``)."""
    o = torch.zeros(q.shape[0], q.shape[1], head_dim, dtype=q.dtype, device=q.device)
    return (o, torch.zeros(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)) if return_lse else o


class PagedStandIn(PagedPrefillSignature):
    """``BatchPrefillWithPagedKVCacheWrapper`` with zero outputs; run asserts the window (prefill.py:2317)."""

    def _plan(self, a) -> None:
        self._head_dim_vo = a.head_dim_vo or a.head_dim_qk

    def _run(self, a):
        self._run_window(a.window_left)
        return _zeros(a.q, self._head_dim_vo, a.return_lse)


class RaggedStandIn(RaggedPrefillSignature):
    """``BatchPrefillWithRaggedKVCacheWrapper`` with zero outputs (run takes no window, :3324)."""

    def _plan(self, a) -> None:
        self._head_dim_vo = a.head_dim_vo or a.head_dim_qk

    def _run(self, a):
        return _zeros(a.q, self._head_dim_vo, a.return_lse)


class DecodeStandIn(DecodeSignature):
    """``BatchDecodeWithPagedKVCacheWrapper`` with zero outputs; run asserts the window (decode.py:1368)."""

    def _plan(self, a) -> None:
        self._head_dim = a.head_dim

    def _run(self, a):
        self._run_window(a.window_left)
        return _zeros(a.q, self._head_dim, a.return_lse)


STAND_INS = {PAGED: PagedStandIn, RAGGED: RaggedStandIn, DECODE: DecodeStandIn}


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                     pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
                     kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
                     non_blocking=True, fixed_split_size=None, disable_split_kv=False,
                     global_override_indptr_cpu=None, **newer):
    """flashinfer decode.py:2898: re-plans the captured wrapper *without* re-picking its module;
    stores the window, cap and scales it is given (:3061-3066)."""
    given = locals()
    for n in DECODE_ATTRS:
        setattr(self, f"_{n}", given[n])


def merge_state(v_a, s_a, v_b, s_b):
    """flashinfer.cascade.merge_state (base-2 log-sum-exp merge of two partial attentions). The
    stand-ins' outputs are zeros: then every ``head_dim`` element of a (token, head) is the same
    ``(0 * wa + 0 * wb) / (wa + wb)`` (0, or NaN where the weights are), computed per (token, head)
    instead of over ``(tokens, heads, head_dim)`` floats (seconds per extend at a 4096 window)."""
    m = torch.maximum(s_a, s_b)
    wa, wb = torch.exp2(s_a - m), torch.exp2(s_b - m)
    if not (v_a.any() or v_b.any()):
        v = torch.empty_like(v_a)
        v.copy_(((0.0 * wa + 0.0 * wb) / (wa + wb))[..., None].expand(v_a.shape))
        return v, m + torch.log2(wa + wb)
    v = (v_a.float() * wa[..., None] + v_b.float() * wb[..., None]) / (wa + wb)[..., None]
    return v.to(v_a.dtype), m + torch.log2(wa + wb)


class _CpuTorch(types.ModuleType):
    """``torch`` for the backend module: ``device="cuda"`` -> CPU, and an
    H200's SM count for ``_full_cg_prefill_workspace_bytes`` (:968)."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(
            get_device_properties=lambda d=None: types.SimpleNamespace(multi_processor_count=132),
            is_available=lambda: False)

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name in ("zeros", "empty", "ones", "full", "arange", "tensor"):
            def on_cpu(*a, **kw):
                if str(kw.get("device", "")).startswith("cuda"):
                    kw["device"] = "cpu"
                return attr(*a, **kw)
            return on_cpu
        return attr


@contextlib.contextmanager
def audit_env(trace: Trace, fb, *, use_paged: bool, device: str = "cpu"):
    """The stand-ins in the backend module's namespace plus the release's switches
    (``releases.release_env``), restored on exit; the CPU replacements only on ``device="cpu"``."""
    from swa_repro.sglang import releases  # releases imports harness; kept out of import time

    names = {n: record_class(cls, trace, n) for n, cls in STAND_INS.items()}
    # merge_state: 0.5.10 calls flashinfer.cascade.merge_state by name (:58, :862); later, _safe_merge_state
    names.update(fast_decode_plan=fast_decode_plan, _safe_merge_state=merge_state, merge_state=merge_state,
                 global_workspace_buffer=None)
    on_cpu = device == "cpu"
    if on_cpu:
        names.update(torch=_CpuTorch(), create_flashinfer_kv_indices_triton=harness.TorchKvIndices())
    if hasattr(fb, "fast_prefill_plan"):
        names["fast_prefill_plan"] = releases.fast_prefill_plan
    with harness._namespace(fb, names), releases.release_env(fb, use_paged=use_paged, kv_indices_port=on_cpu):
        yield
