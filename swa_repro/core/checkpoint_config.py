"""A user's checkpoint ``config.json`` as any server reads it, before an engine is asked (``audit
--sglang X --model PATH``: ``sglang.checkpoint``; ``audit --vllm X --model PATH``: ``vllm.checkpoint``).

Engine-neutral: the file found (a ``config.json`` or a folder holding one), parsed, its
``architectures[0]`` checked present (both engines pick the model class by it), the config object
built as transformers' class for its ``model_type`` (the user's values, the class filling the rest;
a ``model_type`` transformers lacks is a plain ``PretrainedConfig`` of the file's values), the layer
kinds transformers' mask gives it, and the record of what was read with each value's origin
(``"user"``: the file; ``"default"``: the class). Bad input is one line (``UsageError``, exit 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.core.inputs import read_json

# The values an audit reads of a checkpoint's attention, reported with where each came from.
ATTENTION_KEYS = ("sliding_window", "layer_types", "sliding_window_pattern", "use_sliding_window",
                  "max_window_layers", "attn_logit_softcapping", "final_logit_softcapping", "head_dim",
                  "num_attention_heads", "num_key_value_heads", "hidden_size", "num_hidden_layers",
                  "query_pre_attn_scalar")
USER, DEFAULT = "user", "default"
SLIDING, FULL = "sliding", "full"


@dataclass(frozen=True)
class Checkpoint:
    """One ``config.json`` as read (before a release is asked)."""
    arg: str  # what --model said
    path: str  # the config.json read
    values: dict  # the file's JSON
    architecture: str
    config_class: str  # "transformers.Gemma2Config" or "PretrainedConfig (plain: ...)"
    config: object  # the config object: the user's values, the class filling the rest
    # keys the release's own config class sets where the release re-parses the file through it (its
    # ``_CONFIG_REGISTRY``: ``sglang.release_configs``): its defaults and methods
    provides: frozenset = frozenset()

    def text_config(self):
        """The config holding the layers (a multimodal config's ``text_config``)."""
        get = getattr(self.config, "get_text_config", None)
        return get() if get else self.config

    def sub_configs(self) -> list:
        """The config's sub-configs at any depth (a multimodal model's ``vision_config`` /
        ``audio_config``, and theirs): the model file's vision tower reads ``config.layer_norm_eps`` off
        its own (0.5.23 siglip.py:265), and a sub-config may nest it one level further (transformers'
        ``ColModernVBertConfig``: ``vlm_config.vision_config``, the ``SiglipVisionConfig`` that vLLM
        0.34.0 colmodernvbert.py:268-269 hands ``SiglipVisionModel``, whose siglip.py:621 reads
        ``config.layer_norm_eps``)."""
        out, todo, seen = [], [self.config], {id(self.config)}
        while todo:
            for v in getattr(todo.pop(), "__dict__", {}).values():
                if hasattr(v, "to_dict") and hasattr(v, "model_type") and id(v) not in seen:
                    seen.add(id(v))
                    out.append(v)
                    todo.append(v)
        return out

    def has(self, key: str) -> bool:
        """The file gives ``key`` (at its top, its text part, or in a ``*_config`` it nests at any depth: a
        plain config keeps those as dicts), or the config class (the config, its text part, a sub-config at
        any depth) sets it."""
        return key in self.values or key in self.raw_text() or key in self.provides or \
            any(key in d for d in _nested_dicts(self.values)) or \
            any(hasattr(c, key) for c in (self.config, self.text_config(), *self.sub_configs()))

    def raw_text(self) -> dict:
        """The file's own values of the text config (its ``text_config`` object, else the file)."""
        sub = self.values.get("text_config")
        return sub if isinstance(sub, dict) else self.values


def _nested_dicts(values: dict) -> list[dict]:
    """The ``*_config`` dicts a file nests, at any depth (``vlm_config`` -> ``vision_config``)."""
    out = [v for k, v in values.items() if k.endswith("_config") and isinstance(v, dict)]
    return out + [d for v in out for d in _nested_dicts(v)]


def looks_like_path(text: str) -> bool:
    """A ``--model`` that names a file or folder rather than families."""
    return os.path.exists(text) or text.endswith(".json") or os.sep in text or text.startswith(".")


def config_path(text: str, families: tuple = ()) -> Path:
    """``--model``'s ``config.json`` (the file, or the one in the folder named)."""
    p = Path(text).expanduser()
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise UsageError(f"--model {text}: the folder holds no config.json; give the checkpoint's folder or its "
                             "config.json")
    elif not p.exists():
        raise UsageError(f"--model {text}: no such file or folder; give a checkpoint's config.json, a folder holding "
                         f"one{', or a family (' + ', '.join(families) + ')' if families else ''}")
    return p


def read(text: str, engine: str, families: tuple = (), cls=Checkpoint):
    """The file read and parsed (no release asked yet); ``engine`` names who picks the class by
    ``architectures`` (``sglang``, ``vLLM``) in the one line a file without it gets."""
    p = config_path(text, families)
    values = read_json(p, "--model")
    arch = values.get("architectures")
    if not isinstance(arch, list) or not arch or not isinstance(arch[0], str) or not arch[0]:
        raise UsageError(f"--model {p} has no architectures (e.g. \"architectures\": [\"Gemma2ForCausalLM\"]): "
                         f"{engine} picks the model class by it")
    cls_name, cfg = config_object(values, p)
    return cls(text, str(p), values, arch[0], cls_name, cfg)


def config_object(values: dict, p) -> tuple[str, object]:
    """transformers' class for ``model_type`` built from the values, else a plain PretrainedConfig."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    mt = values.get("model_type")
    if isinstance(mt, str) and mt in CONFIG_MAPPING:
        cls, name = CONFIG_MAPPING[mt], f"transformers.{CONFIG_MAPPING[mt].__name__}"
    else:
        cls = transformers.PretrainedConfig
        name = f"PretrainedConfig (plain: transformers {transformers.__version__} has no class for model_type {mt!r})"
    try:
        return name, cls.from_dict(dict(values))
    except Exception as e:  # noqa: BLE001 - a class's own validators (huggingface_hub's strict dataclasses)
        try:  # the plain class has no validators of its own: its __post_init__ is what refused
            if cls is transformers.PretrainedConfig:
                return name, plain_config(values)
        except Exception:  # noqa: BLE001, S110 - the first refusal is the one to say
            pass
        raise UsageError(f"--model {p}: {name.split(' ')[0]} refuses the file: {str(e).splitlines()[0][:160]}") \
            from None


def plain_config(values: dict):
    """A plain PretrainedConfig carrying the file's values, each set after construction. Why not
    ``from_dict``: transformers 5.12.1's ``PreTrainedConfig.__post_init__`` standardizes a
    ``rope_scaling`` before it sets the other keys (modeling_rope_utils.py:760 reads
    ``self.max_position_embeddings``), so a remote-code file carrying both (stepfun-ai/Step-3.5-Flash's,
    whose release reads it through its own class: sglang 0.5.23 configs/step3p5.py) fails there though
    no class of its own was asked."""
    import transformers

    cfg = transformers.PretrainedConfig()
    for k, v in values.items():
        setattr(cfg, k, v)
    return cfg


def layer_kinds(cfg) -> tuple:
    """transformers' layer kinds of ``cfg``: its ``layer_types``, else every layer sliding when it
    has ``sliding_window`` that its class reads (Mistral), else every layer full."""
    lt = getattr(cfg, "layer_types", None)
    if lt:
        return tuple({"sliding_attention": SLIDING, "full_attention": FULL}.get(t, "other") for t in lt)
    window = getattr(cfg, "sliding_window", None) and declares_window(type(cfg))
    return ((SLIDING if window else FULL),) * int(cfg.num_hidden_layers)


def declares_window(cls) -> bool:
    """Whether a ``sliding_window`` the file carries is one the model applies: a transformers config
    class that does not declare the key (a field, an ``__init__`` argument in transformers 4, or an
    ``attribute_map`` alias: RecurrentGemmaConfig's ``attention_window_size``)
    belongs to a model that never reads it, so the file's value is a stray. LlamaConfig declares none
    and transformers 5.12.1's modeling_llama.py builds only the causal mask, yet EAGLE-3 drafts
    published as ``LlamaForCausalLMEagle3`` carry their target's window (SpecForge's
    configs/gemma3-1b-eagle3.json: ``sliding_window: 512``, ``use_sliding_window: false``; its draft's
    LlamaAttention, specforge/modeling/draft/llama3_eagle.py, attends causally over every key). A plain
    or a release's own class keeps the file's value: its model is not transformers'."""
    import inspect

    if not cls.__module__.startswith("transformers.") or cls.__name__ in ("PretrainedConfig", "PreTrainedConfig"):
        return True
    fields = {k for c in cls.__mro__ for k in getattr(c, "__annotations__", {})}
    return "sliding_window" in fields or "sliding_window" in getattr(cls, "attribute_map", {}) or \
        "sliding_window" in inspect.signature(cls.__init__).parameters


def record(ck: Checkpoint) -> dict:
    """What the answer says it read: the file (``file``: its JSON as read), the class, and each
    attention value with its origin (``keys_from_default``: every key the class set that the file
    lacks, PretrainedConfig's own aside)."""
    from transformers import PretrainedConfig

    text, raw = ck.text_config(), ck.raw_text()
    vals = {}
    for k in ATTENTION_KEYS:
        if k in raw or hasattr(text, k):
            v = raw[k] if k in raw else getattr(text, k)
            vals[k] = {"value": v if isinstance(v, (type(None), bool, int, float, str, list)) else str(v),
                       "from": USER if k in raw else DEFAULT}
    defaulted = []
    if hasattr(text, "to_dict") and type(text) is not PretrainedConfig:  # the class's keys, not PretrainedConfig's
        generic = PretrainedConfig().to_dict()
        defaulted = sorted(k for k in text.to_dict() if k not in raw and k not in generic)
    return {"path": ck.path, "architecture": ck.architecture, "model_type": ck.values.get("model_type"),
            "config_class": ck.config_class, "values": vals, "keys_from_default": defaulted, "file": ck.values}


@cache
def auto_model_types() -> dict:
    """architecture -> model_type, from every ``*_MAPPING_NAMES`` of transformers' ``modeling_auto.py``
    read with ``ast`` (importing it pulls in torch and the generation stack: ~30 s on a busy CPU).
    Both engines' architecture columns find a published config through it (``sglang.audit.arch_cells``,
    ``vllm.archs``)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("transformers.models.auto.modeling_auto")
    out: dict = {}
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "").endswith("_MAPPING_NAMES") for t in node.targets):
            for pair in ast.walk(node.value):
                if isinstance(pair, ast.Tuple) and len(pair.elts) == 2 and isinstance(pair.elts[0], ast.Constant):
                    for n in ast.walk(pair.elts[1]):
                        if isinstance(n, ast.Constant) and isinstance(n.value, str):
                            out.setdefault(n.value, pair.elts[0].value)
    return out
