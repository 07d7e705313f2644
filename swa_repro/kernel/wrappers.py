"""CPU stand-ins for the FlashInfer wrappers sglang's ``FlashInferAttnBackend`` constructs.

``ModelPagedPrefillWrapper`` is the one under test: it keeps the exact call contract of
``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` (flashinfer 0.6.12 ``prefill.py``) and
computes its output through the kernel model (``kernel_model.simulate``), so a caller that
plans without ``window_left`` gets what the real kernel gives it. The contract (signatures and
state rules) is ``kernel.signatures``'; this module adds the outputs:

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

The ragged-prefill stand-in runs the same model at page size 1 (its plan and CTA start are the
paged kernel's): a window compiled out at plan and passed at forward leaks there too. The decode
stand-in is *not* under test (the paged-only prefill path never calls it): it computes exact
windowed attention with the reference and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from swa_repro.core.case import Case
from swa_repro.core.reference import intended_mask, masked_attention
from swa_repro.core.versions import FLASHINFER_VERSIONS
from swa_repro.kernel.model import ModelResult, simulate
from swa_repro.kernel.signatures import DecodeSignature, PagedPrefillSignature, RaggedPrefillSignature

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
        p = torch.cuda.get_device_properties(0)
        try:
            import flashinfer  # lazy: CUDA-only, and slow to import

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


class _ModelWrapper:
    """What the model stand-ins add to the flashinfer signature: the GPU the kernel model predicts
    for (a keyword flashinfer does not have: ``trace.record_class`` passes it unrecorded) and NHD only."""

    def __init__(self, *args, gpu: GpuSpec | None = None, **kwargs):
        self.gpu = gpu or GpuSpec()
        super().__init__(*args, **kwargs)

    def _check_init(self, a) -> None:
        if a.kv_layout != "NHD":
            raise NotImplementedError(f"kv_layout={a.kv_layout!r}: only NHD is modelled (sglang uses NHD)")

    def _model_case(self, window_left: int, **shape) -> Case:
        """The planned batch (``self._qo_lens`` / ``self._kv_lens``) as a kernel-model Case, requests
        with queries only, on this wrapper's backend, plan window and GPU."""
        live = [i for i, n in enumerate(self._qo_lens) if n > 0]
        if not live:
            raise ValueError("no request has queries")
        return Case(prefix_lens=tuple(self._kv_lens[i] - self._qo_lens[i] for i in live),
                    extend_lens=tuple(self._qo_lens[i] for i in live), window_left=window_left,
                    plan_window_left=self._plan_window_left, backend=self._backend, sm_count=self.gpu.sm_count,
                    arch=self.gpu.arch, flashinfer_version=self.gpu.flashinfer_version, **shape)


class ModelPagedPrefillWrapper(_ModelWrapper, PagedPrefillSignature):
    """``BatchPrefillWithPagedKVCacheWrapper`` whose kernel is ``kernel_model.simulate``."""

    _plan_info = None
    last_model: ModelResult | None = None  # the kernel model of the latest run()

    def _check_init(self, a) -> None:
        if a.use_cuda_graph:
            raise NotImplementedError("use_cuda_graph=True is not modelled: the model wrapper runs eagerly")
        if a.jit_args is not None:
            raise NotImplementedError("jit_args (custom attention variants) are not modelled")
        super()._check_init(a)

    def _plan(self, a) -> None:
        """prefill.py:1711. Stores what the real plan() stores; the "module" is fixed here."""
        if a.custom_mask is not None or a.packed_custom_mask is not None:
            raise NotImplementedError("custom masks are not modelled (sglang passes one only on the ragged "
                                      "SWA path and for spec-verify, not on the paged-only path)")
        if a.prefix_len_ptr is not None:
            raise NotImplementedError("multi-item scoring (prefix_len_ptr) is not modelled")
        if a.pos_encoding_mode != "NONE":
            raise NotImplementedError(f"pos_encoding_mode={a.pos_encoding_mode!r} is not modelled")
        if a.head_dim_vo not in (None, a.head_dim_qk):
            raise NotImplementedError("head_dim_vo != head_dim_qk is not modelled")
        self._qo_indptr = a.qo_indptr.detach().to("cpu", torch.int64).clone()
        self._kv_indptr = a.paged_kv_indptr.detach().to("cpu", torch.int64).clone()
        self._kv_indices = a.paged_kv_indices.detach().to("cpu", torch.int64).clone()
        self._last_page_len = a.paged_kv_last_page_len.detach().to("cpu", torch.int64).clone()
        page_size = int(a.page_size)
        qo = (self._qo_indptr[1:] - self._qo_indptr[:-1]).tolist()
        pages = (self._kv_indptr[1:] - self._kv_indptr[:-1]).tolist()
        # get_seq_lens (flashinfer/page.py): (pages - 1) * page_size + last_page_len
        kv = [(n - 1) * page_size + int(self._last_page_len[i]) if n > 0 else 0 for i, n in enumerate(pages)]
        self._qo_lens, self._kv_lens = qo, kv
        self._batch_size, self._page_size = len(qo), page_size
        self._num_qo_heads, self._num_kv_heads = int(a.num_qo_heads), int(a.num_kv_heads)
        self._head_dim = int(a.head_dim_qk)
        self._qo_indptr_last = int(self._qo_indptr[-1])
        self._cached_q_data_type = canonical_dtype(a.q_data_type)
        self._cached_kv_data_type = (canonical_dtype(a.kv_data_type) if a.kv_data_type is not None
                                     else self._cached_q_data_type)
        self._cached_o_data_type = (canonical_dtype(a.o_data_type) if a.o_data_type is not None
                                    else self._cached_q_data_type)
        self._plan_window_left = int(a.window_left)
        self._fixed_split_size = -1 if a.fixed_split_size is None else int(a.fixed_split_size)
        self._disable_split_kv = bool(a.disable_split_kv)
        # the module is picked here and only here (prefill.py:2035): window_left >= 0 compiles the window mask
        self._module = {"backend": self._backend, "use_sliding_window": self._plan_window_left >= 0,
                        "use_logits_soft_cap": (a.logits_soft_cap or 0.0) > 0}
        self._plan_info = dict(self._module, qo_lens=qo, kv_lens=kv)
        if any(n > 0 for n in qo):
            self.case(max(self._plan_window_left, -1))  # refuse what the model cannot describe, at plan

    def _run(self, a):
        """prefill.py:2184: checks as the real run(), then the kernel model instead of the kernel."""
        q = a.q
        if q.size(0) != self._qo_indptr_last:
            raise ValueError(f"q.shape[0] ({q.size(0)}) does not match qo_indptr[-1] ({self._qo_indptr_last}).")
        window_left = self._run_window(a.window_left)  # prefill.py:2317: the window is fixed at plan
        if a.return_lse or a.lse is not None:
            raise NotImplementedError("return_lse is not modelled (only the ragged+paged merge path uses it, "
                                      "not the paged-only path)")
        if a.sinks is not None or a.kv_cache_sf is not None or a.skip_softmax_threshold_scale_factor is not None:
            raise NotImplementedError("sinks / NVFP4 KV / skip-softmax are not modelled")
        if not self._causal:
            raise NotImplementedError("only MaskMode.CAUSAL is modelled (prefill.py:2379); sglang passes "
                                      "causal=True for decoder self-attention")
        if (self._logits_soft_cap or 0.0) > 0:
            raise NotImplementedError("logits soft-cap is not modelled")
        k_cache, v_cache = unpack_paged_kv_cache(a.paged_kv_cache, self._kv_layout)
        if k_cache.shape[1] != self._page_size:
            raise ValueError(f"paged KV has page_size {k_cache.shape[1]} but plan() got {self._page_size}")
        sm_scale = self._sm_scale if self._sm_scale is not None else 1.0 / math.sqrt(q.size(-1))
        for s in (a.q_scale, a.k_scale):  # prefill.py:2330-2334
            if s is not None:
                sm_scale *= float(s)
        o = self.compute(q, k_cache, v_cache, int(window_left), sm_scale)
        v_scale = a.v_scale
        if v_scale is not None and not (isinstance(v_scale, float) and v_scale == 1.0):  # prefill.py:2495-2501
            o = (o.float() * float(v_scale)).to(o.dtype)
        if a.out is not None:
            a.out.copy_(o)
            return a.out
        return o

    def case(self, window_left: int) -> Case:
        """The planned batch as a kernel-model Case (requests with queries only)."""
        return self._model_case(window_left, num_qo_heads=self._num_qo_heads, num_kv_heads=self._num_kv_heads,
                                head_dim=self._head_dim, page_size=self._page_size,
                                disable_split_kv=self._disable_split_kv, fixed_split_size=self._fixed_split_size)

    def compute(self, q, k_cache, v_cache, window_left: int, sm_scale: float) -> torch.Tensor:
        """Per request: effective masks from the model, exact attention under them; NaN if undefined."""
        for i, (n, kv) in enumerate(zip(self._qo_lens, self._kv_lens)):
            if n > kv:
                raise ValueError(f"request {i}: {n} queries but {kv} keys; causal prefill needs qo_len <= kv_len")
        res = simulate(self.case(window_left))
        self.last_model = res
        out = torch.zeros(q.shape[0], self._num_qo_heads, v_cache.shape[-1], dtype=self._cached_o_data_type,
                          device=q.device)
        live = iter(res.requests)
        for i, n in enumerate(self._qo_lens):
            if n == 0:
                continue
            r = next(live)
            a = int(self._qo_indptr[i])
            pages = self._kv_indices[self._kv_indptr[i]: self._kv_indptr[i + 1]]
            k, v = _gather(k_cache, pages, r.kv_len), _gather(v_cache, pages, r.kv_len)
            out[a: a + n] = _attend(r, q[a: a + n], k, v, sm_scale, self._num_qo_heads).to(out.dtype).to(out.device)
        return out


def _attend(r, q, k, v, sm_scale: float, hq: int) -> torch.Tensor:
    """One request's rows, exact float64 attention under the model's per-head mask (``r``: a
    ``kernel.model.RequestModel``); NaN rows where the model calls them undefined. Packed GQA: query
    head ``h`` reads KV head ``h // g`` and is head-in-group ``h % g`` (kernel.model's docstring)."""
    g = hq // k.shape[1]
    o = masked_attention(q, k, v, np.stack([r.mask(h % g) for h in range(hq)]), sm_scale)  # (qo, Hq, D)
    return torch.full_like(o, float("nan")) if r.status == "undefined" else o


class RaggedModelWrapper(_ModelWrapper, RaggedPrefillSignature):
    """``BatchPrefillWithRaggedKVCacheWrapper`` (prefill.py:2644, plan 2801, forward 3188) whose kernel
    is the kernel model, as for the paged one: the module is picked at plan from ``window_left >= 0``
    (:3129-3130) and the deprecated ``forward(window_left=W)`` only overwrites ``_window_left``, which
    ``run()`` reads without an assert (:3324). So a plan without the window run with one is plain causal
    on fa3 and fa2's CTA-granular start on fa2: the ragged kernel starts each CTA where the paged one
    does (flashinfer 0.7.2 prefill.cuh:3037-3043 / 3826-3831), and plans with page size 1 (prefill.py:3162),
    so it is the paged model at page size 1. sglang's ragged prefix extend (0.5.23) runs it this way."""

    def _check_init(self, a) -> None:
        if a.use_cuda_graph:
            raise NotImplementedError("use_cuda_graph=True is not supported by the stand-in")
        super()._check_init(a)

    def _plan(self, a) -> None:
        if a.custom_mask is not None or a.packed_custom_mask is not None:
            raise NotImplementedError("custom masks are not supported by the ragged stand-in")
        self._qo_indptr = a.qo_indptr.detach().to("cpu", torch.int64).clone()
        self._kv_indptr = a.kv_indptr.detach().to("cpu", torch.int64).clone()
        self._qo_lens = (self._qo_indptr[1:] - self._qo_indptr[:-1]).tolist()
        self._kv_lens = (self._kv_indptr[1:] - self._kv_indptr[:-1]).tolist()
        self._o_dtype = canonical_dtype(a.o_data_type or a.q_data_type)
        self._plan_window_left = int(a.window_left)  # the module, fixed here (prefill.py:3129-3130)
        self._shape = {"num_qo_heads": int(a.num_qo_heads), "num_kv_heads": int(a.num_kv_heads),
                       "head_dim": int(a.head_dim_qk), "disable_split_kv": bool(a.disable_split_kv),
                       "fixed_split_size": -1 if a.fixed_split_size is None else int(a.fixed_split_size)}

    def case(self, window_left: int) -> Case:
        """The planned batch as a kernel-model Case at page size 1 (requests with queries only)."""
        return self._model_case(window_left, page_size=1, **self._shape)

    def _run(self, a):
        q, k, v = a.q, a.k, a.v
        if a.return_lse:
            raise NotImplementedError("return_lse is not supported by the ragged stand-in")
        if not self._causal or (self._logits_soft_cap or 0.0) > 0:
            raise NotImplementedError("the ragged stand-in computes causal attention without soft-cap only")
        sm = self._sm_scale if self._sm_scale is not None else 1.0 / math.sqrt(q.size(-1))
        o = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=self._o_dtype, device=q.device)
        if any(self._qo_lens):
            live = iter(simulate(self.case(int(self._window_left))).requests)
            for i, n in enumerate(self._qo_lens):
                if n:
                    qa, ka, kb = int(self._qo_indptr[i]), int(self._kv_indptr[i]), int(self._kv_indptr[i + 1])
                    o[qa:qa + n] = _attend(next(live), q[qa:qa + n], k[ka:kb], v[ka:kb], sm, q.shape[1]).to(o.dtype)
        if a.out is not None:
            a.out.copy_(o)
            return a.out
        return o


class DecodeModelWrapper(_ModelWrapper, DecodeSignature):
    """``BatchDecodeWithPagedKVCacheWrapper`` stand-in (decode.py:675 ctor, plan 841, forward 1160,
    run's window assert 1368). Not under test: exact windowed attention of each request's last
    position over its paged KV."""

    def _check_init(self, a) -> None:
        if a.use_cuda_graph:
            raise NotImplementedError("use_cuda_graph=True is not supported by the decode stand-in")
        super()._check_init(a)

    def _plan(self, a) -> None:
        self._kv_indptr = a.indptr.detach().to("cpu", torch.int64).clone()
        self._kv_indices = a.indices.detach().to("cpu", torch.int64).clone()
        self._last_page_len = a.last_page_len.detach().to("cpu", torch.int64).clone()
        self._page_size = int(a.page_size)
        self._o_dtype = canonical_dtype(a.o_data_type or a.q_data_type)

    def _run(self, a):
        q = a.q
        window_left = self._run_window(a.window_left)  # decode.py:1368
        if a.return_lse or (self._logits_soft_cap or 0.0) > 0:
            raise NotImplementedError("the decode stand-in has no LSE output and no soft-cap")
        k_cache, v_cache = unpack_paged_kv_cache(a.paged_kv_cache, self._kv_layout)
        sm = self._sm_scale if self._sm_scale is not None else 1.0 / math.sqrt(q.size(-1))
        for s in (a.q_scale, a.k_scale):
            if s is not None:
                sm *= float(s)
        o = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=self._o_dtype, device=q.device)
        for i in range(len(self._kv_indptr) - 1):
            pages = self._kv_indices[self._kv_indptr[i]: self._kv_indptr[i + 1]]
            n = (len(pages) - 1) * self._page_size + int(self._last_page_len[i]) if len(pages) else 0
            if n:
                m = intended_mask(n - 1, 1, int(window_left))  # (1, kv)
                o[i: i + 1] = masked_attention(q[i: i + 1], _gather(k_cache, pages, n), _gather(v_cache, pages, n),
                                               m, sm).to(o.dtype).to(o.device)
        if a.v_scale is not None:
            o = (o.float() * float(a.v_scale)).to(o.dtype)
        return o
