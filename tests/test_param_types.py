"""Every notebook parameter has a declared type and range (``notebook.param_types``), and
``swa-repro run --parameters`` holds a value to it before anything runs, whatever the default."""

from __future__ import annotations

import pytest

from swa_repro.cli import main
from swa_repro.notebook import param_types as PT
from swa_repro.notebook.params import notebook_parameters
from swa_repro.notebook.places import NOTEBOOKS_DIR, RESERVED
from swa_repro.notebook.runner import available_notebooks

NOTEBOOKS = available_notebooks(NOTEBOOKS_DIR)


def _defaults(path) -> dict:
    import ast

    import jupytext

    cell = next(c for c in jupytext.read(path).cells if "parameters" in c.metadata.get("tags", []))
    return {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(cell.source).body if isinstance(n, ast.Assign)}


def test_the_table_knows_every_project_notebook():
    assert PT.PROJECT == tuple(p.stem for p in NOTEBOOKS)
    assert PT.declared("00_someone_elses", "seed") is None  # typed by its default instead


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_parameter_is_declared_and_its_default_fits(path):
    defaults = _defaults(path)
    assert set(defaults) == set(notebook_parameters(path))
    for name, default in defaults.items():
        if name in RESERVED:
            continue
        spec = PT.declared(path.stem, name)
        assert spec is not None, f"{path.stem}: parameter {name} has no declared type (notebook/param_types.py)"
        assert spec.problem(default) is None, (path.stem, name, default, spec.problem(default))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_kernels_reading_of_the_parameters_cell_is_jupytexts(path, tmp_path):
    """A notebook's kernel reads its parameters cell without importing jupytext (2 s a run): the same
    names and kinds as jupytext's reading, also for an edited copy (the lab's scratch/), and None
    (ask jupytext) where the file has no such cell."""
    from swa_repro.notebook.params import jupytext_parameters, percent_parameters

    assert percent_parameters(path) == jupytext_parameters(path) is not None
    edited = tmp_path / path.name
    edited.write_text(path.read_text().replace('tags=["parameters"]', 'tags=["parameters", "x"]  title')
                      .replace('\n# %%\n', '\nextra_after_the_cell = 1\n# %%\n', 1) + "\n# %%\nlast = 2\n")
    assert percent_parameters(edited) == jupytext_parameters(edited) == notebook_parameters(edited)
    untagged = tmp_path / "untagged.py"
    untagged.write_text(path.read_text().replace('tags=["parameters"]', ""))
    assert percent_parameters(untagged) is None is jupytext_parameters(untagged) is notebook_parameters(untagged)


# (name, a value of the wrong type, a value out of range or not a choice); None: no such value
WRONG = {
    "window_left": ("abc", -2), "extend_lens": ("[6,8]", [0]), "prefix_lens": (5, [-1]),
    "num_qo_heads": (1.5, 0), "head_dim": ("128", 96), "page_size": (True, 0), "seed": ("x", -1),
    "backend": (3, "fa4"), "gqa_window_left": ([4], -5), "long_extend": ("long", 0),
    "fuzz_selftest_cases": ("4", 10_001), "plot_recordings": ("yes", None), "cases": ("upstream", None),
    "peer": (1, None), "prompts": (1024, []), "live_budget_s": ("300", 0), "live_backends": (["fa2"], "fa1"),
    "sglang_release": (0.5, None), "tile_window_left": ("8", -2), "split_extend": ([64], 0),
}


def _notebook_of(name: str) -> str:
    return next(p.stem for p in NOTEBOOKS if name in notebook_parameters(p))


@pytest.mark.parametrize("name, which", [(n, i) for n, vals in WRONG.items() for i in (0, 1) if vals[i] is not None])
def test_a_wrong_value_is_one_line_exit_2_before_anything_runs(name, which, tmp_path, capsys, monkeypatch):
    import json

    from swa_repro.notebook import runner

    def never(*a, **k):
        raise AssertionError("a notebook ran")

    monkeypatch.setattr(runner, "run_all", never)
    value = WRONG[name][which]
    out = tmp_path / "out"
    assert main(["run", _notebook_of(name), "--output", str(out), "-p", f"{name}={json.dumps(value)}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--parameters {name}:" in err[0] and "expects" in err[0], err
    assert not out.exists()  # nothing ran, nothing was written


def test_a_none_default_still_has_a_type():
    """``window_left = None`` in the cell: None keeps the seed's window, an int sets it, a string is refused."""
    spec = PT.declared("02_masks_and_cta_skips", "window_left")
    assert spec.problem(None) is None and spec.problem(8) is None and spec.problem("8")
    assert PT.declared("04_rerun_checks", "cases").problem([3]) and PT.declared("04_rerun_checks", "cases").problem([]) is None


def test_good_values_pass(tmp_path, monkeypatch):
    from swa_repro.notebook import runner

    ran = []
    monkeypatch.setattr(runner, "run_all", lambda paths, *a, **k: ran.append([p.stem for p in paths]) or [])
    assert main(["run", "02", "--output", str(tmp_path / "o"), "--mode", "model", "-p", "window_left=8",
                 "extend_lens=[6,8,16]", "head_dim=64", "gqa_window_left=None"]) == 0
    assert ran == [["02_masks_and_cta_skips"]]
