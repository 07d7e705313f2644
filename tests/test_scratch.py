"""`make lab` opens scratch/, a git-ignored copy of notebooks/ brought up to date without ever
discarding an edit (issue 24: an edited parameters cell was autosaved into the tracked .py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from swa_repro.notebook import scratch

REPO = Path(__file__).resolve().parents[1]
A, B = "00_alpha.py", "01_beta.py"


@pytest.fixture
def dirs(tmp_path):
    src, dst = tmp_path / "notebooks", tmp_path / "scratch"
    src.mkdir()
    (src / A).write_text("a = 1\n")
    (src / B).write_text("b = 1\n")
    (src / "jupytext.toml").write_text('formats = "py:percent"\n')
    (src / "helper.py").write_text("# not a notebook\n")
    return src, dst


def actions(src, dst) -> dict[str, str]:
    return {f: a for f, a, _ in scratch.sync(src, dst)}


def test_first_sync_copies_the_notebooks_and_the_jupytext_config(dirs):
    src, dst = dirs
    assert actions(src, dst) == {A: "copied", B: "copied", "jupytext.toml": "copied"}
    assert sorted(p.name for p in dst.iterdir()) == sorted([A, B, "jupytext.toml", scratch.MANIFEST])
    assert (dst / A).read_text() == "a = 1\n"
    assert actions(src, dst) == {A: "same", B: "same", "jupytext.toml": "same"}


def test_an_unedited_copy_follows_the_tracked_notebook(dirs):
    src, dst = dirs
    scratch.sync(src, dst)
    (src / A).write_text("a = 2\n")  # e.g. git pull
    assert actions(src, dst)[A] == "refreshed"
    assert (dst / A).read_text() == "a = 2\n"


def test_an_edited_copy_is_never_discarded(dirs):
    src, dst = dirs
    scratch.sync(src, dst)
    (dst / A).write_text("a = 1\nwindow_left = 8\n")  # the user's edit, saved by the lab
    assert actions(src, dst)[A] == "kept"
    (src / A).write_text("a = 2\n")  # and then the tracked notebook changes too
    [(_, action, why)] = [r for r in scratch.sync(src, dst) if r[0] == A]
    assert action == "kept" and (dst / A).read_text() == "a = 1\nwindow_left = 8\n"
    assert "changed since it was copied" in why and "diff " in why and "delete" in why
    assert (src / A).read_text() == "a = 2\n"  # the tracked one is never written either
    # the user deletes the copy to take the new one
    (dst / A).unlink()
    assert actions(src, dst)[A] == "copied" and (dst / A).read_text() == "a = 2\n"


def test_an_edit_equal_to_the_tracked_notebook_counts_as_unedited(dirs):
    src, dst = dirs
    scratch.sync(src, dst)
    (dst / A).write_text("a = 3\n")
    (src / A).write_text("a = 3\n")  # the same change committed
    assert actions(src, dst)[A] == "same"
    (src / A).write_text("a = 4\n")
    assert actions(src, dst)[A] == "refreshed" and (dst / A).read_text() == "a = 4\n"


def test_copies_without_a_record_are_kept_unless_identical(dirs):
    """A scratch folder from before the record (or a hand-made one): identical files are adopted,
    different ones kept as the user's."""
    src, dst = dirs
    dst.mkdir()
    (dst / A).write_text("a = 1\n")
    (dst / B).write_text("b = 99\n")
    (dst / "mine.py").write_text("x = 1\n")
    (dst / "09_gone.py").write_text("g = 1\n")
    got = {f: (a, why) for f, a, why in scratch.sync(src, dst)}
    assert got[A][0] == "same" and got[B][0] == "kept" and "did not copy it" in got[B][1]
    assert (dst / B).read_text() == "b = 99\n" and (dst / "mine.py").exists() and (dst / "09_gone.py").exists()
    assert json.loads((dst / scratch.MANIFEST).read_text())["files"].keys() == {A, "jupytext.toml"}


def test_a_broken_record_is_no_record(dirs):
    src, dst = dirs
    scratch.sync(src, dst)
    (dst / A).write_text("edited\n")
    (dst / scratch.MANIFEST).write_text("{not json")
    assert actions(src, dst)[A] == "kept" and (dst / A).read_text() == "edited\n"


def test_the_tracked_folder_itself_is_left_alone(dirs):
    src, _ = dirs
    before = sorted(p.name for p in src.iterdir())
    assert scratch.sync(src, src) == []
    assert sorted(p.name for p in src.iterdir()) == before
    assert "opening the tracked" in scratch.report(src, src, [])[0]


def test_main_prints_where_the_lab_opens_and_what_it_kept(dirs, capsys, monkeypatch):
    src, dst = dirs
    monkeypatch.chdir(src.parent)
    assert scratch.main([str(src), str(dst)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("make lab: opening scratch/, your git-ignored copy of notebooks/; a save")
    assert out[1] == f"  copied 3 file(s): {A}, {B}, jupytext.toml"
    (dst / B).write_text("b = 2\n")
    (src / B).write_text("b = 3\n")
    assert scratch.main([str(src), str(dst)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [f"  kept {B}: your edits; notebooks/{B} changed since it was copied: diff notebooks/{B} "
                       f"scratch/{B} (delete scratch/{B} to take the tracked one)"]
    assert scratch.main([str(src / "nope"), str(dst)]) == 2


def test_make_lab_syncs_scratch_then_opens_it():
    dry = subprocess.run(["make", "-s", "-n", "-C", str(REPO), "lab", "LAB_STATE=/nonexistent"],
                         capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    sync = next(i for i, ln in enumerate(dry) if "-m swa_repro.notebook.scratch 'notebooks' 'scratch'" in ln)
    lab = next(i for i, ln in enumerate(dry) if "/jupyter lab" in ln)
    assert sync < lab and "--ServerApp.root_dir='scratch'" in dry[lab]


def test_scratch_is_git_ignored():
    assert re.search(r"(?m)^/scratch/$", (REPO / ".gitignore").read_text())


def test_lab_page_says_what_a_save_and_a_run_in_the_lab_write():
    """The lab's page (docs/lab.md, linked from the README's "Where to go next") says it."""
    text = " ".join((REPO / "docs" / "lab.md").read_text().split())
    assert "**What a save does.** `make lab` opens `scratch/`, your own copy of `notebooks/`, which git ignores" in text
    assert "never a tracked notebook" in text and "never discards an edit" in text
    assert "`artifacts/interactive/<notebook>-<hash of the parameters>/`" in text
