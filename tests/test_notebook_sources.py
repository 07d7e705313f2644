"""What the notebooks promise an interactive run: outputs under the repo root's artifacts/ (where
`make repro` writes), in a folder of their own, whatever the kernel's cwd; what a save does, said in
the first cell; and headings a parameter cannot make stale."""

from __future__ import annotations

import re

import pytest

from conftest import skip_module_unless

from swa_repro.notebook import artifacts, places, runner, story
from swa_repro.notebook.params import notebook_parameters
from swa_repro.notebook.places import NOTEBOOKS_DIR, REPO_DIR, output_path
from swa_repro.notebook.runner import available_notebooks

skip_module_unless("jupytext", reason="the notebooks extra (jupytext) is not installed")


def _read(path):
    import jupytext  # here, not at collection: ~1 s in every worker

    return jupytext.read(path)


NOTEBOOKS = available_notebooks(NOTEBOOKS_DIR)
# a shape parameter followed by a value: what a heading must not state
VALUE = re.compile(r"\b(window|window_left|prefix|extend|page|heads?|head_dim)\s*[=:]?\s*\d")


def test_output_path_is_from_the_repo_root_whatever_the_cwd(monkeypatch, tmp_path):
    monkeypatch.chdir(NOTEBOOKS_DIR)  # the lab's kernel runs here
    assert output_path("artifacts") == REPO_DIR / "artifacts"
    assert output_path("artifacts/w8") == REPO_DIR / "artifacts" / "w8"
    assert output_path(str(tmp_path)) == tmp_path  # `swa-repro run` passes an absolute path: kept


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_interactive_run_writes_its_own_set_under_the_repo_roots_artifacts(path, monkeypatch, tmp_path):
    """The parameters cell and the cells up to announce_mode, run as the lab runs them: in a kernel
    whose cwd is the notebook's folder, with the default output_dir. The repo root is a temp dir.
    The run's files go to artifacts/interactive/<notebook>-<hash>/, never artifacts/ itself
    (make repro's), with every parameter of the cell recorded."""
    nb = _read(path)
    start = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    code = [c.source for c in nb.cells[start:] if c.cell_type == "code"]
    upto = next(i for i, src in enumerate(code) if "announce_mode(" in src)
    monkeypatch.setattr(places, "REPO_DIR", tmp_path / "repo")  # where output_path reads it
    cwd = tmp_path / "notebooks"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    scope: dict = {}
    exec(code[0], scope)  # the parameters cell as shipped
    scope["mode"] = "model"  # the output path does not depend on it; "auto" would probe CUDA
    for src in code[1:upto + 1]:
        exec(src, scope)
    art = tmp_path / "repo" / "artifacts"
    assert [p.name for p in art.iterdir()] == ["interactive"], "wrote into make repro's artifacts/"
    [folder] = (art / "interactive").iterdir()
    assert folder.name.startswith(f"{path.stem}-") and (folder / f"{path.stem}.mode.json").is_file()
    rec = artifacts.read(folder, path.stem)
    assert rec["run"] == "interactive" and rec["parameters"]["output_dir"] == "artifacts"
    assert set(rec["parameters"]) == set(notebook_parameters(path))
    assert artifacts.problems(folder, path.stem) == []
    assert scope["output_dir"] == folder
    assert not any(cwd.iterdir()), "wrote into the kernel's cwd"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_cell_says_what_a_save_and_a_run_write(path):
    first = _read(path).cells[0]
    text = " ".join(first.source.split())
    assert first.cell_type == "markdown"
    assert "your copy in `scratch/` (git-ignored)" in text and "write that copy only" in text
    assert "`artifacts/interactive/<notebook>-<hash of the parameters>/`" in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_headings_state_no_parameter_values(path):
    """A heading is markdown: it cannot follow the parameters cell, so it names no shape value."""
    headings = [ln for c in _read(path).cells if c.cell_type == "markdown"
                for ln in c.source.splitlines() if ln.startswith("#")]
    assert headings and not [h for h in headings if VALUE.search(h)]


def test_shapes_line_follows_the_parameters():
    line = story.shapes_line(story.seed_case(window_left=8, extend_lens=[6, 8, 16]))
    assert "window 8" in line and "extend 6/8/16" in line
    assert "window 4" in story.shapes_line(story.seed_case())  # the default, from SEED_SHAPES


def test_excerpt_shows_the_statement_not_the_method():
    from swa_repro.notebook.show import excerpt

    src = "def f(a):\n    x = 1\n    w.plan(\n        a,\n        b=2,\n    )\n    return x\n"
    assert excerpt(src, ".plan(") == "# lines 3-6 of 7\n    w.plan(\n        a,\n        b=2,\n    )"
    assert excerpt(src, "x = 1", more=1).splitlines()[1:] == ["    x = 1", "    w.plan("]
    assert "not in this source" in excerpt(src, "nope")


def test_a_usage_error_in_a_notebook_cell_is_one_line():
    """`fixes = "bogus_fix"` in 03 ended Run All with a UsageError traceback: one line now, and the
    cell still fails (Run All and papermill stop there)."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    try:
        assert runner.one_line_usage_errors()
        with capture_output() as out:
            r = shell.run_cell("from swa_repro.notebook import fix_view as FV\nFV.load_release('0.5.23', 'bogus_fix')")
        assert r.error_in_exec is not None and not r.success
        text = out.stdout + out.stderr
        assert text.strip().splitlines() == [text.strip()] and "UsageError: --fix: unknown bogus_fix" in text
        assert "Traceback" not in text and "File " not in text
    finally:
        shell.set_custom_exc((), None)
        InteractiveShell.clear_instance()


def test_third_party_noise_is_quiet_and_other_warnings_are_not():
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        runner.quiet_third_party()
        for module, message in (("sglang.srt.layers.attention.fla.utils", "Triton is not supported on current platform"),
                                ("sglang.srt.layers.quantization.awq.awq", "Only CUDA, HIP and XPU support AWQ currently."),
                                ("tqdm.auto", "IProgress not found. Please update jupyter and ipywidgets."),
                                ("swa_repro.x", "a warning of this project's own")):
            warnings.warn_explicit(message, UserWarning, f"{module}.py", 1, module=module)
    assert [str(w.message) for w in seen] == ["a warning of this project's own"]
