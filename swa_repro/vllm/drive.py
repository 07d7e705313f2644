"""The child: vLLM release X's FlashInfer backend driven on CPU (``python -m swa_repro.vllm.drive
--overlay DIR --out F --gpu sm90 --model gemma2``), one JSON document of what each path's layers
ask for and what FlashInfer is told.

What is the release's own code: ``FlashInferMetadataBuilder`` (``__init__`` and ``build``) and
``FlashInferImpl`` (``__init__`` and ``forward``) of ``vllm/v1/attention/backends/flashinfer.py``,
vLLM's ``utils/flashinfer.py`` (which kernel route: ``use_trtllm_attention`` & co.), its
``v1/attention/backends/utils.py`` (``infer_global_hyperparameters``) and its KV-cache specs.
What the audit supplies (``setup``): the FlashInfer stand-ins (``standins``), a CUDA platform of the
chosen GPU class built on vLLM's own ``Platform`` (its compiled ``CudaPlatform`` cannot load
without ``vllm._C``), a config namespace with the fields the builder reads, and attention layers
whose ``FlashInferImpl`` gets the family's parameters from the transformers config
(``layers``) rather than from vLLM's model classes (not built in phase 1).
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import torch

from swa_repro.sglang.overlay_run import child_main, child_parser
from swa_repro.vllm import standins

PAGE = 16


def foreign(overlay: Path) -> list[str]:
    root = str(overlay.resolve())
    return sorted(k for k, m in list(sys.modules.items()) if (k == "vllm" or k.startswith("vllm."))
                  and getattr(m, "__file__", None) and not str(Path(m.__file__).resolve()).startswith(root))


def setup(arch: tuple, rec: standins.Recorder):
    """Stand-ins and platform first, then the release's backend module."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ["VLLM_HAS_FLASHINFER_CUBIN"] = "1"  # vLLM's artifactory probe is a network GET otherwise
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    standins.install(rec)
    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class AuditCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = device_type = "cuda"
        dispatch_key = "CUDA"

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(*arch)

        @classmethod
        def is_pin_memory_available(cls) -> bool:
            return False

    platforms._current_platform = AuditCuda()
    import vllm.v1.attention.backends.flashinfer as fb

    from swa_repro.sglang.audit.env import _CpuTorch

    fb.get_dcp_world_size_and_rank = lambda *a, **k: (1, 0)
    fb.torch = _CpuTorch()  # device="cuda" buffers land on the CPU, as in the sglang audit
    fb._copy_page_indices_kernel = CopyPageIndices()
    return fb


class CopyPageIndices:
    """Torch port of the release's Triton ``_copy_page_indices_kernel`` (flashinfer.py, launched
    ``[(num_reqs,)]``): request i's first ``cu[i+1]-cu[i]`` block-table entries to ``out[cu[i]:]``."""

    def __getitem__(self, grid):
        def launch(out, table, stride, cu, BLOCK_SIZE=None):
            for i in range(grid[0]):
                a, b = int(cu[i]), int(cu[i + 1])
                out[a:b] = table[i, :b - a]
        return launch


# ----------------------------------------------------------------------------- layers and config
def layer_params(fam: dict) -> dict:
    """kind -> FlashInferImpl kwargs: ``sliding_window`` is HF's (inclusive; the impl keeps
    ``sliding_window - 1``, flashinfer.py ``FlashInferImpl.__init__``), ``logits_soft_cap`` the
    config's ``attn_logit_softcapping``, ``scale`` ``query_pre_attn_scalar ** -0.5`` where the config
    has it (gemma), else ``head_dim ** -0.5``."""
    out = {}
    for kind in sorted(set(fam["kinds"])):
        out[kind] = dict(num_heads=fam["num_qo_heads"], head_size=fam["head_dim"], scale=fam["scale"],
                         num_kv_heads=fam["num_kv_heads"], alibi_slopes=None,
                         sliding_window=fam["sliding_window"] if kind == "sliding" else None,
                         kv_cache_dtype="auto", logits_soft_cap=fam["cap"] or None)
    return out


def make_config(fb, fam: dict, layers: dict, max_len: int):
    from vllm.config import CUDAGraphMode

    ns = types.SimpleNamespace
    cfg = ns(cache_config=ns(cache_dtype="auto", block_size=PAGE),
             model_config=ns(max_model_len=max_len, dtype=torch.bfloat16, use_mla=False,
                             get_num_attention_heads=lambda pc=None: fam["num_qo_heads"],
                             get_head_size=lambda: fam["head_dim"]),
             attention_config=ns(use_trtllm_attention=None, disable_flashinfer_prefill=False,
                                 disable_flashinfer_q_quantization=False),
             num_speculative_tokens=0, speculative_config=None,
             scheduler_config=ns(max_num_batched_tokens=8192, max_num_seqs=16),
             compilation_config=ns(cudagraph_mode=CUDAGraphMode.NONE, max_cudagraph_capture_size=None,
                                   static_forward_context=layers),
             parallel_config=ns(cp_kv_cache_interleave_size=1, dcp_comm_backend="ag_rs",
                                decode_context_parallel_size=1, prefill_context_parallel_size=1,
                                tensor_parallel_size=1))
    return cfg


# ----------------------------------------------------------------------------- batches and paths
# path -> per request (query tokens, sequence length); decodes first, as vLLM's reorder puts them
PATHS = {"prefill": [(300, 5000), (200, 200)],
         "decode": [(1, 6000), (1, 100), (1, 4097)],
         "mixed": [(1, 6000), (1, 50), (300, 5000)]}


def common_metadata(reqs: list):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    q = [a for a, _ in reqs]
    s = [b for _, b in reqs]
    qsl = torch.tensor([0, *torch.tensor(q).cumsum(0).tolist()], dtype=torch.int32)
    pages = [(n + PAGE - 1) // PAGE for n in s]
    table = torch.zeros(len(reqs), max(pages), dtype=torch.int32)
    start = 0
    for i, n in enumerate(pages):
        table[i, :n] = torch.arange(start, start + n, dtype=torch.int32)
        start += n
    slots = torch.cat([table[i, (torch.arange(sl - ql, sl) // PAGE)] * PAGE + torch.arange(sl - ql, sl) % PAGE
                       for i, (ql, sl) in enumerate(reqs)]).long()
    seq = torch.tensor(s, dtype=torch.int32)
    cm = CommonAttentionMetadata(query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq,
                                 num_reqs=len(reqs), num_actual_tokens=int(sum(q)), max_query_len=max(q),
                                 max_seq_len=max(s), block_table_tensor=table, slot_mapping=slots, causal=True)
    return cm, start


class Layer:
    """What vLLM's ``FlashInferImpl.forward`` reads of its layer: the q/k/v scales (1.0: no fp8)."""

    def __init__(self, impl, name):
        self.impl, self.layer_name, self.kv_cache_dtype = impl, name, "auto"
        for n in ("_q_scale", "_k_scale", "_v_scale"):
            setattr(self, n, torch.ones(()))
            setattr(self, f"{n}_float", 1.0)
        self._o_scale_float = None


def kv_cache(layout, pages: int, heads: int, head_dim: int) -> torch.Tensor:
    """A layer's cache, logical ``[B, H, N, 2*D]`` (vLLM's ``KVCacheLayout``: logical order fixed,
    ``layer_view_order`` the physical one), allocated in the layout's physical order."""
    logical = (pages, heads, PAGE, 2 * head_dim)
    order = layout.layer_view_order
    phys = torch.zeros([logical[i] for i in order], dtype=torch.bfloat16)
    return phys.permute(*[order.index(i) for i in range(4)])


# ----------------------------------------------------------------------------- the audit
def told(call: dict) -> dict:
    """What the kernel is told: a wrapper's ``run`` -> the window, cap and scale it planned; a
    direct kernel call -> its own arguments (``bmm1_scale`` is the softmax scale for bf16 caches;
    no ``logits_soft_cap`` argument is recorded as "not passed")."""
    a = call["args"]
    if call["method"] == "run":
        return {"window_left": a["planned_window_left"], "logits_soft_cap": a["planned_logits_soft_cap"],
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


KERNEL_CALLS = ("run", "call")


def audit(fam: dict, arch: tuple, rec: standins.Recorder) -> dict:
    fb = setup(arch, rec)
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
    cfg = make_config(fb, fam, layers, 16384)
    cv._current_vllm_config = cfg  # what force_use_trtllm_attention() reads
    layout = fb.FlashInferBackend.supported_kv_cache_layouts()[0]
    cfg.cache_config.get_resolved_kv_cache_layout = lambda: layout
    hq, hk, d = fam["num_qo_heads"], fam["num_kv_heads"], fam["head_dim"]
    rows = []
    for kind, p in params.items():
        name = f"model.layers.{kind}.attn"
        layer = layers[name] = AuditLayer(fb.FlashInferImpl(**p), name)
        impl = layer.impl
        asked = {"window_left": impl.window_left, "logits_soft_cap": impl.logits_soft_cap, "sm_scale": impl.scale,
                 "sinks": impl.sinks is not None}
        common = dict(block_size=PAGE, num_kv_heads=hk, head_size=d, dtype=torch.bfloat16)
        spec = SlidingWindowSpec(**common, sliding_window=p["sliding_window"]) if p["sliding_window"] \
            else FullAttentionSpec(**common)
        # one builder per layer kind: vLLM builds one per KV-cache group, and the kinds' specs differ
        builder = fb.FlashInferMetadataBuilder(spec, [name], cfg, torch.device("cpu"))
        for path, reqs in PATHS.items():
            n0 = len(rec.calls)
            cm, pages = common_metadata(reqs)
            row = {"layer": kind, "path": path, "requests": reqs, "asked": asked}
            try:
                md = builder.build(0, cm)
                t = cm.num_actual_tokens
                q = torch.zeros(t, hq, d, dtype=torch.bfloat16)
                k = torch.zeros(t, hk, d, dtype=torch.bfloat16)
                impl.forward(layer, q, k, k.clone(), kv_cache(layout, pages, hk, d), md,
                             torch.zeros(t, hq, d, dtype=torch.bfloat16))
            except Exception as e:  # the release refused this path: that is the row's answer
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            calls = rec.calls[n0:]
            row["calls"] = calls
            row["kernels"] = [{"kernel": c["target"], "how": c["method"], "told": told(c),
                               "differs": verdict(asked, told(c))}
                              for c in calls if c["method"] in KERNEL_CALLS and c["target"] != "get_seq_lens"]
            rows.append(row)
    return {"rows": rows, "kv_cache_layout": layout.name, "backend_file": fb.__file__}


def run(overlay: Path, a) -> dict:
    import json

    fam = json.loads(a.family)
    rec = standins.Recorder()
    doc = audit(fam, tuple(int(x) for x in a.arch.split(".")), rec)
    bad = foreign(overlay)
    if bad:
        raise RuntimeError(f"{len(bad)} vllm modules did not come from the overlay (e.g. {bad[0]})")
    import vllm

    return {**doc, "vllm": vllm.__version__ if hasattr(vllm, "__version__") else None,
            "family": fam, "arch": a.arch}


def main(argv=None) -> int:
    p = child_parser("swa_repro.vllm.drive")
    p.add_argument("--family", required=True, help="the family's parameters as JSON (vllm.families)")
    p.add_argument("--arch", required=True, help="the GPU class's compute capability, e.g. 9.0")
    p.add_argument("--deps", type=Path, help="pure-Python imports the venv lacks, after the overlay")
    a, _ = p.parse_known_args(argv)
    if a.deps:
        sys.path.append(str(a.deps))
    return child_main(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
