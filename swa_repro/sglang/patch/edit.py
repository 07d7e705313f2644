"""Minimal line edits at ast locations: unfixed <-> fixed, everything else byte for byte.

:func:`transform` checks its own work (the result parses, classifies as the target, and an
unfixed -> fixed edit reverses to the original bytes) before anyone writes it.
"""

from __future__ import annotations

import ast
import re
import types

from swa_repro.engine.patching import PatchError
from swa_repro.sglang.patch.classify import (CBF, USW, call_keyword, classify, names_in, params_of,
                                             splat_window_if)

_COMMENT = "# PR #31501: plan the paged-only SWA wrapper with its window, so FlashInfer"
_COMMENT2 = "# compiles the left-window mask in (ragged / spec-verify keep their own masks)"
_PLAN_COMMENT = "# window_left >= 0 makes plan() pick the module with the window mask compiled in"


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
    usw_params = {p.arg for p in params_of(s.usw)}
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
                         if n not in names_in(s.cbf))
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
    kw = call_keyword(s.usw_call, "window_left")
    items = s.usw_call.args + [k.value for k in s.usw_call.keywords if k is not kw]
    cuts.append(_kw_lines(t, kw, items, s.usw_call.lineno))
    # 2. the window_left parameter
    items = _cbf_items(s.cbf)
    p = next(i for i in items if i.arg == "window_left")
    cuts.append(_whole_lines(t, *_span(t, p), _prev_end(items, p, s.cbf.lineno),
                             f"the {CBF} signature"))
    # 3. the plan plumbing: a direct keyword, or the `if window_left >= 0:` block (+ own dict)
    direct = call_keyword(s.plan_call, "window_left")
    others = s.plan_call.args + [k.value for k in s.plan_call.keywords if k is not direct]
    if direct is not None:
        cuts.append(_kw_lines(t, direct, others, s.plan_call.lineno))
    else:
        node, name = splat_window_if(s.cbf, s.plan_call)
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
