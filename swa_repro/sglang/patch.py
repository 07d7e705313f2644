"""Classify, patch and revert sglang's FlashInfer backend for the sliding-window plan bug.

The bug (sglang <= 0.5.15.post1): ``FlashInferIndicesUpdaterPrefill.update_sliding_window``
(0.5.15.post1 ``srt/layers/attention/flashinfer_backend.py:1653``) calls ``call_begin_forward``
(:1822) for the paged-only SWA wrapper without a window, and ``call_begin_forward`` plans the paged
wrapper (:1960 ``wrapper_paged.begin_forward(...)``) without ``window_left``, so FlashInfer compiles
the left-window mask out. The fix (PR #31501, 0.5.16 ``flashinfer_backend.py:2054`` and
:2190-2192, :1933): ``call_begin_forward(..., window_left: int = -1)`` adds it to the paged plan
kwargs only when ``>= 0``; ``update_sliding_window`` passes the window for wrapper 0 when neither
ragged nor spec-verify.

Everything works on the real source text: :func:`classify` reads its structure with ``ast``,
:func:`transform` makes minimal line edits at ast locations (everything else byte for byte), the
context managers :func:`patched` / :func:`unpatched` swap the two methods of the loaded class, and
``swa-repro patch`` shows or writes the change (site-packages only with ``--in-place``, with a
backup that ``revert`` restores byte for byte).
"""

from __future__ import annotations

import __future__
import ast
import builtins
import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import json
import linecache
import os
import re
import shutil
import sys
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from swa_repro.core.errors import UsageError

MODULE = "sglang.srt.layers.attention.flashinfer_backend"
REL_PATH = Path("srt/layers/attention/flashinfer_backend.py")  # under the sglang package
CLASS, USW, CBF = "FlashInferIndicesUpdaterPrefill", "update_sliding_window", "call_begin_forward"
STATES = ("unfixed", "fixed", "unknown")
OTHER = {"unfixed": "fixed", "fixed": "unfixed"}
_COMMENT = "# PR #31501: plan the paged-only SWA wrapper with its window, so FlashInfer"
_COMMENT2 = "# compiles the left-window mask in (ragged / spec-verify keep their own masks)"
_PLAN_COMMENT = "# window_left >= 0 makes plan() pick the module with the window mask compiled in"


class PatchError(UsageError):
    """Refused: the message says why and what to do; nothing was written."""


# ----------------------------------------------------------------------------- structure


@dataclass
class Structure:
    """What :func:`classify` found. ``state`` is unfixed / fixed / unknown, ``reasons`` say why."""

    state: str
    reasons: list = field(default_factory=list)
    plan_style: str = ""  # how call_begin_forward builds the paged plan call (for reports)
    # ast nodes for transform()
    tree: ast.Module | None = None
    usw: ast.FunctionDef | None = None
    cbf: ast.FunctionDef | None = None
    usw_call: ast.Call | None = None
    loop_var: str = "wrapper_id"
    plan_call: ast.Call | None = None
    plan_stmt: ast.stmt | None = None


def _kw(call, name):
    return next((k for k in call.keywords if k.arg == name), None)


def _names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _params(fn):
    a = fn.args
    return a.posonlyargs + a.args + a.kwonlyargs


def _default(fn, name):
    a = fn.args
    pos = a.posonlyargs + a.args
    defs = dict(zip([p.arg for p in pos[len(pos) - len(a.defaults):]], a.defaults))
    defs.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    d = defs.get(name)
    return ast.literal_eval(d) if d is not None else None


def _mentions_window_left(fn):
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and n.id == "window_left" or (
                isinstance(n, ast.arg) and n.arg == "window_left") or (
                isinstance(n, ast.keyword) and n.arg == "window_left") or (
                isinstance(n, ast.Constant) and n.value == "window_left"):
            return True
    return False


def _plan_calls(cbf):
    """The paged wrapper's ``begin_forward``/``plan`` calls: on the parameter named
    ``wrapper_paged`` (every release so far), else the third positional parameter."""
    names = [p.arg for p in cbf.args.args]
    paged = "wrapper_paged" if "wrapper_paged" in names else (names[2] if len(names) > 2 else "")
    return [n for n in ast.walk(cbf) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr in ("begin_forward", "plan")
            and isinstance(n.func.value, ast.Name) and n.func.value.id == paged]


def _splat_window_if(cbf, call):
    """``if window_left >= 0: X["window_left"] = window_left`` with ``**X`` in the plan call."""
    splats = {k.value.id for k in call.keywords if k.arg is None and isinstance(k.value, ast.Name)}
    for n in ast.walk(cbf):
        if (isinstance(n, ast.If) and len(n.body) == 1 and isinstance(n.body[0], ast.Assign)
                and "window_left" in _names(n.test)):
            t = n.body[0].targets[0]
            if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                    and t.value.id in splats and isinstance(t.slice, ast.Constant)
                    and t.slice.value == "window_left"
                    and _names(n.body[0].value) == {"window_left"}):
                return n, t.value.id
    return None, None


def _stmt_of(fn, call):
    for n in ast.walk(fn):
        if isinstance(n, ast.Expr) and n.value is call:
            return n
    return None


def classify(text: str) -> Structure:
    """Classify flashinfer_backend.py source by its structure (never by a version string)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        return Structure("unknown", [f"does not parse: {e}"])
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS), None)
    if cls is None:
        return Structure("unknown", [f"no class {CLASS}"])
    fns = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if USW not in fns or CBF not in fns:
        return Structure("unknown", [f"{CLASS} lacks {USW} or {CBF}"])
    s = Structure("unknown", tree=tree, usw=fns[USW], cbf=fns[CBF])
    calls = [n for n in ast.walk(s.usw) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == CBF]
    loops = [n for n in ast.walk(s.usw) if isinstance(n, ast.For) and isinstance(n.target, ast.Name)
             and any(c in ast.walk(n) for c in calls)]
    plans = _plan_calls(s.cbf)
    if len(calls) != 1 or len(loops) != 1 or len(plans) != 1:
        s.reasons.append(f"expected one self.{CBF}(...) in a wrapper loop of {USW} and one paged "
                         f"begin_forward/plan call in {CBF}; found {len(calls)}, {len(loops)}, "
                         f"{len(plans)}")
        return s
    s.usw_call, s.loop_var, s.plan_call = calls[0], loops[0].target.id, plans[0]
    s.plan_stmt = _stmt_of(s.cbf, s.plan_call)
    branch = any(isinstance(n, ast.Compare) and _names(n) == {s.loop_var}
                 and isinstance(n.comparators[0], ast.Constant) and n.comparators[0].value == 0
                 for n in ast.walk(loops[0]))
    if not branch or s.plan_stmt is None:
        s.reasons.append(f"no `if {s.loop_var} == 0:` sliding-window branch in {USW}, "
                         "or the plan call is not a statement")
        return s
    splats = [k.value for k in s.plan_call.keywords if k.arg is None]
    s.plan_style = (f"{s.plan_call.func.attr}({len(s.plan_call.args)} positional, "
                    f"{len(s.plan_call.keywords) - len(splats)} keywords"
                    + "".join(f", **{ast.unparse(v)}" for v in splats) + ")")
    usw_kw = _kw(s.usw_call, "window_left")
    has_param = "window_left" in [p.arg for p in _params(s.cbf)]
    if usw_kw is None and not _mentions_window_left(s.cbf):
        s.state = "unfixed"
        s.reasons.append(f"paged-only branch calls {CBF} without window_left and {CBF} never "
                         "plans the paged wrapper with one")
        return s
    direct = _kw(s.plan_call, "window_left")
    plumbed = (direct is not None and _names(direct.value) == {"window_left"}) or (
        _splat_window_if(s.cbf, s.plan_call)[0] is not None)
    usw_params = {p.arg for p in _params(s.usw)}
    need = {s.loop_var, "use_ragged"} | ({"spec_info"} & usw_params)
    gated = usw_kw is not None and need <= _names(usw_kw.value)
    default = _default(s.cbf, "window_left") if has_param else None
    checks = {f"{CBF} has `window_left: int = -1`": default == -1,
              f"{CBF} puts window_left into the paged plan": plumbed,
              f"{USW} passes window_left gated on {sorted(need)}": gated}
    if all(checks.values()):
        s.state = "fixed"
        s.reasons.append("; ".join(checks))
    else:
        s.reasons.append("partly patched or unrecognised: missing " +
                         "; ".join(k for k, ok in checks.items() if not ok))
    return s


# ----------------------------------------------------------------------------- text edits


class _Text:
    """Source lines with ast positions (1-based line, utf-8 byte column) -> str offsets."""

    def __init__(self, text):
        self.text, self.lines = text, text.splitlines(keepends=True)
        self.nl = "\r\n" if self.lines and self.lines[0].endswith("\r\n") else "\n"
        self.starts = [0]
        for ln in self.lines:
            self.starts.append(self.starts[-1] + len(ln))

    def off(self, lineno, col):
        return self.starts[lineno - 1] + len(self.lines[lineno - 1].encode()[:col].decode())

    def indent(self, lineno):
        ln = self.lines[lineno - 1]
        return ln[: len(ln) - len(ln.lstrip())]

    def is_comment(self, lineno):
        return self.lines[lineno - 1].lstrip().startswith("#")

    def is_blank(self, lineno):
        return 1 <= lineno <= len(self.lines) and not self.lines[lineno - 1].strip()


def _layout_error(what):
    return PatchError(f"cannot edit {what}: it is not laid out one item per line with trailing "
                      "commas (black style, as in every sglang release); patch it by hand")


def _span(t, node):
    """(start, end) str offsets of a call/signature item; a keyword spans ``name=`` or ``**``
    and any parentheses around its value (``window_left=(...)``)."""
    a = t.off(node.lineno, node.col_offset)
    v = getattr(node, "value", None) if isinstance(node, ast.keyword) else None
    end = v or node
    b = t.off(end.end_lineno, end.end_col_offset)
    if v is not None:
        for _ in range(t.text[a:t.off(v.lineno, v.col_offset)].count("(")):
            m = re.match(r"\s*\)", t.text[b:])
            if not m:
                break
            b += m.end()
    return a, b


def _after_last_item(t, items, what):
    """Offset of the line after the last item of a multi-line call/signature, and its indent."""
    spans = [(_span(t, n), n) for n in items]
    (_, b), last = max(spans, key=lambda x: x[0][1])
    if not re.match(r",[ \t]*(#[^\n]*)?\r?\n", t.text[b:]):
        raise _layout_error(what)
    return t.text.index("\n", b) + 1, t.indent(last.lineno)


def _whole_lines(t, a, b, prev_end, what):
    """(start, end) offsets of the whole lines holding ``text[a:b]`` plus the comment lines right
    above it (not above line ``prev_end``); it must sit alone on its lines (comma allowed)."""
    ls = t.text.rfind("\n", 0, a) + 1
    m = re.match(r",?[ \t]*(#[^\n]*)?\r?\n", t.text[b:])
    if t.text[ls:a].strip() or not m:
        raise _layout_error(what)
    first = t.text.count("\n", 0, ls) + 1  # 1-based line of ls
    while first - 1 > prev_end and t.is_comment(first - 1):
        first -= 1
    return t.starts[first - 1], b + m.end()


def _prev_end(items, node, floor):
    before = [n.end_lineno for n in items if n is not node and n.end_lineno < node.lineno]
    return max(before, default=floor)


def _cbf_items(cbf):
    """Parameters with their annotations/defaults as pseudo-nodes spanning the whole item."""
    a, out = cbf.args, []
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    for p, d in list(zip(pos, defaults)) + list(zip(a.kwonlyargs, a.kw_defaults)):
        end = d or p
        out.append(types.SimpleNamespace(arg=p.arg, lineno=p.lineno, col_offset=p.col_offset,
                                         end_lineno=end.end_lineno,
                                         end_col_offset=end.end_col_offset))
    return out


def _to_fixed(text, s):
    t, ins = _Text(text), []
    nl = t.nl
    # 1. update_sliding_window: pass the window for the paged-only branch
    usw_params = {p.arg for p in _params(s.usw)}
    if "use_ragged" not in usw_params:
        raise PatchError(f"{USW} has no use_ragged parameter; cannot tell the paged-only branch")
    window = "sliding_window_size" if any(
        isinstance(n, ast.Name) and n.id == "sliding_window_size" and isinstance(n.ctx, ast.Store)
        for n in ast.walk(s.usw)) else "self.sliding_window_size"
    cond = f"{s.loop_var} == 0 and not use_ragged" + (
        " and spec_info is None" if "spec_info" in usw_params else "")
    off, ind = _after_last_item(t, s.usw_call.args + s.usw_call.keywords, f"the {CBF} call")
    lines = [_COMMENT, _COMMENT2, "window_left=(", f"    {window}", f"    if ({cond})",
             "    else -1", "),"]
    ins.append((off, "".join(f"{ind}{ln}{nl}" for ln in lines)))
    # 2. call_begin_forward(..., window_left: int = -1)
    items = _cbf_items(s.cbf)
    pos = [i for i in items if i.arg in {p.arg for p in s.cbf.args.args}]
    off, ind = _after_last_item(t, pos, f"the {CBF} signature")
    ins.append((off, f"{ind}window_left: int = -1,{nl}"))
    # 3. into the paged plan kwargs, only when >= 0
    splat = next((k.value.id for k in s.plan_call.keywords if k.arg is None
                  and isinstance(k.value, ast.Name) and any(
                      isinstance(n, ast.Name) and n.id == k.value.id
                      and isinstance(n.ctx, ast.Store) for n in ast.walk(s.cbf))), None)
    name = splat or next(n for n in ("paged_plan_kwargs", "swa_plan_kwargs", "_swa_plan_kwargs")
                         if n not in _names(s.cbf))
    ind = " " * s.plan_stmt.col_offset
    block = "" if splat else f"{ind}{name} = {{}}{nl}"
    block += (f"{ind}if window_left >= 0:{nl}{ind}    {_PLAN_COMMENT}{nl}"
              f"{ind}    {name}[\"window_left\"] = window_left{nl}{nl}")
    first = s.plan_stmt.lineno
    while first > 1 and t.is_comment(first - 1):
        first -= 1
    ins.append((t.starts[first - 1], block))
    if not splat:
        off, aind = _after_last_item(t, s.plan_call.args + s.plan_call.keywords, "the plan call")
        ins.append((off, f"{aind}**{name},{nl}"))
    return _splice(text, [(o, o, r) for o, r in ins])


def _to_unfixed(text, s):
    t, cuts = _Text(text), []
    # 1. the window_left keyword (and its comment lines) of the update_sliding_window call
    kw = _kw(s.usw_call, "window_left")
    items = s.usw_call.args + [k.value for k in s.usw_call.keywords if k is not kw]
    cuts.append(_kw_lines(t, kw, items, s.usw_call.lineno))
    # 2. the window_left parameter
    items = _cbf_items(s.cbf)
    p = next(i for i in items if i.arg == "window_left")
    cuts.append(_whole_lines(t, *_span(t, p), _prev_end(items, p, s.cbf.lineno),
                             f"the {CBF} signature"))
    # 3. the plan plumbing: a direct keyword, or the `if window_left >= 0:` block (+ own dict)
    direct = _kw(s.plan_call, "window_left")
    others = s.plan_call.args + [k.value for k in s.plan_call.keywords if k is not direct]
    if direct is not None:
        cuts.append(_kw_lines(t, direct, others, s.plan_call.lineno))
    else:
        node, name = _splat_window_if(s.cbf, s.plan_call)
        start = node.lineno
        body = next(b for b in (getattr(n, "body", None) for n in ast.walk(s.cbf))
                    if isinstance(b, list) and node in b)
        i = body.index(node)
        prev = body[i - 1] if i else None
        own = (prev is not None and isinstance(prev, ast.Assign) and len(prev.targets) == 1
               and isinstance(prev.targets[0], ast.Name) and prev.targets[0].id == name
               and isinstance(prev.value, ast.Dict) and not prev.value.keys
               and prev.end_lineno == start - 1
               and sum(isinstance(n, ast.Name) and n.id == name for n in ast.walk(s.cbf)) == 3)
        if own:
            start = prev.lineno
        a, _ = _whole_lines(t, t.off(start, 0) + len(t.indent(start)), _span(t, node)[1],
                            prev.end_lineno if prev else s.cbf.lineno, "the plan block")
        end_line = node.end_lineno + (1 if t.is_blank(node.end_lineno + 1) else 0)
        cuts.append((a, t.starts[end_line]))
        if own:
            splat = next(k for k in s.plan_call.keywords if k.arg is None
                         and isinstance(k.value, ast.Name) and k.value.id == name)
            rest = s.plan_call.args + [k.value for k in s.plan_call.keywords if k is not splat]
            cuts.append(_kw_lines(t, splat, rest, s.plan_call.lineno))
    return _splice(text, [(a, b, "") for a, b in cuts])


def _kw_lines(t, kw, others, floor):
    """Whole lines of keyword ``kw`` (``name=value`` or ``**value``) plus its comment lines."""
    return _whole_lines(t, *_span(t, kw), _prev_end(others, kw, floor), "a keyword argument")


def _splice(text, edits):
    out, pos = [], 0
    for a, b, rep in sorted(edits):
        if a < pos:
            raise PatchError("internal error: overlapping edits; nothing was written")
        out += [text[pos:a], rep]
        pos = b
    return "".join(out + [text[pos:]])


def transform(text: str, target: str) -> str:
    """Source text turned into ``target`` (fixed / unfixed); checked to parse, classify as the
    target and, for unfixed -> fixed, to reverse back to the original bytes."""
    s = classify(text)
    if s.state == "unknown":
        raise PatchError("flashinfer_backend.py is in an unknown state (" + "; ".join(s.reasons)
                         + "); nothing was changed. Compare it with sglang 0.5.15.post1 / 0.5.16 "
                         "and patch by hand")
    if s.state == target:
        return text
    new = (_to_fixed if target == "fixed" else _to_unfixed)(text, s)
    got = classify(new)
    if got.state != target:
        raise PatchError(f"internal error: the edited source classifies {got.state} "
                         f"({'; '.join(got.reasons)}); nothing was written")
    if target == "fixed" and _to_unfixed(new, got) != text:
        raise PatchError("internal error: the patch does not reverse to the original bytes; "
                         "nothing was written")
    return new


def unified_diff(old: str, new: str, path="flashinfer_backend.py") -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        f"a/{path}", f"b/{path}"))


def method_spans(text: str) -> dict:
    """``{method: (def_line, last_line)}`` of the two methods."""
    s = classify(text)
    if s.usw is None:
        raise PatchError(f"no {CLASS}.{USW}/{CBF} in this source")
    return {f.name: (f.lineno, f.end_lineno) for f in (s.usw, s.cbf)}


# ----------------------------------------------------------------------------- behaviour on stubs


class _StubMeta(type):
    def __getattr__(cls, name):
        return mock.MagicMock(name=f"{cls.__name__}.{name}")

    def __getitem__(cls, item):
        return cls


class _Stubs(dict):
    """Globals for running the two methods without torch/flashinfer: builtins are real,
    Capitalised names are stub classes (isinstance works), the rest are MagicMocks."""

    def __missing__(self, name):
        if hasattr(builtins, name):
            return getattr(builtins, name)
        v = _StubMeta(name, (), {}) if name[:1].isupper() else mock.MagicMock(name=name)
        self[name] = v
        return v


def _top_level(tree):
    """Module-level statements, also inside top-level if/try/with blocks (not defs)."""
    todo = list(tree.body)
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for f in ("body", "orelse", "finalbody", "handlers"):
                todo += [c for c in getattr(n, f, []) if isinstance(c, ast.stmt)
                         or isinstance(c, ast.excepthandler)]


def _compile_methods(text, glb, filename):
    """The two methods of ``text`` compiled in ``glb`` (at their own lines, with the file's
    ``__future__`` flags, so code objects compare equal to the loaded ones)."""
    cls = compile_class(text, glb, filename)
    return cls.__dict__[USW], cls.__dict__[CBF]


def compile_class(text, glb, filename, whole=False):
    """``FlashInferIndicesUpdaterPrefill`` of ``text`` compiled in ``glb`` without running the
    rest of the module: the two methods only, or (``whole``) the class as written."""
    s = classify(text)
    if s.usw is None:
        raise PatchError(f"no {CLASS}.{USW}/{CBF} in {filename}")
    flags = 0
    for n in s.tree.body:
        if isinstance(n, ast.ImportFrom) and n.module == "__future__":
            for a in n.names:
                flags |= getattr(__future__, a.name).compiler_flag
    if {"super", "__class__"} & (_names(s.usw) | _names(s.cbf)):
        raise PatchError(f"{USW}/{CBF} use super(); they cannot be swapped in memory")
    cls = next(n for n in s.tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS)
    if not whole:
        cls = ast.ClassDef(CLASS, [], [], [s.usw, s.cbf], [], lineno=s.usw.lineno, col_offset=0,
                           end_lineno=max(s.usw.end_lineno, s.cbf.end_lineno), end_col_offset=0)
    # The module's imports, never run (`if False:`), so names like `torch` count as imported
    # as they do in the real module: CPython 3.11 then emits LOAD_ATTR, not LOAD_METHOD, for
    # `torch.f(...)` (compile.c is_import_originated) and the code objects compare equal.
    imports = [n for n in _top_level(s.tree) if isinstance(n, (ast.Import, ast.ImportFrom))
               and getattr(n, "module", None) != "__future__"]
    never = ast.If(ast.Constant(False, lineno=1, col_offset=0, end_lineno=1, end_col_offset=0),
                   imports, [], lineno=1, col_offset=0, end_lineno=1, end_col_offset=0)
    body = ([never] if imports else []) + [cls]
    code = compile(ast.Module(body=body, type_ignores=[]), filename, "exec", flags=flags,
                   dont_inherit=True)
    ns = {}
    exec(code, glb, ns)  # noqa: S102 - a class statement only (the imports never run)
    return ns[CLASS]


def _rebind(fn, glb):
    out = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


def plan_window_lefts(source, *, use_ragged=False, window=64) -> dict:
    """Run ``update_sliding_window`` -> ``call_begin_forward`` on stubs and return
    ``{wrapper_id: window_left given to that paged wrapper's plan, or None}``.

    ``source`` is flashinfer_backend.py text or a loaded ``FlashInferIndicesUpdaterPrefill``
    class (the code its two methods have now); either runs on stub globals (MagicMock torch,
    wrappers and tensors). A behavioural check without a GPU: fixed
    code gives ``{0: window, 1: None}`` on the paged-only path and ``{0: None, 1: None}`` with
    ragged; unfixed code never passes a window.
    """
    # eager path: no piecewise-CUDA-graph context (0.5.10 call_begin_forward pads for one)
    stubs = _Stubs(get_forward_context=lambda: None, is_in_piecewise_cuda_graph=lambda: False)
    if isinstance(source, str):
        usw, cbf = _compile_methods(source, stubs, "<swa-repro stub>")
    else:  # the class's current code, rebound to stub globals
        usw, cbf = (_rebind(source.__dict__[n], stubs) for n in (USW, CBF))
    wrappers = [mock.MagicMock(name=f"paged_wrapper_{i}") for i in range(2)]
    self = mock.MagicMock(name="self", sliding_window_size=window, _swa_kv_pool=None,
                          token_to_kv_pool_allocator=None, wrappers_paged=wrappers)
    self.call_begin_forward = types.MethodType(cbf, self)
    special = {"prefill_wrappers": wrappers, "use_ragged": use_ragged, "spec_info": None}
    kwargs = {}
    for name, p in list(inspect.signature(usw).parameters.items())[1:]:
        if name in special:
            kwargs[name] = special[name]
        elif p.default is inspect.Parameter.empty:
            kwargs[name] = mock.MagicMock(name=name)
    usw(self, **kwargs)
    out = {}
    for i, w in enumerate(wrappers):
        calls = w.begin_forward.call_args_list + w.plan.call_args_list
        if len(calls) != 1:
            raise AssertionError(f"paged wrapper {i} planned {len(calls)} times")
        out[i] = calls[0].kwargs.get("window_left")
    return out


# ----------------------------------------------------------------------------- in memory

_BASE: dict = {}  # class -> (text its loaded methods come from, that text's state, methods)


def _loaded_module(module):
    if module is not None:
        return module
    try:
        return importlib.import_module(MODULE)
    except ImportError as e:
        raise PatchError(f"cannot import {MODULE} ({e}); install sglang "
                         "(`pip install sglang==0.5.15.post1`)") from e


def _base_of(module, cls):
    """The text and state the loaded (not swapped) methods come from: the file on disk, or its
    transform if the file was patched in place after import."""
    if cls in _BASE:
        return _BASE[cls]
    path = Path(module.__file__)
    disk = path.read_bytes().decode()
    s = classify(disk)
    if s.state == "unknown":
        raise PatchError(f"{path} is in an unknown state ({'; '.join(s.reasons)})")
    loaded = (cls.__dict__[USW].__code__, cls.__dict__[CBF].__code__)
    for text, state in ((disk, s.state), (transform(disk, OTHER[s.state]), OTHER[s.state])):
        fns = _compile_methods(text, _Stubs(), str(path))
        if (fns[0].__code__, fns[1].__code__) == loaded:
            _BASE[cls] = (text, state, {USW: cls.__dict__[USW], CBF: cls.__dict__[CBF]})
            return _BASE[cls]
    raise PatchError(f"the loaded {CLASS} matches neither {path} nor its patched form (changed "
                     "since import?); restart Python and try again")


@contextlib.contextmanager
def _swapped(target, module=None):
    module = _loaded_module(module)
    cls = getattr(module, CLASS)
    saved = {n: cls.__dict__[n] for n in (USW, CBF)}
    base, base_state, originals = _base_of(module, cls)
    current = getattr(saved[USW], "__swa_repro_state__", base_state)
    if current != target and base_state == target:
        for n, fn in originals.items():
            setattr(cls, n, fn)
    elif current != target:
        text = transform(base, target)
        fname = f"<swa-repro {target} {module.__file__}>"
        linecache.cache[fname] = (len(text), None, text.splitlines(True), fname)
        for fn in _compile_methods(text, originals[USW].__globals__, fname):
            fn.__module__, fn.__qualname__ = module.__name__, f"{CLASS}.{fn.__name__}"
            fn.__swa_repro_state__ = target
            setattr(cls, fn.__name__, fn)
    try:
        yield cls
    finally:
        for n, fn in saved.items():
            setattr(cls, n, fn)


def patched(module=None):
    """``with patched():`` the loaded FlashInferIndicesUpdaterPrefill behaves fixed (PR #31501);
    the original methods come back on exit, also on error. Nesting is safe."""
    return _swapped("fixed", module)


def unpatched(module=None):
    """``with unpatched():`` it behaves like sglang <= 0.5.15.post1 (plan without window_left),
    also on releases that have the fix; restored on exit."""
    return _swapped("unfixed", module)


# ----------------------------------------------------------------------------- files


def installed_path() -> Path:
    """flashinfer_backend.py of the importable sglang, found without importing sglang."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("sglang is not installed in this Python "
                         f"({sys.executable}); install it (`pip install sglang==0.5.15.post1`) "
                         "or pass --source FILE")
    path = Path(list(spec.submodule_search_locations)[0]) / REL_PATH
    if not path.is_file():
        raise PatchError(f"{path} does not exist: this sglang has no FlashInfer backend file; "
                         "pass --source FILE")
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _backup_paths(path: Path):
    return (path.with_name(path.name + ".swa-repro.bak"),
            path.with_name(path.name + ".swa-repro.json"))


def _read_only_reason(path: Path):
    d = path.parent
    if os.statvfs(d).f_flag & os.ST_RDONLY:
        return f"{d} is on a read-only file system"
    for p in (d, path):
        if p.exists() and (not os.access(p, os.W_OK) or not os.stat(p).st_mode & 0o222):
            return f"{p} is read-only"
    return None


def _atomic_write(path: Path, data: bytes, like: Path | None = None):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if like is not None and like.exists():
            shutil.copymode(like, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def apply_in_place(path: Path, target="fixed") -> str:
    """Patch ``path`` in place to ``target`` with a backup; returns a one-line message."""
    data = path.read_bytes()
    text = data.decode()
    state = classify(text).state
    bak, meta = _backup_paths(path)
    info = json.loads(meta.read_text()) if meta.exists() else None
    if info and _sha(data) == info["patched_sha256"]:
        if state == target:
            return f"already {target} (patched by swa-repro; `swa-repro patch revert` restores it)"
        raise PatchError(f"{path} was patched to {info['patched_state']} by swa-repro; run "
                         "`swa-repro patch revert` first; nothing was changed")
    if info and _sha(data) != info["original_sha256"]:
        raise PatchError(f"{path} changed since swa-repro's backup {bak} (sha256 {_sha(data)[:12]} "
                         f"is neither the original {info['original_sha256'][:12]} nor the "
                         f"patched {info['patched_sha256'][:12]}); nothing was changed. If sglang "
                         f"was reinstalled, delete {bak} and {meta} and try again")
    if state == target:
        return f"already {target}; nothing written"
    new = transform(text, target).encode()  # refuses unknown
    why = _read_only_reason(path)
    if why:
        raise PatchError(f"{why}; nothing was changed. Write a patched copy with `--out FILE`, "
                         "or use swa_repro.sglang.patch.patched() in-process")
    _atomic_write(bak, data, like=path)
    if _sha(bak.read_bytes()) != _sha(data):
        raise PatchError(f"backup {bak} did not verify; nothing was changed")
    _atomic_write(meta, (json.dumps({
        "file": str(path), "original_sha256": _sha(data), "original_state": state,
        "patched_sha256": _sha(new), "patched_state": target,
        "tool": "swa-repro patch apply --in-place"}, indent=1) + "\n").encode(), like=path)
    _atomic_write(path, new, like=path)
    return f"patched {path} ({state} -> {target}); backup {bak}; `swa-repro patch revert` undoes it"


def revert_in_place(path: Path) -> str:
    """Restore the backed-up original bytes (checked by sha256) and drop the backup."""
    bak, meta = _backup_paths(path)
    if not meta.exists() or not bak.exists():
        raise PatchError(f"no swa-repro backup next to {path} ({bak.name}); nothing to revert")
    info = json.loads(meta.read_text())
    cur, orig = _sha(path.read_bytes()), bak.read_bytes()
    if _sha(orig) != info["original_sha256"]:
        raise PatchError(f"backup {bak} does not match its recorded sha256; nothing was changed")
    if cur == info["original_sha256"]:
        bak.unlink()
        meta.unlink()
        return f"{path} is already the original; removed the stale backup"
    if cur != info["patched_sha256"]:
        raise PatchError(f"{path} changed since swa-repro patched it (sha256 {cur[:12]}, "
                         f"expected {info['patched_sha256'][:12]}); nothing was changed. The "
                         f"original is kept in {bak}")
    why = _read_only_reason(path)
    if why:
        raise PatchError(f"{why}; nothing was changed")
    _atomic_write(path, orig, like=path)
    if _sha(path.read_bytes()) != info["original_sha256"]:
        raise PatchError(f"restored {path} does not verify; the original is still in {bak}")
    bak.unlink()
    meta.unlink()
    return f"restored {path} byte for byte (sha256 {info['original_sha256'][:12]})"


# ----------------------------------------------------------------------------- CLI


def register(sub):
    p = sub.add_parser("patch", help="classify / diff / patch / revert sglang's FlashInfer "
                       "backend for the sliding-window plan bug (PR #31501)",
                       description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("status", "diff", "apply", "revert"))
    p.add_argument("--source", type=Path, help="flashinfer_backend.py to read (default: the "
                   "installed sglang's)")
    p.add_argument("--out", type=Path, help="apply: write the patched file here")
    p.add_argument("--in-place", action="store_true", help="apply: patch the file itself, "
                   "with a backup (`revert` restores it)")
    p.add_argument("--reverse", action="store_true", help="diff/apply: fixed -> unfixed, to "
                   "show the bug on sglang >= 0.5.16")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.out and args.in_place:
        raise UsageError("choose one of --out FILE and --in-place")
    if (args.out or args.in_place) and args.action != "apply":
        raise UsageError("--out / --in-place go with `apply`")
    if args.reverse and args.action not in ("diff", "apply"):
        raise UsageError("--reverse goes with `diff` or `apply`")
    path = args.source if args.source else installed_path()
    if not path.is_file():
        raise UsageError(f"--source {path}: no such file")
    if args.action == "revert":
        print(revert_in_place(path))
        return 0
    text = path.read_bytes().decode()
    s = classify(text)
    if args.action == "status":
        if s.state == "unknown":
            print(f"swa-repro patch: {path}: " + "; ".join(s.reasons), file=sys.stderr)
        meta = _backup_paths(path)[1]
        if meta.exists() and json.loads(meta.read_text())["patched_sha256"] == _sha(text.encode()):
            print(f"swa-repro patch: {path} was patched in place by swa-repro "
                  "(`swa-repro patch revert` restores it)", file=sys.stderr)
        print(s.state)
        return 0
    target = "unfixed" if args.reverse else "fixed"
    if args.in_place:
        print(apply_in_place(path, target))
        return 0
    new = transform(text, target)  # refuses unknown
    if new == text:
        print(f"swa-repro patch: {path} is already {target}; nothing to do", file=sys.stderr)
        return 0
    diff = unified_diff(text, new, str(path).lstrip("/"))
    if args.action == "diff":
        sys.stdout.write(diff)
        return 0
    if args.out is None:
        sys.stdout.write(diff)
        raise UsageError("nothing written: choose `--out FILE` (a patched copy) or `--in-place` "
                         "(patch the file, with a backup)")
    if args.out.resolve() == path.resolve():
        raise UsageError("--out is the source file itself; use --in-place (it keeps a backup)")
    if not args.out.parent.is_dir():
        raise UsageError(f"--out {args.out}: directory {args.out.parent} does not exist")
    _atomic_write(args.out, new.encode(), like=path)
    print(f"wrote {args.out} ({s.state} -> {target}); {path} unchanged")
    return 0
