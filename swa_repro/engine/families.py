"""Model families and GPU classes as both engines' audits take them: transformers-level facts, no engine's.

A family is a transformers config class with its published defaults (:data:`MODELS`: head_dim,
GQA, window, cap and layer pattern, nothing typed here) and the architecture that serves it.
:func:`small_config` keeps those and cuts the layer count to the shortest prefix of the published
pattern that holds every layer kind (gemma2: 2 layers, gemma3: 6, qwen2-swa: 29), so a release's
own model code (sglang's: ``sglang.audit.family``; vLLM's values: ``vllm.families``) builds a
model whose layers are the real ones. A GPU class is what a release and FlashInfer read of the GPU.

The layer kind a user's checkpoint asks for is transformers': ``layer_types[i] ==
"sliding_attention"``, or every layer when the class has ``sliding_window`` and no ``layer_types``
(Mistral). HF counts the window inclusive of the query (``sliding_window=4096``: keys ``q - 4095 ..
q``), so the keys a sliding layer intends are FlashInfer's ``window_left = sliding_window - 1``
(transformers 5.12.1 masking_utils.py:88-95 ``sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``).

Nothing here imports torch or an engine: the CLI checks its arguments with it before any work.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from swa_repro.core.checkpoint_config import layer_kinds
from swa_repro.core.errors import UsageError

# name -> (transformers config class, constructor switches, architecture: its ``architectures`` entry).
# Switches only turn a published feature on (Qwen2 ships use_sliding_window=False); no sizes here.
MODELS: dict[str, tuple[str, dict, str]] = {
    "gemma2": ("Gemma2Config", {}, "Gemma2ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", {}, "Gemma3ForCausalLM"),
    "gpt-oss": ("GptOssConfig", {}, "GptOssForCausalLM"),
    "exaone4": ("Exaone4Config", {}, "Exaone4ForCausalLM"),
    "cohere2": ("Cohere2Config", {}, "Cohere2ForCausalLM"),
    "gemma4": ("Gemma4TextConfig", {}, "Gemma4ForCausalLM"),
    "mistral": ("MistralConfig", {}, "MistralForCausalLM"),
    "qwen2-swa": ("Qwen2Config", {"use_sliding_window": True}, "Qwen2ForCausalLM"),
}
# Keys a published checkpoint's config.json carries that the transformers class does not set, read by
# sglang's model file outside attention (no size, window or cap among them).
CHECKPOINT_KEYS = {
    "gemma2": {"hidden_act": "gelu_pytorch_tanh"},  # google/gemma-2-9b config.json (beside hidden_activation)
    "gpt-oss": {"swiglu_limit": 7.0},  # openai/gpt-oss-20b config.json
    "exaone4": {"sliding_window_pattern": "LLLG"},  # LGAI-EXAONE/EXAONE-4.0-32B config.json (the class: 4)
    # google/gemma-3-{4b,12b,27b}-it config.json text_config (transformers 5 files it under
    # rope_parameters["full_attention"]); 0.5.12-0.5.13.post1 gemma3_causal.py:584 reads its "factor"
    # unconditionally (KeyError for a config without one, e.g. gemma-3-1b's rope_scaling null)
    "gemma3": {"rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
}
FAMILIES = tuple(MODELS)


@dataclass(frozen=True)
class GpuClass:
    """What the release and FlashInfer read of the GPU: sm100 or not (sglang's ragged wrapper
    backend, 0.5.23 flashinfer_backend.py:501-522), sm90 or not (FlashInfer's ``auto``: fa3 on
    sm90a, flashinfer 0.7.2 utils.py:616-628)."""
    name: str
    arch: tuple
    cards: str

    @property
    def is_sm100(self) -> bool:
        return self.arch[0] == 10

    def resolve(self, backend: str, head_dim: int, custom_mask: bool) -> str:
        """What FlashInfer runs for a wrapper built with ``backend``: explicit backends are never
        rewritten (flashinfer 0.7.2 prefill.py:4815-4816); ``auto`` is fa3 on sm90 where fa3 takes
        the call (no custom mask, head_dim 64/128/256: utils.py:504-507, :616-628), else fa2 (on
        sm100, ``auto`` may move a windowless, capless call on to cudnn/cutlass, prefill.py:1833-1843,
        which serve exactly what fa2 does)."""
        if backend != "auto":
            return backend
        return "fa3" if self.arch[0] == 9 and not custom_mask and head_dim in (64, 128, 256) else "fa2"


GPU_CLASSES = {g.name: g for g in (GpuClass("sm80", (8, 0), "A100 / A10 / L40 (sm80, sm86, sm89)"),
                                   GpuClass("sm90", (9, 0), "H100 / H200"),
                                   GpuClass("sm100", (10, 0), "B200 / GB200"))}
DEFAULT_GPU = "sm90"


# ----------------------------------------------------------------------------- the small config
@dataclass(frozen=True)
class SmallConfig:
    family: str
    config: dict  # config.json of the small model (transformers' to_dict + architectures)
    kinds: tuple  # per layer of the small model: sliding | full | other (transformers')
    full_layers: int  # the published default's layer count
    sliding_window: int | None  # HF, inclusive of the query
    head_dim: int
    num_qo_heads: int
    num_kv_heads: int
    cap: float  # attn_logit_softcapping, 0 none
    hf_class: str = ""  # the config class read (a checkpoint's; a family's is MODELS')

    @classmethod
    def from_dict(cls, d: dict) -> SmallConfig:
        """Back from ``dataclasses.asdict`` (the audit's child gets a checkpoint's as JSON)."""
        return cls(**{**d, "kinds": tuple(d["kinds"])})

    @property
    def intended_window(self) -> int:
        """FlashInfer's count of the keys a sliding layer intends (HF's window minus the query)."""
        return -1 if self.sliding_window is None else self.sliding_window - 1


def small_config(family: str) -> SmallConfig:
    """The family's config at its published defaults, cut to the shortest layer prefix (at least 2)
    that holds every layer kind of the published pattern."""
    cls_name, switches, arch = MODELS[family]
    cls = getattr(importlib.import_module("transformers"), cls_name, None)
    if cls is None:
        raise UsageError(f"--model {family}: the installed transformers has no {cls_name}")
    full = cls(**switches)
    kinds = layer_kinds(full)
    n = max([2] + [kinds.index(k) + 1 for k in set(kinds)])
    extra = {"layer_types": list(full.layer_types[:n])} if getattr(full, "layer_types", None) else {}
    cfg = cls(**switches, num_hidden_layers=n, **extra)
    d = {**cfg.to_dict(), **CHECKPOINT_KEYS.get(family, {}), "architectures": [arch]}
    hd = getattr(full, "head_dim", None) or full.hidden_size // full.num_attention_heads
    nkv = getattr(full, "num_key_value_heads", None) or full.num_attention_heads
    return SmallConfig(family, d, kinds[:n], int(full.num_hidden_layers), getattr(full, "sliding_window", None),
                       int(hd), int(full.num_attention_heads), int(nkv),
                       float(getattr(full, "attn_logit_softcapping", None) or 0.0))
