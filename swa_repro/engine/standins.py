"""FlashInfer's three batch attention wrappers as recording stand-ins: flashinfer 0.6.12's call
contract (``kernel.signatures``: the same signatures and plan/forward/run state rules as the model
wrappers) with zero outputs. An audit reads the *calls* a backend makes, never these outputs, so
both engines' audits stand on them (``sglang.audit.env``, ``vllm.audit.env``, ``vllm.audit.live_kernels``).
Beside them what a backend calls around the wrappers: flashinfer's ``fast_decode_plan``
(decode.py:2898) and ``merge_state``, and :class:`CpuTorch`, ``torch`` as a backend module sees it
on a CPU host (``device="cuda"`` buffers on the CPU, an H200's SM count).
"""

from __future__ import annotations

import types

import torch

from swa_repro.kernel.signatures import (
    DECODE_ATTRS,
    DecodeSignature,
    PagedPrefillSignature,
    RaggedPrefillSignature,
)

LAZY_BYTES = 1 << 20  # a zero tensor this large on the CPU comes from calloc (:func:`lazy_zeros`)


def lazy_zeros(shape, dtype, device=None) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``, the same values, writable; on the CPU and from
    :data:`LAZY_BYTES` up, memory from numpy's calloc: the OS maps zero pages only where something
    writes. Why: a stand-in's zero output (a 4096-token prefill of 64 heads x 256: 128 MB) and a
    backend's ``device="cuda"`` buffers were written whole by ``torch.zeros`` and most never read
    (cProfile of 0.5.23's table child: ~15 s of memset in ~5k calls)."""
    shape = tuple(int(n) for n in shape)
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    if torch.device(device or "cpu").type != "cpu" or nbytes < LAZY_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    import numpy as np

    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)


def _zeros(q, head_dim, return_lse):
    """A zero output ``(tokens, heads, head_dim)`` in q's dtype (+ a zero LSE ``(tokens, heads)``),
    marked as zeros at its current version (:func:`known_zero`)."""
    o = lazy_zeros((q.shape[0], q.shape[1], head_dim), q.dtype, q.device)
    o._swa_repro_zero_version = o._version
    return (o, lazy_zeros((q.shape[0], q.shape[1]), torch.float32, q.device)) if return_lse else o


def known_zero(t) -> bool:
    """``t`` is a stand-in's zero output that nothing has written since (an in-place write, also through
    a view, bumps the version counter the tensor shares with its views): zeros without reading them."""
    return getattr(t, "_swa_repro_zero_version", None) == t._version


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
    instead of over ``(tokens, heads, head_dim)`` floats (seconds per extend at a 4096 window). Outputs
    the stand-ins made and nothing wrote are known zeros (:func:`known_zero`), not scanned (``any()`` over
    both: ~5 CPU-s of 0.5.23's table child in 128 merges)."""
    m = torch.maximum(s_a, s_b)
    wa, wb = torch.exp2(s_a - m), torch.exp2(s_b - m)
    if all(known_zero(v) or not v.any() for v in (v_a, v_b)):
        v = torch.empty_like(v_a)
        v.copy_(((0.0 * wa + 0.0 * wb) / (wa + wb))[..., None].expand(v_a.shape))
        return v, m + torch.log2(wa + wb)
    v = (v_a.float() * wa[..., None] + v_b.float() * wb[..., None]) / (wa + wb)[..., None]
    return v.to(v_a.dtype), m + torch.log2(wa + wb)


class CpuTorch(types.ModuleType):
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
                if name == "zeros" and set(kw) <= {"dtype", "device"} and a:  # a plain zeros(shape, dtype=)
                    shape = a[0] if len(a) == 1 and isinstance(a[0], (tuple, list, torch.Size)) else a
                    if all(isinstance(d, int) for d in shape):
                        return lazy_zeros(shape, kw.get("dtype") or torch.get_default_dtype(), kw.get("device"))
                return attr(*a, **kw)
            return on_cpu
        return attr
