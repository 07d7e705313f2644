"""`swa-repro patch` on the installed sglang's flashinfer_backend.py (read only: every write goes
to a copy in tmp_path, and the real file's sha256 is checked before and after)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import shutil
import stat
import sys
import types
from pathlib import Path

import pytest

from swa_repro.cli import main
from swa_repro.core.outputs import backup_paths
from swa_repro.engine.patching import PatchError, unified_diff
from swa_repro.sglang.patch import stubs
from swa_repro.sglang.patch.classify import CBF, CLASS, MODULE, OTHER, REL_PATH, USW, classify, method_spans
from swa_repro.sglang.patch.edit import transform
from swa_repro.sglang.patch.files import installed_path
from swa_repro.sglang.patch.stubs import compile_class, plan_window_lefts
from swa_repro.sglang.patch.swap import patched, unpatched
from difftools import changed_lines, changed_outside_the_methods, normalized_methods  # tests/difftools.py


@pytest.fixture(scope="module")
def installed():
    try:
        path = installed_path()
    except PatchError as e:
        pytest.skip(str(e))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    yield path
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before, "tests wrote into the venv"


@pytest.fixture
def fake_site(installed, tmp_path, monkeypatch):
    """A copy of the installed file in a fake site-packages that `find_spec('sglang')` finds."""
    site = tmp_path / "site-packages"
    target = site / "sglang" / REL_PATH
    target.parent.mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    shutil.copy2(installed, target)
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    assert installed_path() == target
    return target


def expected_state(path):
    from importlib.metadata import version

    v = tuple(int(x) for x in version("sglang").split(".")[:3] if x.isdigit())
    return "unfixed" if v < (0, 5, 16) else "fixed"


def inside(lines, spans):
    return all(any(lo <= n <= hi for lo, hi in spans.values()) for n in lines)


def test_status_prints_one_word(installed, capsys):
    assert main(["patch", "status"]) == 0
    out = capsys.readouterr().out
    assert out == expected_state(installed) + "\n"


def test_diff_adds_the_window_only_inside_the_two_methods(installed, capsys):
    text = installed.read_text()
    flag = [] if expected_state(installed) == "unfixed" else ["--reverse"]
    assert main(["patch", "diff", *flag]) == 0
    diff = capsys.readouterr().out
    assert diff.startswith("--- a/") and "\n+++ b/" in diff
    assert ("+        window_left: int = -1," in diff) == (not flag)
    new = transform(text, "unfixed" if flag else "fixed")
    assert diff == unified_diff(text, new, str(installed).lstrip("/"))
    old_lines, new_lines = changed_lines(text, new)
    assert old_lines and inside(old_lines, method_spans(text))
    assert inside(new_lines, method_spans(new))


def test_diff_in_the_direction_already_taken_is_empty(installed, capsys):
    flag = ["--reverse"] if expected_state(installed) == "unfixed" else []
    assert main(["patch", "diff", *flag]) == 0
    cap = capsys.readouterr()
    assert cap.out == "" and "already" in cap.err


@pytest.mark.parametrize("start", ["unfixed", "fixed"])
def test_apply_out_writes_a_patched_copy_and_leaves_the_source(installed, tmp_path, capsys, start):
    """Both directions on any sglang: the source is the installed file, or its transform when the
    installed file is in the other state."""
    text = installed.read_bytes().decode()
    src = tmp_path / "flashinfer_backend.py"
    src.write_bytes((text if classify(text).state == start else transform(text, start)).encode())
    before = src.read_bytes()
    out = tmp_path / "patched.py"
    flag = ["--reverse"] if start == "fixed" else []
    assert main(["patch", "apply", "--source", str(src), "--out", str(out), *flag]) == 0
    assert src.read_bytes() == before
    new = out.read_bytes().decode()
    want = OTHER[start]
    assert classify(new).state == want
    compile(new, str(out), "exec")
    back = transform(new, start)
    if start == "unfixed":
        assert back.encode() == before  # exact way back
    else:  # re-fixing the written copy gives the same fix (upstream's may be laid out differently)
        assert normalized_methods(back) == normalized_methods(before.decode())
        assert not changed_outside_the_methods(before.decode(), back)
    fixed = new if want == "fixed" else before.decode()
    assert plan_window_lefts(fixed, window=4096) == {0: 4096, 1: None}
    assert plan_window_lefts(fixed, use_ragged=True) == {0: None, 1: None}
    assert plan_window_lefts(transform(fixed, "unfixed")) == {0: None, 1: None}
    assert f"wrote {out}" in capsys.readouterr().out


def test_apply_without_a_destination_shows_the_diff_and_exits_2(installed, tmp_path, capsys):
    src = tmp_path / "flashinfer_backend.py"
    shutil.copy2(installed, src)
    flag = [] if expected_state(installed) == "unfixed" else ["--reverse"]
    assert main(["patch", "apply", "--source", str(src), *flag]) == 2
    cap = capsys.readouterr()
    assert cap.out.startswith("--- a/") and "--out FILE" in cap.err and "--in-place" in cap.err
    assert src.read_bytes() == installed.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flashinfer_backend.py"]


def test_in_place_apply_and_revert_in_a_fake_site_packages(fake_site, capsys):
    original = fake_site.read_bytes()
    state = classify(original.decode()).state
    flag = [] if state == "unfixed" else ["--reverse"]
    assert main(["patch", "apply", "--in-place", *flag]) == 0
    bak, meta = backup_paths(fake_site)
    assert bak.read_bytes() == original
    info = json.loads(meta.read_text())
    assert info["original_sha256"] == hashlib.sha256(original).hexdigest()
    assert info["patched_sha256"] == hashlib.sha256(fake_site.read_bytes()).hexdigest()
    assert stat.S_IMODE(fake_site.stat().st_mode) == stat.S_IMODE(bak.stat().st_mode)
    capsys.readouterr()
    assert main(["patch", "status"]) == 0
    cap = capsys.readouterr()
    assert cap.out == OTHER[state] + "\n" and "patched in place by swa-repro" in cap.err
    assert main(["patch", "apply", "--in-place", *flag]) == 0  # idempotent
    assert "already" in capsys.readouterr().out and bak.read_bytes() == original
    back = ["--reverse"] if not flag else []
    assert main(["patch", "apply", "--in-place", *back]) == 2  # revert first, not stacked
    assert "revert` first" in capsys.readouterr().err and bak.read_bytes() == original
    assert main(["patch", "revert"]) == 0
    assert fake_site.read_bytes() == original
    assert not bak.exists() and not meta.exists()
    assert main(["patch", "revert"]) == 2  # nothing left to revert
    assert "no swa-repro backup" in capsys.readouterr().err
    assert [p.name for p in fake_site.parent.iterdir()] == ["flashinfer_backend.py"]


def test_read_only_site_packages_is_refused(fake_site, capsys):
    original = fake_site.read_bytes()
    d = fake_site.parent
    mode = d.stat().st_mode
    d.chmod(0o555)
    try:
        assert main(["patch", "apply", "--in-place"]) == 2
    finally:
        d.chmod(mode)
    err = capsys.readouterr().err
    assert "read-only" in err and "nothing was changed" in err
    assert fake_site.read_bytes() == original
    assert [p.name for p in d.iterdir()] == ["flashinfer_backend.py"]


def test_file_changed_since_backup_is_refused(fake_site, capsys):
    original = fake_site.read_bytes()
    assert main(["patch", "apply", "--in-place"]) == 0
    changed = fake_site.read_bytes() + b"# edited by someone else\n"
    fake_site.write_bytes(changed)  # e.g. a reinstall or a hand edit
    capsys.readouterr()
    assert main(["patch", "revert"]) == 2
    assert "changed since" in capsys.readouterr().err
    assert main(["patch", "apply", "--in-place"]) == 2
    assert "changed since" in capsys.readouterr().err
    bak, _ = backup_paths(fake_site)
    assert fake_site.read_bytes() == changed and bak.read_bytes() == original


@pytest.mark.parametrize("how", ["renamed", "partial"])
def test_unknown_state_is_refused(installed, tmp_path, capsys, how):
    text = installed.read_text()
    if how == "renamed":  # the class no longer has update_sliding_window
        bad = text.replace("def update_sliding_window(", "def update_sliding_window_v2(")
    else:  # the signature patched, the rest not: neither state
        fixed = transform(text, "fixed")
        bad = fixed.replace("        window_left: int = -1,\n", "", 1)
    src = tmp_path / "site" / "flashinfer_backend.py"
    src.parent.mkdir()
    src.write_text(bad)
    assert classify(bad).state == "unknown"
    assert main(["patch", "status", "--source", str(src)]) == 0
    cap = capsys.readouterr()
    assert cap.out == "unknown\n" and cap.err
    for args in (["--out", str(tmp_path / "o.py")], ["--in-place"], [], ["--reverse"]):
        assert main(["patch", "apply", "--source", str(src), *args]) == 2
        assert "unknown state" in capsys.readouterr().err
    assert src.read_text() == bad
    assert [p.name for p in src.parent.iterdir()] == ["flashinfer_backend.py"]
    assert not (tmp_path / "o.py").exists()


def test_no_sglang_installed_is_a_clear_error(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sglang" else real(name, *a))
    for action in ("status", "diff", "apply", "revert"):
        assert main(["patch", action]) == 2
        assert "sglang is not installed" in capsys.readouterr().err
    src = tmp_path / "flashinfer_backend.py"
    assert main(["patch", "status", "--source", str(src)]) == 2  # missing --source file
    assert "no such file" in capsys.readouterr().err


def test_bad_flag_combinations_exit_2(capsys):
    assert main(["patch", "status", "--in-place"]) == 2
    assert main(["patch", "apply", "--out", "x.py", "--in-place"]) == 2
    assert main(["patch", "revert", "--reverse"]) == 2
    assert capsys.readouterr().err.count("error:") == 3


def lite_module(path):
    """The installed FlashInferIndicesUpdaterPrefill compiled from the real file's class on stub
    globals (importing sglang's module takes a minute on 2 cores; the slow test below does)."""
    glb = stubs.Stubs(__name__="lite_flashinfer_backend")
    cls = compile_class(path.read_text(), glb, str(path), whole=True)
    return types.SimpleNamespace(__file__=str(path), __name__=glb["__name__"], **{CLASS: cls})


def check_context_managers(module):
    cls = getattr(module, CLASS)
    orig = {n: cls.__dict__[n] for n in (USW, CBF)}
    base = classify(Path(module.__file__).read_text()).state
    window = {"fixed": {0: 64, 1: None}, "unfixed": {0: None, 1: None}}
    assert plan_window_lefts(cls) == window[base]
    with patched(module) as c:
        assert c is cls and plan_window_lefts(cls) == window["fixed"]
        assert plan_window_lefts(cls, use_ragged=True) == window["unfixed"]
        with unpatched(module):
            assert plan_window_lefts(cls) == window["unfixed"]
        with patched(module):  # nested, same state: a no-op
            assert plan_window_lefts(cls) == window["fixed"]
        assert plan_window_lefts(cls) == window["fixed"]
    assert all(cls.__dict__[n] is f for n, f in orig.items())
    for cm in (patched, unpatched):
        with pytest.raises(RuntimeError, match="boom"):
            with cm(module):
                with cm(module):
                    raise RuntimeError("boom")
        assert all(cls.__dict__[n] is f for n, f in orig.items())


def test_context_managers_swap_and_restore_even_on_error(installed):
    check_context_managers(lite_module(installed))


def test_context_manager_refuses_a_class_that_does_not_match_the_file(installed, tmp_path):
    module = lite_module(installed)
    other = tmp_path / "flashinfer_backend.py"  # the loaded class came from a different text
    other.write_text(transform(installed.read_text(), OTHER[expected_state(installed)])
                     .replace("bs = len(seq_lens)", "bs = len(seq_lens) + 0"))
    module.__file__ = str(other)
    cls = getattr(module, CLASS)
    before = dict(cls.__dict__)
    with pytest.raises(PatchError, match="matches neither"):
        with patched(module):
            pass
    assert dict(cls.__dict__) == before


@pytest.mark.slow
def test_context_managers_on_the_imported_sglang_module(installed):
    pytest.importorskip("torch")
    try:
        module = importlib.import_module(MODULE)
    except Exception as e:  # noqa: BLE001 - any import failure of the real module
        pytest.skip(f"{MODULE} does not import here: {e}")
    check_context_managers(module)
