"""The config classes a release registers itself (its ``_CONFIG_REGISTRY``), the same for both engines.

Why one module: sglang (``sglang.release_configs``: 0.5.23 utils/hf_transformers/common.py:117) and vLLM
(``vllm.release_configs``: 0.34.0 transformers_utils/config.py:450 ``config_class =
_CONFIG_REGISTRY[model_type]``) each re-parse a checkpoint whose ``model_type`` their registry names through
the registry's class, so both audits need the same two facts of it: each class built with its own defaults
(:func:`entries`, in a child with the release's code), and which ``model_type`` serves an architecture
(:func:`model_type_for`). Each engine passes what differs: where its registry lives and how its loader
renames a class's attributes, whether its columns read a composite class's text part, and, for vLLM, the
config module of the model's own name (``own``).
"""

from __future__ import annotations

import json
from pathlib import Path


# ----------------------------------------------------------------------------- child: each class built
def where(obj, overlay: Path) -> str:
    """``vllm/transformers_utils/configs/lfm3.py:8``: the file (relative to the overlay where it lies in it)
    and line that define ``obj``; its module where the source cannot be read."""
    import inspect

    try:
        f, overlay = Path(inspect.getsourcefile(obj) or "?").resolve(), Path(overlay).resolve()
        return f"{f.relative_to(overlay) if f.is_relative_to(overlay) else f}:{inspect.getsourcelines(obj)[1]}"
    except (OSError, TypeError):
        return getattr(obj, "__module__", "?")


def entries(registry, overlay: Path, at: str, remap=None, *, text_part: bool = False, sub_attrs: bool = False) -> dict:
    """``{model_type: entry}`` for every class of ``registry`` (:func:`entry`); a lazy entry naming a class
    the release cannot import here is an entry with its error, ``at`` the registry's file (vLLM's
    ``_LazyConfigDict``)."""
    from transformers import PretrainedConfig

    generic = set(dir(PretrainedConfig()))
    out = {}
    for mt in list(registry):
        try:
            cls = registry[mt]
        except Exception as e:  # noqa: BLE001 - said, not skipped
            out[mt] = {"class": "?", "where": at, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        out[mt] = entry(cls, generic, where(cls, overlay), remap, text_part=text_part, sub_attrs=sub_attrs)
    return out


def entry(cls, generic: set, at: str, remap=None, *, text_part: bool = False, sub_attrs: bool = False) -> dict:
    """``{class, where, defaults, attrs, architectures}`` of ``cls`` built with its own defaults, or
    ``{class, where, error}`` where they do not build. ``remap``: the loader's renames (vLLM 0.34.0
    config.py:823 ``llm_config`` -> ``text_config``); ``text_part``: a composite class's text part as
    ``text`` (its class, ``model_type`` and defaults); ``sub_attrs``: the keys of its sub-configs among its
    ``attrs`` (a vision tower's reads). ``attrs``: the names an instance has beyond ``PretrainedConfig``'s
    (methods a model file calls on its config: 0.5.23 ``get_nemotron_h_config_for_layer``)."""
    from transformers import PretrainedConfig

    out = {"class": cls.__name__, "where": at}
    try:
        inst = cls() if remap is None else remap(cls())
        out["defaults"] = _plain(inst.to_dict())
        text = inst.get_text_config() if text_part else inst
        if text is not inst:
            out["text"] = {"class": type(text).__name__, "model_type": getattr(text, "model_type", None),
                           "defaults": _plain(text.to_dict())}
        subs = [v for v in vars(inst).values() if isinstance(v, PretrainedConfig)] if sub_attrs else []
        out["attrs"] = sorted(a for a in set(dir(inst)).union(*(v.to_dict() for v in subs)) - generic
                              if not a.startswith("_"))
        declared = getattr(cls, "architectures", None)  # a class attribute (PretrainedConfig's own init sets None)
        out["architectures"] = list(declared if isinstance(declared, (list, tuple)) else
                                    getattr(inst, "architectures", None) or [])
    except Exception as e:  # noqa: BLE001 - a class whose defaults do not build: said, not skipped
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return out


def _plain(v):
    """The value as the child's JSON answer will carry it (``child_main``: ``default=str``)."""
    return json.loads(json.dumps(v, default=str))


# ----------------------------------------------------------------------------- parent: which class serves
def names_in(trees) -> set:
    """Every name the parsed files use or import (a model file's imports and annotations name its config class)."""
    import ast

    out = set()
    for tree in trees:
        out |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        out |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    return out


def model_type_for(arch: str, types: dict, names: set, files: str, own: set = frozenset()) -> tuple[str | None, str]:
    """``(model_type, how)``: the registry's type serving ``arch``: the one whose class declares it in
    ``architectures`` (0.5.23 configs/step3p5.py:8), else the one class of the registry the model's files
    (``files``, said in ``how``) name (``names``: an import or an annotation, 0.5.23 jet_nemotron.py ``config:
    JetNemotronConfig``), several named: the one of them among ``own``, else the one in ``own`` (vLLM: the
    classes of the config module of the model's own name; 0.34.0 models/midashenglm.py imports only its audio
    tower's ``DashengConfig``, configs/midashenglm.py:83 ``MiDashengLMConfig`` is the ``midashenglm`` type).
    One class registered under several types: the first type. None when none or several classes fit."""
    declared = [mt for mt, e in types.items() if arch in (e.get("architectures") or [])]
    if len(declared) == 1:
        e = types[declared[0]]
        return declared[0], f"{e['class']} declares architectures={[arch]} ({e['where']})"
    named = {mt for mt, e in types.items() if e["class"] in names}
    for pick, how in ((named, f"{files} names"), (named & set(own), f"{files} names"),
                      (set(own), "the config module of the model's own name defines")):
        if len({types[m]["class"] for m in pick}) == 1:
            e = types[min(pick)]
            return min(pick), f"{how} {e['class']} ({e['where']})"
    classes = sorted({types[m]["class"] for m in named})
    if classes:  # several (one is taken above)
        return None, (f"{files} names {len(classes)} of the release's config classes ({', '.join(classes)}) "
                      f"and none declares {arch}")
    return None, f"no config class of the release's registry declares {arch} or is named by {files}"
