"""CPU stand-ins for the FlashInfer wrappers sglang's ``FlashInferAttnBackend`` constructs.

``ModelPagedPrefillWrapper`` is the one under test: it keeps the exact call contract of
``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` (flashinfer 0.6.12 ``prefill.py``) and
computes its output through the kernel model (``kernel_model.simulate``), so a caller that
plans without ``window_left`` gets what the real kernel gives it:

* constructor args as ``prefill.py:1515``; ``plan()`` as ``prefill.py:1711`` with
  ``begin_forward = plan`` (``prefill.py:2115``);
* the compiled "module" is chosen at plan from ``window_left >= 0`` (``prefill.py:2035``);
* the deprecated ``forward()``/``forward_return_lse()`` overwrite ``self._window_left`` and
  ``self._causal`` before calling ``run()`` (``prefill.py:2133-2141``, ``2523-2530``);
* ``run()`` asserts ``window_left == self._window_left`` (``prefill.py:2317``), so
  ``run(window_left=W)`` after a plan without it raises ``AssertionError``.

Output: each request's rows are exact float64 attention (``reference.masked_attention``) under
the *effective* per-head mask the model predicts, cast to the plan's output dtype. A request the
model calls ``undefined`` (split-KV chunk counts differ between plan and run) yields NaN rows:
the real kernel's output is then not a function of the inputs, so no number would be honest.

The ragged-prefill and decode stand-ins are *not* under test (sglang constructs them in
``FlashInferAttnBackend.__init__``, flashinfer_backend.py:428-456, but the paged-only prefill path
never calls them): they compute exact windowed attention with the reference and say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from swa_repro.core.case import Case
from swa_repro.kernel.model import ModelResult, simulate
from swa_repro.core.reference import intended_mask, masked_attention

_DTYPES = {"float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
           "float32": torch.float32, "float": torch.float32, "float8_e4m3fn": torch.float8_e4m3fn}


def canonical_dtype(x) -> torch.dtype:
    """flashinfer.utils.canonicalize_torch_dtype: a string or a torch.dtype -> torch.dtype."""
    if isinstance(x, torch.dtype):
        return x
    if x in _DTYPES:
        return _DTYPES[x]
    raise ValueError(f"unknown dtype {x!r}: use a torch.dtype or one of {sorted(_DTYPES)}")


@dataclass(frozen=True)
class GpuSpec:
    """The GPU and flashinfer version the kernel model predicts for (sglang 0.5.15.post1 pins
    flashinfer-python 0.6.12; an H200 has 132 SMs, sm90)."""
    sm_count: int = 132
    arch: tuple[int, int] = (9, 0)
    flashinfer_version: str = "0.6.12"

    @classmethod
    def detect(cls) -> "GpuSpec":
        """The CUDA device 0 and the installed flashinfer (for modelling a live run's trace)."""
        from swa_repro.core.case import FLASHINFER_VERSIONS

        p = torch.cuda.get_device_properties(0)
        try:
            import flashinfer

            v = flashinfer.__version__ if flashinfer.__version__ in FLASHINFER_VERSIONS else cls.flashinfer_version
        except Exception:
            v = cls.flashinfer_version
        return cls(p.multi_processor_count, (p.major, p.minor), v)


def unpack_paged_kv_cache(paged_kv_cache, kv_layout: str = "NHD"):
    """flashinfer/utils.py:169 ``_unpack_paged_kv_cache`` for NHD: a ``(k, v)`` tuple of 3-D
    (page_size 1) or 4-D tensors, or one 4-/5-D tensor split on dim 1 -> 4-D ``(pages, ps, H, D)``."""
    if kv_layout != "NHD":
        raise NotImplementedError(f"kv_layout={kv_layout!r}: the model wrappers handle NHD only (sglang uses NHD)")
    if isinstance(paged_kv_cache, tuple):
        k, v = paged_kv_cache
        return (k.unsqueeze(-3) if k.dim() == 3 else k), (v.unsqueeze(-3) if v.dim() == 3 else v)
    if torch.is_tensor(paged_kv_cache):
        x = paged_kv_cache.unsqueeze(-3) if paged_kv_cache.dim() == 4 else paged_kv_cache
        return x.unbind(dim=1)
    raise KeyError(f"unrecognized paged_kv_cache type {type(paged_kv_cache)}: expect a tensor or a (k, v) tuple")


def _gather(cache: torch.Tensor, pages: torch.Tensor, kv_len: int) -> torch.Tensor:
    """One request's dense ``(kv, H, D)`` from its page ids."""
    return cache[pages.long()].reshape(-1, *cache.shape[2:])[:kv_len]


class _WrapperBase:
    """What every flashinfer wrapper stand-in shares: the constructor contract."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 *, backend: str = "auto", gpu: GpuSpec | None = None, **buffers):
        if kv_layout != "NHD":
            raise NotImplementedError(f"kv_layout={kv_layout!r}: only NHD is modelled (sglang uses NHD)")
        self._float_workspace_buffer = float_workspace_buffer
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._backend = backend
        self._buffers = buffers
        self.device = float_workspace_buffer.device
        self.gpu = gpu or GpuSpec()
        self._planned = False

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def end_forward(self) -> None:
        """Deprecated no-op, as in flashinfer."""


class ModelPagedPrefillWrapper(_WrapperBase):
    """``BatchPrefillWithPagedKVCacheWrapper`` whose kernel is ``kernel_model.simulate``."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None,
                 *, gpu: GpuSpec | None = None):
        if use_cuda_graph:
            raise NotImplementedError("use_cuda_graph=True is not modelled: the model wrapper runs eagerly")
        if jit_args is not None:
            raise NotImplementedError("jit_args (custom attention variants) are not modelled")
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend=backend, gpu=gpu)
        self._plan_info = None
        self.last_model: ModelResult | None = None  # the kernel model of the latest run()

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads: int,
             num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo=None, custom_mask=None,
             packed_custom_mask=None, causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, sm_scale=None, window_left: int = -1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None,
             non_blocking: bool = True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len: int = 0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None,
             block_tables=None, max_token_per_sequence=None, max_sequence_kv=None, fixed_split_size=None,
             disable_split_kv: bool = False) -> None:
        """prefill.py:1711. Stores what the real plan() stores; the "module" is fixed here."""
        if custom_mask is not None or packed_custom_mask is not None:
            raise NotImplementedError("custom masks are not modelled (sglang passes one only on the ragged "
                                      "SWA path and for spec-verify, not on the paged-only path)")
        if prefix_len_ptr is not None:
            raise NotImplementedError("multi-item scoring (prefix_len_ptr) is not modelled")
        if pos_encoding_mode != "NONE":
            raise NotImplementedError(f"pos_encoding_mode={pos_encoding_mode!r} is not modelled")
        if head_dim_vo not in (None, head_dim_qk):
            raise NotImplementedError("head_dim_vo != head_dim_qk is not modelled")
        self._qo_indptr = qo_indptr.detach().to("cpu", torch.int64).clone()
        self._kv_indptr = paged_kv_indptr.detach().to("cpu", torch.int64).clone()
        self._kv_indices = paged_kv_indices.detach().to("cpu", torch.int64).clone()
        self._last_page_len = paged_kv_last_page_len.detach().to("cpu", torch.int64).clone()
        bs = len(self._qo_indptr) - 1
        qo = (self._qo_indptr[1:] - self._qo_indptr[:-1]).tolist()
        pages = (self._kv_indptr[1:] - self._kv_indptr[:-1]).tolist()
        # get_seq_lens (flashinfer/page.py): (pages - 1) * page_size + last_page_len
        kv = [(n - 1) * page_size + int(self._last_page_len[i]) if n > 0 else 0 for i, n in enumerate(pages)]
        self._qo_lens, self._kv_lens = qo, kv
        self._batch_size, self._page_size = bs, int(page_size)
        self._num_qo_heads, self._num_kv_heads, self._head_dim = int(num_qo_heads), int(num_kv_heads), int(head_dim_qk)
        self._qo_indptr_last = int(self._qo_indptr[-1])
        self._cached_q_data_type = canonical_dtype(q_data_type)
        self._cached_kv_data_type = canonical_dtype(kv_data_type) if kv_data_type is not None else self._cached_q_data_type
        self._cached_o_data_type = canonical_dtype(o_data_type) if o_data_type is not None else self._cached_q_data_type
        self._plan_window_left = int(window_left)
        self._fixed_split_size = -1 if fixed_split_size is None else int(fixed_split_size)
        self._disable_split_kv = bool(disable_split_kv)
        # the module is picked here and only here (prefill.py:2035): window_left >= 0 compiles the window mask
        self._module = {"backend": self._backend, "use_sliding_window": self._plan_window_left >= 0,
                        "use_logits_soft_cap": (logits_soft_cap or 0.0) > 0}
        self._plan_info = dict(self._module, qo_lens=qo, kv_lens=kv)
        if any(n > 0 for n in qo):
            self.case(max(self._plan_window_left, -1))  # refuse what the model cannot describe, at plan
        # prefill.py:2104-2113
        self._causal = causal
        self._pos_encoding_mode = pos_encoding_mode
        self._use_fp16_qk_reduction = use_fp16_qk_reduction
        self._window_left = int(window_left)
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale, self._rope_theta = rope_scale, rope_theta
        self._planned = True

    begin_forward = plan

    def forward(self, q, paged_kv_cache, causal: bool = False, pos_encoding_mode: str = "NONE",
                use_fp16_qk_reduction: bool = False, k_scale=None, v_scale=None, window_left: int = -1,
                logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """Deprecated: overwrites the planned attributes, window included (prefill.py:2133-2141)."""
        self._set_run_attrs(causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
                            sm_scale, rope_scale, rope_theta)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, causal: bool = False, pos_encoding_mode: str = "NONE",
                           use_fp16_qk_reduction: bool = False, k_scale=None, v_scale=None, window_left: int = -1,
                           logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """prefill.py:2507-2531."""
        self._set_run_attrs(causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
                            sm_scale, rope_scale, rope_theta)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)

    def _set_run_attrs(self, causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
                       sm_scale, rope_scale, rope_theta):
        self._causal = causal
        self._pos_encoding_mode = pos_encoding_mode
        self._use_fp16_qk_reduction = use_fp16_qk_reduction
        self._window_left = window_left
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale, self._rope_theta = rope_scale, rope_theta

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse: bool = False, enable_pdl=None, window_left=None, sinks=None, kv_cache_sf=None,
            skip_softmax_threshold_scale_factor=None):
        """prefill.py:2184: checks as the real run(), then the kernel model instead of the kernel."""
        assert self._planned, "plan info is not initialized"
        if q.size(0) != self._qo_indptr_last:
            raise ValueError(f"q.shape[0] ({q.size(0)}) does not match qo_indptr[-1] ({self._qo_indptr_last}).")
        window_left = self._window_left if window_left is None else window_left
        assert window_left == self._window_left  # prefill.py:2317: the window is fixed at plan
        if return_lse or lse is not None:
            raise NotImplementedError("return_lse is not modelled (only the ragged+paged merge path uses it, "
                                      "not the paged-only path)")
        if sinks is not None or kv_cache_sf is not None or skip_softmax_threshold_scale_factor is not None:
            raise NotImplementedError("sinks / NVFP4 KV / skip-softmax are not modelled")
        if not self._causal:
            raise NotImplementedError("only MaskMode.CAUSAL is modelled (prefill.py:2379); sglang passes "
                                      "causal=True for decoder self-attention")
        if (self._logits_soft_cap or 0.0) > 0:
            raise NotImplementedError("logits soft-cap is not modelled")
        k_cache, v_cache = unpack_paged_kv_cache(paged_kv_cache, self._kv_layout)
        if k_cache.shape[1] != self._page_size:
            raise ValueError(f"paged KV has page_size {k_cache.shape[1]} but plan() got {self._page_size}")
        sm_scale = self._sm_scale if self._sm_scale is not None else 1.0 / math.sqrt(q.size(-1))
        for s in (q_scale, k_scale):  # prefill.py:2330-2334
            if s is not None:
                sm_scale *= float(s)
        o = self.compute(q, k_cache, v_cache, int(window_left), sm_scale)
        if v_scale is not None and not (isinstance(v_scale, float) and v_scale == 1.0):  # prefill.py:2495-2501
            o = (o.float() * float(v_scale)).to(o.dtype)
        if out is not None:
            out.copy_(o)
            return out
        return o

    def case(self, window_left: int) -> Case:
        """The planned batch as a kernel-model Case (requests with queries only)."""
        live = [i for i, n in enumerate(self._qo_lens) if n > 0]
        if not live:
            raise ValueError("no request has queries")
        return Case(
            prefix_lens=tuple(self._kv_lens[i] - self._qo_lens[i] for i in live),
            extend_lens=tuple(self._qo_lens[i] for i in live),
            num_qo_heads=self._num_qo_heads, num_kv_heads=self._num_kv_heads, head_dim=self._head_dim,
            page_size=self._page_size, window_left=window_left, plan_window_left=self._plan_window_left,
            backend=self._backend, disable_split_kv=self._disable_split_kv,
            fixed_split_size=self._fixed_split_size, sm_count=self.gpu.sm_count, arch=self.gpu.arch,
            flashinfer_version=self.gpu.flashinfer_version,
        )

    def compute(self, q, k_cache, v_cache, window_left: int, sm_scale: float) -> torch.Tensor:
        """Per request: effective masks from the model, exact attention under them; NaN if undefined."""
        for i, (n, kv) in enumerate(zip(self._qo_lens, self._kv_lens)):
            if n > kv:
                raise ValueError(f"request {i}: {n} queries but {kv} keys; causal prefill needs qo_len <= kv_len")
        res = simulate(self.case(window_left))
        self.last_model = res
        hq, g = self._num_qo_heads, self._num_qo_heads // self._num_kv_heads
        out = torch.zeros(q.shape[0], hq, v_cache.shape[-1], dtype=self._cached_o_data_type, device=q.device)
        live = iter(res.requests)
        for i, n in enumerate(self._qo_lens):
            if n == 0:
                continue
            r = next(live)
            a = int(self._qo_indptr[i])
            pages = self._kv_indices[self._kv_indptr[i]: self._kv_indptr[i + 1]]
            k, v = _gather(k_cache, pages, r.kv_len), _gather(v_cache, pages, r.kv_len)
            # packed GQA: qo head h reads kv head h // g and is head-in-group h % g (kernel_model docstring)
            mask = np.stack([r.mask(h % g) for h in range(hq)])  # (Hq, qo, kv)
            o = masked_attention(q[a: a + n], k, v, mask, sm_scale)  # (qo, Hq, D) float64
            if r.status == "undefined":
                o = torch.full_like(o, float("nan"))
            out[a: a + n] = o.to(out.dtype).to(out.device)
        return out


class RaggedModelWrapper(_WrapperBase):
    """``BatchPrefillWithRaggedKVCacheWrapper`` stand-in (prefill.py:2644, plan 2801, forward 3188).

    Not under test: exact windowed causal attention from the reference, honouring the plan/run
    window contract (run asserts nothing here since it takes no window: prefill.py:3324).
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, *args, backend="auto",
                 gpu: GpuSpec | None = None, **kw):
        if use_cuda_graph:
            raise NotImplementedError("use_cuda_graph=True is not supported by the stand-in")
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend=backend, gpu=gpu)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None, **_ignored):
        if custom_mask is not None or packed_custom_mask is not None:
            raise NotImplementedError("custom masks are not supported by the ragged stand-in")
        self._qo_indptr = qo_indptr.detach().to("cpu", torch.int64).clone()
        self._kv_indptr = kv_indptr.detach().to("cpu", torch.int64).clone()
        self._causal, self._window_left, self._sm_scale = causal, int(window_left), sm_scale
        self._logits_soft_cap = logits_soft_cap
        self._o_dtype = canonical_dtype(o_data_type or q_data_type)
        self._planned = True

    begin_forward = plan

    def forward(self, q, k, v, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._causal, self._window_left, self._sm_scale = causal, int(window_left), sm_scale
        self._logits_soft_cap = logits_soft_cap
        return self.run(q, k, v)

    def run(self, q, k, v, *args, return_lse=False, out=None, **_ignored):
        assert self._planned, "plan info is not initialized"
        if return_lse:
            raise NotImplementedError("return_lse is not supported by the ragged stand-in")
        if not self._causal or (self._logits_soft_cap or 0.0) > 0:
            raise NotImplementedError("the ragged stand-in computes causal attention without soft-cap only")
        sm = self._sm_scale if self._sm_scale is not None else 1.0 / math.sqrt(q.size(-1))
        o = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=self._o_dtype, device=q.device)
        for i in range(len(self._qo_indptr) - 1):
            a, b = int(self._qo_indptr[i]), int(self._qo_indptr[i + 1])
            c, d = int(self._kv_indptr[i]), int(self._kv_indptr[i + 1])
            if b > a:
                m = intended_mask(d - c - (b - a), b - a, self._window_left)
                o[a:b] = masked_attention(q[a:b], k[c:d], v[c:d], m, sm).to(o.dtype).to(o.device)
        if out is not None:
            out.copy_(o)
            return out
        return o


class DecodeModelWrapper(_WrapperBase):
    """``BatchDecodeWithPagedKVCacheWrapper`` stand-in (decode.py:675 ctor, plan 841, forward 1160,
    run's window assert 1368). Not under test: exact windowed attention of each request's last
    position over its paged KV."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, *, gpu: GpuSpec | None = None):
        if use_cuda_graph:
            raise NotImplementedError("use_cuda_graph=True is not supported by the decode stand-in")
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend=backend, gpu=gpu)
        self.use_tensor_cores = use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, **_ignored):
        self._kv_indptr = indptr.detach().to("cpu", torch.int64).clone()
        self._kv_indices = indices.detach().to("cpu", torch.int64).clone()
        self._last_page_len = last_page_len.detach().to("cpu", torch.int64).clone()
        self._page_size, self._window_left, self._sm_scale = int(page_size), int(window_left), sm_scale
        self._logits_soft_cap = logits_soft_cap
        self._o_dtype = canonical_dtype(o_data_type or q_data_type)
        self._planned = True

    begin_forward = plan

    def forward(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None, v_scale=None,
                window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._window_left, self._logits_soft_cap, self._sm_scale = window_left, logits_soft_cap, sm_scale
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, window_left=None,
            return_lse=False, out=None, **_ignored):
        assert self._planned, "plan info is not initialized"
        window_left = self._window_left if window_left is None else window_left
        assert window_left == self._window_left  # decode.py:1368
        if return_lse or (self._logits_soft_cap or 0.0) > 0:
            raise NotImplementedError("the decode stand-in has no LSE output and no soft-cap")
        k_cache, v_cache = unpack_paged_kv_cache(paged_kv_cache, self._kv_layout)
        sm = self._sm_scale if self._sm_scale is not None else 1.0 / math.sqrt(q.size(-1))
        for s in (q_scale, k_scale):
            if s is not None:
                sm *= float(s)
        o = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=self._o_dtype, device=q.device)
        for i in range(len(self._kv_indptr) - 1):
            pages = self._kv_indices[self._kv_indptr[i]: self._kv_indptr[i + 1]]
            n = (len(pages) - 1) * self._page_size + int(self._last_page_len[i]) if len(pages) else 0
            if n:
                m = intended_mask(n - 1, 1, int(window_left))
                o[i: i + 1] = masked_attention(q[i: i + 1], _gather(k_cache, pages, n), _gather(v_cache, pages, n),
                                               m, sm).to(o.dtype).to(o.device)
        if v_scale is not None:
            o = (o.float() * float(v_scale)).to(o.dtype)
        return o
