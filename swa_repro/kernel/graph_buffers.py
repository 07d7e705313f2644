"""Who owns a prefill wrapper's index and mask buffers: FlashInfer's CUDA-graph-mode rules.

A ``BatchPrefillWith{Paged,Ragged}KVCacheWrapper`` built with ``use_cuda_graph=True`` keeps the
buffers it is GIVEN (``qo_indptr_buf``, ``paged_kv_indptr_buf`` / ``kv_indptr_buf``,
``paged_kv_indices_buf``, ``paged_kv_last_page_len_buf``, ``custom_mask_buf``, ``mask_indptr_buf``:
the ctor stores them as they are) and ``plan()`` copies its inputs INTO them; the packed custom mask
goes to offset 0 of ``custom_mask_buf``. ``run()`` (and a captured kernel at replay) reads them
there, at run time. Two wrappers given one buffer therefore both read what was planned into it
last. Built without ``use_cuda_graph``, ``plan()`` rebinds each buffer to its own tensor (the mask
packed anew, or ``None`` without one), so each wrapper reads its own plan. ``run()`` runs the
custom-mask kernel whenever ``_custom_mask_buf`` is not ``None`` (in graph mode: whenever a buffer
was given, planned with a mask or not).

The rules and their lines, ``py/prefill.py`` of each pinned flashinfer (same code in every one;
only the line numbers move). Paged wrapper:

=========== ========== ===================== ================= ============ ============
version     ctor keeps graph: indptr/indices  graph: mask copy  eager: own   run: CUSTOM
=========== ========== ===================== ================= ============ ============
0.6.7.post2 :1619      :1909-1917            :1919-1934        :1946-1955   :2296
0.6.12      :1672      :1962-1970            :1972-1987        :1999-2008   :2375
0.6.14      :1726      :2016-2024            :2026-2041        :2053-2062   :2445
0.6.18      :1809      :2381-2389            :2391-2406        :2418-2427   :2972
0.7.2       :2196      :2799-2807            :2809-2824        :2836-2845   :3646
0.7.2.post1 :2872      :3499-3507            :3509-3524        :3536-3545   :4382
=========== ========== ===================== ================= ============ ============

Ragged wrapper (same rules; the mask by slice assignment, and an eager plan without a mask keeps
the mask it had): 0.6.12 :2766, :3019-3020 graph, :3021-3030 eager, :3457 run; 0.7.2 :4206,
:4510-4511, :4527-4536, :5631. The mask is packed per request by
``segment_packbits(bitorder="little")`` over ``_compute_page_mask_indptr`` (0.6.12 :1888-1901,
0.7.2 :2712-2730): request ``r``'s ``qo * kv`` bits start at byte
``mask_indptr[r]``. 0.7.2.post1's fp8-KV EAGLE route keeps the rule: in graph mode "the buffer
belongs to the caller (shared with the captured graph)" (:2182-2184), eager it may pad its own
copy (:2194-2196).

The index buffers' dtype is the module's ``IdType``: plan picks the module from the dtype of the
indptr it is GIVEN (0.7.2 prefill.py:2985 ``paged_kv_indptr.dtype``, ragged :4871 ``kv_indptr.dtype``)
and copies its arguments into the buffers with ``copy_`` (:2799-2807, a silent cast), and the kernel
casts each buffer's pointer to ``IdType*`` unchecked (csrc/batch_prefill_paged.cuh:76-84,
batch_prefill.cu:162-163). A graph wrapper planned with int64 indices over sglang's int32 buffers
reads each pair of int32 as one int64: on the H100 of 2026-12-06 an illegal memory access
(:func:`check_index_dtypes` refuses it instead).

sglang builds every CUDA-graph verify wrapper on ONE ``custom_mask_buf`` (0.5.23
flashinfer_backend.py:1134-1138 allocates ``cuda_graph_custom_mask``, :1182-1186 hands it to
each wrapper of :1174-1204), with a ``mask_indptr_buf`` per wrapper.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

PAGED_BUFFERS = ("qo_indptr", "paged_kv_indptr", "paged_kv_last_page_len")  # copied whole
RAGGED_BUFFERS = ("qo_indptr", "kv_indptr")
# the plan argument whose dtype picks the module's IdType, and the buffers its kernel reads as IdType
ID_BUFFERS = {"paged": ("paged_kv_indptr", ("_qo_indptr_buf", "_paged_kv_indptr_buf", "_paged_kv_indices_buf",
                                            "_paged_kv_last_page_len_buf", "_mask_indptr_buf")),
              "ragged": ("kv_indptr", ("_qo_indptr_buf", "_kv_indptr_buf", "_mask_indptr_buf"))}


def check_index_dtypes(w, kind: str, plan: dict) -> None:
    """A CUDA-graph wrapper (``kind``: paged / ragged) about to be planned with ``plan``'s arguments:
    a ValueError where a buffer it was given has another dtype than the indptr that picks the
    module's ``IdType`` (see the module docstring: FlashInfer checks nothing, and its kernel reads
    the buffer as ``IdType`` out of bounds). Eager wrappers rebind their buffers: nothing to check."""
    name, attrs = ID_BUFFERS[kind]
    idtype = getattr(plan.get(name), "dtype", None)
    if not getattr(w, "_use_cuda_graph", False) or idtype is None:
        return
    for attr in attrs:
        buf = getattr(w, attr, None)
        if torch.is_tensor(buf) and buf.dtype != idtype:
            raise ValueError(f"CUDA-graph plan with {name} of {idtype} over the {buf.dtype} {attr[1:]}: the kernel "
                             f"built for {idtype} indices would read the buffer as {idtype} (flashinfer 0.7.2 "
                             "prefill.py:2985, csrc/batch_prefill_paged.cuh:76-84), an illegal memory access on a GPU")


def pack_segments(bits: torch.Tensor, indptr) -> tuple[torch.Tensor, torch.Tensor]:
    """flashinfer ``segment_packbits(bits, indptr, bitorder="little")``: each segment packed to
    ``ceil(n / 8)`` bytes; ``(packed uint8, byte indptr int32)``."""
    b = bits.reshape(-1).detach().to("cpu", torch.bool).numpy()
    ip = [int(x) for x in indptr]
    segs = [np.packbits(b[s:e], bitorder="little") for s, e in itertools.pairwise(ip)]
    out = np.concatenate(segs) if segs else np.zeros(0, np.uint8)
    return torch.from_numpy(out), torch.tensor(np.cumsum([0] + [len(s) for s in segs]), dtype=torch.int32)


def unpack_segments(packed: torch.Tensor, byte_indptr, sizes) -> torch.Tensor:
    """The bits a kernel reads: request ``r``'s first ``sizes[r]`` bits from byte ``byte_indptr[r]``
    of ``packed``, concatenated (the layout ``plan(custom_mask=)`` takes)."""
    raw = packed.detach().to("cpu", torch.uint8).numpy()
    parts = [np.unpackbits(raw[int(byte_indptr[r]):], bitorder="little", count=int(n))
             for r, n in enumerate(sizes)]
    return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, np.uint8)).bool()


def kv_lens(kv_indptr, last_page_len, page_size: int) -> list[int]:
    """flashinfer page.py ``get_seq_lens``: ``(pages - 1) * page_size + last_page_len``."""
    pages = (kv_indptr[1:] - kv_indptr[:-1]).tolist()
    return [(n - 1) * int(page_size) + int(last_page_len[i]) if n > 0 else 0 for i, n in enumerate(pages)]


def _copy(w, attr: str, value: torch.Tensor) -> None:
    buf = getattr(w, attr)
    buf[: len(value)].copy_(value.to(buf.device))


def keep_mask(w, packed, mask_indptr, graph: bool, clear: bool = True) -> None:
    """The packed mask into the given buffer at offset 0 (graph mode: a ValueError without one,
    as flashinfer raises), else the wrapper's own tensor (``None`` without a mask where ``clear``:
    the paged wrapper; the ragged one keeps its old mask)."""
    if not graph:
        if packed is None and not clear:
            return
        w._custom_mask_buf = None if packed is None else packed.to(w.device)
        w._mask_indptr_buf = None if packed is None else mask_indptr.to(w.device)
        return
    if packed is None:
        return  # the buffers keep what was planned into them last
    for attr in ("_custom_mask_buf", "_mask_indptr_buf"):
        if not torch.is_tensor(getattr(w, attr)):
            raise ValueError(f"{attr[1:]} must be initialized with a torch.Tensor in cuda graph mode if we "
                             "use custom mask in attention computation.")
    _copy(w, "_custom_mask_buf", packed)
    _copy(w, "_mask_indptr_buf", mask_indptr)


def packed_mask(a, qo_lens, kv_lens_):
    """``(packed, mask_indptr)`` of a plan's mask (``None, None`` without one), as plan() makes them."""
    elems = torch.tensor(np.cumsum([0] + [q * k for q, k in zip(qo_lens, kv_lens_)]), dtype=torch.int32)
    if a.packed_custom_mask is not None:
        return a.packed_custom_mask, elems
    if a.custom_mask is None:
        return None, None
    return pack_segments(a.custom_mask, elems)


def plan_paged(w, a) -> None:
    """A paged plan's index and mask buffers, under the rules above."""
    graph = w._use_cuda_graph
    check_index_dtypes(w, "paged", vars(a))
    qo_lens = (a.qo_indptr[1:] - a.qo_indptr[:-1]).tolist()
    packed, mask_indptr = packed_mask(a, qo_lens, kv_lens(a.paged_kv_indptr, a.paged_kv_last_page_len, a.page_size))
    w._page_size = int(a.page_size)
    if graph:
        if len(a.qo_indptr) - 1 != len(w._qo_indptr_buf) - 1:
            raise ValueError("The batch size should be fixed during the lifecycle of the wrapper in cuda graph mode")
        if len(a.paged_kv_indices) > len(w._paged_kv_indices_buf):
            raise ValueError("The length of paged_kv_indices exceeds the allocated buffer size.")
        for n in (*PAGED_BUFFERS, "paged_kv_indices"):
            _copy(w, f"_{n}_buf", getattr(a, n))
    else:
        for n in (*PAGED_BUFFERS, "paged_kv_indices"):
            setattr(w, f"_{n}_buf", getattr(a, n).to(w.device))
    keep_mask(w, packed, mask_indptr, graph)


def plan_ragged(w, a) -> None:
    """A ragged plan's index and mask buffers (page size 1: ``kv_indptr`` is the lengths')."""
    graph = w._use_cuda_graph
    check_index_dtypes(w, "ragged", vars(a))
    qo_lens = (a.qo_indptr[1:] - a.qo_indptr[:-1]).tolist()
    packed, mask_indptr = packed_mask(a, qo_lens, (a.kv_indptr[1:] - a.kv_indptr[:-1]).tolist())
    for n in RAGGED_BUFFERS:
        if graph:
            _copy(w, f"_{n}_buf", getattr(a, n))
        else:
            setattr(w, f"_{n}_buf", getattr(a, n).to(w.device))
    keep_mask(w, packed, mask_indptr, graph, clear=False)


def paged_reads(w) -> dict:
    """What a paged ``run()`` reads at run time, in ``plan()``'s argument names: the index buffers
    and the mask unpacked from ``_custom_mask_buf`` at ``_mask_indptr_buf`` (``custom_mask`` None:
    the causal / non-causal kernel). Each index tensor keeps its buffer's dtype: it is the ``IdType``
    the kernel reads it as, and a plan handed these reads picks its module from
    ``paged_kv_indptr.dtype`` (0.7.2 prefill.py:2985), so a re-plan over sglang's int32 buffers
    (0.5.23 flashinfer_backend.py:474-487, :1107-1111, :1139-1140) stays int32
    (:func:`check_index_dtypes` refuses any other). Copies: a later plan refills the buffers."""
    qo, kv, last, idx = (getattr(w, f"_{n}_buf").detach().cpu().clone() for n in (*PAGED_BUFFERS, "paged_kv_indices"))
    out = {"qo_indptr": qo, "paged_kv_indptr": kv, "paged_kv_last_page_len": last, "paged_kv_indices": idx,
           "custom_mask": None}
    if w._custom_mask_buf is not None:
        sizes = [q * k for q, k in zip((qo[1:] - qo[:-1]).tolist(), kv_lens(kv, last, w._page_size))]
        out["custom_mask"] = unpack_segments(w._custom_mask_buf, w._mask_indptr_buf.cpu(), sizes)
    return out
