"""What the notebooks promise an interactive run: outputs in the repo root's artifacts/ (where
`make repro` writes), whatever the kernel's cwd, and headings a parameter cannot make stale."""

from __future__ import annotations

import re

import pytest

from swa_repro.notebook import runner, story
from swa_repro.notebook.runner import NOTEBOOKS_DIR, REPO_DIR, available_notebooks, output_path

jupytext = pytest.importorskip("jupytext", reason="the notebooks extra (jupytext) is not installed")
NOTEBOOKS = available_notebooks(NOTEBOOKS_DIR)
# a shape parameter followed by a value: what a heading must not state
VALUE = re.compile(r"\b(window|window_left|prefix|extend|page|heads?|head_dim)\s*[=:]?\s*\d")


def test_output_path_is_from_the_repo_root_whatever_the_cwd(monkeypatch, tmp_path):
    monkeypatch.chdir(NOTEBOOKS_DIR)  # the lab's kernel runs here
    assert output_path("artifacts") == REPO_DIR / "artifacts"
    assert output_path("artifacts/w8") == REPO_DIR / "artifacts" / "w8"
    assert output_path(str(tmp_path)) == tmp_path  # `swa-repro run` passes an absolute path: kept


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_interactive_run_writes_to_the_repo_roots_artifacts(path, monkeypatch, tmp_path):
    """The parameters cell and the cells up to announce_mode, run as the lab runs them: in a kernel
    whose cwd is the notebook's folder, with the default output_dir. The repo root is a temp dir."""
    nb = jupytext.read(path)
    start = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    code = [c.source for c in nb.cells[start:] if c.cell_type == "code"]
    upto = next(i for i, src in enumerate(code) if "announce_mode(" in src)
    monkeypatch.setattr(runner, "REPO_DIR", tmp_path / "repo")
    cwd = tmp_path / "notebooks"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    scope: dict = {}
    exec(code[0], scope)  # the parameters cell as shipped
    scope["mode"] = "model"  # the output path does not depend on it; "auto" would probe CUDA
    for src in code[1:upto + 1]:
        exec(src, scope)
    assert (tmp_path / "repo" / "artifacts" / f"{path.stem}.mode.json").is_file()
    assert not any(cwd.iterdir()), "wrote into the kernel's cwd"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_headings_state_no_parameter_values(path):
    """A heading is markdown: it cannot follow the parameters cell, so it names no shape value."""
    headings = [ln for c in jupytext.read(path).cells if c.cell_type == "markdown"
                for ln in c.source.splitlines() if ln.startswith("#")]
    assert headings and not [h for h in headings if VALUE.search(h)]


def test_shapes_line_follows_the_parameters():
    line = story.shapes_line(story.seed_case(window_left=8, extend_lens=[6, 8, 16]))
    assert "window 8" in line and "extend 6/8/16" in line
    assert "window 4" in story.shapes_line(story.seed_case())  # the default, from SEED_SHAPES
