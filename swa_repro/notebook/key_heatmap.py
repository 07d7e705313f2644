"""The keys heatmap of a family audit at its real window, drawn from ranges (never a dense mask).

An audit record's ``rows`` (``sglang.audit.rows``: per query position, the key positions it
intends and the ones the calls let it see, as ranges) become rectangles per category
(:func:`boxes`): a row's ranges split by interval arithmetic into attended-and-intended, attended
outside the window (extra), intended-not-attended (missing); consecutive rows with equal ranges
are one taller rectangle. :func:`figure` draws them as one compound path per category.
"""

from __future__ import annotations

from swa_repro.sglang.audit.rows import decode, merge

CATEGORIES = {"ok": ("attended, inside the window", "#9db8d9"),
              "extra": ("attended, OUTSIDE the window", "#d62728"),
              "missing": ("in the window, NOT attended", "#ff7f0e"),
              "undefined": ("undefined row (no masked softmax)", "#7f7f7f")}


def intersect(a, b) -> list[list[int]]:
    """Two merged range lists -> their intersection (merged)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append([lo, hi])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a, b) -> list[list[int]]:
    """Merged ``a`` minus merged ``b`` (merged)."""
    out = []
    for lo, hi in a:
        cur = lo
        for blo, bhi in b:
            if bhi < cur or blo > hi:
                continue
            if blo > cur:
                out.append([cur, blo - 1])
            cur = max(cur, bhi + 1)
        if cur <= hi:
            out.append([cur, hi])
    return out


def row_categories(want, seen) -> dict[str, list[list[int]]]:
    """One query's key ranges per category."""
    w, s = merge(want), merge(seen)
    return {"ok": intersect(s, w), "extra": subtract(s, w), "missing": subtract(w, s)}


def boxes(lines, undefined=(), width: int | None = None) -> dict[str, list[tuple[int, int, int, int]]]:
    """``lines`` ``[(position, want, seen), ...]`` -> per category, rectangles ``(x, w, y, h)``
    covering cells ``[x, x + w) x [y, y + h)`` (key position x, query position y); an undefined
    row is one rectangle over ``width`` keys (default: the widest key seen)."""
    out: dict[str, list] = {k: [] for k in CATEGORIES}
    open_: dict[tuple, list] = {}  # (category, lo, hi) -> the rectangle that the previous row extended
    prev_q = None
    for q, want, seen in sorted(lines, key=lambda t: t[0]):
        cats = row_categories(want, seen)
        now = {}
        for cat, ranges in cats.items():
            for lo, hi in ranges:
                box = open_.get((cat, lo, hi)) if prev_q == q - 1 else None
                if box is None:
                    box = [lo, hi - lo + 1, q, 0]
                    out[cat].append(box)
                box[3] += 1
                now[(cat, lo, hi)] = box
        open_, prev_q = now, q
    right = width if width is not None else max((b[0] + b[1] for v in out.values() for b in v), default=1)
    for lo, hi in merge(undefined):
        out["undefined"].append([0, right, lo, hi - lo + 1])
    return {k: [tuple(b) for b in v] for k, v in out.items()}


def rows_of(record: dict) -> tuple[list, list]:
    """An audit record's rows: ``(lines, undefined ranges)``."""
    rw = record.get("rows") or {}
    return decode(rw.get("runs", [])), rw.get("undefined", [])


def zoom(bx: dict, pad: int = 64):
    """``(x0, x1, y0, y1)`` around every rectangle that is not ``ok`` (padded), or None: all exact."""
    odd = [b for k, v in bx.items() if k != "ok" for b in v]
    if not odd:
        return None
    return (max(min(b[0] for b in odd) - pad, 0), max(b[0] + b[1] for b in odd) + pad,
            max(min(b[2] for b in odd) - pad, 0), max(b[2] + b[3] for b in odd))


def rectangles_path(rects):
    """``[(x, w, y, h), ...]`` -> one compound ``Path`` of closed rectangles (one patch per
    category: thousands of rows draw in milliseconds)."""
    import numpy as np
    from matplotlib.path import Path

    r = np.asarray(rects, float)
    x, w, y, h = r.T
    verts = np.stack([np.stack([x, y], 1), np.stack([x + w, y], 1), np.stack([x + w, y + h], 1),
                      np.stack([x, y + h], 1), np.stack([x, y], 1)], 1).reshape(-1, 2)
    codes = np.tile([Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY], len(r))
    return Path(verts, codes)


def figure(panels, title: str, zoomed: bool = False):
    """``panels``: ``[[(subtitle, record or None), ...] per figure row]`` -> a figure ~1150 px wide:
    per panel the query position (down) against the key position (right), every category drawn
    from :func:`boxes`; ``zoomed``: each panel shows only where a query sees keys outside its
    window or misses some (:func:`zoom`). A ``Figure``, not pyplot's: the inline backend showed a
    pyplot figure again after ``plots.publish`` showed its PNG (issue #42: every heatmap twice)."""
    from matplotlib.collections import PathCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from swa_repro.notebook.plots import LARGE, MEDIUM, NOTEBOOK_WIDTH_IN, SMALL, wrap

    nr, nc = len(panels), max(len(r) for r in panels)
    fig = Figure(figsize=(NOTEBOOK_WIDTH_IN, 3.4 * nr + 0.8), layout="constrained")
    axes = fig.subplots(nr, nc, squeeze=False)
    for i, row in enumerate(panels):
        for j in range(nc):
            ax = axes[i][j]
            if j >= len(row) or row[j][1] is None or not (row[j][1].get("rows") or {}).get("runs"):
                ax.set_axis_off()
                if j < len(row):
                    ax.text(0.5, 0.5, wrap(f"{row[j][0]}\nnot driven", 34), ha="center", va="center",
                            fontsize=SMALL, transform=ax.transAxes)
                continue
            sub, rec = row[j]
            lines, undefined = rows_of(rec)
            bx = boxes(lines, undefined)
            for cat, (_, color) in CATEGORIES.items():
                if bx[cat]:
                    ax.add_collection(PathCollection([rectangles_path(bx[cat])], facecolors=color, edgecolors="none",
                                                     linewidths=0, antialiaseds=False), autolim=False)
            xs = [b[0] + b[1] for v in bx.values() for b in v] or [1]
            ys = [b[2] for v in bx.values() for b in v] + [b[2] + b[3] for v in bx.values() for b in v]
            x0, x1, y0, y1 = (zoom(bx) if zoomed else None) or (0, max(xs), min(ys), max(ys))
            ax.set_xlim(x0, x1)
            ax.set_ylim(y1, y0)  # the first query at the top, as a mask is drawn
            ax.set_title(wrap(f"{sub}: {rec['verdict']}"), fontsize=MEDIUM)
            ax.set_xlabel("key position", fontsize=MEDIUM)
            ax.set_ylabel("query position", fontsize=MEDIUM)
            ax.tick_params(labelsize=SMALL)
    fig.legend(handles=[Patch(color=c, label=t) for t, c in CATEGORIES.values()], loc="outside lower center",
               ncol=4, fontsize=SMALL, frameon=False)
    fig.suptitle(wrap(title, 110), fontsize=LARGE)
    return fig


PATHS = ("extend_paged", "extend_ragged_no_prefix", "extend_ragged_prefix")  # the prefill paths, one request each


def panels_of(f: dict, paths=PATHS) -> list[list[tuple[str, dict | None]]]:
    """A family's audit -> one figure row per layer kind it has, one panel per prefill path."""
    rec = {(r["kind"], r["path"]): r for r in f.get("paths", []) if r.get("status") == "driven"}
    return [[(f"{kind} layer, {p}", rec.get((kind, p))) for p in paths] for kind in f.get("kinds", {})]


def agrees(record: dict) -> bool:
    """The drawn rows say what the audit's counts say: extra rectangles iff the longest request
    has a query seeing keys outside its window, missing ones iff it misses some."""
    bx = boxes(*rows_of(record))
    counts = record["keys"][record["rows"]["stage"]]
    return bool(bx["extra"]) <= (counts["queries_with_extra"] > 0) and bool(bx["missing"]) <= (counts["missing_keys"] > 0)
