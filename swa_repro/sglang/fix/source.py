"""Source text with ast positions, and the few minimal edits the fixes make at them.

Every edit is an insertion or a replacement at an ast node's span, so everything the fixes do not
touch stays byte for byte (``patch.edit`` works the same way for PR #31501). Inserted lines take the
indentation of the statement they sit next to; a keyword added to a call spread one argument per
line goes on its own line, as the file writes it (black style).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from swa_repro.sglang.patch.classify import parse


@dataclass(frozen=True)
class Edit:
    start: int  # str offsets into the text
    end: int
    new: str


class Source:
    """``text`` parsed once; ast (line, utf-8 column) -> str offsets; node lookups."""

    def __init__(self, text: str):
        self.text = text
        self.tree = parse(text)  # memoized and shared: nothing here modifies it
        self.lines = text.splitlines(keepends=True)
        self.nl = "\r\n" if self.lines and self.lines[0].endswith("\r\n") else "\n"
        self.starts = [0]
        for ln in self.lines:
            self.starts.append(self.starts[-1] + len(ln))

    # ------------------------------------------------------------------ positions
    def off(self, lineno: int, col: int) -> int:
        return self.starts[lineno - 1] + len(self.lines[lineno - 1].encode()[:col].decode())

    def span(self, node) -> tuple[int, int]:
        return self.off(node.lineno, node.col_offset), self.off(node.end_lineno, node.end_col_offset)

    def seg(self, node) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def indent_of(self, node) -> str:
        line = self.lines[node.lineno - 1]
        return line[:len(line) - len(line.lstrip())]

    # ------------------------------------------------------------------ lookups
    def cls(self, name: str):
        return next((n for n in self.tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)

    def func(self, name: str):
        return next((n for n in self.tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)

    def method(self, cls: str, name: str):
        c = self.cls(cls)
        return None if c is None else next(
            (n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == name), None)

    # ------------------------------------------------------------------ edits
    def insert_lines_after(self, stmt, lines: list[str], indent: str | None = None) -> Edit:
        """``lines`` after ``stmt`` (a whole statement), at its indentation (or ``indent``)."""
        ind = self.indent_of(stmt) if indent is None else indent
        at = self.starts[stmt.end_lineno]  # start of the line after the statement's last line
        return Edit(at, at, "".join(f"{ind}{ln}{self.nl}" if ln else self.nl for ln in lines))

    def insert_lines_before(self, stmt, lines: list[str], indent: str | None = None) -> Edit:
        ind = self.indent_of(stmt) if indent is None else indent
        at = self.starts[stmt.lineno - 1]
        return Edit(at, at, "".join(f"{ind}{ln}{self.nl}" if ln else self.nl for ln in lines))

    def replace(self, node, new: str) -> Edit:
        a, b = self.span(node)
        return Edit(a, b, new)

    def add_keyword(self, call: ast.Call, kw: str) -> Edit:
        """``kw`` (``name=expr``) into ``call``: before a ``**splat`` if there is one, else last."""
        splat = next((k for k in call.keywords if k.arg is None), None)
        items = list(call.args) + [k for k in call.keywords if k.arg is not None]
        multiline = call.end_lineno > call.lineno and items and items[-1].lineno != call.lineno
        if splat is not None:
            a, _ = self.span(splat)
            if multiline:
                line_start = self.starts[splat.lineno - 1]
                return Edit(line_start, line_start, f"{self.indent_of(splat)}{kw},{self.nl}")
            return Edit(a, a, f"{kw}, ")
        if not items:
            _, b = self.span(call)
            return Edit(b - 1, b - 1, kw)
        last = items[-1]
        _, b = self.span(last)
        if multiline:
            rest = self.text[b:self.starts[last.end_lineno]]  # "," and comment after the last item
            if rest.lstrip().startswith(","):
                at = self.starts[last.end_lineno]
                return Edit(at, at, f"{self.indent_of(last)}{kw},{self.nl}")
            return Edit(b, b, f",{self.nl}{self.indent_of(last)}{kw}")
        return Edit(b, b, f", {kw}")

    def add_parameter(self, fn: ast.FunctionDef, param: str) -> Edit:
        """``param`` (``name: T = default``) after the last positional-or-keyword parameter, so
        keyword-only ones (after ``*``) stay where they are; one per line as the file writes them."""
        last = fn.args.args[-1]
        defaults = fn.args.defaults
        end_node = defaults[-1] if defaults and defaults[-1].end_lineno >= last.end_lineno else last
        _, b = self.span(end_node)
        if fn.lineno != last.lineno:  # one parameter per line
            at = self.starts[end_node.end_lineno]
            if self.text[b:at].lstrip().startswith(","):
                return Edit(at, at, f"{self.indent_of(last)}{param},{self.nl}")
            return Edit(b, b, f",{self.nl}{self.indent_of(last)}{param}")
        return Edit(b, b, f", {param}")


def apply_edits(text: str, edits: list[Edit]) -> str:
    """Edits at distinct places, applied back to front (same-offset insertions keep their order)."""
    out = text
    for e in sorted(enumerate(edits), key=lambda ie: (ie[1].start, ie[0]), reverse=True):
        e = e[1]
        out = out[:e.start] + e.new + out[e.end:]
    return out


def calls_on(node, receiver: str, methods=("begin_forward", "plan")) -> list[ast.Call]:
    """``<receiver>.<method>(...)`` calls under ``node`` (``receiver`` a plain name or ``self.x``)."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in methods:
            if ast.unparse(n.func.value) == receiver:
                out.append(n)
    return sorted(out, key=lambda c: (c.lineno, c.col_offset))


def keyword(call: ast.Call, name: str):
    return next((k for k in call.keywords if k.arg == name), None)

