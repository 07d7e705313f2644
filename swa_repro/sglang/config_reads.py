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


# the packages whose sibling model files an import names: sglang's; vLLM's, absolute or relative
# (vLLM 0.34.0 gemma3.py ``from .gemma2 import``), for ``audit --vllm X --model`` (``vllm.checkpoint``)
SGLANG_MODELS = ("sglang.srt.models.",)
VLLM_MODELS = ("vllm.model_executor.models.", ".")


def model_imports(path: Path, packages: tuple = SGLANG_MODELS) -> dict:
    """name -> the model file it is imported from (``from sglang.srt.models.llama import X``; with
    ``VLLM_MODELS``, vLLM's ``from .llama import X`` too)."""
    out = {}
    for n in _tree(path).body:
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


def _reachable(path: Path, name: str, packages: tuple = SGLANG_MODELS):
    """``(file, def)`` of ``name`` and everything it names, across imported model files."""
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
        yield p, node
        todo += [(p, x.id) for x in ast.walk(node) if isinstance(x, ast.Name) and x.id != n]


def _guard(x) -> bool:
    """``hasattr(config, "X")`` or ``getattr(config, "X", default)``: the code tests for the key."""
    return isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and len(x.args) >= 2 and _is_config(x.args[0]) \
        and isinstance(x.args[1], ast.Constant) and (x.func.id, len(x.args)) in (("hasattr", 2), ("getattr", 3))


def _unconditional(node):
    """``ast.walk`` without the branches of an ``if`` / ``x if c else y`` (their tests kept): a read
    only some configs reach (vLLM 0.34.0 mistral.py:161-165 reads ``config.ada_rms_norm_t_cond_dim``
    only where ``getattr(config, "ada_rms_norm_t_cond", False)``)."""
    todo = [node]
    while todo:
        x = todo.pop()
        yield x
        todo += [x.test] if isinstance(x, (ast.If, ast.IfExp)) else list(ast.iter_child_nodes(x))


def config_reads(model_file: Path, class_name: str, packages: tuple = SGLANG_MODELS,
                 branches: bool = True) -> dict[str, str]:
    """``{key: "file.py:line"}`` (first read) of the keys ``class_name`` reads off its config unguarded
    (``packages``: whose model-file imports are followed, :func:`model_imports`; ``branches=False``:
    only the reads every config reaches, :func:`_unconditional`)."""
    reads, guarded = {}, set()
    for p, node in _reachable(Path(model_file), class_name, packages):
        for x in (ast.walk(node) if branches else _unconditional(node)):
            if isinstance(x, ast.Attribute) and _is_config(x.value) and x.attr != _CONFIG:
                if isinstance(x.ctx, ast.Store):
                    guarded.add(x.attr)
                else:
                    reads.setdefault(x.attr, f"{p.name}:{x.lineno}")
            elif _guard(x):
                guarded.add(x.args[1].value)
    return {k: v for k, v in reads.items() if k not in guarded}
