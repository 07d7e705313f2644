"""``core.cache``: a release's audit / kit run / regression run is computed once per content and
shared (tests, notebooks, CLI), and a change of anything that produces it is a new key."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import sys
import time
from pathlib import Path

import pytest

from swa_repro.core import cache as C
from swa_repro.sglang import overlay_run, provision

PACKAGE = Path(C.__file__).resolve().parents[1]


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SWA_REPRO_NO_CACHE", raising=False)
    return tmp_path / "cache"


def test_cache_root_is_the_users_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("SWA_REPRO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert C.cache_root() == tmp_path / "xdg" / "swa-repro" == provision.cache_root()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert C.cache_root() == tmp_path / "home" / ".cache" / "swa-repro"
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "mine"))
    assert C.cache_root() == tmp_path / "mine"
    assert provision.overlay_dir("0.5.23") == tmp_path / "mine" / "sglang" / "0.5.23"


def test_a_change_of_the_producing_code_changes_the_key(tmp_path):
    """The key hashes every module a release's child can import (the layers up to sglang): an edit
    there is a new key; an edit above them (notebook/, cli.py: nothing below imports them) is not."""
    copy = tmp_path / "swa_repro"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = C.code_hash(root=copy)
    assert before == C.code_hash(root=PACKAGE)  # content, not place
    for rel in ("sglang/audit/core.py", "kernel/model.py", "core/intervals.py", "evidence/stubs/sgl_kernel/__init__.py"):
        f = copy / rel
        text = f.read_text()
        f.write_text(text + "\n# an edit\n")
        C._CODE.clear()
        assert C.code_hash(root=copy) != before, rel
        f.write_text(text)
        C._CODE.clear()
        assert C.code_hash(root=copy) == before
    (copy / "notebook" / "show.py").write_text("# not code a child runs\n")
    (copy / "cli.py").write_text("# nor this\n")
    C._CODE.clear()
    assert C.code_hash(root=copy) == before
    (copy / "sglang" / "new_module.py").write_text("X = 1\n")  # a new file is code too
    C._CODE.clear()
    assert C.code_hash(root=copy) != before


def test_hit_miss_and_a_failure_is_not_stored(root):
    calls = []

    def compute():
        calls.append(1)
        return {"n": len(calls)}

    doc, how = C.cached("t", {"a": 1}, compute)
    assert doc == {"n": 1} and how["cache"] == "miss" and Path(how["file"]).is_file()
    doc, how = C.cached("t", {"a": 1}, compute)
    assert doc == {"n": 1} and how["cache"] == "hit" and len(calls) == 1
    doc, how = C.cached("t", {"a": 2}, compute)  # other inputs: another key
    assert doc == {"n": 2} and how["cache"] == "miss"
    stored = json.loads(Path(how["file"]).read_text())
    assert stored["key_parts"] == {"kind": "t", "a": 2}  # what it was made from, beside it

    def boom():
        raise RuntimeError("failed")

    with pytest.raises(RuntimeError):
        C.cached("t", {"a": 3}, boom)
    assert C.cached("t", {"a": 3}, compute)[1]["cache"] == "miss"


def test_off_switch(root, monkeypatch):
    monkeypatch.setenv("SWA_REPRO_NO_CACHE", "1")
    assert C.cached("t", {"a": 1}, lambda: {"x": 1}) == ({"x": 1}, {"cache": "off", "key": C.key_of({"kind": "t", "a": 1})})
    assert not root.exists()


def _slow_compute(out: str, log: str) -> None:
    import os

    os.environ["SWA_REPRO_CACHE"] = out

    def compute():
        with open(log, "a") as f:
            f.write("computed\n")
        time.sleep(1.0)
        return {"v": 42}

    assert C.cached("race", {"k": 1}, compute)[0] == {"v": 42}


def test_two_processes_compute_one_key_once(root, tmp_path):
    """pytest-xdist workers (or a notebook beside the suite) asking for one key: the second waits
    on the lock and reads the first one's result."""
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_slow_compute, args=(str(root), str(log))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert log.read_text() == "computed\n"


def _overlay(at: Path, backend: str, record: str = "sglang/__init__.py,sha256=x,1\n") -> Path:
    (at / "sglang-0.0.0.dist-info").mkdir(parents=True)
    (at / "sglang-0.0.0.dist-info" / "RECORD").write_text(record)
    f = at / "sglang" / provision_rel()
    f.parent.mkdir(parents=True)
    f.write_text(backend)
    return at


def provision_rel():
    from swa_repro.sglang.patch.classify import REL_PATH

    return REL_PATH


def test_overlay_content_digest_tells_shipped_from_fixed(tmp_path):
    a = provision.content_digest(_overlay(tmp_path / "a", "shipped"))
    assert a == provision.content_digest(_overlay(tmp_path / "b", "shipped"))  # content, not place
    assert a != provision.content_digest(_overlay(tmp_path / "c", "fixed"))  # the file a fix replaces
    assert a != provision.content_digest(_overlay(tmp_path / "d", "shipped", "sglang/x.py,sha256=y,2\n"))  # the release


CHILD = '''
import json, sys
from pathlib import Path
from swa_repro.engine.child import child_main, child_parser
p = child_parser("fake_child")
p.add_argument("--log")
def run(overlay, a):
    with open(a.log, "a") as f:
        f.write("ran\\n")
    return {"overlay": overlay.name}
sys.exit(child_main(p, run))
'''


def test_run_child_runs_once_per_content_and_again_when_the_code_changes(root, tmp_path, monkeypatch):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "fake_child.py").write_text(CHILD)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mods"))
    overlay, log = _overlay(tmp_path / "ov", "shipped"), tmp_path / "log"
    args = ["--log", str(log)]
    doc, secs, how = overlay_run.run_child("fake_child", overlay, args, "fake")
    assert doc == {"overlay": "ov"} and how["cache"] == "miss" and secs >= 0
    doc2, secs2, how = overlay_run.run_child("fake_child", overlay, args, "fake")
    assert (doc2, secs2, how["cache"]) == (doc, secs, "hit") and log.read_text() == "ran\n"
    monkeypatch.setitem(C._CODE, (str(PACKAGE), ("core", "kernel", "evidence", "engine", "sglang")), "edited code")
    assert overlay_run.run_child("fake_child", overlay, args, "fake")[2]["cache"] == "miss"
    assert log.read_text() == "ran\nran\n"
    (overlay / "sglang" / provision_rel()).write_text("fixed")  # another overlay content
    assert overlay_run.run_child("fake_child", overlay, args, "fake")[2]["cache"] == "miss"
    assert overlay_run.run_child("fake_child", overlay, args, "fake", cache=False)[2] == {"cache": "off"}
    assert log.read_text().count("ran") == 4
    assert sys.executable  # the child ran on this interpreter (its torch/numpy are in the key)


def test_two_workers_provision_one_release_once(root, monkeypatch):
    """Two xdist workers asking for a release no one has installed yet: one installs it, the other
    waits and takes it (before, both filled one .partial folder and renamed it over the other's)."""
    import threading

    calls = []

    def install(version, target):
        calls.append(version)
        time.sleep(0.3)
        (target / "sglang").mkdir(parents=True)
        (target / "sglang" / "__init__.py").write_text("")  # an overlay is its wheel's files and RECORD (#43)
        (target / f"sglang-{version}.dist-info").mkdir()
        (target / f"sglang-{version}.dist-info" / "RECORD").write_text(
            "sglang/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n")
        (target / provision.MARKER).write_text(json.dumps({"sglang": version}))
        return target, {"sglang": version, "cached": False}

    monkeypatch.setattr(provision, "_install", install)
    got = []
    threads = [threading.Thread(target=lambda: got.append(provision.provision("0.5.99"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert calls == ["0.5.99"] and sorted(info["cached"] for _, info in got) == [False, True]
    assert {d for d, _ in got} == {root / "sglang" / "0.5.99"}


def test_cached_cells_computes_only_the_missing_cells_once(tmp_path, monkeypatch):
    """A release's child makes several cells; a later request for more cells computes only the new
    ones, in one call, and a request for fewer reads them all; SWA_REPRO_NO_CACHE computes all."""
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SWA_REPRO_NO_CACHE", raising=False)
    calls = []

    def compute(cells):
        calls.append([c["f"] for c in cells])
        return [{"made": c["f"], "n": len(calls)} for c in cells]

    common = {"overlay": "x", "code": "y"}
    docs, how = C.cached_cells("t", common, [{"f": "a"}, {"f": "b"}], compute)
    assert docs == [{"made": "a", "n": 1}, {"made": "b", "n": 1}] and how["cache"] == "miss"
    docs, how = C.cached_cells("t", common, [{"f": "b"}, {"f": "c"}, {"f": "a"}], compute)
    assert calls == [["a", "b"], ["c"]] and how["cache"] == "partial" and how["computed"] == 1
    assert docs == [{"made": "b", "n": 1}, {"made": "c", "n": 2}, {"made": "a", "n": 1}]
    assert C.cached_cells("t", common, [{"f": "c"}], compute)[1]["cache"] == "hit" and len(calls) == 2
    assert C.cached_cells("t", {**common, "code": "z"}, [{"f": "a"}], compute)[1]["cache"] == "miss"  # new code
    monkeypatch.setenv("SWA_REPRO_NO_CACHE", "1")
    assert C.cached_cells("t", common, [{"f": "a"}], compute)[1] == {"cache": "off", "computed": 1}
