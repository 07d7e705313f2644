"""The config keys a release's model class reads, from its source (``ast``, nothing imported).

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
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _defs(path: Path) -> dict:
    """Top-level classes and functions of a model file by name."""
    return {n.name: n for n in _tree(path).body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}


def model_imports(path: Path) -> dict:
    """name -> the sglang model file it is imported from (``from sglang.srt.models.llama import X``)."""
    out = {}
    for n in _tree(path).body:
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.srt.models."):
            p = path.parent / (n.module.rsplit(".", 1)[1] + ".py")
            if p.is_file():
                out.update({a.asname or a.name: p for a in n.names})
    return out


def _is_config(node) -> bool:
    """``config`` or ``self.config``."""
    if isinstance(node, ast.Name):
        return node.id == _CONFIG
    return isinstance(node, ast.Attribute) and node.attr == _CONFIG and isinstance(node.value, ast.Name) \
        and node.value.id == "self"


def _reachable(path: Path, name: str):
    """``(file, def)`` of ``name`` and everything it names, across imported model files."""
    seen, todo = set(), [(path, name)]
    while todo:
        p, n = todo.pop()
        if (p, n) in seen:
            continue
        seen.add((p, n))
        node = _defs(p).get(n)
        if node is None:
            if n in model_imports(p):
                todo.append((model_imports(p)[n], n))
            continue
        yield p, node
        todo += [(p, x.id) for x in ast.walk(node) if isinstance(x, ast.Name) and x.id != n]


def _guard(x) -> bool:
    """``hasattr(config, "X")`` or ``getattr(config, "X", default)``: the code tests for the key."""
    return isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and len(x.args) >= 2 and _is_config(x.args[0]) \
        and isinstance(x.args[1], ast.Constant) and (x.func.id, len(x.args)) in (("hasattr", 2), ("getattr", 3))


def config_reads(model_file: Path, class_name: str) -> dict[str, str]:
    """``{key: "file.py:line"}`` (first read) of the keys ``class_name`` reads off its config unguarded."""
    reads, guarded = {}, set()
    for p, node in _reachable(Path(model_file), class_name):
        for x in ast.walk(node):
            if isinstance(x, ast.Attribute) and _is_config(x.value) and x.attr != _CONFIG:
                if isinstance(x.ctx, ast.Store):
                    guarded.add(x.attr)
                else:
                    reads.setdefault(x.attr, f"{p.name}:{x.lineno}")
            elif _guard(x):
                guarded.add(x.args[1].value)
    return {k: v for k, v in reads.items() if k not in guarded}
