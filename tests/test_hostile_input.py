"""Issue 28: hostile input to ``patch``, ``bundle``, ``run``, ``fuzz`` and ``audit`` is one line on stderr,
exit 2, no traceback, and nothing on disk changes (a snapshot of the tree, bytes, links and modes
before and after). One class per section, every fixture made here:

1. writes: one atomic writer (``core.outputs``) that refuses links, the tool's own backups, existing
   files (without ``--force``), folders and read-only places, and a bundle that takes back what it made;
2. reads: one reader (``core.inputs``) for sources, backup metadata and fuzz recordings;
3. checks before work: ``audit --release-table --out``, ``run --parameters`` values, ``run --list``.

Runs in-process through ``cli.main`` with ``capfd`` (anything any layer prints is seen; an escaping
exception fails the test with its traceback). Nothing here reaches the network: a bundle's version is
refused before pip, and the pip steps are replaced by ones that fail the test if called.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from swa_repro.cli import main
from swa_repro.core.errors import UsageError
from swa_repro.core.outputs import backup_paths, write_atomic
from swa_repro.engine.patching import PatchError
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.patch.classify import classify
from swa_repro.sglang.patch.files import installed_path

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- helpers
def snapshot(root: Path) -> dict:
    """Every entry under ``root``: (kind, bytes or link target, permission bits)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(d) / n
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                what = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                what = ("dir", None)
            else:
                what = ("file", p.read_bytes())
            out[str(p.relative_to(root))] = (*what, stat.S_IMODE(st.st_mode))
    return out


def refused(capfd, argv, must: str, root: Path) -> str:
    """``argv`` exits 2 with one ``swa-repro CMD: error:`` line naming ``must``; ``root`` unchanged."""
    before = snapshot(root)
    capfd.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capfd.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (argv, rc, err[-2000:])
    assert lines[0].startswith(f"swa-repro {argv[0]}: error:") and must in lines[0], (argv, lines[0])
    assert snapshot(root) == before, f"{argv} changed {root}"
    return lines[0]


@pytest.fixture(scope="module")
def backend_text():
    try:
        return installed_path().read_text()
    except PatchError as e:
        pytest.skip(str(e))


@pytest.fixture
def src(tmp_path, backend_text):
    """A copy of the installed flashinfer_backend.py in its own folder."""
    p = tmp_path / "site" / "flashinfer_backend.py"
    p.parent.mkdir()
    p.write_text(backend_text)
    return p


def patched_in_place(path: Path, capfd) -> None:
    flag = [] if classify(path.read_text()).state == "unfixed" else ["--reverse"]  # PR #31501: the quick one
    assert main(["patch", "apply", "--in-place", *flag, "--source", str(path)]) == 0
    capfd.readouterr()
    assert all(q.is_file() for q in backup_paths(path))


# ----------------------------------------------------------------------------- 1. writes
def test_in_place_on_a_symlink_is_refused_and_the_link_stays(src, tmp_path, capfd):
    """Replacing the link by a patched regular file left its target unpatched (and revert then
    'restored' a regular file): refused, with the target named, for apply and revert alike."""
    link = tmp_path / "link.py"
    link.symlink_to(src)
    for argv in (["apply", "--in-place"], ["apply", "--in-place", "--fix", "all"], ["revert"]):
        line = refused(capfd, ["patch", *argv, "--source", link], "is a symbolic link", tmp_path)
        assert str(src) in line
    assert link.is_symlink() and os.readlink(link) == str(src)


def test_out_never_lands_on_the_tools_own_files(src, tmp_path, capfd, backend_text):
    """--out onto another patched file's backup or metadata lost its original (revert then refused)."""
    other = tmp_path / "other" / "flashinfer_backend.py"
    other.parent.mkdir()
    other.write_text(backend_text)
    patched_in_place(other, capfd)
    bak, meta = backup_paths(other)
    for target, must in ((bak, "swa-repro's own backup"), (meta, "swa-repro's own backup"),
                         (other, "patched in place by swa-repro")):
        for force in ([], ["--force"]):
            refused(capfd, ["patch", "apply", "--fix", "all", "--source", src, "--out", target, *force], must, tmp_path)
    assert main(["patch", "revert", "--source", str(other)]) == 0  # the original is still there
    assert other.read_text() == backend_text


def test_out_refuses_existing_links_folders_and_read_only_places(src, tmp_path, capfd):
    existing = tmp_path / "notes.txt"
    existing.write_text("someone's notes\n")
    link = tmp_path / "link.py"
    link.symlink_to(existing)
    dangling = tmp_path / "dangling.py"
    dangling.symlink_to(tmp_path / "nowhere.py")
    folder = tmp_path / "folder"
    folder.mkdir()
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)  # as root os.access says writable: the tool reads the bits, as --in-place does
    try:
        for fixes in ([], ["--fix", "all"]):
            run = ["patch", "apply", "--source", src, *fixes]
            refused(capfd, [*run, "--out", existing], "exists: name a new file, or add --force", tmp_path)
            refused(capfd, [*run, "--out", link, "--force"], "is a symbolic link", tmp_path)
            refused(capfd, [*run, "--out", dangling], "is a symbolic link", tmp_path)
            refused(capfd, [*run, "--out", folder], "is a folder", tmp_path)
            refused(capfd, [*run, "--out", ro / "fixed.py"], "is read-only", tmp_path)
            refused(capfd, [*run, "--out", tmp_path / "missing" / "fixed.py"], "does not exist", tmp_path)
            refused(capfd, [*run, "--out", src, "--force"], "the source file itself", tmp_path)
        refused(capfd, ["patch", "apply", "--source", src, "--force"], "--force goes with", tmp_path)
        refused(capfd, ["patch", "revert", "--source", src, "--fix", "all"], "--fix goes with", tmp_path)
        # the same read-only folder refused for --in-place
        victim = ro / "flashinfer_backend.py"
        ro.chmod(0o755)
        shutil.copy(src, victim)
        ro.chmod(0o555)
        refused(capfd, ["patch", "apply", "--in-place", "--fix", "all", "--source", victim], "read-only", tmp_path)
    finally:
        ro.chmod(0o755)
    flag = [] if classify(src.read_text()).state == "unfixed" else ["--reverse"]
    assert main(["patch", "apply", *flag, "--source", str(src), "--out", str(existing), "--force"]) == 0
    assert classify(existing.read_text()).state != classify(src.read_text()).state and link.is_symlink()


def test_the_writer_is_all_or_nothing(tmp_path, monkeypatch, src, capfd, backend_text):
    """A failed write leaves the old bytes and no temp file; an in-place apply whose last write fails
    leaves no backup of a file it did not change."""
    target = tmp_path / "t.txt"
    target.write_bytes(b"old")

    class Boom(Exception):
        pass

    def fail(*a, **k):
        raise Boom

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(Boom):
        write_atomic(target, b"new")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site", "t.txt"] and target.read_bytes() == b"old"

    from swa_repro.engine import patching as files

    real, calls = vars(files)["write_atomic"], []  # the name patching's functions call

    def third_fails(path, data, like=None):
        calls.append(path)
        if len(calls) == 3:  # the backup and its metadata written, then the file itself fails
            raise OSError(28, "No space left on device")
        real(path, data, like)

    monkeypatch.setattr(files, "write_atomic", third_fails)
    with pytest.raises(OSError):
        files.apply_in_place(src, edit=lambda t: t + "# edited\n", label="an edit", done=lambda t: False)
    assert [p.name for p in src.parent.iterdir()] == ["flashinfer_backend.py"] and src.read_text() == backend_text


def _no_pip(*a, **k):
    raise AssertionError("pip was reached")


@pytest.mark.parametrize("version", ["0.6.12;rm -rf x", ">=0.6", "../0.6.12", "0.6.12 ", "latest", "", "0.6.12+local"])
def test_bundle_refuses_a_non_version_before_any_folder_or_pip(version, tmp_path, capfd, monkeypatch):
    from swa_repro.evidence import bundle
    import subprocess

    monkeypatch.setattr(bundle, "_pip_download", _no_pip)
    monkeypatch.setattr(subprocess, "run", _no_pip)
    refused(capfd, ["bundle", "--flashinfer", version, "--out", tmp_path / "b" / "fi"],
            "--flashinfer" if version else "--flashinfer '' is not a release number", tmp_path)


def test_a_failed_bundle_leaves_nothing_so_the_next_command_runs(tmp_path, capfd, monkeypatch):
    """A version pip cannot find (here a stand-in that fails as pip would) left a partial --out, and
    the corrected command was refused as "not empty"."""
    from swa_repro.evidence import bundle, sglang_bundle

    def pip_fails(specs, dest, **k):
        (Path(dest) / "partial.whl").write_bytes(b"half")
        raise UsageError(f"pip download {' '.join(specs)} failed: ERROR: No matching distribution found")

    monkeypatch.setattr(bundle, "_pip_download", pip_fails)
    new = tmp_path / "a" / "b" / "fi-9.9.9"
    refused(capfd, ["bundle", "--flashinfer", "9.9.9", "--out", new], "No matching distribution", tmp_path)
    assert not (tmp_path / "a").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(capfd, ["bundle", "--flashinfer", "9.9.9", "--out", empty], "No matching distribution", tmp_path)
    assert list(empty.iterdir()) == []

    def resolve_fails(version, folders, dl, python_version="3.12"):
        raise UsageError(f"no cp312 wheel of sglang=={version} (network?)")

    monkeypatch.setattr(sglang_bundle, "resolve", resolve_fails)
    refused(capfd, ["bundle", "--sglang", "9.9.9", "--out", tmp_path / "sg" / "x"], "no cp312 wheel", tmp_path)
    refused(capfd, ["bundle", "--sglang", "0.5.15;x", "--out", tmp_path / "sg"], "not a version", tmp_path)
    assert not (tmp_path / "sg").exists()


# ----------------------------------------------------------------------------- 2. reads
BAD_SOURCES = {
    "binary": (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "is binary"),
    "latin-1": ('window = "fenêtre"\n'.encode("latin-1"), "is not UTF-8 (byte 0xea"),
    "bom": (b"\xef\xbb\xbfimport os\n", "byte order mark"),
    "empty": (b"", "is empty"),
    "blank": (b"\n  \n", "is empty"),
    "syntax": (b"class FlashInferIndicesUpdaterPrefill:\n    def update_sliding_window(self:\n", "does not parse"),
}
FIX_CHOICES = [[], ["--fix", "all"], *(["--fix", n] for n in ORDER)]


@pytest.mark.parametrize("kind", list(BAD_SOURCES))
def test_a_source_that_is_no_python_text_is_one_line_for_every_fix(kind, tmp_path, capfd):
    data, must = BAD_SOURCES[kind]
    bad = tmp_path / "flashinfer_backend.py"
    bad.write_bytes(data)
    for fixes in FIX_CHOICES:
        for action in (["status"], ["diff"], ["apply", "--out", tmp_path / "o.py"], ["apply", "--in-place"]):
            refused(capfd, ["patch", *action, "--source", bad, *fixes], must, tmp_path)
    refused(capfd, ["patch", "status", "--source", tmp_path], "is a folder", tmp_path)


def _hand_edits(text: str) -> dict:
    return {"renamed method": text.replace("def update_sliding_window(", "def update_sliding_window_v2("),
            "no ragged wrapper": text.replace("BatchPrefillWithRaggedKVCacheWrapper(", "RaggedWrapper("),
            "class gone": text.replace("class FlashInferIndicesUpdaterPrefill", "class Prefill")}


# the fixes that read PR #31501's plumbing first (where fixes.Unknown escaped), and two that do not
HAND_FIXES = [[], ["--fix", "all"], ["--fix", "eagle_verify_window"], ["--fix", "dflash_verify_window"],
              ["--fix", "ragged_prefix_window"], ["--fix", "soft_cap_prefill"]]


def test_a_hand_edited_source_is_refused_not_a_traceback(tmp_path, capfd, backend_text):
    """``fixes.Unknown`` escaped from some --fix combinations; now each refuses in one line, nothing
    written (or, where the edit is not on its path, applies), and status reports the state."""
    for name, text in _hand_edits(backend_text).items():
        src = tmp_path / name.replace(" ", "_") / "flashinfer_backend.py"
        src.parent.mkdir()
        src.write_text(text)
        for fixes in HAND_FIXES:
            for action in (["diff"], ["apply", "--out", src.parent / "o.py"]):
                before = snapshot(tmp_path)
                capfd.readouterr()
                rc = main([str(a) for a in ["patch", *action, "--source", src, *fixes]])
                err = capfd.readouterr().err
                assert rc in (0, 2) and "Traceback" not in err, (name, fixes, action, err)
                if rc == 2:
                    assert len(err.strip().splitlines()) == 1 and snapshot(tmp_path) == before, (name, fixes, err)
                (src.parent / "o.py").unlink(missing_ok=True)
        if name == "renamed method":  # the one that escaped: also in place, and status reads unknown
            refused(capfd, ["patch", "apply", "--in-place", "--source", src, "--fix", "eagle_verify_window"],
                    "not a structure the fix knows", tmp_path)
            assert main(["patch", "status", "--source", str(src), "--fix", "eagle_verify_window"]) == 0
            assert capfd.readouterr().out.startswith("eagle_verify_window: unknown")
        assert src.read_text() == text


@pytest.mark.parametrize("corrupt", ["not json", "truncated", "a list", "key missing", "a folder"])
def test_corrupt_backup_metadata_is_one_line_in_status_revert_and_apply(corrupt, src, tmp_path, capfd):
    patched_in_place(src, capfd)
    meta = backup_paths(src)[1]
    doc = json.loads(meta.read_text())
    if corrupt == "a folder":
        meta.unlink()
        meta.mkdir()
    else:
        meta.write_text({"not json": "{this is not json", "truncated": meta.read_text()[:40], "a list": "[1, 2]",
                         "key missing": json.dumps({k: v for k, v in doc.items() if k != "original_sha256"})}[corrupt])
    must = "lacks original_sha256" if corrupt == "key missing" else "backup metadata"
    for argv in (["status"], ["status", "--fix", "all"], ["revert"], ["apply", "--in-place"],
                 ["apply", "--in-place", "--fix", "all"]):
        line = refused(capfd, ["patch", *argv, "--source", src], must, tmp_path)
        assert "the original is kept in" in line


def _recording(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of one committed fuzz recording (JSON + npz) under ``tmp_path/rec/<version>/``."""
    v = "0.6.11.post1"
    found = sorted((REPO / "recordings" / "fuzz" / v).glob("fuzz-*[0-9].json"))
    if not found:
        pytest.skip("no committed fuzz recording")
    d = tmp_path / "rec" / v
    d.mkdir(parents=True)
    js = Path(shutil.copy(found[0], d))
    npz = Path(shutil.copy(found[0].with_suffix(".npz"), d))
    return js, npz


def _shift_extend(doc: dict) -> str:
    case = next(c for c in doc["cases"] if not c.get("error"))
    case["case"]["extend_lens"] = [x + 1 for x in case["case"]["extend_lens"]]
    return json.dumps(doc)


@pytest.mark.parametrize("corrupt, must", [
    ("truncated json", "is not valid JSON"),
    ("json without cases", "lacks cases"),
    ("arrays outside", "'arrays' must name a file beside it"),
    ("shapes changed", "a case does not decode"),
    ("npz garbage", "is not a readable .npz"),
    ("npz truncated", "is not a readable .npz"),
    ("npz missing", "no such file"),
])
def test_corrupt_fuzz_recordings_are_one_line(corrupt, must, tmp_path, capfd):
    js, npz = _recording(tmp_path)
    doc = json.loads(js.read_text())
    if corrupt == "truncated json":
        js.write_text(js.read_text()[:len(js.read_text()) // 2])
    elif corrupt == "json without cases":
        js.write_text(json.dumps({k: v for k, v in doc.items() if k != "cases"}))
    elif corrupt == "arrays outside":
        js.write_text(json.dumps({**doc, "arrays": "../../" + npz.name}))
    elif corrupt == "shapes changed":
        js.write_text(_shift_extend(doc))
    elif corrupt == "npz garbage":
        npz.write_bytes(b"PK\x03\x04 not really a zip")
    elif corrupt == "npz truncated":
        npz.write_bytes(npz.read_bytes()[:1000])
    else:
        npz.unlink()
    report = tmp_path / "report.json"
    refused(capfd, ["fuzz", "--mode", "model", "--recordings", tmp_path / "rec", "--report", report], must, tmp_path)
    assert not report.exists()


# ----------------------------------------------------------------------------- 3. checks before work
def test_release_table_out_is_checked_before_any_audit(tmp_path, capfd, monkeypatch):
    from swa_repro.sglang.audit import table

    monkeypatch.setattr(table, "build_table", _no_pip)  # any audit fails the test
    f = tmp_path / "a_file"
    f.write_text("x\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        for out, must in ((f, "is a file"), (f / "sub", "cannot be created"), (ro / "t", "is read-only")):
            refused(capfd, ["audit", "--release-table", "--releases", "0.5.23", "--out", out], must, tmp_path)
    finally:
        ro.chmod(0o755)
    refused(capfd, ["audit", "--release-table", "--releases", "0.5.9", "--out", tmp_path / "t"], "0.5.10 and later",
            tmp_path)


@pytest.mark.parametrize("argv, must", [
    (["00", "-p", "seed=1", "seed=2"], "--parameters seed is given twice"),
    (["00", "-p", "seed=1", "-p", "seed=1"], "--parameters seed is given twice"),
    (["03", "-p", "fixes=bogus"], '--parameters fixes="bogus": unknown bogus'),
    (["03", "04", "-p", "fixes=,"], "selects no fix"),
    (["04", "-p", "sglang_release=banana"], "not a release number"),
    (["03", "-p", "sglang_release=0.4.9"], "older than 0.5.10"),
    (["03", "-p", "sglang_release=0.5.23;x"], "not a release number"),
    (["00", "-p", "backend=fa9"], "fa9"),
    (["--list", "-p", "oops"], "name=value"),
    (["--list", "-p", "sizes=[1,2"], "does not parse"),
    (["--list", "03", "-p", "fixes=bogus"], "unknown bogus"),
])
def test_run_parameters_are_checked_for_values_the_notebook_can_use(argv, must, tmp_path, capfd, monkeypatch):
    """Before any notebook starts (run_all and the kernel are stand-ins that fail the test)."""
    from swa_repro.notebook import runner

    monkeypatch.setattr(runner, "run_all", _no_pip)
    monkeypatch.setattr(runner, "ensure_kernel", _no_pip)
    refused(capfd, ["run", "--output", tmp_path / "out", *argv], must, tmp_path)


def test_values_the_notebooks_use_still_pass(capfd):
    assert main(["run", "--list", "03", "04", "-p", "fixes=ragged_prefix_window,soft_cap_decode",
                 "sglang_release=0.5.15.post1"]) == 0
    assert capfd.readouterr().out.split() == ["03_apply_backend_patch", "04_rerun_checks"]


def test_a_written_file_has_the_permissions_open_would_give_it(tmp_path):
    """mkstemp makes 0600 files: a regenerated table or a new output must not turn private."""
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "new.md", b"x")
        assert (tmp_path / "new.md").stat().st_mode & 0o777 == 0o644
        kept = tmp_path / "kept.md"
        kept.write_bytes(b"old")
        kept.chmod(0o640)
        write_atomic(kept, b"new")
        assert kept.stat().st_mode & 0o777 == 0o640 and kept.read_bytes() == b"new"
    finally:
        os.umask(old)
