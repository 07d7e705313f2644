"""The config class a release's own code gives an architecture that no ``model_type`` names (parent
side, ``ast`` only).

Why: about 15 sliding-window architectures of 0.5.23 have no ``model_type`` of their own in
transformers' auto mappings and none of the release's ``_CONFIG_REGISTRY`` classes declares them, yet
the release builds each from a config class it names: a draft or MTP head beside its target
(``DeepseekV4ForCausalLMNextN(DeepseekV4ForCausalLM)``, 0.5.23 models/deepseek_v4_nextn.py:243), an
embedding model in its causal sibling's file (``EmbeddingGemmaModel(Gemma3ForCausalLM)`` with
``config: Gemma3TextConfig``, models/gemma3_causal.py:958-963), an EAGLE-3 head reading a
``LlamaConfig`` (models/llama_eagle3.py:275-277). The route, first found wins, each step said in
``how`` with its file:line:

1. the ``config`` annotation of the class's ``__init__`` (not ``PretrainedConfig``): a class of the
   release's registry, a transformers config class, or a class the model file imports from
   ``sglang.srt.configs`` whose ``model_type`` constant is one of those (0.5.23
   configs/deepseek_v4.py:65 ``model_type = "deepseek_v4"``);
2. another architecture the same file's ``EntryClass`` lists that has a ``model_type`` (0.5.23
   models/exaone_moe.py:886 ``EntryClass = [ExaoneMoEForCausalLM, ExaoneMoeForCausalLM]``);
3. the same for each base class, in its own file (the model files it imports from).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from swa_repro.engine.config_reads import model_imports, model_tree

GENERIC = {"PretrainedConfig", "PreTrainedConfig", "Any", "object"}


@dataclass(frozen=True)
class Route:
    """``model_type`` of transformers (``source == "transformers"``) or of the release's registry
    (``"release"``), and how the release's code names it."""
    source: str
    model_type: str
    how: str


def _classes(path: Path) -> dict:
    return {n.name: n for n in model_tree(path).body if isinstance(n, ast.ClassDef)}


def entry_names(path: Path) -> list[str]:
    """The names a model file's ``EntryClass`` lists, in order."""
    for n in model_tree(path).body:
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in n.targets):
            return [x.id for x in ast.walk(n.value) if isinstance(x, ast.Name)]
    return []


def config_annotation(cls: ast.ClassDef) -> tuple[str, int] | None:
    """``(name, line)`` of the ``config`` parameter's annotation of ``cls.__init__`` (its last name:
    ``Optional[X]`` -> X), unless generic."""
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    arg = next((a for a in (init.args.args + init.args.kwonlyargs if init else []) if a.arg == "config"), None)
    if arg is None or arg.annotation is None:
        return None
    names = [x.id if isinstance(x, ast.Name) else x.attr for x in ast.walk(arg.annotation)
             if isinstance(x, (ast.Name, ast.Attribute)) and (isinstance(x, ast.Attribute) or x.id[:1].isupper())]
    names = [n for n in names if n not in GENERIC and n not in ("Optional", "Union")]
    return (names[-1], arg.annotation.lineno) if names else None


def _imported_model_type(model_file: Path, name: str) -> tuple[str, str] | None:
    """``(model_type, "configs/x.py:line")`` of a config class the model file imports from
    ``sglang.srt.configs``: its class-level ``model_type = "..."``."""
    for n in model_tree(model_file).body:
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.srt.configs.") and \
                any((a.asname or a.name) == name for a in n.names):
            src = model_file.parent.parent / "configs" / (n.module.rsplit(".", 1)[-1] + ".py")
            cls = _classes(src).get(name) if src.is_file() else None
            got = _class_model_type(cls) if cls else None
            if got:
                return got[0], f"configs/{src.name}:{got[1]}"
    return None


def _class_model_type(cls: ast.ClassDef) -> tuple[str, int] | None:
    """``(model_type, line)`` of a config class's class-level ``model_type = "..."``."""
    for st in cls.body:
        target = st.target if isinstance(st, ast.AnnAssign) else (st.targets[0] if isinstance(
            st, ast.Assign) and len(st.targets) == 1 else None)
        if getattr(target, "id", None) == "model_type" and isinstance(st.value, ast.Constant):
            return st.value.value, st.lineno
    return None


def declares_model_type(configs: Path, model_type: str) -> bool:
    """Whether a class of the release's ``configs/*.py`` declares ``model_type`` (read, not imported)."""
    return any((_class_model_type(c) or (None,))[0] == model_type
               for f in sorted(configs.glob("*.py")) for c in _classes(f).values())


def _resolve_class(name: str, model_file: Path, types: dict, mapping: dict) -> tuple[str, str, str] | None:
    """``(source, model_type, extra how)`` of a config class name."""
    mine = [mt for mt, e in types.items() if e.get("class") == name and not e.get("error")]
    if len(mine) == 1:
        return "release", mine[0], f" (the release's registry: {types[mine[0]]['where']})"
    theirs = [mt for mt, c in mapping.items() if c == name]
    if len(theirs) == 1:
        return "transformers", theirs[0], f" (transformers' class of model_type {theirs[0]})"
    got = _imported_model_type(model_file, name)  # transformers' type first, as column_config reads one
    if got and got[0] in mapping:
        return "transformers", got[0], f" (model_type {got[0]!r} at {got[1]}, transformers' type)"
    if got and got[0] in types and not types[got[0]].get("error"):
        return "release", got[0], f" (model_type {got[0]!r} at {got[1]}, the release's registry type)"
    return None


def route(arch: str, model_file: Path, types: dict, model_type_of) -> Route | None:
    """The config route for ``arch`` (module docstring), None when the release's code names none."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return _route(arch, Path(model_file), types, model_type_of, dict(CONFIG_MAPPING_NAMES), set())


def _route(name: str, path: Path, types: dict, model_type_of, mapping: dict, seen: set) -> Route | None:
    if (path, name) in seen:
        return None
    seen.add((path, name))
    cls = _classes(path).get(name)
    if cls is None:
        where = model_imports(path).get(name)
        return _route(name, where, types, model_type_of, mapping, seen) if where else None
    ann = config_annotation(cls)
    if ann:
        got = _resolve_class(ann[0], path, types, mapping)
        if got:
            return Route(got[0], got[1], f"models/{path.name}:{ann[1]} {name}.__init__(config: {ann[0]}){got[2]}")
    for sib in entry_names(path):
        mt = model_type_of(sib) if sib != name else None
        if mt:
            return Route("transformers", mt, f"models/{path.name}'s EntryClass lists {sib} (model_type {mt}) "
                                             f"beside {name}")
        declared = [t for t, e in types.items() if sib in (e.get("architectures") or []) and not e.get("error")]
        if sib != name and len(declared) == 1:
            return Route("release", declared[0], f"models/{path.name}'s EntryClass lists {sib} (declared by "
                                                 f"{types[declared[0]]['class']}, {types[declared[0]]['where']}) "
                                                 f"beside {name}")
    for base in cls.bases:
        if isinstance(base, ast.Name):
            mt = model_type_of(base.id)
            if mt:
                return Route("transformers", mt, f"models/{path.name}:{cls.lineno} {name}({base.id}), model_type {mt}")
            got = _route(base.id, path, types, model_type_of, mapping, seen)
            if got:
                return Route(got.source, got.model_type, f"models/{path.name}:{cls.lineno} {name}({base.id}); "
                                                         + got.how)
    return None


def unnamed(arch: str, model_file: Path) -> str:
    """Why no route: what the class's ``__init__`` takes (a generic ``PretrainedConfig``, or a class in
    neither transformers' mappings nor the release's registry, with its ``model_type``), for the
    column's ``not built`` line."""
    path = Path(model_file)
    cls = _classes(path).get(arch)
    if cls is None:
        return f"{arch} is imported into models/{path.name}"
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    arg = next((a for a in (init.args.args + init.args.kwonlyargs if init else []) if a.arg == "config"), None)
    ann = ast.unparse(arg.annotation) if arg is not None and arg.annotation is not None else None
    where = f"models/{path.name}:{(arg or cls).lineno}"
    if ann is None or ann in GENERIC:
        return f"{where} {arch}.__init__ takes config{': ' + ann if ann else ''} (no class of its own)"
    got = _imported_model_type(path, ann)
    tail = f" (model_type {got[0]!r}, {got[1]})" if got else ""
    return f"{where} {arch}.__init__(config: {ann}){tail}, a class in neither transformers' mappings nor the release's registry"
