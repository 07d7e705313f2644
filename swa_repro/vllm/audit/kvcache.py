"""A layer's KV cache as a release lays it out: the layout its worker resolves, the cache allocated in
it, the spec a quantized cache makes, and the kernel page a ``--block-size`` gets (``paths`` drives
the builder and impl on them; ``live`` writes real keys into them).

Release differences, each read from the release's own code rather than assumed: the layout (0.29
and later: ``KVCacheLayout`` objects, the first of the release's
``get_supported_kv_cache_layouts([FlashInferBackend])``, as its worker resolves them; before: the
``"NHD"``/``"HND"`` strings of ``get_required_kv_cache_layout()``, set with the release's
``set_kv_cache_layout`` as its ``v1/attention/selector.py`` does, and the cache allocated from
``get_kv_cache_shape`` permuted by ``get_kv_cache_stride_order``, as its model runner does).
"""

from __future__ import annotations

import torch

PAGE = 16  # the audit's kernel page (tokens), the release's default block size
LARGE_PAGE = 64  # pages over this run only on trtllm-gen (the release's builder asserts it, 0.24.0+)


def resolve_layout(fb, cfg):
    """The layout this GPU class gets, by the release's own rule -> (layout, its name)."""
    from vllm.v1.attention.backends import utils as bu

    be = fb.FlashInferBackend
    if hasattr(be, "supported_kv_cache_layouts"):  # 0.29+: the worker's resolution, most preferred first
        pick = getattr(bu, "get_supported_kv_cache_layouts", None)
        layout = pick([be])[0] if pick else be.supported_kv_cache_layouts()[0]
        cfg.cache_config.get_resolved_kv_cache_layout = lambda: layout
        return layout, layout.name

    required = be.get_required_kv_cache_layout() if hasattr(be, "get_required_kv_cache_layout") else None
    if required is not None:
        bu.set_kv_cache_layout(required)
    return None, bu.get_kv_cache_layout()


def kv_cache(fb, layout, pages: int, heads: int, head_dim: int, dtype=torch.bfloat16, device="cpu",
             spec=None, cache_dtype: str = "auto", page: int = PAGE) -> torch.Tensor:
    """A layer's cache in the release's logical shape, allocated in its physical order (a quantized
    cache as bytes, vLLM's ``STR_DTYPE_TO_TORCH_DTYPE``, viewed as fp8 by ``forward``). 0.29+: the
    logical page ``[B, H, N, C]`` of the layer's spec (``spec.num_heads`` slots of
    ``state_content_size_bytes``: an NVFP4 spec packs K and V as ``2 * num_kv_heads`` slots,
    kv_cache_interface.py ``AttentionSpec``); before: ``get_kv_cache_shape`` with the cache dtype,
    which sizes an NVFP4 page's last dim itself."""
    if layout is not None:  # logical [B, H, N, C]; ``layer_view_order`` the physical one
        if spec is not None:
            from vllm.utils.torch_utils import get_dtype_size

            heads, content = spec.num_heads, spec.state_content_size_bytes // get_dtype_size(dtype)
        else:
            content = 2 * head_dim
        logical = (pages, heads, page, content)
        order = layout.layer_view_order
    else:  # get_kv_cache_shape, permuted by get_kv_cache_stride_order (the model runner's view)
        kw = {"cache_dtype_str": cache_dtype} if cache_dtype != "auto" else {}
        logical = fb.FlashInferBackend.get_kv_cache_shape(pages, page, heads, head_dim, **kw)
        order = fb.FlashInferBackend.get_kv_cache_stride_order()
    phys = torch.zeros([logical[i] for i in order], dtype=dtype, device=device)
    return phys.permute(*[list(order).index(i) for i in range(len(order))])


def quantized(spec, kv_cache_dtype: str):
    """The layer's KV-cache spec with a quantized cache, as the release's ``Attention.get_kv_cache_spec``
    makes it (0.20.0-0.34.0 model_executor/layers/attention/attention.py): the storage dtype
    (``STR_DTYPE_TO_TORCH_DTYPE``: fp8 is uint8) and ``kv_quant_mode=get_kv_quant_mode(dtype)``,
    which the builder reads to plan with fp8 KV (0.34.0 flashinfer.py:951)."""
    import dataclasses

    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    return dataclasses.replace(spec, dtype=STR_DTYPE_TO_TORCH_DTYPE[kv_cache_dtype],
                               kv_quant_mode=get_kv_quant_mode(kv_cache_dtype))


def packed(fb, spec):
    """The spec as the backend packs it, where the release lets the backend do so
    (``AttentionBackend.customize_spec``, 0.28+, called by ``Attention.get_kv_cache_spec`` and the
    worker's ``customize_attention_spec``): an NVFP4 spec becomes ``2 * num_kv_heads`` head slots of
    packed data and block scales (flashinfer.py ``FlashInferBackend.customize_spec``)."""
    custom = getattr(fb.FlashInferBackend, "customize_spec", None)
    return custom(spec) if custom else spec


def kernel_page(fb, spec, block: int) -> int:
    """The kernel page the release's worker gives a ``block``-token KV-cache block: the block itself
    where ``FlashInferBackend.get_supported_kernel_block_sizes`` takes it (a listed size, or a
    multiple of a ``MultipleOf``), else the largest listed size dividing it. This is the rule of
    ``select_common_block_size`` (``vllm/v1/worker/utils.py``: 0.24.0 :262, 0.34.0 :508), restated
    because that module imports vLLM's compiled flash-attention on its way in; the sizes are the
    release's own, asked with the audit's config current and the layers built."""
    sizes_of = fb.FlashInferBackend.get_supported_kernel_block_sizes
    try:
        sizes = sizes_of(spec)
    except TypeError:  # before 0.31.0 it takes no spec
        sizes = sizes_of()

    def takes(n: int) -> bool:
        return any(n == x if isinstance(x, int) else n % x.base == 0 for x in sizes)

    if takes(block):
        return block
    fits = [x for x in sizes if isinstance(x, int) and block % x == 0 and takes(x)]
    if not fits:
        raise ValueError(f"no kernel page of {sizes} divides --block-size {block}")
    return max(fits)
