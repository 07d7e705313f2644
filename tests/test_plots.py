"""plots.py and mask_blocks.py: reductions never hide an extra/missing key; figures build at 12 and 4096 tokens."""

from __future__ import annotations

import io

import numpy as np
import pytest
from matplotlib.figure import Figure

from swa_repro.notebook import mask_blocks, plots
from swa_repro.core.case import Case
from swa_repro.kernel.model import simulate
from swa_repro.core.reference import intended_interval, interval_to_mask


def dense_pool(a, block, fn, pad):
    br, bc = block
    r, c = a.shape
    nr, nc = -(-r // br), -(-c // bc)
    p = np.full((nr * br, nc * bc), pad)
    p[:r, :c] = a
    return fn(p.reshape(nr, br, nc, bc), axis=(1, 3))


def test_single_extra_key_survives_4096_to_256():
    rng = np.random.default_rng(0)
    for _ in range(5):
        i, j = rng.integers(0, 4096, 2)
        diff = np.zeros((4096, 4096), bool)
        diff[i, j] = True
        red = mask_blocks.reduce_bool(diff, 256)
        assert red.shape == (256, 256)
        assert red.sum() == 1 and red[i // 16, j // 16]


def test_reduce_bool_is_maxpool_on_ragged_shapes():
    rng = np.random.default_rng(1)
    a = rng.random((1000, 777)) > 0.999
    red = mask_blocks.reduce_bool(a, 64)
    block = (mask_blocks.block_size(1000, 64), mask_blocks.block_size(777, 64))
    assert np.array_equal(red, dense_pool(a, block, np.max, False))
    assert red.sum() >= 1 and red.sum() <= a.sum()


@pytest.mark.parametrize("block", [(1, 1), (3, 5), (16, 16), (7, 64)])
def test_interval_reductions_match_dense(block):
    rng = np.random.default_rng(sum(block))
    rows, n = 150, 333
    lo = rng.integers(-1, n, rows)
    hi = np.where(rng.random(rows) < 0.1, lo - 1, np.minimum(lo + rng.integers(0, 200, rows), n - 1))  # some empty
    dense = interval_to_mask(lo, hi, n) & (hi >= 0)[:, None]
    assert np.array_equal(mask_blocks.intervals_any(lo, hi, n, block), dense_pool(dense, block, np.max, False))
    assert np.array_equal(mask_blocks.intervals_all(lo, hi, n, block), dense_pool(dense, block, np.min, True))
    levels = mask_blocks.reduce_mask(lo, hi, n, block)
    assert set(np.unique(levels)) <= {0, 1, 2}


def test_reduce_difference_matches_dense_per_head():
    """Extra = some head sees a key outside the window; missing = some head misses a window key."""
    rng = np.random.default_rng(3)
    p, e, w, heads = 50, 120, 16, 3
    ilo, ihi = intended_interval(p, e, w)
    lo = np.clip(ilo[:, None] + rng.integers(-5, 5, (e, heads)), 0, None)
    hi = ihi[:, None] - rng.integers(0, 2, (e, heads))
    kv = p + e
    intended = interval_to_mask(ilo, ihi, kv)
    eff = [interval_to_mask(lo[:, h], hi[:, h], kv) for h in range(heads)]
    extra = np.any([m & ~intended for m in eff], 0)
    missing = np.any([intended & ~m for m in eff], 0)
    for block in [(1, 1), (4, 8), (32, 32)]:
        d = mask_blocks.reduce_difference(lo, hi, ilo, ihi, kv, block)
        ex, mi = dense_pool(extra, block, np.max, False), dense_pool(missing, block, np.max, False)
        assert np.array_equal(np.isin(d, (2, 4)), ex)
        assert np.array_equal(np.isin(d, (3, 4)), mi)
        assert np.array_equal(d == 1, dense_pool(intended, block, np.max, False) & ~ex & ~mi)


def test_one_leaked_key_in_a_large_request_colours_exactly_one_block():
    p, e, w = 0, 4096, 256
    ilo, ihi = intended_interval(p, e, w)
    lo, hi = ilo.copy(), ihi.copy()
    lo[3000] -= 1  # one (row, key) pair outside the window
    d = mask_blocks.reduce_difference(lo, hi, ilo, ihi, p + e, (16, 16))
    assert d.shape == (256, 256)
    assert np.argwhere(d == 2).tolist() == [[3000 // 16, (ilo[3000] - 1) // 16]]
    assert not np.isin(d, (3, 4)).any()


def test_reduce_tiles_keeps_most_severe_state():
    t = np.zeros((2, 1000), np.int8)
    t[0, 10:500] = 1
    t[0, 123] = 2
    t[1, 999] = 1
    red, bc = mask_blocks.reduce_tiles(t, 100)
    assert bc == 10 and red.shape == (2, 100)
    assert red[0, 12] == 2 and red[0, 1] == 1 and red[0, 0] == 0 and red[0, 49] == 1 and red[0, 50] == 0
    assert red[1, 99] == 1 and red[1, :99].max() == 0
    rows, _ = mask_blocks.reduce_tiles(np.repeat(t, 150, axis=0), 100, max_rows=128)  # 300 q tiles -> blocks of 3
    assert rows.shape == (100, 100) and rows[16, 12] == 2 and rows[50, 12] == 0 and rows[50, 99] == 1


def test_row_kv_start_maps_rows_to_their_cta():
    case = Case((200,), (100,), num_qo_heads=32, num_kv_heads=8, window_left=64, disable_split_kv=True)
    r = simulate(case).requests[0]
    ks = mask_blocks.row_kv_start(r, 128, 4)
    assert ks.shape == (100,)
    assert ks[0] == r.kv_start[0] and ks[31] == r.kv_start[0] and ks[32] == r.kv_start[1] and ks[99] == r.kv_start[3]
    # every row's effective first key is its CTA's kv_start (mask compiled out, no split)
    assert np.array_equal(r.lo[:, 0], ks)


def _render(fig) -> np.ndarray:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.tell() > 1000
    return buf


def test_plot_case_12_tokens_labels_every_cell():
    case = Case((0,), (12,), window_left=4, name="seed12")
    fig = plots.plot_case(case, simulate(case, tiles=True))
    assert isinstance(fig, Figure)
    axes = fig.axes
    assert len([a for a in axes if a.images]) == 4  # intended, model, difference, tile map (no recording)
    intended = axes[0]
    assert list(intended.get_xticks()) == list(range(12)) and list(intended.get_yticks()) == list(range(12))
    title = fig._suptitle.get_text()
    assert "fa2" in title and "plan window_left=-1" in title and "run window_left=4" in title and "leak" in title
    diff = axes[3].images[0].get_array()
    assert (np.asarray(diff) == 2).sum() == int(simulate(case).requests[0].extra_keys().sum()) == 28  # one cell per key
    _render(fig)


def test_plot_case_large_and_fa3_and_undefined():
    big = Case((0,), (4096,), window_left=512, name="big")
    fig = plots.plot_case(big, simulate(big, tiles=True))
    diff = np.asarray(fig.axes[3].images[0].get_array())
    assert diff.shape[0] <= plots.PLOT_CELLS and (diff == 2).any()
    _render(fig)
    fa3 = Case((64,), (100,), window_left=8, backend="fa3", num_qo_heads=8, num_kv_heads=2, name="fa3")
    fig = plots.plot_case(fa3, simulate(fa3, tiles=True))
    assert "fa3" in fig._suptitle.get_text()
    split = Case((4000,), (64,), window_left=128, name="split")
    fig = plots.plot_case(split, simulate(split, tiles=True))
    assert "undefined" in fig._suptitle.get_text()


def test_plot_case_with_probe_evidence_on_cpu():
    """A genuine ProbeResult read off a CPU stand-in kernel that applies the model's masks."""
    from swa_repro.kernel.probe import mask_attention_fn, model_masks, probe_from_attention_fn

    case = Case((0, 5), (12, 9), window_left=4, num_qo_heads=4, num_kv_heads=2, head_dim=64, name="cpu_probe")
    pr = probe_from_attention_fn(case, mask_attention_fn(case, model_masks(case)), repeats=1, random_runs=0)
    fig = plots.plot_case(case, simulate(case, tiles=True), pr)
    assert len([a for a in fig.axes if a.images]) == 10  # 2 requests x 5 panels
    assert "live probe" in fig.axes[2].get_title()
    _render(fig)


def test_harness_figure_for_a_failing_case():
    """Notebook 04's figure of sglang's own run (moved here from sglang.check: drawing is the
    notebook layer's job)."""
    pytest.importorskip("sglang", reason="drives sglang's own backend: install sglang==0.5.15.post1")
    from swa_repro.sglang.check import MATRIX
    from swa_repro.sglang.harness import run_case

    r = run_case(MATRIX[2], False, "model")
    fig = plots.harness_figure(r)
    assert "unpatched" in fig._suptitle.get_text() and len(fig.axes) >= 3 * 5


def heat_cell(model, w, prompt, prefix, status, frac):
    from swa_repro.notebook.matrix import Cell

    return Cell(model, w, prompt, prefix, status, 3 if frac else 0, 0.0, None, leak_frac=frac)


def test_leak_heatmaps_show_the_fraction_of_leaking_queries_per_model_and_prompt():
    cells = [heat_cell("m1", 127, 1024, 0, "exact", 0.0), heat_cell("m1", 127, 8192, 0, "leak", 0.0625),
             heat_cell("m2", 511, 1024, 0, "leak", 0.484375), heat_cell("m2", 511, 8192, 0, "undefined", 0.9),
             heat_cell("m3", -1, 1024, 0, "no window", None)]  # no window: no row
    cells += [heat_cell(c.model, c.window_left, c.prompt, 4096, c.status, c.leak_frac) for c in cells]
    fig = plots.leak_heatmaps(cells, [1024, 8192], [0, 4096])
    heat = [ax for ax in fig.axes if ax.images and ax.get_title()]
    assert [ax.get_title() for ax in heat] == ["cached prefix 0", "cached prefix 4096"]
    assert [t.get_text() for t in heat[0].texts] == ["0", "6.2%", "48%", "undefined"]
    assert [t.get_text() for t in heat[0].get_yticklabels()] == ["m1 (W=127)", "m2 (W=511)"]
    assert heat[0].images[0].get_clim() == (0, 1)


def _px_per_cell(ax) -> tuple[float, float]:
    """Screen pixels per image cell of the heatmap in ``ax`` (its data extent over its cells)."""
    im = ax.images[0]
    rows, cols = im.get_array().shape
    x0, x1, y0, y1 = im.get_extent()
    box = ax.get_window_extent()
    (a, b), (c, d) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    return box.width * abs(x1 - x0) / cols / (b - a), box.height * abs(y1 - y0) / rows / (d - c)


@pytest.mark.parametrize("tokens", [12, 32768])
def test_saved_figures_give_every_cell_two_pixels(tokens):
    """Honesty of the saved PNG: after max-pooling to <= PLOT_CELLS cells an axis, every heatmap
    cell of plot_case gets >= 2 px at FIGURE_DPI (runner.save_figure's dpi), so none falls between
    pixels, at 12 tokens and at 32k (whose tile map has 256+ q tiles before pooling)."""
    from swa_repro.notebook import story

    case = story.seed_case(False) if tokens == 12 else story.long_case(False)
    assert max(case.extend_lens) == tokens
    fig = plots.plot_case(case, simulate(case, tiles=True))
    fig.set_dpi(plots.FIGURE_DPI)
    fig.canvas.draw()  # constrained layout places the axes
    maps = [ax for ax in fig.axes if ax.images]
    assert len(maps) >= 4 * case.batch_size
    for ax in maps:
        assert max(ax.images[0].get_array().shape) <= plots.PLOT_CELLS
        px = _px_per_cell(ax)
        assert min(px) >= 2, (ax.get_title(), px)


def test_publish_saves_through_the_given_function(tmp_path):
    saved = []

    def save(fig, name):
        saved.append(name)
        path = tmp_path / f"{name}.png"
        fig.savefig(path)
        return path

    fig = Figure()
    fig.subplots().plot([0, 1])
    assert plots.publish(fig, "x_fig", save) is None and saved == ["x_fig"] and (tmp_path / "x_fig.png").exists()


def test_mask_figures_are_readable_at_notebook_width():
    """02's and 04's mask figures were 2200 px wide, shown at ~1150 px: 5-6 px text. Now at most
    the notebook's width, so shown 1:1, and no text under 7 pt (~10 px at FIGURE_DPI)."""
    from matplotlib.text import Text

    from swa_repro.kernel.model import simulate
    from swa_repro.notebook import story

    case = story.seed_case()
    fig = plots.plot_case(case, simulate(case, tiles=True), title="a title")
    fig.canvas.draw()
    width_px = fig.get_figwidth() * plots.FIGURE_DPI
    assert width_px <= 1150, width_px
    shown = min(1.0, 1150 / width_px)  # the notebook scales a wider image down
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip() and t.get_visible()]
    assert sizes and min(sizes) * plots.FIGURE_DPI / 72 * shown >= 9.5, min(sizes)
    assert len([a for a in fig.axes if a.images]) == 4 * case.batch_size  # every request still has its panels
