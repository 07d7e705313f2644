"""Every architecture a release serves with a sliding window, read off its own ``srt/`` (``ast``, nothing imported).

Why: the family audit named 8 families by hand; a release's ``models/`` serves about 40 architectures
that hand a window to their attention (issue #41 part 2). A user of any of them needs a cell, and the
list has to follow the release, not this project.

An architecture (a name in a model file's ``EntryClass``, sglang's registry rule:
``model_configs.model_file_in``) is a sliding-window one when

* the code its entry class reaches (the class, every class or function it names, followed into the
  sglang model files it imports from: the rule of ``config_reads``) calls anything with a
  ``sliding_window_size=`` whose value is not a constant (``-1`` / ``None`` / ``0`` pass no window:
  0.5.23 mimo_v2.py:912), or defines ``get_attention_sliding_window_size`` (the runner's hook,
  0.5.23 load_model_utils.py:144-157); or
* the release serves it on its hybrid SWA pool: the architecture set of ``configs/model_config.py``
  ``is_hybrid_swa_model`` (0.5.23 :2651-2679, its ``*SWA_SINK_ARCHS`` / ``*MIMO_V2_MODEL_ARCHS``
  resolved to the module's own constants).

Beside the window it records what FlashInfer's backend cannot take: an attention call passing
``sinks=`` (0.5.23 gpt_oss.py:499, granite.py:221) where the release's ``FlashInferAttnBackend``
``forward_extend`` / ``forward_decode`` take neither ``sinks`` nor ``**kwargs`` (0.5.23
flashinfer_backend.py:1357-1365: a ``TypeError`` on the first prefill), and the Transformers fallback
(``models/transformers.py``), which serves what ``EntryClass`` does not list.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from swa_repro.engine.config_reads import model_imports, model_tree

NO_WINDOW = (-1, None, 0)
WINDOW_WORD = "sliding_window_size"
FALLBACK_FILE = "transformers.py"  # sglang's Transformers fallback (TransformersForCausalLM & co)


@dataclass(frozen=True)
class SwaArch:
    """One architecture the release serves with a sliding window."""
    architecture: str
    model_file: str  # the file whose EntryClass lists it
    windows: tuple = ()  # "file.py:line" of each sliding_window_size= / get_attention_sliding_window_size reached
    hybrid: str | None = None  # "configs/model_config.py:line" where is_hybrid_swa_model lists it
    sinks: tuple = ()  # "file.py:line" of each attention call passing sinks=
    fallback: bool = False  # the Transformers fallback's own entry class
    extra: dict = field(default_factory=dict)


def _tree(path: Path) -> ast.Module:
    """The file's one parse in this process, shared with ``config_reads`` and ``config_routes``
    (``arch_cells.plan`` reads the same model files through all three: each parsed its own copy)."""
    return model_tree(Path(path))


@cache
def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8-sig")


_IMPORT = re.compile(r"^from sglang\.srt\.models\.(\w+) import", re.MULTILINE)


def _closure(path: Path) -> set:
    """``path`` and the sglang model files it imports from, transitively (text; a superset of what
    :func:`sites` follows, so no file it could reach is skipped)."""
    seen, todo = set(), [path]
    while todo:
        p = todo.pop()
        if p in seen or not p.is_file():
            continue
        seen.add(p)
        todo += [p.parent / f"{m}.py" for m in _IMPORT.findall(_text(p))]
    return seen


def entry_classes(models: Path, keep=None) -> dict[str, Path]:
    """architecture -> its model file, for every ``EntryClass`` of ``models/`` (a list, a tuple or one
    name); ``keep(path)``: parse only the files it keeps (cheap text tests first)."""
    out = {}
    for p in sorted(Path(models).glob("*.py")):
        if "EntryClass" not in _text(p) or (keep is not None and not keep(p)):
            continue
        for node in _tree(p).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass"
                                                    for t in node.targets):
                for n in ast.walk(node.value):
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, p)
    return out


def _window_kw(x) -> bool:
    """``sliding_window_size=<not a no-window constant>`` in a call."""
    return isinstance(x, ast.keyword) and x.arg == "sliding_window_size" and not (
        isinstance(x.value, ast.Constant) and x.value.value in NO_WINDOW) and not (
        isinstance(x.value, ast.UnaryOp) and isinstance(x.value.operand, ast.Constant))


def _sinks_call(x) -> bool:
    """An attention call (``self.attn(...)``, ``self.attn_xyz(...)``) with a ``sinks=`` keyword."""
    return isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and "attn" in x.func.attr.lower() \
        and any(k.arg == "sinks" for k in x.keywords)


@cache
def _defs(path: Path) -> dict:
    """Top-level classes, functions and module constants by name (0.5.23 nemotron_h.py:797
    ``ALL_DECODER_LAYER_TYPES`` maps the pattern's letters to the layer classes)."""
    out = {}
    for n in _tree(path).body:
        if isinstance(n, (ast.ClassDef, ast.FunctionDef)):
            out[n.name] = n
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                if isinstance(t, ast.Name) and n.value is not None:
                    out.setdefault(t.id, n.value)
    return out


@cache
def _imports(path: Path) -> dict:
    """name -> the sglang model file it is imported from (``config_reads.model_imports``, once a file)."""
    return model_imports(path)


@cache
def _facts(path: Path, name: str):
    """``(names it uses, window sites, sinks sites)`` of one top-level def, one walk each."""
    node = _defs(path).get(name)
    if node is None:
        return (), (), ()
    names, win, snk = set(), set(), set()
    if isinstance(node, ast.FunctionDef) and node.name == "get_attention_sliding_window_size":
        win.add(f"{path.name}:{node.lineno}")
    for x in ast.walk(node):
        if isinstance(x, ast.Name) and x.id != name:
            names.add(x.id)
        elif isinstance(x, ast.Call):  # the keyword's own line
            win.update(f"{path.name}:{k.lineno}" for k in x.keywords if _window_kw(k))
            if _sinks_call(x):
                snk.update(f"{path.name}:{k.lineno}" for k in x.keywords if k.arg == "sinks")
        elif isinstance(x, ast.FunctionDef) and x.name == "get_attention_sliding_window_size":
            win.add(f"{path.name}:{x.lineno}")
    return tuple(names), tuple(win), tuple(snk)


def sites(path: Path, arch: str) -> tuple[tuple, tuple]:
    """``(windows, sinks)`` file:line sites in the code ``arch``'s entry class reaches: the class and
    every def it names, followed into imported sglang model files (``config_reads.reachable``'s rule)."""
    win, snk, seen, todo = set(), set(), set(), [(Path(path), arch)]
    while todo:
        p, n = todo.pop()
        if (p, n) in seen:
            continue
        seen.add((p, n))
        if n not in _defs(p):
            if n in _imports(p):
                todo.append((_imports(p)[n], n))
            continue
        names, w, s = _facts(p, n)
        win.update(w)
        snk.update(s)
        todo += [(p, x) for x in names]
    key = lambda s: (s.split(":")[0], int(s.split(":")[1]))
    return tuple(sorted(win, key=key)), tuple(sorted(snk, key=key))


def hybrid_archs(srt: Path) -> dict[str, str]:
    """architecture -> ``configs/model_config.py:line`` of ``is_hybrid_swa_model``'s set (its starred
    names resolved to the module's tuple / frozenset constants); empty before the release has one."""
    p = Path(srt) / "configs" / "model_config.py"
    if not p.is_file():
        return {}
    tree = _tree(p)
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            consts[node.targets[0].id] = [c.value for c in ast.walk(node.value)
                                          if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    out = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "is_hybrid_swa_model"):
        for s in ast.walk(fn):
            if not isinstance(s, (ast.Set, ast.List, ast.Tuple)):
                continue
            for e in s.elts:
                if isinstance(e, ast.Constant) and isinstance(e.value, str):
                    out.setdefault(e.value, f"configs/model_config.py:{e.lineno}")
                elif isinstance(e, ast.Starred) and isinstance(e.value, ast.Name):
                    out.update({a: f"configs/model_config.py:{e.lineno}" for a in consts.get(e.value.id, [])
                                if a not in out})
    return out


def backend_takes_sinks(srt: Path) -> str | None:
    """None when the release's FlashInfer backend takes ``sinks=``; else where it does not
    (``forward_extend``'s def, file:line): the call a model passing sinks makes ends in a TypeError."""
    p = Path(srt) / "layers" / "attention" / "flashinfer_backend.py"
    for cls in (n for n in _tree(p).body if isinstance(n, ast.ClassDef) and n.name == "FlashInferAttnBackend"):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name in ("forward_extend", "forward_decode"):
                a = fn.args
                if a.kwarg is None and "sinks" not in [x.arg for x in a.args + a.kwonlyargs]:
                    return f"layers/attention/flashinfer_backend.py:{fn.lineno}"
    return None


def discover(srt: Path) -> list[SwaArch]:
    """Every sliding-window architecture of the release whose ``sglang/srt`` is ``srt``, by name."""
    srt = Path(srt)
    hyb, out = hybrid_archs(srt), []

    def keep(p):  # a window can be reached only through a file that names one; a hybrid arch by its name
        return any(WINDOW_WORD in _text(f) or "get_attention_sliding_window_size" in _text(f) for f in _closure(p)) \
            or any(a in _text(p) for a in hyb)
    for arch, path in entry_classes(srt / "models", keep).items():
        win, snk = sites(path, arch)
        if win or arch in hyb:
            out.append(SwaArch(arch, path.name, win, hyb.get(arch), snk, path.name == FALLBACK_FILE))
    return sorted(out, key=lambda a: a.architecture)


def crash_on_flashinfer(srt: Path, a: SwaArch) -> str | None:
    """``the release crashes on FlashInfer: ...`` for an architecture passing ``sinks=`` to a backend
    that takes none; None otherwise."""
    where = backend_takes_sinks(srt) if a.sinks else None
    if where is None:
        return None
    return (f"the release crashes on FlashInfer: {', '.join(f'models/{s}' for s in a.sinks)} passes sinks= to the "
            f"attention, which FlashInferAttnBackend.forward_extend ({where}) does not take (TypeError on the first "
            "prefill of a layer with sinks)")
