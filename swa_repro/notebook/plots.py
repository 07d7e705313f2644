"""Heatmaps of one case: intended mask, effective mask, difference, per-CTA ``kv_start``, tile map.

Large cases are reduced by blocks before drawing, never averaged (``notebook.mask_blocks``: "no /
some / every key in the block visible", "any extra key" / "any missing key", the most severe tile
state), so a single leaked key in a 32k x 32k mask still shows, and a 32k-token case never
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

from swa_repro.kernel.model import ModelResult
from swa_repro.core.intervals import intended_bounds
from swa_repro.notebook.mask_blocks import block_size, reduce_difference, reduce_mask, reduce_tiles, row_kv_start

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
