"""Heatmaps of one case: intended mask, effective mask, difference, per-CTA ``kv_start``, tile map.

Large cases are reduced by blocks before drawing, never averaged: a reduced mask cell says "no /
some / every key in the block visible", a difference cell "any extra key" / "any missing key"
(max-pooling of the boolean difference), a tile-map cell the most severe state in its block. So a
single leaked key in a 32k x 32k mask still shows. Masks are handled as per-row intervals
(``lo, hi`` inclusive, the ``RequestModel`` / ``ProbeResult`` layout), so a 32k-token case never
materialises a dense ``(qo, kv)`` array. Figures are ``matplotlib.figure.Figure`` objects: no
pyplot state, safe under Agg and headless papermill.
"""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import PercentFormatter

from swa_repro.kernel.model import ModelResult, RequestModel
from swa_repro.core.intervals import ceil_div, intended_bounds

MAX_CELLS = 256  # per axis, after reduction
PLOT_CELLS = 128  # per axis in plot_case: >= 2 pixels a cell at FIGURE_DPI, so none is lost
# Saved figures (runner.save_figure): a plot_case figure is NOTEBOOK_WIDTH_IN (~1100 px) wide, shown
# 1:1 in a notebook, 7-pt labels ~10 px. Its heatmap axes are ~3 in, so 128 cells get >= 2 px each
# (tests/test_plots.py measures it); below ~88 dpi a cell could fall between pixels.
FIGURE_DPI = 100
NOTEBOOK_WIDTH_IN = 11.5  # a notebook's output area is ~1100-1150 px wide: figures this wide show 1:1 at FIGURE_DPI
LABEL_EVERY_CELL = 32  # below this many cells per axis every cell gets a tick label
# The figures' one text style (issue #42: 7-8 pt ticks and legends were 9-10 px at 1400 px): shown 1:1
# at FIGURE_DPI, a point is 100/72 px. SMALL (12.5 px): ticks, legends, cell labels; MEDIUM: axis
# labels, panel titles; LARGE: a figure's title. tests/test_figure_style.py: >= MIN_TEXT_PX, inside.
MIN_TEXT_PX = 12
SMALL, MEDIUM, LARGE = 9, 10, 12
PANEL_CHARS = 40  # a MEDIUM title's line over one of plot_case's three panels a row (~3.3 in)

MASK_STATES = ("not visible", "some keys in block visible", "visible")
MASK_COLORS = ("#ffffff", "#9ecae1", "#08519c")
DIFF_STATES = ("not visible (agrees)", "visible (agrees)", "extra key (attended, outside window)",
               "missing key (inside window, not attended)", "extra and missing in block")
DIFF_COLORS = ("#ffffff", "#d9d9d9", "#d62728", "#1f77b4", "#9467bd")
TILE_STATES = ("skipped", "computed, element mask applied", "computed, no element mask")
TILE_COLORS = ("#ffffff", "#a1d99b", "#fd8d3c")


# ----------------------------------------------------------------------------- reductions
def block_size(n: int, max_cells: int = MAX_CELLS) -> int:
    """Smallest block edge that fits ``n`` cells into ``max_cells``."""
    return max(1, ceil_div(n, max_cells))


def maxpool(a: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """Max over ``block`` = (rows, cols) tiles of a 2-D array (bool -> "any"); edges padded with the
    array's minimum so padding never adds anything."""
    br, bc = block
    r, c = a.shape
    nr, nc = ceil_div(r, br), ceil_div(c, bc)
    fill = False if a.dtype == bool else a.min(initial=0)
    p = np.full((nr * br, nc * bc), fill, dtype=a.dtype)
    p[:r, :c] = a
    return p.reshape(nr, br, nc, bc).max(axis=(1, 3))


def reduce_bool(a: np.ndarray, max_cells: int = MAX_CELLS) -> np.ndarray:
    """A 2-D bool array reduced to at most ``max_cells`` per axis: a cell is True iff any element of
    its block is (so a single True survives any reduction)."""
    return maxpool(np.asarray(a, bool), (block_size(a.shape[0], max_cells), block_size(a.shape[1], max_cells)))


def intervals_any(lo, hi, n_cols: int, block: tuple[int, int]) -> np.ndarray:
    """Reduced "any key" map of row intervals without a dense array.

    ``lo, hi`` are ``(rows,)`` or ``(rows, k)`` (k intervals per row, inclusive, empty when
    ``lo < 0`` or ``lo > hi``: ``core.intervals.bounds_to_mask``'s rule). Returns bool ``(ceil(rows/br), ceil(n_cols/bc))``: a cell is True iff
    some interval of some row in its row block touches its column block. O(rows * k)."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    lo, hi = (lo[:, None], hi[:, None]) if lo.ndim == 1 else (lo, hi)
    br, bc = block
    rows = lo.shape[0]
    nr, nc = ceil_div(rows, br), ceil_div(n_cols, bc)
    rb = np.broadcast_to((np.arange(rows) // br)[:, None], lo.shape)
    lo_c, hi_c = np.clip(lo, 0, n_cols - 1), np.clip(hi, 0, n_cols - 1)
    ok = (lo >= 0) & (lo <= hi) & (lo < n_cols)
    diff = np.zeros((nr, nc + 1), np.int64)  # difference array over column blocks
    np.add.at(diff, (rb[ok], lo_c[ok] // bc), 1)
    np.add.at(diff, (rb[ok], hi_c[ok] // bc + 1), -1)
    return np.cumsum(diff, axis=1)[:, :nc] > 0


def intervals_all(lo, hi, n_cols: int, block: tuple[int, int]) -> np.ndarray:
    """Reduced "every key visible" map of one interval per row: True iff every row of the row
    block covers its whole column block (the last, partial column block counts up to ``n_cols``)."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    br, bc = block
    rows = lo.shape[0]
    nr, nc = ceil_div(rows, br), ceil_div(n_cols, bc)
    hi_pad = np.where(hi >= n_cols - 1, nc * bc - 1, hi)  # reaching the last key covers the padding
    first = ceil_div(np.maximum(lo, 0), bc)  # first fully covered column block
    last = (hi_pad + 1) // bc - 1
    ok = (lo >= 0) & (lo <= hi) & (first <= last)
    rb = np.arange(rows) // br
    diff = np.zeros((nr, nc + 1), np.int64)
    np.add.at(diff, (rb[ok], first[ok]), 1)
    np.add.at(diff, (rb[ok], last[ok] + 1), -1)
    full = np.cumsum(diff, axis=1)[:, :nc]
    rows_in_block = np.minimum(br, rows - np.arange(nr) * br)[:, None]
    return full == rows_in_block


def reduce_mask(lo, hi, n_cols: int, block) -> np.ndarray:
    """int8 map: 0 nothing visible, 1 some keys of the block visible, 2 every key visible."""
    return intervals_any(lo, hi, n_cols, block).astype(np.int8) + intervals_all(lo, hi, n_cols, block)


def difference_intervals(lo, hi, ilo, ihi):
    """Extra and missing keys of effective per-head intervals ``lo, hi (qo, heads)`` against the
    intended ``ilo, ihi (qo,)``, as ``(qo, 2)`` interval pairs: extra = keys some head attends that
    the window excludes; missing = window keys some head does not attend."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    lo, hi = (lo[:, None], hi[:, None]) if lo.ndim == 1 else (lo, hi)
    empty = (lo > hi) | (hi < 0)
    big = np.iinfo(np.int64).max // 4
    a, b = np.where(empty, big, lo).min(1), np.where(empty, -1, hi).max(1)  # union (heads overlap)
    A, B = np.where(empty, big, lo).max(1), np.where(empty, -1, hi).min(1)  # intersection
    A = np.where(empty.any(1), big, A)  # a head that sees nothing misses the whole window
    extra_lo = np.stack([a, np.maximum(a, ihi + 1)], 1)
    extra_hi = np.stack([np.minimum(b, ilo - 1), b], 1)
    miss_lo = np.stack([ilo, np.maximum(ilo, B + 1)], 1)
    miss_hi = np.stack([np.minimum(ihi, A - 1), ihi], 1)
    return (extra_lo, extra_hi), (miss_lo, miss_hi)


def reduce_difference(lo, hi, ilo, ihi, n_cols: int, block) -> np.ndarray:
    """int8 map with ``DIFF_STATES``: extra / missing / both outrank agreement, so a single extra
    or missing key colours its block."""
    (elo, ehi), (mlo, mhi) = difference_intervals(lo, hi, ilo, ihi)
    extra = intervals_any(elo, ehi, n_cols, block)
    miss = intervals_any(mlo, mhi, n_cols, block)
    seen = intervals_any(ilo, ihi, n_cols, block)
    out = seen.astype(np.int8)
    out[extra] = 2
    out[miss] = 3
    out[extra & miss] = 4
    return out


def request_difference(req: RequestModel, window_left: int, max_cells: int = MAX_CELLS):
    """``(reduced difference map, block)`` of one modelled request against its intended window."""
    block = (block_size(req.extend_len, max_cells), block_size(req.kv_len, max_cells))
    ilo, ihi = intended_bounds(req.prefix_len, req.extend_len, window_left)
    return reduce_difference(req.intervals.lo, req.intervals.hi, ilo, ihi, req.kv_len, block), block


def reduce_tiles(tiles: np.ndarray, max_cols: int = MAX_CELLS, max_rows: int | None = None) -> tuple[np.ndarray, int]:
    """Tile map ``(q_tiles, kv)`` reduced along keys (and along q tiles when ``max_rows`` is given)
    by the most severe state (0 < 1 < 2). Returns ``(map, key block)``; the q-tile block is
    ``block_size(q_tiles, max_rows)``."""
    bc = block_size(tiles.shape[1], max_cols)
    br = 1 if max_rows is None else block_size(tiles.shape[0], max_rows)
    return maxpool(tiles.astype(np.int8), (br, bc)), bc


def row_kv_start(req: RequestModel, cta_tile_q: int, group: int, head: int = 0) -> np.ndarray:
    """``(qo,)`` kv_start of the CTA holding each query row of head-in-group ``head``: the row's
    packed index is ``q*group + head`` and its tile ``packed // CTA_TILE_Q`` (prefill.cuh:2441)."""
    q = np.arange(req.extend_len)
    return np.asarray(req.kv_start)[(q * group + head) // cta_tile_q]


# ----------------------------------------------------------------------------- evidence rows
def probe_flags(req) -> list[str]:
    """What the real kernel did that no mask explains (a ``ProbeRequest``, probed or recorded):
    NaN, run-to-run differences, holes."""
    flags = (("NaN", np.asarray(req.nan).any()), ("differs run to run", not np.asarray(req.repeat_equal).all()),
             ("not contiguous", not np.asarray(req.contiguous).all()))
    return [w for w, f in flags if f]


def evidence_label(rec) -> str:
    prov = getattr(rec, "provenance", None)
    if prov:  # a committed Recording: its GPU and the flashinfer version it ran
        return f"recording ({prov.get('gpu', '?')}, flashinfer {rec.case.flashinfer_version})"
    return f"live probe ({getattr(rec, 'source', 'this GPU')})"


# ----------------------------------------------------------------------------- drawing
def wrap(text: str, width: int = PANEL_CHARS) -> str:
    """Each line of ``text`` wrapped to ``width`` characters, so a panel's title or note stays over
    its panel (issue #42: 17 of 02's figures had a recording's title cut at the figure's edge)."""
    return "\n".join(textwrap.fill(line, width) or line for line in text.split("\n"))


def _cmap(colors):
    return ListedColormap(colors), BoundaryNorm(np.arange(len(colors) + 1) - 0.5, len(colors))


def _show(ax, img, colors, n_rows, n_cols, block, xlabel="key position", ylabel="query row"):
    """Draw a reduced map in original coordinates so overlays and ticks stay in tokens."""
    cmap, norm = _cmap(colors)
    br, bc = block
    ext = (-0.5, img.shape[1] * bc - 0.5, img.shape[0] * br - 0.5, -0.5)
    ax.imshow(img, cmap=cmap, norm=norm, extent=ext, interpolation="nearest", aspect="auto")
    ax.set_xlim(-0.5, n_cols - 0.5)
    ax.set_ylim(n_rows - 0.5, -0.5)
    for axis, n, b in ((ax.xaxis, n_cols, bc), (ax.yaxis, n_rows, br)):
        if b == 1 and n <= LABEL_EVERY_CELL:
            axis.set_ticks(range(n))
            axis.set_tick_params(labelsize=SMALL)
        else:
            axis.get_major_locator().set_params(integer=True)
    if block == (1, 1) and max(n_rows, n_cols) <= LABEL_EVERY_CELL:  # cell borders, one artist each way
        ax.hlines(np.arange(n_rows + 1) - 0.5, -0.5, n_cols - 0.5, color="#bdbdbd", lw=0.4)
        ax.vlines(np.arange(n_cols + 1) - 0.5, -0.5, n_rows - 0.5, color="#bdbdbd", lw=0.4)
    note = "" if block == (1, 1) else f"\n1 cell = {br}x{bc} (max-pooled)"
    ax.set_xlabel(xlabel + note, fontsize=MEDIUM)
    ax.set_ylabel(ylabel, fontsize=MEDIUM)


def _kv_start_line(ax, ks: np.ndarray, **kw):
    """Step line at the left edge of each row's first loaded key."""
    r = np.arange(len(ks))
    x = np.repeat(ks - 0.5, 2)
    y = np.stack([r - 0.5, r + 0.5], 1).ravel()
    ax.plot(x, y, clip_on=False, zorder=5, **kw)


def _legend(ax, colors, names, used=None):
    used = range(len(colors)) if used is None else sorted(set(np.unique(used).tolist()))
    ax.legend(handles=[Patch(facecolor=colors[k], edgecolor="#636363", label=names[k]) for k in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), fontsize=SMALL, frameon=False, ncol=1)


def _text_panel(ax, text):
    ax.text(0.5, 0.5, wrap(text, 34), ha="center", va="center", fontsize=SMALL, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_case(case, model_result: ModelResult, recording=None, *, requests=None, max_cells: int = PLOT_CELLS,
              title: str | None = None) -> Figure:
    """One row per request: intended / effective (model) with per-CTA kv_start / effective
    (recording or live probe) / difference / tile map. The difference panel compares the
    recording to the intended mask when there is one, else the model."""
    reqs = list(range(case.batch_size)) if requests is None else list(requests)
    res = model_result
    plan = res.plan
    # Readable at a notebook's width (~1100 px): 11 in at FIGURE_DPI, each request's five panels on
    # two rows of three (the sixth removed), text 7-11 pt = 10-15 px shown 1:1 (was 22 in, one row:
    # shown at half size, 5-6 px text).
    fig = Figure(figsize=(NOTEBOOK_WIDTH_IN, 7.6 * len(reqs) + 1.0), layout="constrained")
    grid = fig.subplots(2 * len(reqs), 3, squeeze=False)
    axes = []
    for k in range(len(reqs)):
        fig.delaxes(grid[2 * k + 1, 2])
        axes.append([*grid[2 * k], *grid[2 * k + 1, :2]])
    for row, i in zip(axes, reqs):
        r = res.requests[i]
        qo, kv, g = r.extend_len, r.kv_len, case.group_size
        block = (block_size(qo, max_cells), block_size(kv, max_cells))
        ilo, ihi = intended_bounds(r.prefix_len, r.extend_len, case.window_left)
        head_tag = f" (union over {g} heads of a group)" if g > 1 else ""
        lbl = f"req {i}: prefix {r.prefix_len}, extend {qo}"

        _show(row[0], reduce_mask(ilo, ihi, kv, block), MASK_COLORS, qo, kv, block)
        row[0].set_title(wrap(f"{lbl}\nintended (window_left={case.window_left})"), fontsize=MEDIUM)
        _legend(row[0], MASK_COLORS, MASK_STATES, [0, 2] if block == (1, 1) else None)

        ulo, uhi = r.intervals.lo.min(1), r.intervals.hi.max(1)  # union over heads-in-group
        _show(row[1], reduce_mask(ulo, uhi, kv, block), MASK_COLORS, qo, kv, block)
        row[1].set_title(wrap(f"effective, model{head_tag}\nstatus {r.status}"), fontsize=MEDIUM)
        if plan is not None and len(r.kv_start):
            ks = r.kv_start.tolist()
            vals = f": {ks}" if len(ks) <= 6 else f": {ks[:3]} ... {ks[-1]}"
            _kv_start_line(row[1], row_kv_start(r, plan.cta_tile_q, g), color="#e6550d", lw=2.0,
                           label=f"per-CTA kv_start (CTA_TILE_Q={plan.cta_tile_q}){vals}")
            if g > 1 and not np.array_equal(row_kv_start(r, plan.cta_tile_q, g), row_kv_start(r, plan.cta_tile_q, g, g - 1)):
                _kv_start_line(row[1], row_kv_start(r, plan.cta_tile_q, g, g - 1), color="#e6550d", lw=1.0,
                               ls="--", label=f"CTA kv_start, head {g - 1} of group")
            row[1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), fontsize=SMALL, frameon=False)

        diff_src = "model"
        dlo, dhi = r.intervals.lo, r.intervals.hi
        if recording is not None:
            rq = recording.requests[i]
            plo, phi = rq.intervals.lo.astype(np.int64), rq.intervals.hi.astype(np.int64)  # probes store int32
            empty = (plo < 0) | (phi < plo)
            big = np.iinfo(np.int64).max // 4
            elo, ehi = np.where(empty, big, plo).min(1), np.where(empty, -1, phi).max(1)
            _show(row[2], reduce_mask(elo, ehi, kv, block), MASK_COLORS, qo, kv, block)
            flags = probe_flags(rq)
            row[2].set_title(wrap(f"effective, {evidence_label(recording)}\nstatus {rq.status}"
                                  + (f" ({', '.join(flags)})" if flags else "")), fontsize=MEDIUM)
            dlo, dhi, diff_src = plo, phi, "recording" if getattr(recording, "provenance", None) else "probe"
        else:
            _text_panel(row[2], "no GPU recording of this case\n(model only; run `swa-repro record` on a GPU)")
            row[2].set_title("effective, real kernel", fontsize=MEDIUM)

        d = reduce_difference(dlo, dhi, ilo, ihi, kv, block)
        _show(row[3], d, DIFF_COLORS, qo, kv, block)
        undefined = " (status undefined: output not defined by the mask)" if r.status == "undefined" and diff_src == "model" else ""
        row[3].set_title(wrap(f"difference: {diff_src} vs intended{undefined}\n"
                              f"{int(np.isin(d, (2, 4)).sum())} cells with extra, {int(np.isin(d, (3, 4)).sum())} "
                              "with missing keys"), fontsize=MEDIUM)
        if plan is not None and len(r.kv_start) and block[1] <= 2:  # wider cells: the line would hide the band
            _kv_start_line(row[3], row_kv_start(r, plan.cta_tile_q, g), color="#e6550d", lw=1.2)
        _legend(row[3], DIFF_COLORS, DIFF_STATES, d)

        if r.tiles is not None:
            t, bc = reduce_tiles(r.tiles, max_cells, max_cells)  # a 32k request has 256+ q tiles
            n_tiles = r.tiles.shape[0]
            _show(row[4], t, TILE_COLORS, n_tiles, kv, (block_size(n_tiles, max_cells), bc),
                  ylabel=f"q tile ({plan.cta_tile_q} packed rows)")
            row[4].set_title(wrap(f"CTA tile map ({'split-KV, ' if plan.split_kv else ''}KV loop per q tile)"),
                            fontsize=MEDIUM)
            names = TILE_STATES if plan.use_sliding_window else \
                (TILE_STATES[0], "computed, element mask (causal only: window compiled out)", TILE_STATES[2])
            _legend(row[4], TILE_COLORS, names)
        else:
            why = "fa3: per-element mask of the compiled module, no fa2 CTA loop" if res.backend == "fa3" else \
                "tile map not computed: simulate(case, tiles=True)"
            _text_panel(row[4], why)
            row[4].set_title("CTA tile map", fontsize=MEDIUM)
    fig.suptitle(wrap((f"{title}; " if title else "") + case_title(case, res), 110), fontsize=LARGE)
    return fig


def case_title(case, res: ModelResult) -> str:
    plan = res.plan
    extra = f", CTA_TILE_Q {plan.cta_tile_q}, split_kv {plan.split_kv}" if plan is not None else ""
    return (f"{case.name or 'case'}: backend {res.backend}, plan window_left={case.plan_window_left}, "
            f"run window_left={case.window_left}{extra}; status {', '.join(res.statuses)}")


def publish(fig: Figure, name: str, save) -> None:
    """Save ``fig`` through ``save(fig, name) -> path`` (the runner's ``figure_saver(output_dir)``)
    and show that PNG in the notebook (a bare ``Figure`` has no inline repr), so the reader sees
    exactly the saved artifact. Returns None so a notebook cell ending in it prints nothing more."""
    path = save(fig, name)
    try:
        from IPython import get_ipython
        from IPython.display import Image, display

        if get_ipython() is not None:
            display(Image(filename=str(path)))
    except ImportError:  # plain python: the file is the output
        pass


def harness_figure(result, title: str | None = None) -> Figure:
    """:func:`plot_case` of the sliding-window wrapper's run in sglang's harness
    (``sglang.harness.run_case``), on the KV sglang handed it (its trimmed window, page_size 1)."""
    from swa_repro.kernel.model import simulate

    m = result.model
    case = m.case.with_(name=result.case.name)
    return plot_case(case, simulate(case, tiles=True),
                     title=title or f"{result.case.name}: sglang {'patched' if result.patched else 'unpatched'}, "
                                    f"plan window_left={m.case.plan_window_left}, run window_left={m.case.window_left}")


def _pct(v: float) -> str:
    """A fraction as a readable cell label: exact 0 stays "0", small leaks keep a decimal."""
    return "0" if v == 0 else (f"{100 * v:.1f}%" if v < 0.1 else f"{100 * v:.0f}%")


def leak_heatmaps(cells, prompts, prefixes) -> Figure:
    """One panel per cached prefix: the fraction of queries that attend keys outside their window
    (model x prompt length), from ``matrix.model_matrix`` cells (``leak_frac``). Undefined cells
    (split-KV planned without the window: the output is no masked softmax at all) are hatched."""
    windowed = [c for c in cells if c.leak_frac is not None or c.status == "undefined"]
    models = list(dict.fromkeys((c.model, c.window_left) for c in windowed))
    at = {(c.model, c.prompt, c.prefix): c for c in windowed}
    fig = Figure(figsize=(4.2 * len(prefixes) + 1.2, 0.45 * len(models) + 1.8), layout="constrained")
    axes = fig.subplots(1, len(prefixes), squeeze=False, sharey=True)[0]
    cmap = colormaps["Reds"]
    for ax, prefix in zip(axes, prefixes):
        grid = np.full((len(models), len(prompts)), np.nan)
        for (i, (m, _)), (j, p) in ((a, b) for a in enumerate(models) for b in enumerate(prompts)):
            c = at.get((m, p, prefix))
            if c is not None and c.status != "undefined":
                grid[i, j] = c.leak_frac
            elif c is not None:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#d9d9d9", hatch="//", edgecolor="#969696", lw=0))
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            undefined = at.get((models[i][0], prompts[j], prefix)) is not None and np.isnan(v)
            label = "undefined" if undefined else ("" if np.isnan(v) else _pct(v))
            ax.text(j, i, label, ha="center", va="center", fontsize=SMALL,
                    color="white" if not np.isnan(v) and v > 0.55 else "black")
        ax.set(xticks=range(len(prompts)), xticklabels=prompts, yticks=range(len(models)),
               yticklabels=[f"{m} (W={w})" for m, w in models], xlabel="prompt length (new tokens)",
               title=f"cached prefix {prefix}")
    fig.colorbar(im, ax=axes.tolist(), label="fraction of queries attending\nkeys outside the window",
                 format=PercentFormatter(1.0))
    return fig
