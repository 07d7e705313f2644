"""The kernels the live vLLM run executes (``vllm.audit.live``), recorded as the audit records them.

* ``install_real``: this GPU's real FlashInfer, every class and function vLLM's backend binds
  replaced *in flashinfer's own modules* by a recording subclass or function that delegates to it
  (``standins.recording_wrapper`` over the real class), before the release imports them, so each
  call's arguments are recorded exactly as for the CPU audit and the real kernel runs;
* ``install_model``: a CPU model of the same kernels, for hosts without CUDA and for tests. Each
  call is exact float64 attention (rounded to the output dtype) at *what the kernel is told* in the
  audit's sense (``paths.told``: a planned wrapper's window and cap where the module its plan picked
  compiles them in, a direct kernel's own arguments, none where it takes none). It is the audit's
  claim run as a kernel; the GPU run holds each real kernel to it (``live.judge``: ``err_told``);
* an NVFP4 cache (``--kv-cache-dtype nvfp4``, read by fa2 on sm80 / sm90 from 0.32.0): the model
  writes it as flashinfer's ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping`` does (page.py:920:
  per 16 values of a head an e4m3 block scale, ``amax / 6`` over the global ``k_scale`` / ``v_scale``, and
  e2m1 codes two to a byte) into the release's views (``_nvfp4_kv_views``), and its wrappers read it
  back through ``kv_cache_sf``; the byte order within that layout is the model's own, since only the
  model reads what the model writes (on CUDA the real append and the real kernels pair up);
* ``reshape_and_cache_flash``: vLLM's compiled cache write (``torch.ops._C_cache_ops``, called by the
  release's ``FlashInferImpl.do_kv_cache_update``, 0.33.0 flashinfer.py:2847), registered in torch
  for the live run: token ``t``'s key and value to ``cache[slot // block, slot % block]`` of the
  ``(blocks, block, heads, dim)`` views the release passes (bf16 caches only).
"""

from __future__ import annotations

import math

import torch

from swa_repro.engine.standins import DecodeStandIn, PagedStandIn
from swa_repro.vllm.audit import env as standins

# what vLLM's backend binds from flashinfer and runs (0.30.0-0.34.0 flashinfer.py imports; XQA
# through vllm/utils/flashinfer.py's lazy ``flashinfer.decode.xqa_batch_decode_with_kv_cache``)
CLASSES = {"": ("BatchPrefillWithPagedKVCacheWrapper", "BatchDecodeWithPagedKVCacheWrapper",
                "BatchPrefillWithRaggedKVCacheWrapper", "BatchAttentionWithAttentionSinkWrapper")}
FUNCTIONS = {"decode": ("xqa_batch_decode_with_kv_cache", "trtllm_batch_decode_with_kv_cache", "fast_decode_plan"),
             "prefill": ("trtllm_batch_context_with_kv_cache",)}


# ----------------------------------------------------------------------------- the real kernels
def recording_call(name: str, fn, rec: standins.Recorder):
    """``fn`` (a real FlashInfer function) recorded as the stand-ins record it, then run."""
    def call(*a, **kw):
        first = {"wrapper": getattr(a[0], "_wid", None)} if name == "fast_decode_plan" and a else {}
        rec.add(name, "call", {**{f"arg{i}": x for i, x in enumerate(a)}, **kw, **first})
        return fn(*a, **kw)

    call.__name__ = name
    return call


def install_real(rec: standins.Recorder) -> dict:
    """Real FlashInfer with recording classes and functions in its modules -> {name: recorder}."""
    import flashinfer
    import flashinfer.decode
    import flashinfer.prefill

    out = {}
    for cls in CLASSES[""]:
        base = getattr(flashinfer, cls, None)
        if base is not None:
            out[cls] = standins.recording_wrapper(cls, base, rec)
            for m in (flashinfer, flashinfer.decode, flashinfer.prefill):
                if hasattr(m, cls):
                    setattr(m, cls, out[cls])
    for sub, names in FUNCTIONS.items():
        mod = getattr(flashinfer, sub)
        for n in names:
            if hasattr(mod, n):
                out[n] = recording_call(n, getattr(mod, n), rec)
                setattr(mod, n, out[n])
                if getattr(flashinfer, n, None) is not None:
                    setattr(flashinfer, n, out[n])
    return out


# ----------------------------------------------------------------------------- the CPU model
def split_cache(cache, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's paged cache -> ``(k, v)``, each ``(pages, page, heads, dim)``: a ``(k, v)`` tuple
    or one tensor with k/v on dim 1 (flashinfer utils.py ``_unpack_paged_kv_cache``), ``HND`` pages
    ``(heads, page, dim)``."""
    k, v = cache if isinstance(cache, (tuple, list)) else cache.unbind(1)
    if layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k, v


def exact(q, k_pages, v_pages, pages, kv_len: int, window_left: int, scale: float, cap: float):
    """One request's rows (the last ``len(q)`` positions of ``kv_len``) at a window and cap, in
    float64 over the keys any row can see, query heads grouped onto their KV head: ``(rows, Hq, D)``
    (written apart from ``core.reference.masked_attention``, the judge's reference)."""
    import torch

    rows, hq, d = q.shape
    lo = 0 if window_left < 0 else max(0, kv_len - rows - window_left)
    idx = pages.long()
    k = k_pages[idx].reshape(-1, *k_pages.shape[2:])[lo:kv_len].double()  # (n, Hk, D)
    v = v_pages[idx].reshape(-1, *v_pages.shape[2:])[lo:kv_len].double()
    hk = k.shape[1]
    s = torch.einsum("rhgd,nhd->hgrn", q.double().reshape(rows, hk, hq // hk, d), k) * scale  # (Hk, g, rows, n)
    if cap:
        s = cap * torch.tanh(s / cap)
    pos = torch.arange(kv_len - rows, kv_len)[:, None]  # (rows, 1)
    key = torch.arange(lo, kv_len)[None, :]  # (1, n)
    seen = (key <= pos) & ((window_left < 0) | (pos - key <= window_left))  # (rows, n)
    p = torch.softmax(s.masked_fill(~seen, float("-inf")), -1)
    return torch.einsum("hgrn,nhd->rhgd", p, v).reshape(rows, hq, d)


def _into(out, res):
    """A kernel's ``out=`` convention: the result written into ``out`` where one is given."""
    if out is None:
        return res
    out.copy_(res)
    return out


def _module(self) -> tuple[float, float]:
    """The window and cap the wrapper's module compiles in (``paths.told``'s rule)."""
    window, cap = getattr(self, "_module", (True, True))
    return (self._window_left if window else -1), ((self._logits_soft_cap or 0.0) if cap else 0.0)


# ----------------------------------------------------------------------------- NVFP4, modelled
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # the magnitudes of the 3 low bits; bit 3 is the sign


def nvfp4_quantize(x: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (..., D) -> (codes (..., D/2) uint8, two e2m1 to a byte, low nibble first; block scales
    (..., D/16) e4m3, ``amax / 6`` of each 16 values over the global ``scale``)."""
    b = x.double().reshape(*x.shape[:-1], -1, 16) / scale  # (..., D/16, 16)
    sf = (b.abs().amax(-1) / 6.0).to(torch.float8_e4m3fn)
    y = b / sf.double().clamp_min(2.0 ** -9)[..., None]
    grid = torch.tensor(E2M1, dtype=torch.float64)
    code = (y.abs()[..., None] - grid).abs().argmin(-1) + 8 * (y < 0)  # nearest magnitude, then the sign
    code = code.reshape(*x.shape[:-1], -1).to(torch.uint8)
    return code[..., 0::2] | (code[..., 1::2] << 4), sf


def nvfp4_dequantize(codes: torch.Tensor, sf: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The inverse of :func:`nvfp4_quantize`: (..., D) float64."""
    c = torch.stack([codes & 15, codes >> 4], -1).reshape(*codes.shape[:-1], -1).long()  # (..., D)
    grid = torch.tensor(E2M1, dtype=torch.float64)
    v = grid[c & 7] * torch.where(c >= 8, -1.0, 1.0).double()
    return (v.reshape(*sf.shape, 16) * sf.double()[..., None]).reshape(v.shape) * scale


def nvfp4_append(key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout="NHD"):
    """flashinfer's ``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping`` (page.py:920), modelled:
    token ``t``'s K and V quantized into slot ``slot_mapping[t]`` of the ``(k, v)`` data and scale views."""
    s = slot_mapping.long()
    s = s[s >= 0]  # negative slots are padding
    for x, data, sf, g in ((key, paged_kv_cache[0], kv_cache_sf[0], k_scale),
                           (value, paged_kv_cache[1], kv_cache_sf[1], v_scale)):
        codes, scales = nvfp4_quantize(x[:len(s)], float(g))
        page, slot = s // data.shape[1 if kv_layout == "NHD" else 2], s % data.shape[1 if kv_layout == "NHD" else 2]
        if kv_layout == "NHD":
            data[page, slot], sf[page, slot] = codes, scales
        else:
            data[page, :, slot], sf[page, :, slot] = codes, scales


def _pages(self, a) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's ``(k, v)`` pages ``(pages, page, heads, D)``: as given, or dequantized from an NVFP4
    cache (codes in ``paged_kv_cache``, block scales in ``kv_cache_sf``, global ``k_scale`` / ``v_scale``)."""
    k, v = split_cache(a.paged_kv_cache, self._kv_layout)
    if a.kv_cache_sf is None:
        return k, v
    ks, vs = split_cache(a.kv_cache_sf, self._kv_layout)
    return nvfp4_dequantize(k, ks, float(a.k_scale or 1.0)), nvfp4_dequantize(v, vs, float(a.v_scale or 1.0))


def _run_pages(self, a, rows: list, head_dim: int):
    """A planned wrapper's ``run``, modelled: request ``i``'s query rows ``rows[i]`` over its pages
    (``_indptr``, ``_indices``, ``_last``), exact at the window and cap its module compiles in."""
    self._run_window(a.window_left)
    k, v = _pages(self, a)
    window, cap = _module(self)
    out = torch.zeros(a.q.shape[0], a.q.shape[1], head_dim, dtype=a.q.dtype)
    for i, (r0, r1) in enumerate(rows):
        p0, p1 = self._indptr[i], self._indptr[i + 1]
        n = (p1 - p0 - 1) * self._page + self._last[i]
        out[r0:r1] = exact(a.q[r0:r1], k, v, self._indices[p0:p1], n, window, self._sm_scale, cap).to(a.q.dtype)
    return _into(a.out, out)


class ToldPaged(PagedStandIn):
    """The paged prefill wrapper, modelled: exact attention at what its module is told."""

    def _plan(self, a) -> None:
        super()._plan(a)
        self._rows, self._indptr = a.qo_indptr.tolist(), a.paged_kv_indptr.tolist()
        self._indices, self._last = a.paged_kv_indices.cpu(), a.paged_kv_last_page_len.tolist()
        self._page = int(a.page_size)

    def _run(self, a):
        return _run_pages(self, a, list(zip(self._rows, self._rows[1:])), self._head_dim_vo)


class ToldDecode(DecodeStandIn):
    """The paged decode wrapper, modelled: one row per request, exact at what its module is told."""

    def _plan(self, a) -> None:
        super()._plan(a)
        self._indptr, self._indices = a.indptr.tolist(), a.indices.cpu()
        self._last, self._page = a.last_page_len.tolist(), int(a.page_size)

    def _run(self, a):
        return _run_pages(self, a, [(i, i + 1) for i in range(len(self._indptr) - 1)], self._head_dim)


def told_decode(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale=1.0,
                bmm2_scale=1.0, window_left=-1, out=None, sinks=None, kv_layout="NHD", q_len_per_req=1, **_):
    """XQA's and trtllm-gen's decode (flashinfer 0.7.2.post1 decode.py:4592 and its trtllm sibling),
    modelled: request ``b``'s ``q_len_per_req`` rows over its first ``seq_lens[b]`` keys of
    ``block_tables[b]``, exact at ``window_left`` with softmax scale ``bmm1_scale`` (bf16: the softmax
    scale), outputs times ``bmm2_scale``; neither function takes a soft cap, so none is applied."""
    if sinks is not None:
        raise NotImplementedError("attention sinks are not modelled on CPU")
    k, v = split_cache(kv_cache, kv_layout)
    n = int(q_len_per_req or 1)
    res = torch.zeros_like(query)
    for b, s in enumerate(seq_lens.tolist()):
        pages = block_tables[b, :math.ceil(s / k.shape[1])]
        rows = slice(b * n, (b + 1) * n)
        o = exact(query[rows], k, v, pages, s, window_left, float(bmm1_scale), 0.0) * float(bmm2_scale)
        res[rows] = o.to(query.dtype)
    return _into(out, res)


def install_model(rec: standins.Recorder) -> dict:
    """The recording stand-in ``flashinfer`` (``standins.install``) whose wrappers and direct decode
    kernels compute :func:`exact` at what they are told."""
    return standins.install(rec, wrappers={"BatchPrefillWithPagedKVCacheWrapper": ToldPaged,
                                           "BatchDecodeWithPagedKVCacheWrapper": ToldDecode},
                            functions={"xqa_batch_decode_with_kv_cache": told_decode,
                                       "trtllm_batch_decode_with_kv_cache": told_decode,
                                       "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping": nvfp4_append})


# ----------------------------------------------------------------------------- vLLM's cache write
def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's ``_C_cache_ops.reshape_and_cache_flash`` for a bf16 cache, in torch (see module docstring)."""
    if kv_cache_dtype != "auto":
        raise NotImplementedError(f"kv_cache_dtype {kv_cache_dtype!r}: the live run writes bf16 caches only")
    n = slot_mapping.shape[0]
    s = slot_mapping.long()
    block = key_cache.shape[1]
    key_cache[s // block, s % block] = key[:n].to(key_cache.dtype)
    value_cache[s // block, s % block] = value[:n].to(value_cache.dtype)


_LIB = []


def register_cache_op() -> None:
    """``torch.ops._C_cache_ops.reshape_and_cache_flash`` -> :func:`reshape_and_cache_flash` (once)."""
    if _LIB or hasattr(getattr(torch.ops, "_C_cache_ops", None), "reshape_and_cache_flash"):
        return
    lib = torch.library.Library("_C_cache_ops", "FRAGMENT")
    lib.define("reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
               "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()")
    for dev in ("CPU", "CUDA"):
        lib.impl("reshape_and_cache_flash", reshape_and_cache_flash, dev)
    _LIB.append(lib)
