"""The family table's architecture columns: every sliding-window architecture a release serves
(``sglang.swa_archs``), beside the 8 named families (parent side).

Why: the table answered for 8 hand-picked families; a release's ``models/`` serves ~70 architectures
that hand a window to their attention or run on the hybrid SWA pool (0.5.23). Each gets a cell:

* a config: the architecture's published defaults, i.e. transformers' config class for it (the
  ``model_type`` whose auto mapping names the architecture, ``checkpoint.config_object``), checked
  against the release's model file (``checkpoint.check_release``: a key its model class reads that
  the class does not default is the cell's ``not built`` reason, with the line), cut to a few layers
  (``checkpoint.small_config``) and driven by the audit's child like a user's checkpoint;
* where the release re-parses that ``model_type`` through a config class of its own
  (``release_configs``: its ``_CONFIG_REGISTRY``), transformers' defaults written out (what a
  published ``config.json`` holds) and the release class's keys counted as set;
* no config class in the installed transformers (a remote-code model): the release's own config class
  for it (``release_configs.model_type_for``) at its defaults; ``not built`` where the release has
  none, or its defaults leave the window or the layer count to a checkpoint, saying which and how to
  audit one (``--model`` its ``config.json``);
* an architecture whose attention passes ``sinks=`` to a FlashInfer backend that takes none:
  ``crashes on FlashInfer`` with both lines (``swa_archs.crash_on_flashinfer``), not driven;
* the Transformers fallback's classes (``models/transformers.py``): one cell, served for any
  architecture without an ``EntryClass``; not driven (the fallback wraps transformers' own modeling
  code, which the audit does not build), said as such with the line that hands it the window.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import re
import tempfile
import types
from dataclasses import asdict
from functools import cache
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.engine.families import MODELS
from swa_repro.sglang import swa_archs

CRASH = "crashes on FlashInfer"
FALLBACK = "Transformers fallback"  # the column of models/transformers.py's entry classes
FALLBACK_STATE = "fallback: not audited"


@cache
def _auto_names() -> dict:
    """architecture -> model_type, from every ``*_MAPPING_NAMES`` of transformers' ``modeling_auto.py``
    read with ``ast`` (importing it pulls in torch and the generation stack: ~30 s on a busy CPU)."""
    import importlib.util

    spec = importlib.util.find_spec("transformers.models.auto.modeling_auto")
    out = {}
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "").endswith("_MAPPING_NAMES") for t in node.targets):
            for pair in ast.walk(node.value):
                if isinstance(pair, ast.Tuple) and len(pair.elts) == 2 and isinstance(pair.elts[0], ast.Constant):
                    for n in ast.walk(pair.elts[1]):
                        if isinstance(n, ast.Constant) and isinstance(n.value, str):
                            out.setdefault(n.value, pair.elts[0].value)
    return out


def model_type_of(arch: str) -> str | None:
    """The ``model_type`` whose transformers auto mapping names ``arch`` (any task's mapping)."""
    return _auto_names().get(arch)


def plan(version: str, overlay: Path) -> tuple[dict, dict]:
    """``(smalls, static)``: ``{arch: SmallConfig as a dict}`` for the child to drive, and ``{arch:
    family document}`` for the cells decided here (not built / crash / the fallback)."""

    from swa_repro.sglang import checkpoint as ckpt

    srt = overlay / "sglang" / "srt"
    family_archs = {a for _, _, a in MODELS.values()}
    smalls, static = {}, {}
    for a in swa_archs.discover(srt):
        if a.architecture in family_archs:
            continue
        facts = {"architecture": a.architecture, "model_file": a.model_file, "window_sites": list(a.windows),
                 "hybrid_swa": a.hybrid, "sinks": list(a.sinks)}
        if a.fallback:
            if FALLBACK not in static:
                serves = fallback_only(srt)
                static[FALLBACK] = {"family": FALLBACK, "fallback": _fallback_text(a, serves), "discovered": facts,
                                    "classes": [], "serves": serves}
            static[FALLBACK]["classes"].append(a.architecture)
            continue
        crash = swa_archs.crash_on_flashinfer(srt, a)
        if crash:
            static[a.architecture] = {"family": a.architecture, "crash": crash, "discovered": facts}
            continue
        label = "transformers' defaults" if model_type_of(a.architecture) else "the release's config class defaults"
        try:
            ck = column_config(a, version, overlay)
            ckpt.check_release(ck, version, overlay)
            smalls[a.architecture] = {"small": asdict(ckpt.small_config(ck)),
                                      "discovered": {**facts, "config": ck.path}}
        except NoConfig as e:
            static[a.architecture] = {"family": a.architecture, "discovered": facts, "error": str(e)}
        except (UsageError, TypeError, ValueError, AttributeError) as e:
            static[a.architecture] = {"family": a.architecture, "discovered": facts, "error": f"not buildable from {label}: "
                                      + str(e).removeprefix("--model ").removesuffix(": add it to the config")[:300]}
    return smalls, static


class NoConfig(Exception):
    """A column with no config to build (its whole ``not built`` line)."""


def column_config(a, version: str, overlay: Path):
    """The config a column is built from: transformers' class defaults for the ``model_type`` its auto
    mapping names (the published defaults; where the release re-parses that type through a class of
    its own, ``release_configs``, that class's keys count as set: it fills them in the child too); for
    an architecture transformers has no class for, the release's own config class for it
    (``release_configs.model_type_for``) at its defaults. :class:`NoConfig` when there is none, or
    when those defaults set no window at all (a release class leaves the pattern to the checkpoint:
    0.5.23 configs/step3p5.py:29-30 ``layer_types=None, sliding_window=None``)."""
    import transformers

    from swa_repro.core import checkpoint_config as cc
    from swa_repro.core.checkpoint_config import config_object
    from swa_repro.sglang import checkpoint as ckpt
    from swa_repro.sglang import release_configs

    mt = model_type_of(a.architecture)
    types = release_configs.registry(version, overlay).get("types", {})
    if mt is not None:
        values = {"architectures": [a.architecture], "model_type": mt, **published_keys(mt)}
        rel = types.get(mt, {})
        if rel:  # the release re-parses the file through its own class: transformers' defaults written out
            values = {**transformers_defaults(mt), **values}
        provides = frozenset([*rel.get("attrs", []), *rel.get("defaults", {})])
        return ckpt.Checkpoint(a.architecture, f"transformers defaults of model_type {mt}", values, a.architecture,
                               *config_object(values, mt), provides)
    mt, how = release_configs.model_type_for(a.architecture, overlay / "sglang" / "srt" / "models" / a.model_file,
                                             types)
    if mt is None:
        raise NoConfig(f"no published config: transformers {transformers.__version__} maps no model_type to "
                       f"{a.architecture} and {how}; audit its checkpoint: swa-repro audit --sglang {version} "
                       "--model PATH/config.json")
    rel = types[mt]
    if rel.get("error"):
        raise NoConfig(f"no published config: the release's {rel['class']} ({rel['where']}; {how}) does not build "
                       f"from its defaults ({rel['error']}); audit its checkpoint: swa-repro audit --sglang {version} "
                       "--model PATH/config.json")
    values = {**rel["defaults"], "architectures": [a.architecture], "model_type": mt}
    source = f"sglang {version}'s {rel['class']} defaults ({rel['where']})"
    ck = ckpt.Checkpoint(a.architecture, source, values, a.architecture,
                         f"{rel['class']} (sglang {version}, {rel['where']})", ClassDefaults.of(values),
                         frozenset([*rel.get("attrs", []), *rel["defaults"]]))
    try:
        kinds = cc.layer_kinds(ck.text_config())
    except (AttributeError, TypeError) as e:
        raise NoConfig(f"no published config: {source} ({how}) leave {getattr(e, 'name', None) or e} unset: a "
                       f"checkpoint sets it; audit one: swa-repro audit --sglang {version} --model PATH/config.json") \
            from None
    if cc.SLIDING not in kinds and not a.hybrid:
        text = ck.raw_text()
        raise NoConfig(f"no published config: {source} ({how}) set no sliding layer (sliding_window="
                       f"{text.get('sliding_window')!r}, layer_types={_short(text.get('layer_types'))}): the window "
                       f"comes from a checkpoint; audit one: swa-repro audit --sglang {version} --model PATH/config.json")
    return ck


class ClassDefaults(types.SimpleNamespace):
    """A release config class's defaults as its child read them (``to_dict()``), read back as
    attributes; its ``*_config`` dicts (a composite's text part: 0.5.23 configs/jet_vlm.py) likewise.
    Not parsed by a transformers class: the release's own class is what the child re-parses them with."""

    @classmethod
    def of(cls, values: dict):
        return cls(**{k: cls.of(v) if k.endswith("_config") and isinstance(v, dict) else v for k, v in values.items()})

    def get_text_config(self, *a, **k):
        text = getattr(self, "text_config", None) or getattr(self, "llm_config", None)
        return text if isinstance(text, ClassDefaults) else self


def transformers_defaults(model_type: str) -> dict:
    """transformers' class defaults for ``model_type`` as a ``config.json`` holds them. Where the release
    reads that type through a class of its own (0.5.23 configs/afmoe.py: ``num_experts=None``), a file of
    ``model_type`` alone would be that class's defaults, not the published ones (afmoe.py:163-165 then
    refuses: "AfmoeConfig must define `num_experts`"): the published values are written out instead."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    d = CONFIG_MAPPING[model_type]().to_dict()
    return {k: v for k, v in d.items() if not k.startswith("_") and k not in ("transformers_version", "dtype",
                                                                              "torch_dtype")}


def _short(x) -> str:
    return repr(x) if not isinstance(x, list) or len(x) <= 4 else f"[{', '.join(map(repr, x[:4]))}, ... ({len(x)})]"


def published_keys(model_type: str) -> dict:
    """The keys a named family's published checkpoints carry beside its class defaults
    (``families.CHECKPOINT_KEYS``), for another architecture of the same config class
    (Gemma2ForSequenceClassification reads gemma2.py's ``hidden_act`` as Gemma2ForCausalLM does)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from swa_repro.engine import families as fam

    cls = CONFIG_MAPPING_NAMES.get(model_type)
    return next((fam.CHECKPOINT_KEYS.get(f, {}) for f, (c, _, _) in MODELS.items() if c == cls), {})


@cache
def _windowed_config_classes() -> frozenset:
    """transformers' config classes whose file mentions ``sliding_window``."""
    import importlib.util

    out = set()
    for f in (Path(importlib.util.find_spec("transformers").origin).parent / "models").glob("*/configuration_*.py"):
        text = f.read_text(encoding="utf-8")
        if "sliding_window" in text:
            out.update(re.findall(r"^class (\w+)\(", text, re.MULTILINE))
    return frozenset(out)


def fallback_only(srt: Path) -> list[str]:
    """Causal-LM / conditional-generation architectures whose transformers config class has a
    ``sliding_window`` and that no file of the release's ``models/`` names: what a server of this
    release runs through the Transformers fallback (text only: transformers' ``configuration_*.py``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    windowed = _windowed_config_classes()
    release = "\n".join(p.read_text(encoding="utf-8-sig") for p in sorted((srt / "models").glob("*.py")))
    return sorted(a for a, mt in _auto_names().items() if CONFIG_MAPPING_NAMES.get(mt) in windowed
                  and a.endswith(("ForCausalLM", "ForConditionalGeneration")) and a not in release)


def _fallback_text(a, serves) -> str:
    return (f"served through sglang's Transformers fallback (models/{a.model_file}; the window per layer at "
            f"models/{', models/'.join(a.windows)}) for any architecture no EntryClass lists ({len(serves)} with a "
            f"window in transformers' config: {', '.join(serves)}): the fallback wraps transformers' own modeling "
            "code, which this audit does not build; not audited")


def digest(small: dict) -> str:
    """A column's cache key part: its small config's hash (a new default or release file, a new cell)."""
    return hashlib.sha256(json.dumps(small, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextlib.contextmanager
def smalls_file(smalls: dict):
    """``--smalls-file F`` for the child (the columns' small configs, too long for one argument), or nothing."""
    if not smalls:
        yield []
        return
    with tempfile.TemporaryDirectory(prefix="swa-repro-smalls-") as d:
        p = Path(d) / "smalls.json"
        p.write_text(json.dumps(smalls, default=str))
        yield ["--smalls-file", str(p)]
