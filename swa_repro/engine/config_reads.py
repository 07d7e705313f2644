"""The config keys a release's model class reads, from its source (``ast``, nothing imported): sglang's
and vLLM's model files alike (``sglang.checkpoint``, ``vllm.checkpoint``).

Why: a user's ``config.json`` that lacks a key the release's model file reads with no default would
fail deep in the audit's child (``AttributeError`` while the model is built, ~15 s in); read off the
source, the parent says which key and which line first, before any audit work.

What counts as a read: ``config.X`` or ``self.config.X`` loaded (not stored) in the entry class and
every class or function it names, followed into the sglang model files it imports from (Mistral's
``MistralForCausalLM(LlamaForCausalLM)`` reads llama.py's). Guarded reads are none:
a key some reachable code tests with ``hasattr(config, "X")`` or reads with
``getattr(config, "X", default)`` (llama.py:329-333 reads ``config.original_max_position_embeddings``
only where the getattr found one), or assigns (``config.X = ...``) is dropped.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

_CONFIG = "config"


@cache
def model_tree(path: Path) -> ast.Module:
    """A release's source file parsed once per process (model files are read by several rules:
    ``config_reads``, ``sglang.config_routes``); callers only read the tree."""
    return ast.parse(Path(path).read_text(encoding="utf-8-sig"))


@cache
def _defs(path: Path) -> dict:
    """Top-level classes and functions of a model file by name (once per file: ``_reachable`` asks per name)."""
    return {n.name: n for n in model_tree(path).body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}


# the packages whose sibling model files an import names: sglang's; vLLM's, absolute or relative
# (vLLM 0.34.0 gemma3.py ``from .gemma2 import``), for ``audit --vllm X --model`` (``vllm.checkpoint``)
SGLANG_MODELS = ("sglang.srt.models.",)
VLLM_MODELS = ("vllm.model_executor.models.", ".")


@cache
def model_imports(path: Path, packages: tuple = SGLANG_MODELS) -> dict:
    """name -> the model file it is imported from (``from sglang.srt.models.llama import X``; with
    ``VLLM_MODELS``, vLLM's ``from .llama import X`` too). Once per file (callers only read it)."""
    out = {}
    for n in model_tree(path).body:
        if not isinstance(n, ast.ImportFrom):
            continue
        mod = "." * n.level + (n.module or "")
        if n.module and any(mod.startswith(pk) and (pk != "." or mod.count(".") == 1) for pk in packages):
            p = path.parent / (n.module.rsplit(".", 1)[-1] + ".py")
            if p.is_file():
                out.update({a.asname or a.name: p for a in n.names})
    return out


def _is_config(node) -> bool:
    """``config`` or ``self.config``."""
    if isinstance(node, ast.Name):
        return node.id == _CONFIG
    return isinstance(node, ast.Attribute) and node.attr == _CONFIG and isinstance(node.value, ast.Name) \
        and node.value.id == "self"


# the methods a build runs: the constructor, and the runner's window hook, called right after the
# load (0.5.23 load_model_utils.py:144-157)
BUILD_METHODS = ("__init__", "get_attention_sliding_window_size")


def build_parts(cls: ast.ClassDef) -> list:
    """What building ``cls`` runs: its bases, its class-level statements, :data:`BUILD_METHODS` and the
    methods they name on ``self`` / ``cls`` / the class (0.5.23 exaone_moe.py:497 ``stage_facts``,
    handed to ``make_layers``), transitively; not ``forward`` or ``load_weights`` (0.5.23
    cohere2_moe.py:566 reads ``num_experts`` only while loading weights), which a model built on the
    meta device never runs."""
    methods = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    keep, todo = set(), [m for m in BUILD_METHODS if m in methods]
    while todo:
        m = todo.pop()
        if m in keep:
            continue
        keep.add(m)
        todo += [x.attr for x in ast.walk(methods[m]) if isinstance(x, ast.Attribute) and x.attr in methods
                 and isinstance(x.value, ast.Name) and x.value.id in ("self", "cls", cls.name)]
    rest = [st for st in cls.body if st.__class__ not in (ast.FunctionDef, ast.AsyncFunctionDef)]
    return [*cls.bases, *rest, *(methods[m] for m in sorted(keep))]


def _reachable(path: Path, name: str, packages: tuple = SGLANG_MODELS, build_only: bool = False):
    """``(file, node)`` of ``name`` and everything it names, across imported model files
    (``build_only``: of a class, only :func:`build_parts`)."""
    seen, todo = set(), [(path, name)]
    while todo:
        p, n = todo.pop()
        if (p, n) in seen:
            continue
        seen.add((p, n))
        node = _defs(p).get(n)
        if node is None:
            imports = model_imports(p, packages)
            if n in imports:
                todo.append((imports[n], n))
            continue
        for part in build_parts(node) if build_only and isinstance(node, ast.ClassDef) else [node]:
            yield p, part
            todo += [(p, x.id) for x in ast.walk(part) if isinstance(x, ast.Name) and x.id != n]


def _guard(x) -> bool:
    """``hasattr(config, "X")`` or ``getattr(config, "X", default)``: the code tests for the key."""
    return isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and len(x.args) >= 2 and _is_config(x.args[0]) \
        and isinstance(x.args[1], ast.Constant) and (x.func.id, len(x.args)) in (("hasattr", 2), ("getattr", 3))


def _unconditional(node):
    """``ast.walk`` without the branches of an ``if`` / ``x if c else y`` (their tests kept) and the
    operands of ``and`` / ``or`` after the first: a read only some configs reach (vLLM 0.34.0
    mistral.py:161-165 reads ``config.ada_rms_norm_t_cond_dim`` only where
    ``getattr(config, "ada_rms_norm_t_cond", False)``; sglang 0.5.23 commandr.py:207 reads
    ``config.layer_types`` only ``if self.v2 and ...``: never for Command-R v1)."""
    todo = [node]
    while todo:
        x = todo.pop()
        yield x
        todo += [x.test] if isinstance(x, (ast.If, ast.IfExp)) else [x.values[0]] if isinstance(x, ast.BoolOp) \
            else list(ast.iter_child_nodes(x))


def config_reads(model_file: Path, class_name: str, packages: tuple = SGLANG_MODELS,
                 branches: bool = True, build_only: bool = False) -> dict[str, str]:
    """``{key: "file.py:line"}`` (first read) of the keys ``class_name`` reads off its config unguarded
    (``packages``: whose model-file imports are followed, :func:`model_imports`; ``branches=False``:
    only the reads every config reaches, :func:`_unconditional`; ``build_only``: only what building
    the model runs, :func:`build_parts`). A pure function of the files: walked once per process
    (``arch_cells.filled_config`` asks again after each key it fills), a fresh dict each call."""
    return dict(_config_reads(Path(model_file), class_name, packages, branches, build_only))


@cache
def _config_reads(model_file: Path, class_name: str, packages: tuple, branches: bool, build_only: bool) -> dict:
    reads, guarded = {}, set()
    for p, node in _reachable(model_file, class_name, packages, build_only):
        for x in (ast.walk(node) if branches else _unconditional(node)):
            if isinstance(x, ast.Attribute) and _is_config(x.value) and x.attr != _CONFIG:
                if isinstance(x.ctx, ast.Store):
                    guarded.add(x.attr)
                else:
                    reads.setdefault(x.attr, f"{p.name}:{x.lineno}")
            elif _guard(x):
                guarded.add(x.args[1].value)
    return {k: v for k, v in reads.items() if k not in guarded}
