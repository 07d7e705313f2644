"""Issue #42 item 6: figures and tables readable in the HTML and the lab at 1400 px. Every figure of
the notebooks keeps its text at >= plots.MIN_TEXT_PX shown 1:1 (figures are at most the notebook's
width) and inside the figure (a recording's panel title was cut at the edge); 07's heatmaps are not
pyplot figures (the inline backend showed each again after plots.publish); pandas shows every row
and whole cells; no check cell prints a stray True/False."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import matplotlib
import pytest
from matplotlib.text import Text

from swa_repro.kernel.model import simulate
from swa_repro.notebook import fix_view, key_heatmap, plots, show, story, vllm_page
from swa_repro.notebook.places import NOTEBOOKS_DIR, REPO_DIR
from swa_repro.notebook.runner import available_notebooks
from swa_repro.sglang.audit.rows import encode

matplotlib.use("Agg")


def _record(n=300, window=50, leak_from=150):
    lines = [(q, [[max(0, q - window), q]], [[0, q]] if q >= leak_from else [[max(0, q - window), q]])
             for q in range(n)]
    return {"verdict": "extra", "rows": {"runs": encode(lines), "undefined": []}}


def _seed():
    c = story.seed_case()
    return plots.plot_case(c, simulate(c, tiles=True), title="a title")


def _recording():  # the long evidence label that was cut: "effective, recording (NVIDIA H200, flashinfer ...)"
    recs, _ = story.load_recordings_or_empty(None)
    r = next(r for r in recs if r.case.backend == "fa3" and r.case.group_size > 1)
    return plots.plot_case(r.case, simulate(r.case, tiles=True), r)


def _keys(zoomed=False):
    panels = [[("sliding layer, extend_paged", _record()), ("sliding layer, extend_ragged_no_prefix", _record()),
               ("sliding layer, extend_ragged_prefix", None)], [("full layer, extend_paged", _record(leak_from=10**6))]]
    return key_heatmap.figure(panels, "gemma2 on sglang 0.5.15.post1, sm90: keys each query attends", zoomed=zoomed)


def _fix_keys():
    cell = {"queries": 8, "queries_with_extra": 7, "missing_keys": 37, "verdict": "extra"}
    rows = [fix_view.KeyRow(p, "x", "y", "extra", "exact", cell, dict(cell, queries_with_extra=0, missing_keys=0))
            for p in ("extend_paged", "extend_ragged_no_prefix", "target_verify_eagle")]
    return fix_view.keys_figure(rows, "keys with and without the fixes")


def _vllm():
    return vllm_page.heatmap(vllm_page.cells(vllm_page.load()), "vLLM's FlashInfer backend, as shipped")


def _leaks():
    from swa_repro.notebook.matrix import Cell

    cells = [Cell(m, w, p, 0, "leak", 3, 0.0, None, leak_frac=f) for m, w, f in (("gemma2", 4095, 0.5), ("gpt-oss", 127, 0.0))
             for p in (1024, 8192)]
    return plots.leak_heatmaps(cells, [1024, 8192], [0])


FIGURES = {"plot_case": _seed, "plot_case_recording": _recording, "key_heatmap": _keys,
           "key_heatmap_zoomed": lambda: _keys(True), "fix_view": _fix_keys, "vllm_page": _vllm, "leak_heatmaps": _leaks}


def _undrawn_tick_labels(fig) -> set[int]:
    """Tick labels outside their axis's view: matplotlib does not draw them (their positions are stale)."""
    out = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if tick.get_loc() is None or not lo - 1e-6 <= tick.get_loc() <= hi + 1e-6:
                    out |= {id(tick.label1), id(tick.label2)}
    return out


@pytest.mark.parametrize("name", FIGURES)
def test_every_text_is_readable_and_inside_its_figure(name):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = FIGURES[name]()
    fig.set_dpi(plots.FIGURE_DPI)
    FigureCanvasAgg(fig).draw()  # a bare Figure's canvas draws nothing: lay it out as the saved PNG is
    width, height = fig.get_figwidth() * plots.FIGURE_DPI, fig.get_figheight() * plots.FIGURE_DPI
    assert width <= 1150, width  # shown 1:1 in the notebook and its HTML
    undrawn = _undrawn_tick_labels(fig)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in undrawn]
    assert texts
    for t in texts:
        px = t.get_fontsize() * plots.FIGURE_DPI / 72
        assert px >= plots.MIN_TEXT_PX, (name, t.get_text()[:40], px)
        box = t.get_window_extent()
        assert box.x0 >= -1 and box.x1 <= width + 1 and box.y0 >= -1 and box.y1 <= height + 1, \
            (name, t.get_text()[:60], box.bounds, width)


def test_the_keys_heatmap_is_no_pyplot_figure():
    """A pyplot figure is shown again by the inline backend after plots.publish showed its PNG:
    07's heatmaps appeared twice (07_my_model_my_gpu_out12_1.png beside 07_my_model_my_gpu_keys.png)."""
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    fig = _keys()
    assert fig.canvas.manager is None and plt.get_fignums() == before


def test_the_figure_modules_use_no_pyplot():
    """No figure of the library or benchmarks goes through pyplot's state (one figure, shown once)."""
    for path in [*(REPO_DIR / "swa_repro" / "notebook").glob("*.py"), REPO_DIR / "benchmarks" / "figures.py"]:
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "matplotlib.pyplot" not in names | mods and "pyplot" not in names, path.name


def test_pandas_shows_every_row_and_whole_cells():
    import pandas as pd

    df = pd.DataFrame({f"c{j}": [f"row {i} " + "a long cell text " * 5 for i in range(68)] for j in range(15)})
    with pd.option_context("display.max_rows", 60, "display.max_columns", 20, "display.max_colwidth", 50):
        show.notebook_display()
        html = df._repr_html_()
    assert "68 rows" not in html and "..." not in html and "…" not in html
    assert html.split("<tbody>")[1].count("<tr>") == 68 and "row 67 " in html  # every row
    assert ("row 0 " + "a long cell text " * 5).strip() in html  # whole cells


def test_a_wide_table_fits_the_page():
    """05's key table (15 snake_case columns) was 1838 px at 1400: its headers now break after an
    underscore and a long cell anywhere; short cells never (no '0.5.10.pos / t1')."""
    import pandas as pd
    from IPython.core.interactiveshell import InteractiveShell

    df = pd.DataFrame([{"queries_with_extra": 1, "sglang": "0.5.10.post1",
                        "runs": "RaggedKVCacheWrapper: auto -> fa3; PagedKVCacheWrapper: fa2 -> fa2"}])
    shell = InteractiveShell.instance()
    try:
        with pd.option_context("display.max_rows", 60, "display.max_columns", 20, "display.max_colwidth", 50):
            show.notebook_display()  # in IPython: every DataFrame is shown through html_table
            html = show.html_table(df)
            assert shell.display_formatter.format(df)[0]["text/html"] == html
        assert "<th>queries_<wbr>with_<wbr>extra</th>" in html and "<td>0.5.10.post1</td>" in html
        assert '<td style="overflow-wrap: anywhere; min-width: 10em">RaggedKVCacheWrapper' in html
        assert "fa3; PagedKVCacheWrapper: fa2 -&gt; fa2</td>" in html  # whole
    finally:
        shell.display_formatter.formatters["text/html"].pop(pd.DataFrame, None)
        InteractiveShell.clear_instance()


def _code_cells(path: Path):
    text = path.read_text()
    heads = list(re.finditer(r"^# %%.*$", text, flags=re.MULTILINE))
    for h, nxt in zip(heads, [*heads[1:], None]):
        if "[markdown]" not in h.group(0):
            yield text[h.end():nxt.start() if nxt else len(text)]


@pytest.mark.parametrize("path", available_notebooks(NOTEBOOKS_DIR), ids=lambda p: p.stem)
def test_no_check_cell_prints_a_stray_bool(path):
    """A cell whose last statement is a check (checks.expect returns its bool) or a comparison
    ends with ';', so the notebook and its HTML show PASS/FAIL lines, not also True or False."""
    for src in _code_cells(path):
        body = ast.parse(src).body
        if body and isinstance(last := body[-1], ast.Expr):
            v = last.value
            bool_valued = isinstance(v, (ast.Compare, ast.BoolOp)) or (
                isinstance(v, ast.Call) and getattr(v.func, "attr", "") == "expect")
            assert not bool_valued or src.rstrip().endswith(";"), (path.stem, ast.get_source_segment(src, last)[:80])


def test_benchmark_legends_use_the_style():
    from benchmarks import figures

    doc = json.loads((REPO_DIR / "benchmarks" / "results" / "cpu_model.json").read_text())
    fig = figures.kernel_model_times(doc)
    legends = [t for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert legends and min(t.get_fontsize() for t in legends) * plots.FIGURE_DPI / 72 >= plots.MIN_TEXT_PX
