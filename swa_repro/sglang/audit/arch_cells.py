"""The family table's architecture columns: every sliding-window architecture a release serves
(``sglang.swa_archs``), beside the 8 named families (parent side).

Why: the table answered for 8 hand-picked families; a release's ``models/`` serves ~70 architectures
that hand a window to their attention or run on the hybrid SWA pool (0.5.23). Each gets a cell:

* a config: the architecture's published defaults, i.e. transformers' config class for it (the
  ``model_type`` whose auto mapping names the architecture, ``checkpoint.config_object``), checked
  against the release's model file (``checkpoint.check_release``: a key its model class reads that
  the class does not default is the cell's ``not built`` reason, with the line), cut to a few layers
  (``checkpoint.small_config``) and driven by the audit's child like a user's checkpoint;
* no config class in the installed transformers (a remote-code model): ``not built``, saying so and
  how to audit it (``--model`` its ``config.json``);
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
from dataclasses import asdict
from functools import cache
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.sglang import model_configs as mc
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
    import transformers

    from swa_repro.sglang import checkpoint as ckpt

    srt = overlay / "sglang" / "srt"
    family_archs = {a for _, _, a in mc.MODELS.values()}
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
        mt = model_type_of(a.architecture)
        if mt is None:
            static[a.architecture] = {"family": a.architecture, "discovered": facts, "error": (
                f"no published config: transformers {transformers.__version__} maps no model_type to "
                f"{a.architecture} (a remote-code model); audit its checkpoint: swa-repro audit --sglang {version} "
                "--model PATH/config.json")}
            continue
        values = {"architectures": [a.architecture], "model_type": mt, **published_keys(mt)}
        try:
            ck = ckpt.Checkpoint(a.architecture, f"transformers defaults of model_type {mt}", values, a.architecture,
                                 *ckpt.config_object(values, mt))
            ckpt.check_release(ck, version, overlay)
            smalls[a.architecture] = {"small": asdict(ckpt.small_config(ck)), "discovered": facts}
        except (UsageError, TypeError, ValueError, AttributeError) as e:
            static[a.architecture] = {"family": a.architecture, "discovered": facts,
                                      "error": "not buildable from transformers' defaults: "
                                      + str(e).removeprefix("--model ").removesuffix(": add it to the config")[:300]}
    return smalls, static


def published_keys(model_type: str) -> dict:
    """The keys a named family's published checkpoints carry beside its class defaults
    (``families.CHECKPOINT_KEYS``), for another architecture of the same config class
    (Gemma2ForSequenceClassification reads gemma2.py's ``hidden_act`` as Gemma2ForCausalLM does)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from swa_repro.engine import families as fam

    cls = CONFIG_MAPPING_NAMES.get(model_type)
    return next((fam.CHECKPOINT_KEYS.get(f, {}) for f, (c, _, _) in mc.MODELS.items() if c == cls), {})


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
