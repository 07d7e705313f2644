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
* the Transformers fallback's classes (``models/transformers.py``) are no column themselves: each
  architecture only the fallback serves is one, built and driven through the fallback (``fallback_cells``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import tempfile
import types
from dataclasses import asdict
from pathlib import Path

from swa_repro.core.checkpoint_config import auto_model_types
from swa_repro.core.errors import UsageError
from swa_repro.engine.families import MODELS
from swa_repro.sglang import config_routes, swa_archs
from swa_repro.sglang.audit import arch_cache, arch_fill, fallback_cells

CRASH = "crashes on FlashInfer"
FALLBACK = "Transformers fallback"  # the one column of models/transformers.py's entry classes (tables before #41)




def model_type_of(arch: str) -> str | None:
    """The ``model_type`` whose transformers auto mapping names ``arch`` (any task's mapping)."""
    return auto_model_types().get(arch)


@arch_cache.cached_plan
def plan(version: str, overlay: Path) -> tuple[dict, dict]:
    """``(smalls, static)``: ``{arch: SmallConfig as a dict}`` for the child to drive, and ``{arch:
    family document}`` for the cells decided here (not built / crash); the fallback's columns too."""

    from swa_repro.sglang import checkpoint as ckpt

    srt = overlay / "sglang" / "srt"
    family_archs = {a for _, _, a in MODELS.values()}
    smalls, static = {}, {}
    for a in swa_archs.discover(srt):
        if a.architecture in family_archs:
            continue
        facts = {"architecture": a.architecture, "model_file": a.model_file, "window_sites": list(a.windows),
                 "hybrid_swa": a.hybrid, "sinks": list(a.sinks)}
        if a.fallback:  # its entry classes: each architecture only it serves is a column (fallback_cells)
            continue
        crash = swa_archs.crash_on_flashinfer(srt, a)
        if crash:
            static[a.architecture] = {"family": a.architecture, "crash": crash, "discovered": facts}
            continue
        set_by = {}
        try:
            ck, set_by = filled_config(a, version, overlay)
            ckpt.check_release(ck, version, overlay)
            found = {**facts, "config": ck.path, "set_by_audit": set_by}
            if any(w.startswith(arch_fill.SET_WINDOW) for w in set_by.values()):
                found["window_from"] = "audit"  # no window in the defaults: the verdict holds at the audit's
            smalls[a.architecture] = {"small": asdict(ckpt.small_config(ck)), "discovered": found}
        except NoConfig as e:
            static[a.architecture] = {"family": a.architecture, "discovered": facts, "error": str(e)}
        # RuntimeError: transformers 5.19.0's AmbiguousGlobalPerLayerAttributeError, a per-layer attribute
        # (head_dim) read globally off a heterogeneous config (integrations/heterogeneity/configuration_utils.py:298)
        except (UsageError, TypeError, ValueError, AttributeError, RuntimeError) as e:
            label = "transformers' defaults" if "transformers defaults" in str(e) else \
                "the release's config class defaults"
            label += f" with {len(set_by)} keys set by the audit ({', '.join(list(set_by)[:3])}, ...)" if set_by else ""
            text = str(e).removeprefix("--model ").removesuffix(": add it to the config")[:300]
            if re.search(r"lacks \w*window\w*,", text):  # a window is never invented (arch_fill)
                text += (f"; a window the audit does not invent: audit a checkpoint: swa-repro audit --sglang {version} "
                         "--model PATH/config.json")
            static[a.architecture] = {"family": a.architecture, "discovered": facts,
                                      "error": f"not buildable from {label}: {text}"}
    more = fallback_cells.plan(version, overlay, column_config, NoConfig)
    return {**smalls, **more[0]}, {**static, **more[1]}


def filled_config(a, version: str, overlay: Path, rounds: int = 32):
    """``(Checkpoint, set_by_audit)``: the column's config with each key its model file reads at build and
    its defaults leave unset filled as ``arch_fill`` says (the sub-configs a class leaves None first),
    until none is missing or one only a checkpoint can say (``check_release`` then says which)."""
    from swa_repro.engine.config_reads import config_reads
    from swa_repro.sglang import model_configs as mcs

    models = overlay / "sglang" / "srt" / "models"
    path = mcs.model_file_in(models, a.architecture)
    extra, why, subs, skip = {}, {}, None, set()
    for _ in range(rounds):
        try:
            ck = column_config(a, version, overlay, extra, why)
        except UsageError:
            if not subs:
                raise
            # the composite refuses its sub-configs' own defaults (transformers' Gemma4AssistantConfig:
            # "hidden_size_per_layer_input must be 0"): left to a checkpoint; what it reads there is said
            for k in subs:
                extra.pop(k), why.pop(k)
            subs = {}
            ck = column_config(a, version, overlay, extra, why)
        if subs is None:
            subs = arch_fill.sub_config_defaults(ck.values["model_type"]) \
                if ck.path.startswith("transformers defaults") else {}
            legacy = arch_fill.legacy_keys(ck.values["model_type"], ck.values) \
                if ck.path.startswith("transformers defaults") else {}
            for k, (v, w) in legacy.items():
                extra[k], why[k] = v, w
            extra.update(subs)
            why.update({k: f"{ck.config_class.split(' ')[0]} leaves {k} None, which a published checkpoint "
                        "carries: its sub-config class's defaults" for k in subs})
            if subs or legacy:
                continue
        if path is None:
            return ck, why
        missing = [(k, w) for k, w in config_reads(path, a.architecture, branches=False, build_only=True).items()
                   if not ck.has(k)]
        if not missing and any(w.startswith(arch_fill.SET_WINDOW) for w in why.values()):
            missing = branch_reads(path, a.architecture, ck, models, skip)
        if not missing:
            files = {path, *(models / w.rpartition(":")[0] for w in config_reads(path, a.architecture,
                                                                              build_only=True).values())}
            forms = {k: vw for k, vw in arch_fill.read_forms(ck.values, sorted(files)).items() if extra.get(k) != vw[0]}
            if not forms:
                return ck, why
            for k, (v, w) in forms.items():
                extra[k], why[k] = v, w
            continue
        text = ck.text_config()
        n = getattr(text, "num_hidden_layers", None) or len(getattr(text, "layer_types", None) or []) or None
        got = arch_fill.fill(*missing[0], models, n, ck.values)
        if got is None:
            return ck, why
        key = missing[0][0]
        extra[key], why[key] = got[0], got[1]
        part = next((p for p in arch_fill.TEXT_PARTS if isinstance(ck.values.get(p), dict)), None)
        if text is not ck.config and hasattr(text, "to_dict"):  # a composite: its text model reads it too
            extra["text_config"] = {**{k: v for k, v in text.to_dict().items() if not k.startswith("_")},
                                    **(extra.get("text_config") or {}), key: got[0]}
        elif text is not ck.config and part:  # a release class's composite (configs/step3p7.py): likewise
            extra[part] = {**ck.values[part], key: got[0]}
    return ck, why


def branch_reads(path: Path, arch: str, ck, models: Path, skip: set) -> list:
    """A window the audit set turns on the branches its sliding layers take (0.5.23 step3p5.py:444-451 reads
    ``attention_other_setting`` only there): the keys read in branches that the config lacks and
    ``arch_fill`` has a value for beyond the generic count (a per-layer list, a flag, a dict of named values,
    a compared constant); the others (``skip``) stay the class's, absent (step3p5.py:421 ``rope_scaling``
    is read only for the ``yarn_only_types`` layers, none here)."""
    from swa_repro.engine.config_reads import config_reads

    text = ck.text_config()
    n = getattr(text, "num_hidden_layers", None)
    for k, w in config_reads(path, arch, build_only=True).items():
        if ck.has(k) or (k, w) in skip:
            continue
        got = arch_fill.fill(k, w, models, n, ck.values)
        if got is None or got[1].endswith("the smallest"):
            skip.add((k, w))
            continue
        return [(k, w)]
    return []


class NoConfig(Exception):
    """A column with no config to build (its whole ``not built`` line)."""


def column_config(a, version: str, overlay: Path, extra: dict | None = None, why: dict | None = None):
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
    model_file = overlay / "sglang" / "srt" / "models" / a.model_file
    via, r = "", None
    if mt is None:  # the config class the release's own code gives it (a draft, MTP or embedding sibling)
        r = config_routes.route(a.architecture, model_file, types, model_type_of)
        if r is not None and r.source == "transformers":
            mt, via = r.model_type, f" ({r.how})"
        elif r is not None:
            types = {**types, r.model_type: {**types[r.model_type], "architectures": [a.architecture]}}
    if mt is not None:
        values = {"architectures": [a.architecture], "model_type": mt, **published_keys(mt)}
        rel = types.get(mt, {})
        if rel:  # the release re-parses the file through its own class: transformers' defaults written out
            values = {**transformers_defaults(mt), **values}
        values.update(extra or {})
        provides = frozenset([*rel.get("attrs", []), *rel.get("defaults", {})])
        return ckpt.Checkpoint(a.architecture, f"transformers defaults of model_type {mt}{via}", values, a.architecture,
                               *config_object(values, mt), provides)
    mt, how = release_configs.model_type_for(a.architecture, model_file, types)
    if r is not None and mt == r.model_type:
        how = r.how
    if mt is None:
        raise NoConfig(f"no published config: transformers {transformers.__version__} maps no model_type to "
                       f"{a.architecture} and {how}; {config_routes.unnamed(a.architecture, model_file)}: "
                       f"audit its checkpoint: swa-repro audit --sglang {version} --model PATH/config.json")
    rel = types[mt]
    if rel.get("error"):
        raise NoConfig(f"no published config: the release's {rel['class']} ({rel['where']}; {how}) does not build "
                       f"from its defaults ({rel['error']}); audit its checkpoint: swa-repro audit --sglang {version} "
                       "--model PATH/config.json")
    values = {**rel["defaults"], **(extra or {}), "architectures": [a.architecture], "model_type": mt}
    if why is not None:
        for k, (v, w) in arch_fill.layer_count(values).items():
            values[k] = v
            why.setdefault(k, w)
    source = f"sglang {version}'s {rel['class']} defaults ({rel['where']})"
    ck = ckpt.Checkpoint(a.architecture, source, values, a.architecture,
                         f"{rel['class']} (sglang {version}, {rel['where']})", ClassDefaults.of(values),
                         frozenset([*rel.get("attrs", []), *rel["defaults"]]))
    try:
        kinds = cc.layer_kinds(ck.text_config())
    except (AttributeError, TypeError) as e:
        unset = arch_fill.none_reads(ck.raw_text(), model_file, a.architecture)
        also = f" (and None, each read by the model: {', '.join(unset)})" if unset else ""
        raise NoConfig(f"no published config: {source} ({how}) leave {getattr(e, 'name', None) or e} unset{also}: a "
                       f"checkpoint sets them; audit one: swa-repro audit --sglang {version} --model PATH/config.json") \
            from None
    text = ck.raw_text()
    windowed = text.get("layer_types") or any("window" in k and isinstance(v, int) and v > 0 for k, v in text.items())
    if cc.SLIDING not in kinds and (not a.hybrid or not windowed):  # hybrid: a window the pool runs, if any
        if extra is not None and why is not None and not any(w.startswith(arch_fill.SET_WINDOW) for w in why.values()):
            new, said = arch_fill.audit_window(values, model_file, a.architecture, a.windows)
            if new:  # the defaults give no window: built at one the audit sets, the verdict conditional
                extra.update(new)
                why.update(said)
                return column_config(a, version, overlay, extra, why)
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


def main(argv=None) -> int:
    """The plan in a child (``arch_cache.cached_plan``): on an overlay with its own transformers, whose
    config classes give the defaults, ``python -m swa_repro.sglang.audit.arch_cells --overlay DIR --out F
    --version X``."""
    from swa_repro.engine.child import child_main, child_parser

    p = child_parser("swa_repro.sglang.audit.arch_cells")
    p.add_argument("--version", required=True)

    def run(overlay, a):
        smalls, static = plan.uncached(a.version, overlay)
        return {"smalls": smalls, "static": static}

    return child_main(p, run, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
