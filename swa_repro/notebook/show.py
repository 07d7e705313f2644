"""The one place display labels are applied: typed rows in, a plain fixed-width text table out.

Library functions return frozen dataclass rows (``Row`` subclasses) that code indexes by
attribute; each field says how it is shown through :func:`col` (its column label, a formatter,
whether an absent value drops the column). :func:`table` / :func:`show` also take plain dicts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields



def col(label: str | None, default=None, *, fmt=None, optional: bool = False, expand: str | None = None,
        **kw):
    """A shown field. ``label`` may name other fields (``"err ({mode})"``); ``None`` hides the field;
    ``optional``: no column when the value is None; ``expand``: a dict field shown as one column per
    key, labelled ``expand.format(key=...)``; ``fmt``: value -> what is shown."""
    meta = {"label": label, "fmt": fmt, "optional": optional, "expand": expand}
    if "default_factory" in kw:
        return field(default_factory=kw["default_factory"], metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Row:
    """Base of every typed row: :meth:`cells` is its display form, used only by :func:`table`."""

    def cells(self) -> dict:
        names = {f.name: getattr(self, f.name) for f in fields(self)}
        out = {}
        for f in fields(self):
            m, v = f.metadata, names[f.name]
            if not m or m.get("label") is None or (m.get("optional") and v is None):
                continue
            if m.get("expand"):
                out.update({m["expand"].format(key=k): x for k, x in (v or {}).items()})
                continue
            out[m["label"].format(**names)] = m["fmt"](v) if m.get("fmt") else v
        return out


def table(rows, cols: list[str] | None = None, max_width: int = 60) -> str:
    """Plain fixed-width text table of typed rows or dicts; columns in order of first appearance."""
    rows = [r.cells() if isinstance(r, Row) else r for r in rows]
    if not rows:
        return "(no rows)"
    cols = cols or list(dict.fromkeys(k for r in rows for k in r))
    cell = lambda v: fmt(v)[:max_width]  # noqa: E731
    w = {c: max(len(c), *(len(cell(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(w[c]) for c in cols), "  ".join("-" * w[c] for c in cols)]
    lines += ["  ".join(cell(r.get(c, "")).ljust(w[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def show(rows, cols=None, max_width: int = 60) -> None:
    print(table(rows, cols, max_width))


def fmt(v) -> str:
    """A cell as text: floats to 3 significant digits, sequences comma-joined, None empty."""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return ",".join(fmt(x) for x in v)
    return "" if v is None else str(v)


# pandas in a notebook (issue #42): every row up to MAX_ROWS (its default showed 10 of 68 and "..."),
# every column, whole cells (it cut them at 50 characters). A table fits the page (one of 15
# snake_case columns was 1838 px at 1400, measured in Chromium): a header may break after an
# underscore, a cell of LONG_CELL characters or more anywhere (with a 10em floor), a shorter one never.
MAX_ROWS = 500
LONG_CELL = 24
_HEADER = re.compile(r"(<th[^>]*>)([^<]*)(</th>)")
_LONG_TD = re.compile(rf"<td>([^<]{{{LONG_CELL},}})</td>")


def html_table(df) -> str | None:
    """``df``'s own HTML (pandas' display options) with its headers breakable after each underscore
    (``<wbr>``) and each long cell breakable anywhere; what a notebook shows for a DataFrame."""
    html = df._repr_html_()
    if html is None:
        return None
    head, sep, body = html.partition("</thead>")
    head = _HEADER.sub(lambda m: m[1] + m[2].replace("_", "_<wbr>") + m[3], head)
    return head + sep + _LONG_TD.sub(r'<td style="overflow-wrap: anywhere; min-width: 10em">\1</td>', body)


def notebook_display() -> None:
    """pandas shows :data:`MAX_ROWS` rows and whole cells; in IPython a DataFrame is shown through
    :func:`html_table` (every notebook's first cell: ``runner.announce_mode``)."""
    import pandas as pd

    for option, value in (("display.max_rows", MAX_ROWS), ("display.max_columns", None),
                          ("display.max_colwidth", None)):
        pd.set_option(option, value)
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None:
        ip.display_formatter.formatters["text/html"].for_type(pd.DataFrame, html_table)


def excerpt(src: str, marker: str, last: bool = False, more: int = 0) -> str:
    """The statement of ``src`` that starts on the line holding ``marker`` (the first such line, or
    the ``last``), up to where its brackets close, and ``more`` lines after; with a line saying how
    much of ``src`` that is. Notebooks show the lines a point is about, not a whole method."""
    lines = src.splitlines()
    hits = [i for i, ln in enumerate(lines) if marker in ln]
    if not hits:
        return f"({marker!r} is not in this source)"
    i = hits[-1] if last else hits[0]
    j, depth = i, 0
    while j < len(lines):
        depth += sum(lines[j].count(c) for c in "([{") - sum(lines[j].count(c) for c in ")]}")
        if depth <= 0:
            break
        j += 1
    j = min(len(lines) - 1, j + more)
    return "\n".join([f"# lines {i + 1}-{j + 1} of {len(lines)}", *lines[i:j + 1]])
