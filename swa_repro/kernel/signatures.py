"""flashinfer 0.6.12's wrapper call contract, written once, for every CPU stand-in.

sglang constructs and calls three FlashInfer wrapper classes; two kinds of stand-in replace them
on CPU: the model wrappers (``kernel.wrappers``, output through the kernel model or the
reference) and the audit's recorders (``engine.standins``, zero output, the calls are the
point). Both subclass the signatures here, so the ~30-parameter argument lists exist once: what
sglang calls with, and what ``sglang.audit.bind`` binds a recorded call to.

The state rules kept here (cited per class): ``plan()`` stores the window, soft cap and scales
and picks the module, and puts its index and mask tensors where FlashInfer does (the given
buffers in CUDA-graph mode, its own tensors otherwise: ``kernel.graph_buffers``); the deprecated ``forward()`` / ``forward_return_lse()`` overwrite them and
call ``run()``; ``run()`` before ``plan()`` fails, and a paged prefill or decode ``run()`` asserts
its window equals the planned one. A subclass implements two hooks on a namespace of the call's
arguments: ``_plan(a)`` (validate, keep what its ``run`` needs) and ``_run(a)`` (the output);
``_check_init(a)`` may refuse a constructor. ``**newer`` on the ragged and decode methods takes
keywords later releases (and sglang's ``fast_decode_plan`` partial) pass.
"""

from __future__ import annotations

import types

from swa_repro.kernel import graph_buffers

# what plan() stores and forward() overwrites: paged prefill.py:2104-2111 / :2133-2140, ragged
# :3177-3184 / :3203-3210; decode (no causal, no fp16 reduction) decode.py:1151-1156 / :1175-1180
PREFILL_ATTRS = ("causal", "pos_encoding_mode", "use_fp16_qk_reduction", "window_left", "logits_soft_cap",
                 "sm_scale", "rope_scale", "rope_theta")
DECODE_ATTRS = ("pos_encoding_mode", "window_left", "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta")


def _args(local_vars: dict) -> types.SimpleNamespace:
    """A method's arguments (its ``locals()`` on entry) without ``self``."""
    return types.SimpleNamespace(**{k: v for k, v in local_vars.items() if k != "self"})


class WrapperSignature:
    """What every wrapper shares: constructor state (buffers under flashinfer's attribute names)
    and the plan-before-run rule."""

    _BUFFERS: tuple = ()  # (constructor argument, attribute) pairs

    def _setup(self, a) -> None:
        self._check_init(a)
        self._float_workspace_buffer = a.float_workspace_buffer
        self._kv_layout, self._use_cuda_graph, self._backend = a.kv_layout, bool(a.use_cuda_graph), a.backend
        for arg, attr in self._BUFFERS:
            setattr(self, attr, getattr(a, arg))
        self.device = a.float_workspace_buffer.device
        self._window_left, self._logits_soft_cap, self._sm_scale = -1, None, None
        self._planned = False
        self.run_reads = None

    def _check_init(self, a) -> None:
        """Refuse a constructor call this stand-in cannot honour (default: accept all)."""

    def _set(self, a, names) -> None:
        for n in names:
            setattr(self, f"_{n}", getattr(a, n))

    def _planned_call(self, a, attrs):
        self._plan(a)
        self._keep_buffers(a)
        self._set(a, attrs)
        self._planned = True

    def _checked_run(self, a):
        assert self._planned, "plan info is not initialized"
        self.run_reads = self._reads() if self._use_cuda_graph else None
        return self._run(a)

    def _keep_buffers(self, a) -> None:
        """Where plan() puts its index and mask tensors (``kernel.graph_buffers``; default: nowhere)."""

    def _reads(self) -> dict | None:
        """What ``run()`` reads from the buffers at run time (``kernel.graph_buffers``); a CUDA-graph
        wrapper's ``run_reads``, which a recorder (``trace``) keeps with the call."""
        return None

    def _run_window(self, window_left):
        """``run()``'s window: the planned one unless given, and equal to it (prefill.py:2317,
        decode.py:1368: the window is compiled in at plan)."""
        window_left = self._window_left if window_left is None else window_left
        assert window_left == self._window_left
        return window_left

    def _plan(self, a) -> None:
        raise NotImplementedError

    def _run(self, a):
        raise NotImplementedError

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def end_forward(self) -> None:
        """Deprecated no-op, as in flashinfer."""


class PagedPrefillSignature(WrapperSignature):
    """``BatchPrefillWithPagedKVCacheWrapper``: ctor prefill.py:1515, plan :1711 (module picked
    from ``window_left >= 0`` at :2035), ``begin_forward = plan`` :2115, forward :2117 and
    forward_return_lse :2507 overwrite the planned attributes, run :2184 asserts the window :2317."""

    _BUFFERS = (("qo_indptr_buf", "_qo_indptr_buf"), ("paged_kv_indptr_buf", "_paged_kv_indptr_buf"),
                ("paged_kv_indices_buf", "_paged_kv_indices_buf"),
                ("paged_kv_last_page_len_buf", "_paged_kv_last_page_len_buf"),
                ("custom_mask_buf", "_custom_mask_buf"), ("mask_indptr_buf", "_mask_indptr_buf"))

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None):
        self._setup(_args(locals()))

    def _keep_buffers(self, a) -> None:
        graph_buffers.plan_paged(self, a)

    def _reads(self) -> dict:
        return graph_buffers.paged_reads(self)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None,
             window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, non_blocking=True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None,
             seq_lens_q=None, block_tables=None, max_token_per_sequence=None, max_sequence_kv=None,
             fixed_split_size=None, disable_split_kv=False):
        self._planned_call(_args(locals()), PREFILL_ATTRS)

    begin_forward = plan

    def forward(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
                rope_theta=None):
        self._set(_args(locals()), PREFILL_ATTRS)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE",
                           use_fp16_qk_reduction=False, k_scale=None, v_scale=None, window_left=-1,
                           logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._set(_args(locals()), PREFILL_ATTRS)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, kv_cache_sf=None,
            skip_softmax_threshold_scale_factor=None):
        return self._checked_run(_args(locals()))


class RaggedPrefillSignature(WrapperSignature):
    """``BatchPrefillWithRaggedKVCacheWrapper``: ctor prefill.py:2644, plan :2801 (module at
    :3129-3130), forward :3188, forward_return_lse :3527; run :3246 reads ``self._window_left``
    without an assert (:3324)."""

    _BUFFERS = (("qo_indptr_buf", "_qo_indptr_buf"), ("kv_indptr_buf", "_kv_indptr_buf"),
                ("custom_mask_buf", "_custom_mask_buf"), ("mask_indptr_buf", "_mask_indptr_buf"))

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None,
                 jit_kwargs=None):
        self._setup(_args(locals()))

    def _keep_buffers(self, a) -> None:
        graph_buffers.plan_ragged(self, a)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
             fixed_split_size=None, disable_split_kv=False, seq_lens=None, seq_lens_q=None,
             max_token_per_sequence=None, max_sequence_kv=None, v_indptr=None, o_indptr=None, **newer):
        self._planned_call(_args(locals()), PREFILL_ATTRS)

    begin_forward = plan

    def forward(self, q, k, v, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._set(_args(locals()), PREFILL_ATTRS)
        return self.run(q, k, v)

    def forward_return_lse(self, q, k, v, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                           window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._set(_args(locals()), PREFILL_ATTRS)
        return self.run(q, k, v, return_lse=True)

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, kv_cache_sf=None, **newer):
        return self._checked_run(_args(locals()))


class DecodeSignature(WrapperSignature):
    """``BatchDecodeWithPagedKVCacheWrapper``: ctor decode.py:675, plan :841 (module from
    ``window_left >= 0`` / ``logits_soft_cap > 0`` at :1054-1055), forward :1160, run asserts the
    window :1368. ``jit_kwargs`` as the prefill wrappers take it."""

    _BUFFERS = (("paged_kv_indptr_buffer", "_paged_kv_indptr_buf"),
                ("paged_kv_indices_buffer", "_paged_kv_indices_buf"),
                ("paged_kv_last_page_len_buffer", "_paged_kv_last_page_len_buf"))

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, jit_kwargs=None):
        self.use_tensor_cores = use_tensor_cores
        self._setup(_args(locals()))

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
             non_blocking=True, block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv=False,
             **newer):
        self._planned_call(_args(locals()), DECODE_ATTRS)

    begin_forward = plan

    def forward(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None, v_scale=None,
                window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._set(_args(locals()), DECODE_ATTRS)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None,
                           v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
                           rope_theta=None):
        self._set(_args(locals()), DECODE_ATTRS)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, return_lse=True)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None,
            skip_softmax_threshold_scale_factor=None, kv_cache_sf=None, **newer):
        return self._checked_run(_args(locals()))
