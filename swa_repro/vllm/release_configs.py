"""The config classes a vLLM release registers itself (``_CONFIG_REGISTRY``), built in a child with its code.

Why: the table's columns for an architecture transformers has no ``model_type`` for were built from the
release's class read with ``ast`` (the constants its ``__init__`` declares, into a plain config). That
misses what the class's ``__init__`` does: 0.34.0 configs/lfm3.py:61 derives ``layer_types`` (conv, full
and sliding layers), which the ``ast`` route left unset, so every layer was taken as sliding; a composite
class builds its text part as a sub-config (configs/lfm3_vl.py:80 ``text_config = Lfm3Config()``,
configs/ultravox.py:81 a transformers class by ``model_type``), which the ``ast`` route left a dict or
None ("its defaults leave num_hidden_layers unset"). vLLM's loader parses a checkpoint whose
``model_type`` its registry names through that class (0.34.0 transformers_utils/config.py:450
``config_class = _CONFIG_REGISTRY[model_type]``), so the class, built with its own defaults, is the
published config the column stands for.

Per ``model_type``: the class and its file:line, its ``to_dict()``, its text part's (``get_text_config()``,
with its ``model_type``) where it is a sub-config, the attribute names an instance has beyond
``PretrainedConfig``'s (properties a model file reads: configs/ultravox.py:116 ``text_config``), and
the ``architectures`` it declares; or the error its defaults raise (said, never guessed around).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from functools import cache
from pathlib import Path

MODULE = "swa_repro.vllm.release_configs"
LOADER = "vllm/transformers_utils/config.py"  # where _CONFIG_REGISTRY lives (0.20.0 .. 0.34.0)


# ----------------------------------------------------------------------------- parent
@cache
def registry(version: str, overlay: Path) -> dict:
    """``{model_type: entry}`` of the release in ``overlay`` (one child, cached by the overlay's content);
    ``{}`` with ``error`` where the registry does not import here."""
    from swa_repro.core.cache import cached, code_hash, interpreter
    from swa_repro.vllm.provision import content_digest

    parts = {"overlay": content_digest(overlay), "code": code_hash(("core", "engine", "vllm")),
             "interpreter": interpreter()}
    doc, _ = cached("vllm-configs", parts, lambda: _run(overlay, version),
                    valid=lambda d: isinstance(d, dict) and isinstance(d.get("types"), dict))
    return doc


def _run(overlay: Path, version: str) -> dict:
    from swa_repro.engine.child import run_module

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]))
        rc, _, err = run_module(MODULE, ["--overlay", str(overlay), "--out", str(out),
                                         "--deps", str(overlay / ".deps")], env, Path(tmp))
        if rc != 0 or not out.is_file():
            last = [ln for ln in err.splitlines() if ln.strip()]
            return {"types": {}, "error": f"vLLM {version}'s config registry: {last[-1] if last else f'exit {rc}'}"}
        return json.loads(out.read_text())


def model_type_for(arch: str, module: str, names: set, types: dict) -> str | None:
    """The registry's ``model_type`` serving ``arch``: the one whose class declares it in ``architectures``,
    else the one class of the registry its model files import (``names``), else the one defined in the
    release's config module of the model's own name (0.34.0 models/midashenglm.py imports only its audio
    tower's ``DashengConfig``; configs/midashenglm.py:83 ``MiDashengLMConfig`` is the registry's
    ``midashenglm``); several named: the one of them in that module. None when none or several."""
    declared = [mt for mt, e in types.items() if arch in (e.get("architectures") or [])]
    if len(declared) == 1:
        return declared[0]
    own = {mt for mt, e in types.items() if Path(e["where"].split(":")[0]).stem == module}
    named = {mt for mt, e in types.items() if e["class"] in names}
    for pick in (named, named & own, own):
        if len({types[m]["class"] for m in pick}) == 1:
            return min(pick)
    return None


# ----------------------------------------------------------------------------- child
def _plain(v):
    return json.loads(json.dumps(v, default=str))


def _entry(cls, generic: set, overlay: Path, remap=None) -> dict:
    import inspect

    from transformers import PretrainedConfig

    try:
        f = Path(inspect.getsourcefile(cls) or "?").resolve()
        where = f"{f.relative_to(overlay) if f.is_relative_to(overlay) else f}:{inspect.getsourcelines(cls)[1]}"
    except (OSError, TypeError):
        where = getattr(cls, "__module__", "?")
    out = {"class": cls.__name__, "where": where}
    try:
        inst = cls()
        if remap is not None:  # the loader's renames (0.34.0 config.py:823: ``llm_config`` -> ``text_config``)
            inst = remap(inst)
        out["defaults"] = _plain(inst.to_dict())
        text = inst.get_text_config()
        if text is not inst:
            out["text"] = {"class": type(text).__name__, "model_type": getattr(text, "model_type", None),
                           "defaults": _plain(text.to_dict())}
        subs = [v for v in vars(inst).values() if isinstance(v, PretrainedConfig)]  # a vision tower's reads too
        out["attrs"] = sorted(a for a in set(dir(inst)).union(*(v.to_dict() for v in subs)) - generic
                              if not a.startswith("_"))
        declared = getattr(cls, "architectures", None)
        out["architectures"] = list(declared if isinstance(declared, (list, tuple)) else
                                    getattr(inst, "architectures", None) or [])
    except Exception as e:  # noqa: BLE001 - a class whose defaults do not build: said, not skipped
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return out


def child(overlay: Path, a) -> dict:
    import importlib
    import warnings

    from transformers import PretrainedConfig
    from transformers.utils import logging as tl

    from swa_repro.vllm.audit.drive import foreign, use_deps

    use_deps(a.deps)
    tl.set_verbosity_error()
    warnings.simplefilter("ignore")
    mod = importlib.import_module(LOADER.removesuffix(".py").replace("/", "."))
    reg = getattr(mod, "_CONFIG_REGISTRY", None)
    if reg is None:
        return {"types": {}, "error": f"{LOADER} has no _CONFIG_REGISTRY"}
    generic = set(dir(PretrainedConfig()))
    types = {}
    for mt in list(reg):
        try:
            cls = reg[mt]
        except Exception as e:  # noqa: BLE001 - a lazy entry naming a class the release cannot import here
            types[mt] = {"class": "?", "where": LOADER, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        types[mt] = _entry(cls, generic, overlay, getattr(mod, "_maybe_remap_hf_config_attrs", None))
    bad = foreign(overlay)
    if bad:
        raise RuntimeError(f"{len(bad)} vllm modules did not come from the overlay (e.g. {bad[0]})")
    return {"types": types}


def main(argv=None) -> int:
    from swa_repro.engine.child import child_main, child_parser

    p = child_parser(MODULE)
    p.add_argument("--deps", type=Path)
    return child_main(p, child, argv)


if __name__ == "__main__":
    sys.exit(main())
