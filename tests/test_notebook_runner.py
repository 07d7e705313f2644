"""`swa-repro run` for real: throwaway jupytext notebooks through papermill on the venv's kernel."""

from __future__ import annotations

import json
import re
import sys

import pytest

from swa_repro.cli import main
from swa_repro.core.errors import UsageError
from swa_repro.notebook import artifacts
from swa_repro.notebook.params import check_parameters, declared, describe, fits, infer
from swa_repro.notebook.places import RESERVED
from swa_repro.notebook.run_summary import longest_first
from swa_repro.notebook.runner import parse_parameters, select_notebooks

HEADER = '''# %% [markdown]
# Throwaway notebook for the runner's tests.

# %% tags=["parameters"]
mode = "auto"
output_dir = "out"
threshold = 1

# %%
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from swa_repro.notebook import plots
from swa_repro.notebook.checks import Checks
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode, figure_saver, save_figure

output_dir = artifact_set(NAME, globals())
info = announce_mode(mode, output_dir, NAME)
checks = Checks(NAME, output_dir)
'''

PASSING = HEADER.replace("NAME", '"00_pass"') + '''
# %%
fig, ax = plt.subplots()
ax.plot([0, 1], [1, 0])
plots.publish(fig, "00_pass_line", figure_saver(output_dir))
checks.expect(1 + 1 == 2, "arithmetic")
checks.expect(isinstance(threshold, int), "threshold is an int", threshold=threshold)
checks.close()
'''

FAILING = HEADER.replace("NAME", '"01_fail"') + '''
# %%
checks.expect(True, "a check that passes")
checks.expect(threshold > 5, "threshold above 5", threshold=threshold)
checks.close()

# %%
print("never reached")
'''


@pytest.fixture(scope="module")
def nb_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("notebooks")
    (d / "00_pass.py").write_text(PASSING)
    (d / "01_fail.py").write_text(FAILING)
    (d / "helper.py").write_text("# not a notebook: no NN_ prefix\n")
    return d


@pytest.fixture(scope="module")
def both_run(nb_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("artifacts")
    rc = main(["run", "--mode", "model", "--output", str(out), "--notebooks-dir", str(nb_dir)])
    return rc, out, json.loads((out / "summary.json").read_text())


def test_failed_run_exits_nonzero_and_summary_is_right(both_run):
    rc, out, summary = both_run
    assert rc == 1
    assert summary["ok"] is False and summary["failed"] == ["01_fail"]
    assert summary["mode_requested"] == "model" and summary["mode"] == "model"
    by = {r["notebook"]: r for r in summary["notebooks"]}
    assert list(by) == ["00_pass", "01_fail"]  # in order; helper.py is not a notebook

    ok = by["00_pass"]
    assert (ok["status"], ok["error"], ok["mode"]) == ("ok", None, "model")
    assert (ok["checks_passed"], ok["checks_failed"]) == (2, 0)
    assert ok["figures"] == ["00_pass_line.png"]
    assert ok["seconds"] > 0

    bad = by["01_fail"]
    assert bad["status"] == "failed" and bad["mode"] == "model"
    assert (bad["checks_passed"], bad["checks_failed"]) == (1, 1)
    assert bad["error"].startswith("AssertionError: 1 of 2 checks failed in 01_fail: threshold above 5")


def test_artifacts_written_even_for_the_failed_notebook(both_run):
    _, out, _ = both_run
    for name in ("00_pass", "01_fail"):
        nb = json.loads((out / f"{name}.ipynb").read_text())
        assert nb["metadata"]["papermill"]["parameters"]["mode"] == "model"
        assert (out / f"{name}.html").read_text().lstrip().lower().startswith("<!doctype html")
    assert (out / "00_pass_line.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_figure_is_one_png_linked_from_the_notebook_and_its_html(both_run):
    """Lean artifacts: the figure is stored once, as the PNG; the .ipynb and the .html link it."""
    _, out, _ = both_run
    nb_text = (out / "00_pass.ipynb").read_text()
    assert "image/png" not in nb_text and '<img src=\\"00_pass_line.png\\"' in nb_text
    html = (out / "00_pass.html").read_text()
    assert re.search(r'<img [^>]*src="00_pass_line.png"', html) and "data:image/png;base64,iVBOR" not in html.split("<body")[1]
    cells = json.loads((out / "01_fail.ipynb").read_text())["cells"]
    failing = next(c for c in cells if "threshold above 5" in "".join(c["source"]))
    text = json.dumps(failing["outputs"])
    assert "FAIL threshold above 5" in text and "AssertionError" in text
    after = next(c for c in cells if "never reached" in "".join(c["source"]))
    assert after["outputs"] == [] and after["execution_count"] is None  # execution stopped at the failure


def test_each_set_records_its_run_and_parameters(both_run):
    """Every notebook's files in the output folder are one run's, and say with what parameters:
    NN.params.json (the cell's names, with the values injected), its summary.json entry, the
    .ipynb's injected parameters, the mode and checks records, the figures."""
    _, out, _ = both_run
    summary = json.loads((out / "summary.json").read_text())  # as on disk now (another test may rerun 01)
    for r in summary["notebooks"]:
        rec = artifacts.read(out, r["notebook"])
        assert rec["run"] == "headless" and rec["run_id"] == r["run_id"] and r["params"] == f"{r['notebook']}.params.json"
        assert rec["parameters"] == r["parameters"]
        assert rec["parameters"] == {"mode": "model", "output_dir": str(out),
                                     "threshold": summary["parameters"].get("threshold", 1)}  # the cell's, or -p's
        assert artifacts.problems(out, r["notebook"], r["run_id"]) == []
    assert json.loads((out / "00_pass.params.json").read_text())["figures"].keys() == {"00_pass_line.png"}


def test_kernel_is_this_interpreter(both_run):
    """The kernelspec the runner installs runs the venv's own python, not some other `python3`."""
    _, out, summary = both_run
    assert {r["kernel_python"] for r in summary["notebooks"]} == {sys.executable}
    assert json.loads((out / "00_pass.mode.json").read_text())["python"] == sys.executable


def test_parameters_reach_the_notebook_and_rerun_replaces_results(both_run, nb_dir, capsys):
    _, out, _ = both_run
    rc = main(["run", "--mode", "model", "--output", str(out), "--notebooks-dir", str(nb_dir),
               "01", "--parameters", "threshold=10"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    [r] = summary["notebooks"]
    assert (r["notebook"], r["status"], r["checks_passed"], r["checks_failed"]) == ("01_fail", "ok", 2, 0)
    assert summary["parameters"] == {"threshold": 10}
    line = [ln for ln in capsys.readouterr().out.splitlines() if "01_fail" in ln and "[1/1]" in ln]
    assert line and "ok" in line[0] and line[0].rstrip().endswith("s")  # one progress line with its time


def test_unknown_notebook_lists_the_available_ones(nb_dir, tmp_path, capsys):
    rc = main(["run", "--output", str(tmp_path), "--notebooks-dir", str(nb_dir), "07_nope"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err == "swa-repro run: error: unknown notebook '07_nope': choose from 00_pass, 01_fail"
    assert not (tmp_path / "summary.json").exists()


def test_select_and_parse(nb_dir):
    assert [p.stem for p in select_notebooks(["01_fail.py", "00", "01_fail"], nb_dir)] == ["01_fail", "00_pass"]
    assert parse_parameters(["a=4", "b=1.5", "c=true", "d=[1,2]", "e=fa2", "f=", "g=True", "h=None"]) == \
        {"a": 4, "b": 1.5, "c": True, "d": [1, 2], "e": "fa2", "f": "", "g": True, "h": None}


@pytest.mark.parametrize("bad, msg", [(["nokey"], "name=value"), (["mode=live"], "--mode"),
                                      (["output_dir=x"], "--output")])
def test_bad_parameters(bad, msg, nb_dir, tmp_path, capsys):
    rc = main(["run", "--output", str(tmp_path), "--notebooks-dir", str(nb_dir), "--parameters", *bad])
    assert rc == 2
    assert msg in capsys.readouterr().err


def test_jobs_must_be_positive(nb_dir, tmp_path, capsys):
    assert main(["run", "--output", str(tmp_path), "--notebooks-dir", str(nb_dir), "--jobs", "0"]) == 2
    assert "--jobs must be in 1.." in capsys.readouterr().err


# ----------------------------------------------------------------------------- --parameters types (issue 17)
@pytest.mark.parametrize("default, kind", [
    ("0", "int"), ("0.5", "float"), ("True", "bool"), ('"x"', "str"), ("None", "any value"), ("{}", "dict"),
    ("[1, 2]", "a list of int"), ("(1, 2.5)", "a list of float"), ("[]", "a list"), ('[1, "a"]', "a list"),
    ("[[1], [2]]", "a list of a list of int"), ("f(3)", "any value")])
def test_kind_is_inferred_from_the_default_literal(default, kind):
    assert describe(declared(f"x = {default}\n", "nb")["x"]) == kind


@pytest.mark.parametrize("value, default, ok", [
    (3, 0, True), (True, 0, False), (1.5, 0, False), ("3", 0, False),  # int: not bool, float or str
    (3, 0.5, True), (False, 0.5, False),  # an int is a float
    (1, True, False), (True, True, True), ("x", "s", True), (None, "s", False),
    ([1, 2], [0], True), ([1, "a"], [0], False), ([], [0], True), (3, [0], False),
    ("anything", None, True), ([1.5], None, True)])
def test_values_fit_the_default_type(value, default, ok):
    assert fits(value, infer(default)) is ok


def test_wrong_type_names_notebook_parameter_type_and_the_parameters(nb_dir, tmp_path):
    """Checked against every selected notebook before any starts: one line, nothing written."""
    out = tmp_path / "never"
    with pytest.raises(UsageError) as e:
        check_parameters({"threshold": "ten"}, select_notebooks([], nb_dir), RESERVED)
    msg = str(e.value)
    assert msg.startswith("--parameters threshold: notebook 00_pass expects int;") and "\n" not in msg
    assert msg.endswith("its parameters: threshold")  # mode and output_dir are set by --mode/--output
    assert main(["run", "--output", str(out), "--notebooks-dir", str(nb_dir), "-p", "threshold=ten"]) == 2
    assert not out.exists()


def test_good_parameters_pass_every_notebook(nb_dir):
    check_parameters({"threshold": 7}, select_notebooks([], nb_dir), RESERVED)
    check_parameters({}, [nb_dir / "helper.py"], RESERVED)  # nothing to check: no cell is read


def test_longest_first_uses_the_last_run_and_keeps_unknown_ones_in_place(tmp_path):
    paths = [tmp_path / f"{n}.py" for n in ("00_a", "01_b", "02_c", "03_d")]
    assert longest_first(paths, tmp_path) == [0, 1, 2, 3]  # no earlier run: as given
    runs = [{"notebook": "01_b", "seconds": 5.0}, {"notebook": "02_c", "seconds": 40.0}]
    (tmp_path / "summary.json").write_text(json.dumps({"notebooks": runs}))
    assert longest_first(paths, tmp_path) == [2, 1, 0, 3]
