"""One family on one GPU class, inside the child (``drive``): the release's
``FlashInferMetadataBuilder`` built per layer kind, every batch shape (``PATHS``) built and run
through ``FlashInferImpl.forward`` with the recording stand-ins, and per kernel call what it is
told against what the layer asks for.

The KV cache each path runs on is laid out as the release lays it out (``kvcache``).
"""

from __future__ import annotations

import types

import torch

from swa_repro.vllm.audit import env as standins
from swa_repro.vllm.audit.kvcache import (
    LARGE_PAGE,
    PAGE,
    kernel_page,
    kv_cache,
    packed,
    quantized,
    resolve_layout,
)

# path -> per request (query tokens, sequence length); decodes first, as vLLM's reorder puts them
PATHS = {"prefill": [(300, 5000), (200, 200)],
         "decode": [(1, 6000), (1, 100), (1, 4097)],
         "mixed": [(1, 6000), (1, 50), (300, 5000)]}
KERNEL_CALLS = ("run", "call")
NOT_KERNELS = ("get_seq_lens", "fast_decode_plan")  # recorded functions that plan or count, run nothing
SPEC_TOKENS = 2  # draft tokens per request: a verify batch is 1 + 2 query tokens per request
# paths a builder of another config takes: path -> (make_config switches, [(stage, requests)])
# * FULL CUDA-graph decode (``cudagraph_mode`` FULL): the builder's first plan of a graph wrapper is
#   a full ``plan`` (its capture), every later one ``fast_decode_plan`` (a replay: fast_plan_decode in
#   the release's flashinfer.py); the replay is the next decode step of the same batch;
# * speculative decoding: the target model's verify batch, ``1 + num_speculative_tokens`` queries per
#   request; a release whose decode kernel takes them (spec-as-decode: trtllm / XQA, fa2's native
#   decode) treats them as decodes (``reorder_batch_threshold``), any other as prefills;
# * an fp8 KV cache (``--kv-cache-dtype fp8``): the layer's impl, spec and builder with it, the cache
#   stored as bytes and viewed as fp8 by the release's forward, the mixed batch (both kernels);
# * an NVFP4 KV cache (``--kv-cache-dtype nvfp4``): the same, the spec as the backend packs it
#   (``customize_spec``, 0.28+) and the cache allocated in that packing (:func:`kv_cache`);
# * ``--block-size 128``: the kernel page the release's worker picks for it
#   (:func:`kernel_page`); where that is over 64 (sm100's trtllm-gen pages, 0.24.0+), the mixed
#   batch on a builder and cache of that page.
VARIANTS = {
    "cuda_graph_decode": ({"graphs": True}, (("capture", PATHS["decode"]),
                                             ("replay", [(q, s + 1) for q, s in PATHS["decode"]]))),
    "spec_decode": ({"spec": SPEC_TOKENS}, ((None, [(1 + SPEC_TOKENS, s) for _, s in PATHS["decode"]]),)),
    "fp8_kv_mixed": ({"cache_dtype": "fp8"}, ((None, PATHS["mixed"]),)),  # --kv-cache-dtype fp8, scales 1.0
    "nvfp4_kv_mixed": ({"cache_dtype": "nvfp4"}, ((None, PATHS["mixed"]),)),  # --kv-cache-dtype nvfp4
    "large_page_mixed": ({"block_size": 128}, ((None, PATHS["mixed"]),)),  # --block-size 128
}
QUANT_QUERY = ("fp8", "nvfp4")  # caches for which ``Attention.forward`` hands an fp8 query to an impl
# that takes one (``query_quant``: model_executor/layers/attention/attention.py, 0.20.0-0.34.0)


# ----------------------------------------------------------------------------- layers and config
def layer_params(fam: dict) -> dict:
    """kind -> FlashInferImpl kwargs, from the family's per-kind parameters (``vllm.families``:
    the release's model code where it could be driven, else the config): ``sliding_window`` is
    HF's (inclusive; the impl keeps ``sliding_window - 1``), ``sinks`` a tensor of one per head
    where the layer has them (gpt-oss)."""
    out = {}
    for kind, k in sorted(fam["layers"].items()):
        kw = dict(num_heads=fam["num_qo_heads"], head_size=fam["head_dim"], scale=k["scale"],
                  num_kv_heads=fam["num_kv_heads"], alibi_slopes=None, sliding_window=k["sliding_window"],
                  kv_cache_dtype="auto", logits_soft_cap=k["logits_soft_cap"] or None)
        if k.get("sinks"):
            kw["sinks"] = torch.zeros(fam["num_qo_heads"], dtype=torch.float32)
        out[kind] = kw
    return out


def make_config(fam: dict, layers: dict, max_len: int, graphs: bool = False, spec: int = 0,
                cache_dtype: str = "auto", block_size: int = PAGE):
    """What the release's metadata builder reads of its config (``graphs``: FULL CUDA-graph decode;
    ``spec``: draft tokens per request, as ``SpeculativeConfig`` gives them; ``cache_dtype``:
    ``--kv-cache-dtype``; ``block_size``: ``--block-size``, the KV-cache manager's block)."""
    from vllm.config import CUDAGraphMode

    ns = types.SimpleNamespace
    return ns(cache_config=ns(cache_dtype=cache_dtype, block_size=block_size),
              model_config=ns(max_model_len=max_len, dtype=torch.bfloat16, use_mla=False,
                              get_num_attention_heads=lambda pc=None: fam["num_qo_heads"],
                              get_num_kv_heads=lambda pc=None: fam["num_kv_heads"],
                              get_head_size=lambda: fam["head_dim"],
                              hf_text_config=ns(attn_logit_softcapping=fam.get("hf_cap"))),  # the config's cap
              attention_config=ns(use_trtllm_attention=None, disable_flashinfer_prefill=False,
                                  disable_flashinfer_q_quantization=False, use_prefill_decode_attention=False,
                                  flashinfer_max_num_splits=None),
              num_speculative_tokens=spec,
              speculative_config=ns(num_speculative_tokens=spec, max_num_new_slots_for_drafting=0,  # EAGLE's
                                    parallel_drafting=False, enable_adaptive_verification=False,  # defaults
                                    method="eagle") if spec else None,
              scheduler_config=ns(max_num_batched_tokens=8192, max_num_seqs=16),
              compilation_config=ns(cudagraph_mode=CUDAGraphMode.FULL if graphs else CUDAGraphMode.NONE,
                                    max_cudagraph_capture_size=None,
                                    static_forward_context=layers),
              parallel_config=ns(cp_kv_cache_interleave_size=1, dcp_comm_backend="ag_rs",
                                 decode_context_parallel_size=1, prefill_context_parallel_size=1,
                                 tensor_parallel_size=1),
              kv_transfer_config=None, use_v2_model_runner=False)


def common_metadata(reqs: list, table: torch.Tensor | None = None, page: int = PAGE):
    """The release's ``CommonAttentionMetadata`` of a batch ``[(query tokens, sequence length)]``
    -> (it, pages used); ``table``: its block table (default: pages handed out in order) of
    ``page``-token kernel pages."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    q = [a for a, _ in reqs]
    s = [b for _, b in reqs]
    qsl = torch.tensor([0, *torch.tensor(q).cumsum(0).tolist()], dtype=torch.int32)
    pages = [(n + page - 1) // page for n in s]
    if table is None:
        table = torch.zeros(len(reqs), max(pages), dtype=torch.int32)
        start = 0
        for i, n in enumerate(pages):
            table[i, :n] = torch.arange(start, start + n, dtype=torch.int32)
            start += n
    slots = torch.cat([slots_of(table, i, torch.arange(sl - ql, sl), page) for i, (ql, sl) in enumerate(reqs)])
    seq = torch.tensor(s, dtype=torch.int32)
    cm = CommonAttentionMetadata(query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq,
                                 num_reqs=len(reqs), num_actual_tokens=int(sum(q)), max_query_len=max(q),
                                 max_seq_len=max(s), block_table_tensor=table, slot_mapping=slots, causal=True)
    return cm, sum(pages)


def slots_of(table: torch.Tensor, i: int, positions: torch.Tensor, page: int = PAGE) -> torch.Tensor:
    """Request ``i``'s cache slots of token ``positions``: its block table's page times the page size,
    plus the offset in the page (vLLM's slot mapping)."""
    return (table[i, positions // page] * page + positions % page).long()


class Layer:
    """What vLLM's ``FlashInferImpl.forward`` reads of its layer: the q/k/v scales (1.0: no fp8)."""

    def __init__(self, impl, name, kv_cache_dtype: str = "auto"):
        self.impl, self.layer_name, self.kv_cache_dtype = impl, name, kv_cache_dtype
        for n in ("_q_scale", "_k_scale", "_v_scale"):
            setattr(self, n, torch.ones(()))
            setattr(self, f"{n}_float", 1.0)
        self._o_scale_float = None


# ----------------------------------------------------------------------------- verdicts
def told(call: dict) -> dict:
    """What the kernel is told: a wrapper's ``run`` -> the window, cap and scale it holds, each only
    where the module its last full ``plan`` picked compiles it in (a CUDA-graph replay's
    ``fast_decode_plan`` changes the values, not the module: ``standins``); a direct kernel call ->
    its own arguments (``bmm1_scale`` is the softmax scale for bf16 caches; no ``logits_soft_cap``
    argument is recorded as "not passed")."""
    a = call["args"]
    if call["method"] == "run" and "jit_window_left" in a:  # the sink wrapper (standins.SinkStandIn)
        window = a["planned_window_left"] if a["jit_window_left"] >= 0 else -1  # compiled without a window
        return {"window_left": window, "logits_soft_cap": a["planned_logits_soft_cap"],
                "sm_scale": a["sink_sm_scale"], "sinks": a.get("sinks") is not None}
    if call["method"] == "run":
        return {"window_left": a["planned_window_left"] if a.get("module_window", True) else -1,
                "logits_soft_cap": a["planned_logits_soft_cap"] if a.get("module_cap", True) else 0.0,
                "sm_scale": a["planned_sm_scale"], "sinks": a.get("sinks") is not None}
    return {"window_left": a.get("window_left", "not passed"),
            "logits_soft_cap": a.get("logits_soft_cap", "not passed"),
            "sm_scale": a.get("sm_scale", a.get("bmm1_scale", "not passed")),
            "sinks": a.get("sinks") is not None}


def verdict(asked: dict, got: dict) -> list[str]:
    """What differs, one phrase each (empty: the kernel is told what the layer asks for)."""
    out = []
    if got["window_left"] != asked["window_left"]:
        out.append(f"window_left {asked['window_left']} asked, {got['window_left']} told")
    cap_a, cap_t = asked["logits_soft_cap"] or 0.0, got["logits_soft_cap"]
    if (cap_a if cap_t == "not passed" else (cap_t or 0.0) != cap_a):
        out.append(f"logits_soft_cap {cap_a} asked, {cap_t} told")
    if isinstance(got["sm_scale"], float) and abs(got["sm_scale"] - asked["sm_scale"]) > 1e-9:
        out.append(f"sm_scale {asked['sm_scale']} asked, {got['sm_scale']} told")
    if got["sinks"] != asked["sinks"]:
        out.append(f"sinks {asked['sinks']} asked, {got['sinks']} told")
    return out


# ----------------------------------------------------------------------------- one family, one GPU class
def _step(fb, builder, layer, layout, reqs: list, fam: dict, spec=None, page: int = PAGE) -> None:
    """One batch through the builder and ``FlashInferImpl.forward`` (q/k/v zeros: the calls are the
    point). With a quantized cache (:data:`QUANT_QUERY`) and an impl that takes a quantized query, the
    query arrives in fp8, as the release's ``Attention.forward`` quantizes it (its ``query_quant``,
    static per tensor, scale 1.0); the cache is allocated for ``spec`` (the builder's)."""
    cm, pages = common_metadata(reqs, page=page)
    md = builder.build(0, cm)
    t, hq, hk, d = cm.num_actual_tokens, fam["num_qo_heads"], fam["num_kv_heads"], fam["head_dim"]
    k = torch.zeros(t, hk, d, dtype=torch.bfloat16)
    q = torch.zeros(t, hq, d, dtype=torch.bfloat16)
    quant = layer.kv_cache_dtype.startswith(QUANT_QUERY)
    if quant and getattr(layer.impl, "supports_quant_query_input", False):
        q = q.to(torch.float8_e4m3fn)
    cache = kv_cache(fb, layout, pages, hk, d, torch.uint8 if quant else torch.bfloat16, spec=spec,
                     cache_dtype=layer.kv_cache_dtype, page=page)
    layer.impl.forward(layer, q, k, k.clone(), cache, md, torch.zeros(t, hq, d, dtype=torch.bfloat16))


def _kernel(call: dict, asked: dict, stage: str | None) -> dict:
    """One kernel call of a path's row: what it is told and how that differs from what is asked."""
    got = told(call)
    return {"kernel": call["target"], "how": call["method"], "told": got, "differs": verdict(asked, got),
            **({"stage": stage} if stage else {})}


class Drive:
    """One layer kind's paths through the release's builder and impl (:func:`audit`): each path's
    row, what its kernels are told against what the layer asks for."""

    def __init__(self, fb, layout, fam: dict, rec: standins.Recorder, name: str, params: dict, spec, builder,
                 layer_cls):
        self.fb, self.layout, self.fam, self.rec, self.name = fb, layout, fam, rec, name
        self.params, self.spec, self.builder, self.layer_cls = params, spec, builder, layer_cls

    def layer_for(self, kv: str):
        """The kind's layer with ``--kv-cache-dtype kv``: its impl made for that cache."""
        return self.layer_cls(self.fb.FlashInferImpl(**{**self.params, "kv_cache_dtype": kv}), self.name, kv)

    def spec_for(self, kv: str, spec=None):
        """The kind's KV-cache spec (or ``spec``) with that cache, as the layer makes it
        (:func:`quantized`) and the backend packs it (:func:`packed`)."""
        spec = spec if spec is not None else self.spec
        return spec if kv == "auto" else packed(self.fb, quantized(spec, kv))

    def path(self, path: str, cfg, steps, layer, asked: dict) -> dict:
        """``steps`` (``[(stage, requests)]``) on the kind's builder, or (``cfg``: a variant's config)
        on a builder of that config made at its first stage, as vLLM makes one per config; an fp8
        cache with the layer's impl and spec made for it (:func:`quantized`)."""
        n0, row = len(self.rec.calls), {"path": path, "requests": steps[-1][1], "asked": asked, "kernels": []}
        kv = cfg.cache_config.cache_dtype if cfg is not None else "auto"
        builder, spec, page = self.builder, self.spec, PAGE
        if cfg is not None and cfg.cache_config.block_size != PAGE:  # --block-size: the release's kernel page
            import dataclasses

            try:
                page = row["kernel_page"] = kernel_page(self.fb, self.spec, cfg.cache_config.block_size)
            except Exception as e:  # noqa: BLE001 - the release found no kernel page: the row's answer
                return {**row, "error": f"{type(e).__name__}: {e}".splitlines()[0], "calls": []}
            if page <= LARGE_PAGE:  # split into pages the default paths already ran: no other route
                return {**row, "calls": []}
            spec = dataclasses.replace(self.spec, block_size=page)
        if kv != "auto":  # a cache dtype the selector may not give FlashInfer: that is the row's answer
            row["cache_dtype"] = kv
            from vllm.platforms import current_platform

            from swa_repro.vllm.audit.platform_default import flashinfer_reasons

            cap = current_platform.get_device_capability()
            reasons = flashinfer_reasons(self.fb, self.fam, (cap.major, cap.minor), kv)
            if reasons:
                return {**row, "refused": f"validate_configuration: {', '.join(reasons)}", "calls": []}
        for stage, reqs in steps:
            k0 = len(self.rec.calls)
            try:
                if kv != "auto":  # the layer's impl with that cache, and its spec as the layer makes it
                    layer = self.layer_for(kv)
                if cfg is not None and stage in (None, "capture"):
                    spec = self.spec_for(kv, spec)
                    builder = self.fb.FlashInferMetadataBuilder(spec, [self.name], cfg, torch.device("cpu"))
                _step(self.fb, builder, layer, self.layout, reqs, self.fam, spec, page)
            except Exception as e:  # the release refused this path: that is the row's answer
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            row["kernels"] += [_kernel(c, asked, stage) for c in self.rec.calls[k0:]
                               if c["method"] in KERNEL_CALLS and c["target"] not in NOT_KERNELS]
            if "error" in row:
                break
        row["calls"] = self.rec.calls[n0:]
        return row


def prepare(fb, fam: dict, rec: standins.Recorder, device: str = "cpu") -> tuple[dict, str, list]:
    """The family's layers as the release builds them -> ``(configs by variant (None: the default),
    the KV-cache layout's name, [(kind, a refusal's row or (Drive, layer, asked))])``: per layer kind
    the release's ``FlashInferImpl`` and one ``FlashInferMetadataBuilder`` on ``device``."""
    import vllm.config.vllm as cv
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    class AuditLayer(Layer, AttentionLayerBase):
        def get_attn_backend(self):
            return fb.FlashInferBackend

        def get_kv_cache_spec(self, vllm_config):
            return None

    params = layer_params(fam)
    layers: dict = {}
    cfgs = {None: make_config(fam, layers, 16384)}
    cv._current_vllm_config = cfgs[None]  # what force_use_trtllm_attention() reads
    layout, layout_name = resolve_layout(fb, cfgs[None])
    for path, (switches, _) in VARIANTS.items():
        cfgs[path] = make_config(fam, layers, 16384, **switches)
        cfgs[path].cache_config.__dict__.update({k: v for k, v in vars(cfgs[None].cache_config).items()
                                                 if k not in ("cache_dtype", "block_size")})  # the layout, resolved once
    hk, d = fam["num_kv_heads"], fam["head_dim"]
    kinds = []
    for kind, p in params.items():
        name = f"model.layers.{kind}.attn"
        try:
            layer = layers[name] = AuditLayer(fb.FlashInferImpl(**p), name)
        except Exception as e:  # the release's impl refuses the layer (e.g. sinks on this GPU class)
            kinds.append((kind, {"path": "build", "error": f"{type(e).__name__}: {e}".splitlines()[0],
                                 "asked": None, "calls": [], "kernels": []}))
            continue
        impl = layer.impl
        asked = {"window_left": impl.window_left, "logits_soft_cap": impl.logits_soft_cap, "sm_scale": impl.scale,
                 "sinks": getattr(impl, "sinks", None) is not None}
        common = dict(block_size=PAGE, num_kv_heads=hk, head_size=d, dtype=torch.bfloat16)
        spec = SlidingWindowSpec(**common, sliding_window=p["sliding_window"]) if p["sliding_window"] \
            else FullAttentionSpec(**common)
        try:  # one builder per layer kind: vLLM builds one per KV-cache group, and the kinds' specs differ
            builder = fb.FlashInferMetadataBuilder(spec, [name], cfgs[None], torch.device(device))
        except Exception as e:
            kinds.append((kind, {"path": "build", "asked": asked, "calls": [], "kernels": [],
                                 "error": f"{type(e).__name__}: {e}".splitlines()[0]}))
            continue
        kinds.append((kind, (Drive(fb, layout, fam, rec, name, p, spec, builder, AuditLayer), layer, asked)))
    return cfgs, layout_name, kinds


DCP = 2  # decode-context parallel ranks asked of the release's KV-cache sizing (``-dcp 2``)


def dcp_refusal(spec, cfg) -> dict:
    """Decode-context parallelism for one layer kind, as the release sizes its KV cache: the spec's own
    ``max_memory_usage_bytes`` with ``decode_context_parallel_size`` 2 (a sliding layer's asserts
    that DCP has no sliding window: kv_cache_interface.py in 0.20.0-0.34.0; the KV-cache manager
    asserts it again) -> ``{"refused": its message}``, ``{"allowed": True}``, or ``{"not_checked": why}``."""
    import copy

    c = copy.copy(cfg)
    c.parallel_config = types.SimpleNamespace(**{**vars(cfg.parallel_config), "decode_context_parallel_size": DCP})
    try:
        spec.max_memory_usage_bytes(c)
    except AssertionError as e:
        import inspect

        fn = type(spec).max_memory_usage_bytes
        lines, first = inspect.getsourcelines(fn)
        at = next((first + i for i, ln in enumerate(lines) if "DCP" in ln or "decode_context" in ln), first)
        where = inspect.getsourcefile(fn).rsplit("/vllm/", 1)[-1]
        return {"refused": f"AssertionError: {e}".splitlines()[0], "source": f"vllm/{where}:{at}"}
    except Exception as e:  # noqa: BLE001 - the sizing read what this config lacks: no answer, said
        return {"not_checked": f"{type(e).__name__}: {e}".splitlines()[0]}
    return {"allowed": True}


def audit(fb, fam: dict, rec: standins.Recorder) -> dict:
    cfgs, layout_name, kinds = prepare(fb, fam, rec)
    rows, dcp = [], {}
    for kind, built in kinds:
        row0 = {"layer": kind}
        if isinstance(built, dict):
            rows.append({**row0, **built})
            continue
        drive, layer, asked = built
        dcp[kind] = dcp_refusal(drive.spec, cfgs[None])
        rows += [{**row0, **drive.path(path, None, ((None, reqs),), layer, asked)} for path, reqs in PATHS.items()]
        rows += [{**row0, **drive.path(path, cfgs[path], steps, layer, asked)} for path, (_, steps) in VARIANTS.items()]
    return {"rows": rows, "kv_cache_layout": layout_name, "backend_file": fb.__file__, "dcp": dcp}
