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
the ``architectures`` it declares; or the error its defaults raise (said, never guessed around). The entries
and the rule for which type serves an architecture are ``engine.config_classes``' (sglang's the same); this
module passes vLLM's loader renames, the text part and the config module of the model's own name.
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
    """The registry's ``model_type`` serving ``arch`` (``config_classes.model_type_for``): the class declaring
    it, else the one class its model files import (``names``), else the one in the release's config module
    of the model's own name (0.34.0 models/midashenglm.py imports only its audio tower's ``DashengConfig``;
    configs/midashenglm.py:83 ``MiDashengLMConfig`` is the registry's ``midashenglm``); None when none or
    several."""
    from swa_repro.engine import config_classes

    own = {mt for mt, e in types.items() if Path(e["where"].split(":")[0]).stem == module}
    return config_classes.model_type_for(arch, types, names, f"models/{module}.py", own)[0]


# ----------------------------------------------------------------------------- child
def child(overlay: Path, a) -> dict:
    import importlib
    import warnings

    from transformers.utils import logging as tl

    from swa_repro.engine.config_classes import entries
    from swa_repro.vllm.audit.drive import foreign, use_deps

    use_deps(a.deps)
    tl.set_verbosity_error()
    warnings.simplefilter("ignore")
    mod = importlib.import_module(LOADER.removesuffix(".py").replace("/", "."))
    reg = getattr(mod, "_CONFIG_REGISTRY", None)
    if reg is None:
        return {"types": {}, "error": f"{LOADER} has no _CONFIG_REGISTRY"}
    # the loader's renames (0.34.0 config.py:823 ``llm_config`` -> ``text_config``); a composite class's
    # text part (configs/lfm3_vl.py:80) and its vision tower's keys (configs/ultravox.py:116) read too
    types = entries(reg, overlay, LOADER, getattr(mod, "_maybe_remap_hf_config_attrs", None), text_part=True,
                    sub_attrs=True)
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
