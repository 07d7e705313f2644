"""Issue 43 B: nothing is written through a link, into the checkout's committed files (``docs/``,
``recordings/``, ``notebooks/``, the checkout itself) or over a fuller table, unless named with
``--force``; an interrupted ``run`` leaves its set marked interrupted. And its C items of the same
kind: a table's ``--out`` checked before any audit, an empty ``--vllm`` list, a ``--source`` that is
no regular file, a scratch folder that cannot be one.

Each refusal is one line, exit 2, and the target (a link's target too) byte-identical afterwards
(``test_hostile_input.refused``'s snapshot). No release is installed or audited: the audits are
stand-ins that fail the test if called.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_hostile_input import refused, snapshot

from swa_repro.cli import main
from swa_repro.core import cache as core_cache
from swa_repro.core import outputs

REPO = Path(__file__).resolve().parents[1]


def _never(*a, **k):
    raise AssertionError("no work may start for a refused output")


@pytest.fixture
def linked(tmp_path):
    """``out/x.EXT`` links to ``victim/x.EXT``, a file whose bytes must survive."""
    victim, out = tmp_path / "victim", tmp_path / "out"
    victim.mkdir()
    out.mkdir()

    def make(ext: str) -> Path:
        (victim / f"x{ext}").write_bytes(b"keep me\n")
        (out / f"x{ext}").symlink_to(victim / f"x{ext}")
        return out / f"x{ext}"
    return make


# ----------------------------------------------------------------------------- links
@pytest.mark.parametrize("ext", [".json", ".npz"])
def test_mask_out_onto_a_link_is_refused(linked, tmp_path, capfd, ext):
    link = linked(ext)
    refused(capfd, ["mask", "--window-left", "4", "--prefix-lens", "0", "--extend-lens", "8", "--out", link], "is a symbolic link",
            tmp_path)
    assert link.is_symlink() and (tmp_path / "victim" / f"x{ext}").read_bytes() == b"keep me\n"


def test_mask_writes_through_the_one_writer(tmp_path, capfd):
    """An existing regular file is replaced whole (a new inode: a hard link elsewhere keeps its bytes)."""
    out, other = tmp_path / "m.json", tmp_path / "hard.json"
    out.write_bytes(b"old\n")
    os.link(out, other)
    assert main(["mask", "--window-left", "4", "--prefix-lens", "0", "--extend-lens", "8", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["requests"] and other.read_bytes() == b"old\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_fuzz_report_onto_a_link_is_refused(linked, tmp_path, capfd, monkeypatch):
    from swa_repro.evidence import fuzz

    monkeypatch.setattr(fuzz, "_finish", _never)
    link = linked(".json")
    refused(capfd, ["fuzz", "--mode", "model", "--cases", "1", "--report", link], "is a symbolic link", tmp_path)


# ----------------------------------------------------------------------------- committed folders
@pytest.fixture
def no_run(monkeypatch):
    from swa_repro.notebook import runner

    monkeypatch.setattr(runner, "run_all", _never)
    monkeypatch.setattr(runner, "ensure_kernel", _never)
    return runner


def test_run_output_into_committed_evidence_is_refused(no_run, capfd):
    live = REPO / "docs" / "live"
    if not live.is_dir():
        pytest.skip("no docs/live in this checkout")
    refused(capfd, ["run", "00", "--mode", "model", "--output", live], "--force", live)


def test_run_output_through_a_link_to_notebooks_is_refused(no_run, tmp_path, capfd):
    (tmp_path / "nb").symlink_to(REPO / "notebooks")
    before = snapshot(REPO / "notebooks")
    refused(capfd, ["run", "00", "--mode", "model", "--output", tmp_path / "nb"], "notebooks/", tmp_path)
    refused(capfd, ["run", "00", "--mode", "model", "--output", REPO], "the project's checkout", tmp_path)
    assert snapshot(REPO / "notebooks") == before


def test_run_force_writes_a_committed_folder_when_asked(monkeypatch, tmp_path, capfd):
    """``--force`` lifts the refusal (a stand-in checkout: the real docs/ stays untouched)."""
    from swa_repro.notebook import runner

    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "docs" / "live").mkdir(parents=True)
    monkeypatch.setattr(outputs, "REPO", tmp_path)
    monkeypatch.setattr(runner, "run_all", lambda paths, *a, **k: [])
    argv = ["run", "00", "--mode", "model", "--output", tmp_path / "docs" / "live"]
    refused(capfd, argv, "--force", tmp_path)
    assert main([str(a) for a in [*argv, "--force"]]) == 0
    assert json.loads((tmp_path / "docs" / "live" / "summary.json").read_text())["status"] == "done"


# ----------------------------------------------------------------------------- GPU evidence commands
def test_record_defaults_to_a_git_ignored_folder():
    from swa_repro.cli import build_parser

    out = build_parser(["record"]).parse_args(["record"]).out
    assert outputs.tracked_reason(out) is None and "artifacts" in Path(out).parts, out


def test_record_into_recordings_needs_force(tmp_path, capfd):
    """Refused before CUDA is asked for; ``--force`` passes the check (then this CPU has no GPU)."""
    rec = REPO / "recordings"
    refused(capfd, ["record", "--cases", "all", "--out", rec], "--force", rec)
    (tmp_path / "rec").symlink_to(rec)
    refused(capfd, ["record", "--out", tmp_path / "rec"], "recordings/", rec)
    line = refused(capfd, ["record", "--out", rec, "--force"], "CUDA", rec)
    assert "--force" not in line


@pytest.mark.parametrize("argv", [
    ["--mode", "live", "--out", "recordings/fuzz/0.7.2"],
    ["--mode", "selftest", "--out", "recordings/fuzz/selftest"],
    ["--mode", "selftest", "--report", "docs/fuzz.report.json"],
    ["--mode", "model", "--report", "recordings/fuzz/replay.report.json"],
])
def test_fuzz_into_committed_folders_needs_force(monkeypatch, capfd, argv):
    from swa_repro.evidence import fuzz

    for name in ("_live", "_replay", "_device"):
        monkeypatch.setattr(fuzz, name, _never)
    monkeypatch.chdir(REPO)
    refused(capfd, ["fuzz", "--cases", "1", *argv], "--force", REPO / "recordings")


def test_fuzz_live_defaults_to_a_git_ignored_folder(monkeypatch, tmp_path):
    """No ``--out``: the live run's recording goes under artifacts/, not the committed recordings/fuzz/."""
    from swa_repro.evidence import fuzz

    def device(a):
        a.installed_flashinfer = "0.7.2"
        return "0.7.2", 132, (9, 0)
    seen = {}

    def store(cases, probe_fn, stem, doc, **k):
        seen["stem"] = stem
        raise KeyboardInterrupt
    monkeypatch.setattr(fuzz, "_device", device)
    monkeypatch.setattr(fuzz, "_prebuild", lambda *a: {"modules": {}, "seconds_total": 0, "cpu_seconds": 0})
    monkeypatch.setattr(fuzz, "run_and_store", store)
    assert main(["fuzz", "--mode", "live", "--cases", "1", "--backends", "fa2"]) == 130
    assert outputs.tracked_reason(seen["stem"].parent) is None and "artifacts" in seen["stem"].parts, seen
    assert "--force" in (REPO / "scripts" / "gpu_fuzz.sh").read_text()  # the script names recordings/ with --force
    assert "--out recordings --force" in (REPO / "scripts" / "gpu_evidence.sh").read_text()


@pytest.mark.parametrize("argv", [
    ["mask", "--window-left", "4", "--prefix-lens", "0", "--extend-lens", "8", "--out", "docs/m.json"],
    ["mask", "--window-left", "4", "--prefix-lens", "0", "--extend-lens", "8", "--out", "recordings/m.npz"],
    ["replay", "nothing.pt", "--out", "recordings/replay/r.json"],
    ["sglang-check", "--mode", "model", "--trace-dir", "recordings/traces"],
])
def test_other_writers_into_committed_folders_need_force(monkeypatch, capfd, argv):
    monkeypatch.chdir(REPO)
    refused(capfd, argv, "--force", REPO / Path(argv[-1]).parts[0])


def test_mask_force_writes_a_committed_folder_when_asked(monkeypatch, tmp_path, capfd):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(outputs, "REPO", tmp_path)
    argv = ["mask", "--window-left", "4", "--prefix-lens", "0", "--extend-lens", "8", "--out", tmp_path / "docs" / "m.json"]
    refused(capfd, argv, "--force", tmp_path)
    assert main([str(a) for a in [*argv, "--force"]]) == 0 and (tmp_path / "docs" / "m.json").is_file()


@pytest.mark.parametrize("argv", [
    ["mask", "--window-left", "4", "--prefix-lens", "0", "--extend-lens", "8", "--out", "FIFO.json"],
    ["replay", "nothing.pt", "--out", "FIFO.json"],
    ["fuzz", "--mode", "model", "--report", "FIFO.json"],
    ["patch", "apply", "--source", "SRC", "--out", "FIFO.json", "--force"],
])
def test_an_output_that_is_a_pipe_or_device_is_refused(tmp_path, capfd, argv, monkeypatch):
    """``os.replace`` put a regular file in a pipe's place (as root, ``--out /dev/null --force`` would
    replace the device node); refused, ``--force`` or not."""
    from swa_repro.evidence import fuzz

    monkeypatch.setattr(fuzz, "_replay", _never)
    fifo = tmp_path / "FIFO.json"
    os.mkfifo(fifo)
    (tmp_path / "SRC").write_text("x = 1\n")
    argv = [str(tmp_path / a) if a in ("FIFO.json", "SRC") else a for a in argv]
    (tmp_path / "kept").mkdir()  # the snapshot reads every file: a pipe would block it
    refused(capfd, argv, "is not a regular file", tmp_path / "kept")
    assert fifo.exists() and not fifo.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["FIFO.json", "SRC",
                                                                                                   "kept"]


def test_patch_apply_out_into_committed_folders_needs_force(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(REPO)
    (tmp_path / "SRC").write_text("x = 1\n")
    refused(capfd, ["patch", "apply", "--source", tmp_path / "SRC", "--out", "docs/patched.py"], "--force",
            REPO / "docs")


# ----------------------------------------------------------------------------- partial tables
@pytest.fixture
def no_tables(monkeypatch):
    from swa_repro.sglang.audit import family_table
    from swa_repro.sglang.audit import table as at
    from swa_repro.vllm.audit import table as vt

    monkeypatch.setattr(at, "build_table", _never)
    monkeypatch.setattr(family_table, "build", _never)
    monkeypatch.setattr(vt, "build", _never)


@pytest.mark.parametrize("argv", [
    ["--vllm", "0.34.0", "--model", "gemma2", "--gpu", "sm90"],
    ["--releases", "0.5.23"],
    ["--model", "all", "--releases", "0.5.23"],
])
def test_a_partial_table_never_replaces_the_committed_one(no_tables, capfd, argv):
    refused(capfd, ["audit", "--release-table", *argv], "--force", REPO / "docs" / "audit")


def test_a_partial_table_over_a_copy_needs_force(no_tables, tmp_path, capfd):
    shutil_copy = (REPO / "docs" / "audit" / "vllm-releases.json").read_bytes()
    (tmp_path / "vllm-releases.json").write_bytes(shutil_copy)
    argv = ["audit", "--release-table", "--vllm", "0.34.0", "--model", "gemma2", "--gpu", "sm90", "--out", tmp_path]
    line = refused(capfd, argv, "also covers releases 0.20.0", tmp_path)
    assert "families cohere2" in line and "gpus sm100, sm80" in line
    with pytest.raises(AssertionError, match="no work may start"):  # --force: on to the audit
        main([str(a) for a in [*argv, "--force"]])


def test_vllm_table_out_is_checked_before_any_audit(no_tables, tmp_path, capfd):
    f = tmp_path / "a_file"
    f.write_text("x\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        for out, must in ((f, "is a file"), (ro / "t", "is read-only")):
            refused(capfd, ["audit", "--release-table", "--vllm", "0.34.0", "--out", out], must, tmp_path)
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("versions", [",", " , "])
def test_an_empty_vllm_release_list_writes_nothing(no_tables, tmp_path, capfd, versions):
    refused(capfd, ["audit", "--release-table", "--vllm", versions, "--out", tmp_path / "t"], "selects no release",
            tmp_path)


# ----------------------------------------------------------------------------- sources
@pytest.mark.parametrize("kind", ["device", "fifo", "big"])
def test_a_source_that_is_no_regular_file_is_one_line(kind, tmp_path, capfd):
    if kind == "device":
        src = Path("/dev/zero")
    elif kind == "fifo":
        src = tmp_path / "pipe.py"
        os.mkfifo(src)
    else:
        src = tmp_path / "big.py"
        with open(src, "wb") as f:
            f.truncate(17 << 20)
    root = tmp_path / "root"  # the snapshot reads every file it holds: a pipe's open would wait
    root.mkdir()
    for action in ("status", "apply"):
        refused(capfd, ["patch", action, "--vllm", "--source", src], "not a regular file" if kind != "big"
                else "over 16 MiB", root)


# ----------------------------------------------------------------------------- make lab's scratch folder
def _lab(capfd, dst, must: str, root: Path) -> None:
    from swa_repro.notebook import scratch

    before = snapshot(root)
    capfd.readouterr()
    rc = scratch.main([str(REPO / "notebooks"), str(dst)])
    lines = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("make lab: ") and must in lines[0], lines
    assert snapshot(root) == before


def test_scratch_that_cannot_be_one_is_one_line(tmp_path, capfd):
    (tmp_path / "a_file").write_text("x\n")
    _lab(capfd, tmp_path / "a_file", "is a file", tmp_path)
    (tmp_path / "m" / ".swa-repro-scratch.json").mkdir(parents=True)
    _lab(capfd, tmp_path / "m", "is not a file", tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        _lab(capfd, ro, "read-only", tmp_path)
    finally:
        ro.chmod(0o755)


def test_scratch_never_lands_in_tracked_folders(tmp_path, capfd):
    (tmp_path / "scratch").symlink_to(REPO / "notebooks")
    before = snapshot(REPO / "notebooks")
    _lab(capfd, tmp_path / "scratch", "notebooks/", tmp_path)
    _lab(capfd, REPO, "the project's checkout", tmp_path)  # make lab LAB_ROOT=.
    assert snapshot(REPO / "notebooks") == before


# ----------------------------------------------------------------------------- the cache's root
def test_a_relative_cache_root_is_made_absolute_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SWA_REPRO_CACHE", "rel-cache")
    assert core_cache.cache_root() == tmp_path / "rel-cache"
    assert os.environ["SWA_REPRO_CACHE"] == str(tmp_path / "rel-cache")  # what the kernels inherit
    monkeypatch.chdir(REPO / "notebooks")  # a notebook kernel's working directory
    assert core_cache.cache_root() == tmp_path / "rel-cache"


# ----------------------------------------------------------------------------- Ctrl-C during run
def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_ctrl_c_during_run_marks_the_set_interrupted(tmp_path, monkeypatch, capfd):
    from swa_repro.notebook import runner

    (tmp_path / "summary.json").write_text(json.dumps({"ok": True, "failed": [], "notebooks": []}))
    calls = []

    def one(path, out, *a):
        calls.append(path.stem)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"notebook": path.stem, "status": "ok", "error": None, "seconds": 0.1, "mode": "model",
                "checks_passed": None, "checks_failed": None}
    monkeypatch.setattr(runner, "run_one", one)
    monkeypatch.setattr(runner, "ensure_kernel", lambda: "k")
    capfd.readouterr()
    rc = main(["run", "00", "01", "02", "--mode", "model", "--jobs", "1", "--output", str(tmp_path)])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 130 and len(err) == 1 and "interrupted" in err[0], err
    s = _summary(tmp_path)
    assert s["status"] == "interrupted" and s["ok"] is False and len(calls) == 2
    assert [r["notebook"] for r in s["notebooks"]] == calls[:1]  # the one that finished
    assert len(s["failed"]) == 2 and s["failed"][0] == calls[1]  # the one cut short, and the one never started


CHILD = r"""
import subprocess, sys
from pathlib import Path
from swa_repro.notebook import runner
from swa_repro.cli import main

marks = Path(sys.argv[1])
def one(path, out, *a):
    kernel = subprocess.Popen(["sleep", "60"])  # a kernel: a child process that runs until it is ended
    (marks / path.stem).touch()  # only once it runs: a SIGINT before would orphan it (a loaded machine did)
    try:
        kernel.wait()
    finally:
        kernel.kill()
    return {"notebook": path.stem, "status": "failed", "error": "ended", "seconds": 1, "mode": "model",
            "checks_passed": None, "checks_failed": None}
runner.run_one = one
runner.ensure_kernel = lambda: "k"
sys.exit(main(["run", "00", "01", "02", "03", "--mode", "model", "--jobs", sys.argv[3], "--output", sys.argv[2]]))
"""


def _terminal_sigint() -> None:
    """The child gets SIGINT as a terminal's user has it (default action, not blocked), whatever the
    test worker inherited or was left with by earlier tests (a disposition of SIG_IGN or a blocked mask
    passes through fork and exec, and Python keeps an ignored SIGINT ignored: under the full suite the
    run never saw the Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_stops_the_run_and_marks_the_set(tmp_path, jobs):
    """A real SIGINT while a kernel (a child process) runs: with ``--jobs 2`` the old runner waited for
    both and ran the other two; with ``--jobs 1`` the one running is cut short. Either way exit 130,
    one line, no notebook started after it, the set marked interrupted with all four failed."""
    marks, out = tmp_path / "marks", tmp_path / "out"
    marks.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(marks), str(out), str(jobs)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_terminal_sigint)
    try:
        t0 = time.monotonic()
        while len(list(marks.iterdir())) < jobs and time.monotonic() - t0 < 60 and p.poll() is None:
            time.sleep(0.1)
        time.sleep(0.3)  # a second notebook would have started by now with --jobs 1 if the first returned
        assert len(list(marks.iterdir())) == jobs, p.communicate(timeout=5)
        assert _summary(out)["status"] == "running" and _summary(out)["ok"] is False
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=25)  # the old runner waited for both, then ran the other two
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    lines = err.strip().splitlines()
    assert p.returncode == 130 and len(lines) == 1 and "interrupted" in lines[0], err
    assert len(list(marks.iterdir())) == jobs  # no notebook started after Ctrl-C
    s = _summary(out)
    assert s["status"] == "interrupted" and s["ok"] is False and len(s["failed"]) == 4
