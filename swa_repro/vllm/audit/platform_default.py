"""Which attention backend a release picks by default on a GPU class, from its own platform code.

``vllm/platforms/cuda.py`` imports ``vllm._C`` (the compiled extension the overlay does not have)
at the top, so the probe puts empty modules in its place first (the functions read here are pure
Python), then calls the release's ``_get_backend_priorities`` with the arguments its signature
takes (non-MLA, causal, the family's head count, head size and KV dtype). The selector
(``CudaPlatform.get_valid_backends``) takes the first entry whose ``validate_configuration``
passes; the probe runs that check for each entry up to FlashInfer where the backend's module
imports without compiled code, and says so where it does not.
"""

from __future__ import annotations

import inspect
import sys
import types

import torch

COMPILED = ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", "vllm.cumem_allocator", "vllm._flashmla_C")


def _call(fn, **offered):
    """``fn`` with the offered keyword arguments its signature takes (others omitted; a required
    one the audit cannot know is False)."""
    sig = inspect.signature(fn)
    kw = {}
    for name, p in sig.parameters.items():
        if name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in offered:
            kw[name] = offered[name]
        elif p.default is p.empty:
            kw[name] = False
    return fn(**kw)


def _offered(fb, fam: dict, arch: tuple, kv_cache_dtype: str = "auto") -> dict:
    """What the selector hands each backend's ``validate_configuration`` for this family."""
    from vllm.platforms.interface import DeviceCapability

    has_sink = any(k.get("sinks") for k in fam["layers"].values())
    has_sw = any(k.get("sliding_window") for k in fam["layers"].values())
    attn_type = getattr(getattr(fb, "AttentionType", None), "DECODER", "decoder")
    return dict(use_mla=False, device_capability=DeviceCapability(*arch), num_heads=fam["num_qo_heads"],
                kv_cache_dtype=kv_cache_dtype, use_non_causal=False, head_size=fam["head_dim"], use_mm_prefix=False,
                dtype=torch.bfloat16, block_size=16, has_sink=has_sink, use_sparse=False,
                use_per_head_quant_scales=False, attn_type=attn_type, has_sliding_window=has_sw)


def flashinfer_reasons(fb, fam: dict, arch: tuple, kv_cache_dtype: str) -> list[str]:
    """Why the release's selector would not take FlashInfer for this family with that
    ``--kv-cache-dtype`` (its ``FlashInferBackend.validate_configuration``; empty: it would)."""
    return list(_call(fb.FlashInferBackend.validate_configuration, **_offered(fb, fam, arch, kv_cache_dtype)) or [])


def probe(fb, fam: dict, arch: tuple) -> dict:
    for name in COMPILED:
        sys.modules.setdefault(name, types.ModuleType(name))
    offered = _offered(fb, fam, arch)
    try:
        import vllm.platforms.cuda as cuda
    except Exception as e:  # noqa: BLE001
        return {"error": f"vllm/platforms/cuda.py does not import: {type(e).__name__}: {e}".splitlines()[0]}
    order = _call(cuda._get_backend_priorities, **offered)
    checked = []
    for be in order:
        entry = {"backend": be.name}
        try:
            cls = be.get_class()
            reasons = _call(cls.validate_configuration, **offered)
            entry["valid"] = not reasons
            if reasons:
                entry["reasons"] = list(reasons)
        except Exception as e:  # noqa: BLE001 - its module needs compiled code: not checked
            entry["valid"] = None
            entry["why_unchecked"] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
        checked.append(entry)
        if be.name == "FLASHINFER":
            break
    first = next((c for c in checked if c["valid"] is not False), None)
    fi = next((c for c in checked if c["backend"] == "FLASHINFER"), None)
    return {"order": [b.name for b in order], "checked": checked,
            "default": first["backend"] if first else None,
            "default_checked": bool(first and first["valid"]),
            "flashinfer_valid": fi["valid"] if fi else None,
            "flashinfer_reasons": (fi or {}).get("reasons", []),
            "source": f"vllm/platforms/cuda.py:{inspect.getsourcelines(cuda._get_backend_priorities)[1]}"}
