"""What each family's attention layers ask vLLM's ``FlashInferImpl`` for, per layer kind.

vLLM's model classes cannot be built here: importing ``vllm.model_executor.models.gemma2`` (and
the others) reaches ``vllm/vllm_flash_attn/__init__.py``, which raises ImportError without the
compiled ``_vllm_fa2_C``/``_vllm_fa3_C`` (0.34.0 ``model_executor/layers/attention/
mm_encoder_attention.py:33`` -> ``v1/attention/backends/fa_utils.py:24``). So the numbers come
from the family's config (transformers' published defaults, ``engine.families.small_config``),
and each one cites the line of *that release's* model file that hands it to ``Attention(...)``,
found by the patterns in ``RULES``; a pattern that changes the value (cohere2's
``config.sliding_window + 1``, 0.29.0 on) is applied where the release has it, and a value whose
line the release lacks is marked ``source: not found``.
"""

from __future__ import annotations

import re
from pathlib import Path

from swa_repro.core.checkpoint_config import FULL, SLIDING
from swa_repro.engine import families as ef

FAMILIES = ("gemma2", "gemma3", "gpt-oss", "cohere2", "mistral")
MODELS = "vllm/model_executor/models"
# mistral's layers pass no per-layer window (no ``layer_types``): the Attention layer falls back to
# the model-level one (``cache_config.sliding_window``), in this file
ATTN_FILE = "vllm/model_executor/layers/attention/attention.py"
# family -> (model file, {parameter: [(pattern, effect), ...]}); effect: "config" (the config's
# value), "+1" (config + 1), "none" (the layer passes none), "qpas" / "head_dim" (scale rules)
RULES = {
    "gemma2": ("gemma2.py", {"window": [(r"config\.sliding_window if (self\.)?is_sliding", "config")],
                             "cap": [(r"attn_logits_soft_cap=config\.attn_logit_softcapping", "config")],
                             "scale": [(r"config\.query_pre_attn_scalar\s*\*\*\s*-0\.5", "qpas")]}),
    "gemma3": ("gemma3.py", {"window": [(r"config\.sliding_window if (self\.)?is_sliding", "config")],
                             "cap": [(r"attn_logits_soft_cap=None", "none")],
                             "scale": [(r"config\.query_pre_attn_scalar\s*\*\*\s*-0\.5", "qpas")]}),
    "gpt-oss": ("gpt_oss.py", {"window": [(r"config\.sliding_window if self\.layer_idx % 2 == 0", "config")],
                               "sinks": [(r"sinks=self\.sinks", "config")],
                               "scale": [(r"self\.head_dim\s*\*\*\s*-0\.5", "head_dim")]}),
    "cohere2": ("commandr.py", {"window": [(r"config\.sliding_window \+ 1", "+1"),
                                           (r"self\.sliding_window = config\.sliding_window$", "config")],
                                "scale": [(r"self\.head_dim\s*\*\*\s*-0\.5", "head_dim")]}),
    "mistral": ("llama.py", {"window": [(r"sliding_window = cache_config\.sliding_window", "config", ATTN_FILE)],
                             "scale": [(r"self\.head_dim\s*\*\*\s*-0\.5", "head_dim")]}),
}


def find(overlay: Path, rel: str, patterns) -> tuple[str | None, str]:
    """The first line of the release's file matching one of ``patterns`` -> (effect, ``file:line: text``)."""
    p = overlay / rel
    lines = p.read_text().splitlines() if p.is_file() else []
    for pat, effect in patterns:
        for i, ln in enumerate(lines, 1):
            if re.search(pat, ln.strip()):
                return effect, f"{rel}:{i}: {ln.strip()}"
    return None, f"{rel}: not found"


def resolve(name: str, overlay: Path) -> dict:
    """The family's per-kind parameters for the release in ``overlay``, each with its source."""
    sc = ef.small_config(name)
    cfg = sc.config
    mfile, rules = RULES[name]
    src = {}
    for param, pats in rules.items():
        rel = pats[0][2] if len(pats[0]) > 2 else f"{MODELS}/{mfile}"
        src[param] = find(overlay, rel, [x[:2] for x in pats])
    weff = src["window"][0]
    window = None if weff is None or weff == "none" else sc.sliding_window + (1 if weff == "+1" else 0)
    cap = sc.cap if src.get("cap", (None,))[0] == "config" else None
    qpas = cfg.get("query_pre_attn_scalar")
    scale = float(qpas) ** -0.5 if src["scale"][0] == "qpas" else sc.head_dim ** -0.5
    sinks = src.get("sinks", (None,))[0] == "config"
    layers = {}
    for kind in sorted(set(sc.kinds) & {SLIDING, FULL}):
        layers[kind] = {"sliding_window": window if kind == SLIDING else None, "logits_soft_cap": cap,
                        "scale": scale, "sinks": sinks,
                        "hf_window_left": sc.sliding_window - 1 if kind == SLIDING else -1}
    return {"family": name, "num_qo_heads": sc.num_qo_heads, "num_kv_heads": sc.num_kv_heads,
            "head_dim": sc.head_dim, "hf_sliding_window": sc.sliding_window, "hf_cap": sc.cap or None,
            "layers": layers, "sources": {k: v[1] for k, v in src.items()},
            "how": "config (transformers' defaults) + the release's model-file line per value"}
