"""Values the audit sets where an architecture column's published defaults leave a key unset that the
release's model file reads while it builds (parent side, ``ast`` only; never for a user's checkpoint,
whose missing key stays one line: ``checkpoint.check_release``).

Why: a class's defaults are not a checkpoint. transformers' ``Gemma4Config()`` leaves its
``vision_config`` / ``audio_config`` None, which every published Gemma 4 checkpoint carries and
0.5.23 models/gemma4_mm.py:202-214 builds; ``ExaoneMoeConfig()`` has no ``is_moe_layer``, which
models/exaone_moe.py:497-504 indexes per layer; ``Step3p5Config()`` no ``use_head_wise_attn_gate``
(models/step3p5.py:470). None of these moves the window: each is set to the smallest value the
model file accepts, read at the line that reads it, and said in the column's provenance
(``set_by_audit``: key -> value and why). A window key has no smallest value: it is taken from the
config's own text part where the model file's class reads the same key there (the assistant of
Gemma 4 reads its target's), else the column is not built and says so.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

BOOL_PREFIXES = ("use_", "is_", "has_", "enable_", "with_")


def sub_config_defaults(model_type: str) -> dict:
    """``{key: sub-config defaults}`` for each sub-config transformers' class for ``model_type`` leaves
    None whose class is concrete (``Gemma4Config.sub_configs``' ``vision_config: Gemma4VisionConfig``);
    ``AutoConfig`` (any model_type) is left to a checkpoint."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    inst = cls()
    out = {}
    for key, sub in (getattr(cls, "sub_configs", None) or {}).items():
        if getattr(inst, key, None) is None and isinstance(sub, type) and sub.__name__ != "AutoConfig":
            d = sub().to_dict()
            out[key] = {k: v for k, v in d.items() if not k.startswith("_") and k != "transformers_version"}
    return out


@cache
def _parents(path: Path) -> tuple[ast.Module, dict]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8-sig"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    return tree, parents


def _site(path: Path, key: str, line: int):
    """The ``config.KEY`` / ``self.config.KEY`` load at ``line`` of ``path``, with the parent map."""
    tree, parents = _parents(path)
    node = next((x for x in ast.walk(tree) if isinstance(x, ast.Attribute) and x.attr == key
                 and x.lineno == line and isinstance(x.ctx, ast.Load)), None)
    return node, parents


def _indexed(node, parents) -> bool:
    """``config.K[i]``, or ``v = config.K`` and ``v[i]`` in the same function (exaone_moe.py:497-504)."""
    up = parents.get(node)
    if isinstance(up, ast.Subscript) and up.value is node:
        return True
    if isinstance(up, ast.Assign) and len(up.targets) == 1 and isinstance(up.targets[0], ast.Name):
        fn = up
        while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = parents.get(fn)
        name = up.targets[0].id
        return fn is not None and any(isinstance(x, ast.Subscript) and isinstance(x.value, ast.Name)
                                      and x.value.id == name for x in ast.walk(fn))
    return False


def fill(key: str, where: str, models: Path, n_layers: int | None, values: dict):
    """``(value, why)`` for ``key`` read at ``where`` (``file.py:line`` under ``models``), or None when
    only a checkpoint can say (a window the config's text part lacks, a per-layer list of unknown
    length, a read the site does not tell the kind of)."""
    if "window" in key:
        text = values.get("text_config")
        if isinstance(text, dict) and text.get(key) is not None:
            return text[key], f"the config's text_config sets {key}={text[key]!r} (the target's window)"
        return None
    file, _, line = where.rpartition(":")
    node, parents = _site(models / file, key, int(line))
    if node is None:
        return None
    up = parents.get(node)
    if isinstance(up, ast.Compare) and len(up.comparators) == 1 and isinstance(up.ops[0], (ast.Eq, ast.Is)):
        other = up.comparators[0] if up.left is node else up.left
        if isinstance(other, ast.Constant):
            return other.value, f"{where} compares it with {other.value!r}: the one value it accepts"
    boolish = key.startswith(BOOL_PREFIXES)
    if _indexed(node, parents):
        if not n_layers:
            return None
        v = False if boolish else 1
        return [v] * n_layers, f"{where} indexes it per layer: {v!r} for each of the {n_layers} layers"
    if boolish:
        return False, f"{where} reads a flag: False (off)"
    if isinstance(up, ast.Call) and getattr(up.func, "id", None) == "float":
        return 1e-6, f"{where} reads a float: 1e-06"
    return 1, f"{where} reads a count or size: 1, the smallest"


def legacy_keys(model_type: str, values: dict) -> dict:
    """``{key: (value, why)}``: a per-layer key the release reads in the legacy form transformers' class
    folds into its own ``layer_types``, written back through that class's own map. transformers
    5.x configuration_deepseek_v4.py pops ``compress_ratios`` (per-layer 0/4/128) into ``layer_types``
    through ``_COMPRESS_RATIO_TO_LAYER_TYPE``; 0.5.23 configs/model_config.py:1429 reads
    ``hf_config.compress_ratios`` (a published DeepSeek-V4 ``config.json`` carries it)."""
    import importlib

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    mod = importlib.import_module(CONFIG_MAPPING[model_type].__module__)
    out, lt = {}, values.get("layer_types")
    for name, table in vars(mod).items():
        if not (name.startswith("_") and name.endswith("_TO_LAYER_TYPE") and isinstance(table, dict)) or not lt:
            continue
        key = name.strip("_").removesuffix("_TO_LAYER_TYPE").lower() + "s"
        inverse = {t: r for r, t in table.items()}
        if key not in values and all(t in inverse for t in lt):
            why = (f"transformers' {mod.__name__.rsplit('.', 1)[-1]}.py folds {key} into layer_types ({name}); "
                   f"the release reads {key}: written back per layer")
            out[key] = ([inverse[t] for t in lt], why)
    return out


def layer_count(values: dict) -> dict:
    """``{key: (value, why)}``: the layer count of a release class whose defaults leave it unset but
    carry the per-layer pattern it counts from (0.5.23 configs/nemotron_h.py:64-66: ``num_hidden_layers``
    "deprecated ... derived from layers_block_type"), for the text part where the config nests one
    (``text_config`` / ``llm_config``, configs/nano_nemotron_vl.py)."""
    for part in ("text_config", "llm_config", None):
        d = values.get(part) if part else values
        if not isinstance(d, dict) or d.get("num_hidden_layers") is not None:
            continue
        pattern = next((k for k, v in d.items() if isinstance(v, list) and v and "layer" in k and "type" in k
                        and k != "layer_types" and not k.startswith("mtp")), None)
        if pattern:
            n = len(d[pattern])
            why = f"the class leaves num_hidden_layers unset and counts its layers from {pattern} ({n} entries)"
            if part:
                return {part: ({**d, "num_hidden_layers": n}, f"{part}.num_hidden_layers: {why}")}
            return {"num_hidden_layers": (n, why)}
    return {}
