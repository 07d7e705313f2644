"""lean.py: figures move out of .ipynb/.html into PNG files beside them, pixel for pixel."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest

from conftest import REPO
from swa_repro.notebook import lean

LIVE = REPO / "docs" / "live"
TWO_MB = 2_000_000


# matplotlib, PIL and nbformat are imported where used, never at collection (~3 s in every worker)
def figure_png(seed: int, dpi: int = 60) -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    fig.subplots().imshow(np.random.default_rng(seed).random((8, 8)), cmap="viridis")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def few_colors_rgba() -> bytes:
    from PIL import Image

    colors = np.array([(255, 255, 255, 255), (214, 39, 40, 255), (0, 0, 0, 0)], np.uint8)  # one transparent
    px = colors[np.random.default_rng(0).integers(0, 3, (100, 150))]  # noise: RGBA compresses badly
    buf = io.BytesIO()
    Image.fromarray(px, "RGBA").save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("name", ["matplotlib", "few-colors-rgba"])
def test_optimize_png_keeps_every_pixel_and_never_grows(name):
    data = figure_png(0) if name == "matplotlib" else few_colors_rgba()
    out = lean.optimize_png(data)
    assert out[:8] == lean.PNG_MAGIC and len(out) <= len(data)
    assert lean.same_pixels(out, data)


def test_few_colors_become_a_palette():
    from PIL import Image

    out = lean.optimize_png(few_colors_rgba())
    with Image.open(io.BytesIO(out)) as im:
        assert im.mode == "P"


def page(*images: bytes) -> str:
    css = f".x {{ background-image: url(data:image/png;base64,{base64.b64encode(images[0]).decode()}); }}"
    imgs = "".join(f'<div><img alt="a" class="" src="data:image/png;base64,{base64.b64encode(b).decode()}"/></div>'
                   for b in images)
    return f"<!DOCTYPE html><html><head><style>{css}</style></head><body>{imgs}</body></html>"


def test_html_images_move_to_files_deduplicated_and_pixel_exact(tmp_path):
    a, b = figure_png(1), figure_png(2)
    p = tmp_path / "03_x.html"
    p.write_text(page(a, b, a))
    files = lean.link_html_images(p)
    assert [f.name for f in files] == ["03_x_fig01.png", "03_x_fig02.png"]  # the repeat of a shares fig01
    text = p.read_text()
    assert re.findall(r'<img alt="a" class="" src="([^"]+)"/>', text) == ["03_x_fig01.png", "03_x_fig02.png",
                                                                         "03_x_fig01.png"]
    assert "url(data:image/png;base64," in text  # the page's CSS is not an image to move
    assert lean.same_pixels(files[0].read_bytes(), a) and lean.same_pixels(files[1].read_bytes(), b)
    assert lean.link_html_images(p) == [] and p.read_text() == text  # idempotent


def test_notebook_images_link_the_saved_figure_or_a_new_file(tmp_path):
    saved = figure_png(3)
    (tmp_path / "05_nb_heat.png").write_bytes(saved)
    other = figure_png(4)
    import nbformat

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("publish(...)")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(saved).decode(),
                                                                 "text/plain": "<IPython.core.display.Image object>"}),
                    nbformat.v4.new_output("stream", text="hello\n"),
                    nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(other).decode()})]
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), cell]
    path = tmp_path / "05_nb.ipynb"
    nbformat.write(nb, path)
    linked = lean.link_notebook_images(path)
    assert [p.name for p in linked] == ["05_nb_heat.png", "05_nb_out01_2.png"]
    outs = nbformat.read(path, as_version=4).cells[1].outputs
    assert outs[0].data == {"text/html": '<img src="05_nb_heat.png" alt="05_nb_heat"/>',
                            "text/plain": "<figure 05_nb_heat.png>"}
    assert outs[1].text == "hello\n"
    assert outs[2].data["text/html"] == '<img src="05_nb_out01_2.png" alt="05_nb_out01_2"/>'
    assert lean.same_pixels((tmp_path / "05_nb_out01_2.png").read_bytes(), other)
    assert "image/png" not in path.read_text()
    assert lean.link_notebook_images(path) == []


def test_cli_leans_a_folder(tmp_path, capsys):
    (tmp_path / "a.html").write_text(page(figure_png(5)))
    assert lean.main([str(tmp_path)]) == 0
    assert (tmp_path / "a_fig01.png").exists() and "1 image file(s)" in capsys.readouterr().out


@pytest.mark.parametrize("html", sorted(LIVE.glob("*.html")), ids=lambda p: p.name)
def test_committed_live_pages_are_lean_and_their_images_exist(html):
    text = html.read_text(encoding="utf-8")
    assert html.stat().st_size < TWO_MB
    assert lean.embedded_png_bytes(text) == []
    srcs = re.findall(r'<img\b[^>]*\bsrc="([^"]+\.png)"', text)
    figures = {n["notebook"]: n["figures"] for s in LIVE.glob("summary*.json")
               for n in json.loads(s.read_text())["notebooks"]}
    assert bool(srcs) == bool(figures[html.stem]), f"{html.name}: figures {figures[html.stem]}, img tags {srcs}"
    for src in srcs:
        png = html.parent / src
        assert png.is_file() and png.read_bytes()[:8] == lean.PNG_MAGIC, src
