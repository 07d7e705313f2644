"""The config classes a release registers itself (``_CONFIG_REGISTRY``), read in a child with its code.

Why: about 28 sliding-window architectures of 0.5.23 have no config class in transformers (remote-code
models: Step3p5, Beam, IQuest, Inkling, Nemotron-H's variants, ...), and several that transformers knows
(``nemotron_h``, ``laguna``, ``afmoe``, ``deepseek_v4``) the release reads through a class of its own:
its ``get_config`` re-parses every ``model_type`` of its registry through the registry's class
(0.5.23 utils/hf_transformers/config.py:281-295). The registry is built at import from
``sglang/srt/configs/*.py`` (0.5.23 utils/hf_transformers/common.py:117; 0.5.10
utils/hf_transformers_utils.py:100-132), so it is read the way the release has it: imported in a child
with the release's overlay first on ``sys.path`` (``overlay_run``), each class built with its own
defaults. Cached per release content (``overlay_run.run_child``).

Per ``model_type``: the class and its file:line, its default values (``to_dict()``), the attribute names
an instance has beyond ``PretrainedConfig``'s (methods a model file calls on its config:
``get_nemotron_h_config_for_layer``), and the ``architectures`` it declares (0.5.23 configs/step3p5.py:8);
or, for a class whose defaults do not build, the error it raised. Both the entries and which type serves
an architecture are ``engine.config_classes``' (vLLM's registry the same); this module says where sglang's
registry lives and which model file names the class.
"""

from __future__ import annotations

import ast
import inspect
import sys
from functools import cache
from pathlib import Path

MODULE = "swa_repro.sglang.release_configs"
REGISTRY_MODULES = ("sglang.srt.utils.hf_transformers.common", "sglang.srt.utils.hf_transformers_utils",
                    "sglang.srt.hf_transformers_utils")  # where _CONFIG_REGISTRY lives, newest first


# ----------------------------------------------------------------------------- parent
@cache
def registry(version: str, overlay: Path) -> dict:
    """``{"module": file:line, "types": {model_type: entry}}`` of the release in ``overlay`` (one cached child)."""
    from swa_repro.core.errors import UsageError
    from swa_repro.sglang.overlay_run import run_child

    try:
        doc, _, _ = run_child(MODULE, Path(overlay), [], f"reading sglang {version}'s config classes")
    except UsageError as e:  # a release whose registry does not import here: no class of its own, said
        return {"module": None, "types": {}, "error": str(e)}
    return doc


def class_names(model_file: Path) -> set:
    """Every name a model file uses or imports (its imports and annotations name its config class)."""
    from swa_repro.engine.config_classes import names_in
    from swa_repro.engine.config_reads import model_tree

    return names_in([model_tree(Path(model_file))])  # the parse swa_archs and config_reads share


def model_type_for(arch: str, model_file: Path, types: dict) -> tuple[str | None, str]:
    """``(model_type, how)``: the release's registry type serving ``arch`` (``config_classes.model_type_for``:
    the class declaring it, else the one class its model file names); None when none or several do."""
    from swa_repro.engine import config_classes

    return config_classes.model_type_for(arch, types, class_names(model_file), f"models/{model_file.name}")


# ----------------------------------------------------------------------------- child
def child(overlay: Path) -> dict:
    import importlib

    from swa_repro.engine.config_classes import entries, where
    from swa_repro.sglang.overlay_run import check_no_foreign, import_release

    import_release(overlay)
    for name in REGISTRY_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "_CONFIG_REGISTRY"):
            break
    else:
        return {"module": None, "types": {}}
    at = where(mod, overlay).split(":")[0]
    types = entries(mod._CONFIG_REGISTRY, overlay, at)
    check_no_foreign(overlay)
    return {"module": f"{at}:{_registry_line(mod)}", "types": types}


def _registry_line(mod) -> int:
    """The line that first assigns ``_CONFIG_REGISTRY`` in its module."""
    tree = ast.parse(Path(inspect.getsourcefile(mod)).read_text())
    return next((n.lineno for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
        getattr(t, "id", None) == "_CONFIG_REGISTRY" for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))),
        1)


def main(argv=None) -> int:
    from swa_repro.engine.child import child_main, child_parser

    return child_main(child_parser(MODULE), lambda overlay, a: child(overlay), argv)


if __name__ == "__main__":
    sys.exit(main())
