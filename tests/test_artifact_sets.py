"""Artifact sets (issue 24): every run of a notebook writes one consistent set that records its
parameters, and a run in the lab (no papermill, no injected run_id) never writes into the set of
`swa-repro run` / `make repro`, even pointed at the same folder with other parameters."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from swa_repro.cli import main
from swa_repro.notebook import artifacts, runner
from swa_repro.notebook.checks import Checks
from swa_repro.notebook.places import NOTEBOOKS_DIR

NB = "00_overview"


def _tree(root: Path, skip: str | None = None) -> dict[str, str]:
    """sha256 of every file under ``root`` (but the ``skip`` subfolder), by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not (skip and p.relative_to(root).parts[0] == skip)}


# ----------------------------------------------------------------------------- the consistency check
@pytest.fixture
def one_set(tmp_path):
    """A set as a kernel writes it: params first, then the mode record, checks and a figure."""
    artifacts.start(tmp_path, "07_demo", "RUN-A", artifacts.HEADLESS, {"mode": "model", "window_left": 8})
    runner.announce_mode("model", tmp_path, "07_demo")
    with Checks("07_demo", tmp_path) as checks:
        checks.expect(True, "a check")
    (tmp_path / "07_demo_fig.png").write_bytes(b"\x89PNG fake")
    artifacts.add_figure(tmp_path / "07_demo_fig.png")
    return tmp_path


def test_a_set_as_written_is_consistent(one_set):
    rec = artifacts.read(one_set, "07_demo")
    assert rec["run_id"] == "RUN-A" and rec["parameters"] == {"mode": "model", "window_left": 8}
    assert list(rec["figures"]) == ["07_demo_fig.png"]
    for name in ("07_demo.mode.json", "07_demo.checks.json"):
        assert json.loads((one_set / name).read_text())["run_id"] == "RUN-A"
    assert artifacts.problems(one_set, "07_demo") == []
    assert artifacts.problems(one_set, "07_demo", "RUN-A") == []


@pytest.mark.parametrize("spoil, expect", [
    (lambda d: (d / "07_demo_other.png").write_bytes(b"x"), "07_demo_other.png is not from run RUN-A"),
    (lambda d: (d / "07_demo_fig.png").write_bytes(b"y"), "07_demo_fig.png changed since run RUN-A"),
    (lambda d: (d / "07_demo_fig.png").unlink(), "07_demo_fig.png of run RUN-A is missing"),
    (lambda d: (d / "07_demo.checks.json").write_text('{"run_id": "RUN-B"}'), "07_demo.checks.json is from run RUN-B"),
    (lambda d: (d / "07_demo.mode.json").unlink(), "07_demo.mode.json is missing"),
    (lambda d: (d / "07_demo.html").write_text("<html>RUN-B</html>"), "07_demo.html is not from run RUN-A"),
    (lambda d: (d / "07_demo.ipynb").write_text(json.dumps(
        {"metadata": {"papermill": {"parameters": {"run_id": "RUN-A", "window_left": 4}}}})),
     "07_demo.ipynb ran with window_left=4, 07_demo.params.json says 8"),
    (lambda d: (d / "07_demo.params.json").unlink(), "07_demo.params.json is missing"),
])
def test_a_file_of_another_run_is_named(one_set, spoil, expect):
    """What issue 24 saw (02's HTML from one run, its PNGs and checks from another) is caught."""
    spoil(one_set)
    assert any(p.startswith(expect) for p in artifacts.problems(one_set, "07_demo")), \
        artifacts.problems(one_set, "07_demo")


def test_the_runner_checks_the_run_id_it_injected(one_set):
    assert artifacts.problems(one_set, "07_demo", "RUN-B") == ["07_demo.params.json is from run RUN-A, not this run (RUN-B)"]


def test_interactive_folder_is_one_per_case():
    a = artifacts.interactive_folder("/x", NB, {"mode": "model", "window_left": 8, "output_dir": "artifacts"})
    b = artifacts.interactive_folder("/x", NB, {"mode": "model", "window_left": 8, "output_dir": "/elsewhere"})
    c = artifacts.interactive_folder("/x", NB, {"mode": "model", "window_left": 4, "output_dir": "artifacts"})
    assert a == b != c and a.parent == Path("/x/interactive") and re.fullmatch(rf"{NB}-[0-9a-f]{{12}}", a.name)


# ----------------------------------------------------------------------------- a real notebook, both ways
@pytest.mark.slow
def test_interactive_run_leaves_the_headless_set_byte_identical(tmp_path):
    """`swa-repro run 00` writes a headless set; then the lab's way (the notebook's own cells in a
    kernel, no papermill: a scratch copy with window_left = 8 and output_dir the very same folder)
    runs it again. The headless set is byte for byte as it was, and each set's recorded parameters
    match its contents."""
    nbclient = pytest.importorskip("nbclient")
    jupytext = pytest.importorskip("jupytext")
    from swa_repro.notebook import scratch

    art = tmp_path / "artifacts"
    assert main(["run", NB, "--mode", "model", "--output", str(art)]) == 0
    summary = json.loads((art / "summary.json").read_text())
    [entry] = summary["notebooks"]
    # the suite's one headless run of notebook 00 also holds what test_story's runs hold of 01 and 02: it says
    # its mode, passes its checks, saves its figures and shows them inline
    assert entry["status"] == "ok" and entry["mode"] == "model", entry.get("error")
    assert entry["checks_failed"] == 0 and entry["checks_passed"] >= 2
    assert entry["figures"] and all((art / f).stat().st_size > 10_000 for f in entry["figures"])
    html = (art / f"{NB}.html").read_text()
    assert "Mode: model" in html and "data:image/png;base64" in html
    headless = _tree(art)
    assert f"{NB}.params.json" in headless and f"{NB}.html" in headless

    # the headless set: its parameters are the notebook's cell with what the runner injected
    rec = artifacts.read(art, NB)
    assert rec["run"] == "headless" and rec["run_id"] == entry["run_id"]
    assert rec["parameters"] == entry["parameters"]
    assert rec["parameters"]["window_left"] is None and rec["parameters"]["mode"] == "model"
    assert rec["parameters"]["output_dir"] == str(art)
    injected = json.loads((art / f"{NB}.ipynb").read_text())["metadata"]["papermill"]["parameters"]
    assert injected == {"mode": "model", "output_dir": str(art), "run_id": entry["run_id"]}
    assert sorted(rec["figures"]) == entry["figures"] and entry["figures"]
    assert artifacts.problems(art, NB, entry["run_id"]) == []

    # the lab: make lab's scratch copy, its parameters cell edited, every cell run in a kernel
    lab = tmp_path / "scratch"
    scratch.sync(NOTEBOOKS_DIR, lab)
    src = (lab / f"{NB}.py").read_text()
    edited = re.sub(r'(?m)^mode = "auto"', 'mode = "model"', src)
    edited = re.sub(r'(?m)^output_dir = "artifacts"', f'output_dir = "{art}"', edited)
    edited = re.sub(r"(?m)^window_left = None$", "window_left = 8", edited)
    assert edited.count("\n") == src.count("\n") and edited != src
    (lab / f"{NB}.py").write_text(edited)
    nb = jupytext.read(lab / f"{NB}.py")
    nbclient.NotebookClient(nb, kernel_name=runner.ensure_kernel(), timeout=600,
                            resources={"metadata": {"path": str(lab)}}).execute()
    assert not any("injected-parameters" in c.metadata.get("tags", []) for c in nb.cells)  # no papermill

    assert _tree(art, skip="interactive") == headless, "the interactive run wrote into the headless set"
    assert artifacts.problems(art, NB, entry["run_id"]) == []
    [folder] = (art / "interactive").iterdir()
    rec8 = artifacts.read(folder, NB)
    assert folder == artifacts.interactive_folder(art, NB, rec8["parameters"])
    assert rec8["run"] == "interactive" and rec8["run_id"] != entry["run_id"]
    assert rec8["parameters"] == {**rec["parameters"], "window_left": 8}
    assert artifacts.problems(folder, NB) == []
    assert sorted(rec8["figures"]) == entry["figures"]  # the same figures, of another case
    assert json.loads((folder / f"{NB}.checks.json").read_text())["run_id"] == rec8["run_id"]
    bug = f"{NB}_seed_bug.png"
    assert rec8["figures"][bug] != rec["figures"][bug], "window 8 drew the same mask as window 4"
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert f"Interactive run: files in {folder}" in printed
    assert sorted(p.name for p in lab.iterdir()) == sorted([f.name for f in scratch.tracked_files(NOTEBOOKS_DIR)]
                                                          + [scratch.MANIFEST]), "wrote into the kernel's cwd"


def test_only_the_runners_run_id_writes_the_headless_set(tmp_path, capsys):
    """With the run_id papermill injects: the folder itself. Without one (the lab), or with the
    run_id of a set already there (an executed .ipynb run again in a kernel): a folder of its own."""
    ns = {"mode": "model", "output_dir": str(tmp_path), "run_id": "RUN-H"}
    assert artifacts.artifact_set("07_demo", dict(ns)) == tmp_path
    assert artifacts.read(tmp_path, "07_demo")["run"] == "headless" and capsys.readouterr().out == ""
    again = artifacts.artifact_set("07_demo", dict(ns))
    assert again.parent == tmp_path / "interactive" and artifacts.read(again, "07_demo")["run_id"] != "RUN-H"
    assert artifacts.read(tmp_path, "07_demo")["run_id"] == "RUN-H"  # the headless record is untouched
    lab = artifacts.artifact_set("07_demo", {"mode": "model", "output_dir": str(tmp_path)})
    assert lab == again and artifacts.read(lab, "07_demo")["run"] == "interactive"
    assert capsys.readouterr().out.splitlines()[-1] == f"Interactive run: files in {lab} (07_demo.params.json has " \
                                                      f"the parameters); {tmp_path} itself is make repro's"


def test_papermill_is_not_told_that_run_id_is_unknown():
    import logging

    def record(name):
        return logging.LogRecord("papermill", logging.WARNING, "", 0, "Passed unknown parameter: %s", (name,), None)

    assert not artifacts.KnownRunId().filter(record("run_id"))
    assert artifacts.KnownRunId().filter(record("threshold"))
