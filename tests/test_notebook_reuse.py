"""Issue #42 item 8: `make repro` with nothing changed re-ran every notebook. A headless run whose
inputs (the notebook, its parameters, the mode, the package's code, the committed data, the
installed versions) are those of the last passing run into the same folder reuses that run's set;
any change runs it again."""

from __future__ import annotations

import json

import pytest

from swa_repro.cli import main
from swa_repro.notebook import artifacts

NOTEBOOK = '''# %% tags=["parameters"]
mode = "auto"
output_dir = "out"
threshold = 1

# %%
from swa_repro.notebook.checks import Checks
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode

output_dir = artifact_set("00_reuse", globals())
info = announce_mode(mode, output_dir, "00_reuse")
checks = Checks("00_reuse", output_dir)
checks.expect(threshold > 0, "threshold is positive", threshold=threshold)
checks.close()
'''


@pytest.fixture(scope="module")
def twice(tmp_path_factory):
    """The notebook run, then run again with nothing changed."""
    nb = tmp_path_factory.mktemp("nb")
    (nb / "00_reuse.py").write_text(NOTEBOOK)
    out = tmp_path_factory.mktemp("out")
    argv = ["run", "--mode", "model", "--output", str(out), "--notebooks-dir", str(nb)]
    assert main(argv) == 0
    first = json.loads((out / "summary.json").read_text())["notebooks"][0]
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "summary.json"}
    assert main(argv) == 0
    return nb, out, first, stamp


@pytest.mark.slow
def test_a_second_run_with_nothing_changed_reuses_the_set(twice):
    _, out, first, stamp = twice
    again = json.loads((out / "summary.json").read_text())["notebooks"][0]
    assert first["status"] == "ok" and not first.get("reused") and first["inputs_key"]
    assert again["reused"] is True and again["run_id"] == first["run_id"] and again["inputs_key"] == first["inputs_key"]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "summary.json"} == stamp  # not rewritten
    assert artifacts.problems(out, "00_reuse", again["run_id"]) == []


def _key(nb, **kw):
    args = {"path": nb / "00_reuse.py", "mode": "model", "params": {}} | kw
    return artifacts.inputs_key(**args)


@pytest.mark.slow
def test_any_changed_input_runs_it_again(twice, tmp_path, monkeypatch):
    nb, out, _, _ = twice
    path = nb / "00_reuse.py"
    assert artifacts.reusable(path, out, _key(nb)) is not None
    assert artifacts.reusable(path, out, _key(nb, params={"threshold": 2})) is None  # a parameter
    assert artifacts.reusable(path, out, _key(nb, mode="auto")) is None  # the mode asked for
    edited = tmp_path / "00_reuse.py"
    edited.write_text(NOTEBOOK.replace("threshold > 0", "threshold >= 0"))
    assert artifacts.reusable(edited, out, _key(nb, path=edited)) is None  # the notebook
    from swa_repro.core import cache

    real = cache.code_hash
    monkeypatch.setattr(cache, "code_hash", lambda *a, **k: "changed " + real(*a, **k))  # always another hash
    assert artifacts.reusable(path, out, _key(nb)) is None  # the package's code
    monkeypatch.undo()
    monkeypatch.setattr(artifacts, "_tree_hash", lambda root, dirs: "changed")
    assert artifacts.reusable(path, out, _key(nb)) is None  # recordings/, docs/audit/, benchmarks/
    monkeypatch.undo()
    monkeypatch.setattr(artifacts, "_versions", lambda: {"torch": "0"})
    assert artifacts.reusable(path, out, _key(nb)) is None  # the installed versions


@pytest.mark.slow
def test_a_spoilt_or_failed_set_is_not_reused(twice, tmp_path):
    nb, out, _, _ = twice
    path = nb / "00_reuse.py"
    spoilt = tmp_path / "spoilt"
    spoilt.mkdir()
    for p in out.iterdir():
        (spoilt / p.name).write_bytes(p.read_bytes())
    assert artifacts.reusable(path, spoilt, _key(nb)) is not None
    (spoilt / "00_reuse.checks.json").write_text('{"run_id": "another"}')
    assert artifacts.reusable(path, spoilt, _key(nb)) is None
    summary = json.loads((out / "summary.json").read_text())
    summary["notebooks"][0]["status"] = "failed"
    (spoilt / "summary.json").write_text(json.dumps(summary))
    (spoilt / "00_reuse.checks.json").write_bytes((out / "00_reuse.checks.json").read_bytes())
    assert artifacts.reusable(path, spoilt, _key(nb)) is None
