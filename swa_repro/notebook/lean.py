"""Lean notebook artifacts: each figure is one PNG file beside its page, linked, never base64 twice.

An executed notebook used to carry every figure three times (the PNG, base64 in the ``.ipynb``,
base64 again in the ``.html``): 02's three files were ~20 MB. Here:

* :func:`link_notebook_images` rewrites an executed ``.ipynb``: every ``image/png`` output becomes
  an ``<img src="FILE.png">`` output (``text/html``, which JupyterLab resolves relative to the
  notebook and nbconvert copies into the HTML as is). ``FILE`` is the figure the notebook saved
  itself (``<stem>_*.png``, same bytes) or, for any other image, a new ``<stem>_out<cell>_<k>.png``.
* :func:`link_html_images` does the same to an HTML page already exported (the committed
  ``docs/live/*.html``, executed on a GPU and not re-runnable here): each ``<img src="data:...">``
  becomes ``<stem>_fig<NN>.png`` beside it. Pixels are kept exactly (:func:`optimize_png` only
  re-encodes when the decoded RGBA is identical, and keeps the smaller file).

    python -m swa_repro.notebook.lean docs/live          # every *.html in the folder
    python -m swa_repro.notebook.lean artifacts/02_masks_and_cta_skips.ipynb
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import io
import re
import sys
from pathlib import Path

import numpy as np

from swa_repro.core.outputs import write_atomic

# <img ... src="data:image/png;base64,..." ...>: only img tags (the page's CSS has data: URLs too)
IMG_DATA_RE = re.compile(r'(<img\b[^>]*?\bsrc=")data:image/png;base64,([A-Za-z0-9+/=\s]+)(")')
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- PNG bytes
def _rgba(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGBA"))  # (h, w, 4) uint8


def optimize_png(data: bytes) -> bytes:
    """The same pixels in fewer bytes, or ``data`` unchanged: drop an all-opaque alpha channel,
    use an exact palette when there are at most 256 colours, zlib level 9. The result is kept
    only if it decodes to exactly the original RGBA array and is smaller."""
    from PIL import Image

    px = _rgba(data)
    h, w, _ = px.shape
    flat = px.reshape(-1, 4)
    colors, index = np.unique(flat.view(np.uint32).ravel(), return_inverse=True)
    if len(colors) <= 256:
        pal = colors.view(np.uint8).reshape(-1, 4)  # (n, 4) RGBA
        im = Image.fromarray(index.reshape(h, w).astype(np.uint8), "P")
        im.putpalette(pal[:, :3].ravel().tolist(), "RGB")
        if (pal[:, 3] != 255).any():
            im.info["transparency"] = bytes(pal[:, 3].tolist())
    elif (px[..., 3] == 255).all():
        im = Image.fromarray(np.ascontiguousarray(px[..., :3]), "RGB")
    else:
        im = Image.fromarray(px, "RGBA")
    buf = io.BytesIO()
    im.save(buf, "PNG", optimize=True, **({"transparency": im.info["transparency"]} if "transparency" in im.info else {}))
    new = buf.getvalue()
    if len(new) < len(data) and np.array_equal(_rgba(new), px):
        return new
    return data


def same_pixels(a: bytes, b: bytes) -> bool:
    return np.array_equal(_rgba(a), _rgba(b))


def img_tag(src: str, alt: str) -> str:
    return f'<img src="{html.escape(src)}" alt="{html.escape(alt)}"/>'


# ----------------------------------------------------------------------------- executed .ipynb
def link_notebook_images(ipynb: Path, fig_dir: Path | None = None) -> list[Path]:
    """Replace each ``image/png`` output of ``ipynb`` by a link to a PNG file in ``fig_dir``
    (default: beside the notebook; links are relative to the notebook). Returns the files linked.
    Idempotent: a notebook without base64 images is left untouched."""
    import nbformat

    ipynb = Path(ipynb)
    fig_dir = Path(fig_dir or ipynb.parent)
    nb = nbformat.read(ipynb, as_version=4)
    stem = ipynb.stem
    known = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in sorted(fig_dir.glob(f"{stem}_*.png"))}
    linked, changed = [], False
    for ci, cell in enumerate(nb.cells):
        for k, out in enumerate(cell.get("outputs", [])):
            b64 = out.get("data", {}).get("image/png")
            if not b64:
                continue
            data = base64.b64decode(b64)
            path = known.get(hashlib.sha256(data).hexdigest())
            if path is None:  # an image the notebook did not save itself (e.g. a pyplot inline figure)
                path = fig_dir / f"{stem}_out{ci:02d}_{k}.png"
                write_atomic(path, optimize_png(data))
                known[hashlib.sha256(data).hexdigest()] = path
            src = Path(_relpath(path, ipynb.parent)).as_posix()
            out["data"] = {"text/html": img_tag(src, path.stem), "text/plain": f"<figure {path.name}>"}
            out["metadata"] = {}
            linked.append(path)
            changed = True
    if changed:
        nbformat.write(nb, ipynb)
    return linked


def _relpath(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(path.resolve(), start.resolve())


# ----------------------------------------------------------------------------- exported .html
def link_html_images(page: Path, *, optimize: bool = True) -> list[Path]:
    """Move every ``<img src="data:image/png;base64,...">`` of ``page`` into ``<stem>_figNN.png``
    beside it (identical images share one file) and point the tag at it. Returns the files
    written. Idempotent: a page without data-URL images is left untouched."""
    page = Path(page)
    text = page.read_text(encoding="utf-8")
    files: dict[str, Path] = {}

    def repl(m: re.Match) -> str:
        data = base64.b64decode(re.sub(r"\s+", "", m.group(2)))
        digest = hashlib.sha256(data).hexdigest()
        if digest not in files:
            path = page.with_name(f"{page.stem}_fig{len(files) + 1:02d}.png")
            write_atomic(path, optimize_png(data) if optimize else data)
            files[digest] = path
        return m.group(1) + html.escape(files[digest].name) + m.group(3)

    new = IMG_DATA_RE.sub(repl, text)
    if new != text:
        write_atomic(page, new.encode("utf-8"))
    return list(files.values())


def embedded_png_bytes(text: str) -> list[bytes]:
    """The PNGs a page embeds in ``<img>`` tags, in order (what :func:`link_html_images` moves)."""
    return [base64.b64decode(re.sub(r"\s+", "", m.group(2))) for m in IMG_DATA_RE.finditer(text)]


def lean_paths(paths) -> list[tuple[Path, list[Path]]]:
    """Each ``.html`` / ``.ipynb`` given, or found directly in a given folder, leaned in place."""
    done = []
    for p in map(Path, paths):
        targets = sorted([*p.glob("*.html"), *p.glob("*.ipynb")]) if p.is_dir() else [p]
        for t in targets:
            if t.suffix == ".html":
                done.append((t, link_html_images(t)))
            elif t.suffix == ".ipynb":
                done.append((t, link_notebook_images(t)))
            else:
                raise SystemExit(f"lean: {t} is neither .html nor .ipynb")
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m swa_repro.notebook.lean", description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help=".html / .ipynb files, or folders holding them")
    a = ap.parse_args(argv)
    for page, files in lean_paths(a.paths):
        size = page.stat().st_size
        print(f"{page}: {size / 1e6:.2f} MB, {len(files)} image file(s)"
              + (f" ({sum(f.stat().st_size for f in set(files)) / 1e6:.2f} MB)" if files else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
