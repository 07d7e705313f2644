"""The fork server (``engine.forkserver``) and shared bytecode (``engine.bytecode``): a forked run is
the plain ``python -m`` run, and a hard-linked overlay copy compiles only what it replaced."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from swa_repro.engine import forkserver

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux only")

PROBE = textwrap.dedent("""
    import json, os, sys
    seen = {"argv": sys.argv[1:], "cwd": os.getcwd(), "marker": os.environ.get("PROBE_MARK"),
            "leaked": getattr(sys, "probe_leak", None), "numpy_loaded": "numpy" in sys.modules,
            "name": __name__, "learned_var": os.environ.get("SWA_REPRO_FORKSERVER_LEARNED")}
    sys.probe_leak = "set by an earlier run"  # a fresh fork must not see this
    import numpy  # a venv module: the server learns it and preloads it for the next run
    print(json.dumps(seen))
    print("to stderr", file=sys.stderr)
    if sys.argv[1:2] == ["fail"]:
        raise SystemExit(3)
    if sys.argv[1:2] == ["boom"]:
        raise RuntimeError("boom")
""")


@pytest.fixture
def probe_env(tmp_path, monkeypatch):
    (tmp_path / "fsprobe.py").write_text(PROBE)
    monkeypatch.setenv("SWA_REPRO_FORKSERVER", "1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(forkserver.__file__).parents[2])]),
           "PROBE_MARK": "m1", "SWA_REPRO_CACHE": str(tmp_path / "cache"),  # nothing learned by earlier servers
           "SWA_REPRO_FORKSERVER_SEED": "0"}  # nor the safe roots preloaded for that (test_suite_shares): learning alone
    yield env
    forkserver.close_all()


def plain(env, argv, cwd):
    p = subprocess.run([sys.executable, "-m", "fsprobe", *argv], env=env, cwd=cwd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("threads_env", ["omp1", "unset"])
def test_a_forked_run_is_the_plain_run(probe_env, tmp_path, monkeypatch, threads_env):
    monkeypatch.chdir(tmp_path)
    if threads_env == "unset":  # numpy's OpenBLAS would start its pool at import: the server must stay forkable
        probe_env = {k: v for k, v in probe_env.items() if k not in forkserver.SINGLE_THREADED}
    runs = [forkserver.run("fsprobe", ["a", "b"], probe_env, tmp_path) for _ in range(3)]
    rc, out, err = plain(probe_env, ["a", "b"], tmp_path)
    first = json.loads(runs[0][1])
    assert runs[0][0] == rc == 0 and json.loads(out) == first | {"numpy_loaded": False}
    assert first == {"argv": ["a", "b"], "cwd": str(tmp_path), "marker": "m1", "leaked": None,
                     "numpy_loaded": False, "name": "__main__", "learned_var": None}
    for r in runs[1:]:  # each run a fresh fork: nothing the last one set; numpy preloaded from the second on
        assert r[0] == 0 and json.loads(r[1]) == first | {"numpy_loaded": True} and r[2] == err == "to stderr\n"


@pytest.mark.parametrize("argv,rc,tail", [(["fail"], 3, "to stderr"), (["boom"], 1, "RuntimeError: boom")])
def test_exit_status_and_stderr_are_the_runs(probe_env, tmp_path, monkeypatch, argv, rc, tail):
    monkeypatch.chdir(tmp_path)
    got = forkserver.run("fsprobe", argv, probe_env, tmp_path)
    want = plain(probe_env, argv, tmp_path)
    assert got[0] == want[0] == rc and got[2].strip().splitlines()[-1] == want[2].strip().splitlines()[-1] == tail


def test_one_server_per_environment_and_off_switch(probe_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = json.loads(forkserver.run("fsprobe", [], probe_env, tmp_path)[1])
    b = json.loads(forkserver.run("fsprobe", [], probe_env | {"PROBE_MARK": "m2"}, tmp_path)[1])
    assert (a["marker"], b["marker"]) == ("m1", "m2") and len(forkserver._SERVERS) == 2
    monkeypatch.setenv("SWA_REPRO_FORKSERVER", "0")
    assert forkserver.run("fsprobe", [], probe_env, tmp_path) is None


def test_loaded_from_venv_is_the_stdlib_and_the_safe_roots_only():
    import numpy  # noqa: F401  (a safe root, loaded)

    names = forkserver.loaded_from_venv()
    assert "json" in names and "numpy" in names and "numpy.linalg" in names
    assert "pytest" not in names and "_pytest.main" not in names  # loaded, from the venv, but not a safe root
    assert not [n for n in names if n.split(".")[0] in ("swa_repro", "sglang", "sgl_kernel")]


def test_a_preload_that_starts_a_thread_is_caught(tmp_path):
    (tmp_path / "fs_quiet.py").write_text("X = 1\n")
    (tmp_path / "fs_threaded.py").write_text("import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from swa_repro.engine import forkserver as f; "
            "print(f._preload(['fs_quiet'], set()), f._preload(['fs_threaded', 'fs_quiet'], {'fs_threaded'}), "
            "f._preload(['fs_threaded'], set()), f._threads())")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(Path(forkserver.__file__).parents[2])})
    assert p.stdout.split() == ["None", "None", "fs_threaded", "2"], p.stderr


# ----------------------------------------------------------------------------- shared bytecode
CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from swa_repro.engine import bytecode
    copy = Path(sys.argv[1])
    print(bytecode.share(copy))
    sys.path.insert(0, str(copy))
    import pkgx.same, pkgx.edited
    print(pkgx.same.f.__code__.co_filename)
    print(pkgx.edited.VALUE)
""")


def test_a_linked_copy_reads_the_release_overlays_bytecode(tmp_path):
    cache = tmp_path / "cache"
    origin = cache / "sglang" / "9.9.9"
    (origin / "pkgx").mkdir(parents=True)
    (origin / ".swa-repro-overlay.json").write_text(json.dumps({"sglang": "9.9.9"}))
    (origin / "pkgx" / "__init__.py").write_text("")
    (origin / "pkgx" / "same.py").write_text("def f():\n    return 1\n")
    (origin / "pkgx" / "edited.py").write_text("VALUE = 'shipped'\n")
    copy = cache / "sglang-fixed" / "9.9.9-abc"
    shutil.copytree(origin, copy, copy_function=os.link)
    (copy / "pkgx" / "edited.py").unlink()
    (copy / "pkgx" / "edited.py").write_text("VALUE = 'fixed'\n")
    pyc = tmp_path / "pyc"
    env = {**os.environ, "SWA_REPRO_CACHE": str(cache), "PYTHONPYCACHEPREFIX": str(pyc),
           "PYTHONPATH": str(Path(forkserver.__file__).parents[2])}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    p = subprocess.run([sys.executable, "-c", CHILD, str(copy)], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", str(copy / "pkgx" / "same.py"), "fixed"]
    compiled = sorted(str(f.relative_to(pyc)).split(".cpython")[0] for f in pyc.rglob("*.pyc") if "pkgx" in f.parts)
    # with a prefix, a .pyc mirrors its source's path: the linked files under the origin's, the replaced one its own
    assert compiled == sorted([str(origin.relative_to("/") / "pkgx" / "__init__"), str(origin.relative_to("/") / "pkgx" / "same"),
                               str(copy.relative_to("/") / "pkgx" / "edited")])
    # the release overlay itself is no copy: nothing to share
    assert subprocess.run([sys.executable, "-c", CHILD, str(origin)], env=env, capture_output=True,
                          text=True).stdout.split()[:1] == ["False"]


def test_a_variable_torch_sets_itself_does_not_start_a_second_server():
    """The parent's first ``import torch._dynamo`` writes TORCHINDUCTOR_CACHE_DIR (its default) into
    os.environ: the same run before and after it goes to one server; any other variable does not."""
    from swa_repro.engine import forkserver

    env = {"PATH": "/bin", "PYTHONPATH": "/x"}
    assert forkserver.server_key(env) == forkserver.server_key({**env, "TORCHINDUCTOR_CACHE_DIR": "/tmp/t"})
    assert forkserver.server_key(env) != forkserver.server_key({**env, "PYTHONPATH": "/y"})


def test_a_new_server_preloads_what_an_earlier_one_learned_in_the_same_cache(probe_env, tmp_path, monkeypatch):
    """What a server learned is kept in the cache (``preload_file``): the next server (the next command)
    preloads it before its first fork, so that run does not import torch & co. itself and the server
    again after it; another cache starts from nothing; the runs' environment carries none of it."""
    monkeypatch.chdir(tmp_path)
    first = forkserver.run("fsprobe", ["a"], probe_env, tmp_path)
    assert json.loads(first[1])["numpy_loaded"] is False
    assert "numpy" in forkserver.preload_file(probe_env).read_text().split()
    forkserver.close_all()  # a new command: a new server
    again = forkserver.run("fsprobe", ["a"], probe_env, tmp_path)
    assert json.loads(again[1]) == json.loads(first[1]) | {"numpy_loaded": True}
    assert json.loads(again[1])["learned_var"] is None  # the server's own setting, not the run's environment
    other = {**probe_env, "SWA_REPRO_CACHE": str(tmp_path / "other")}
    assert json.loads(forkserver.run("fsprobe", ["a"], other, tmp_path)[1])["numpy_loaded"] is False


MEET = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    me, other = Path(sys.argv[1]), Path(sys.argv[2])
    me.touch()
    t = time.monotonic()
    while not other.exists() and time.monotonic() - t < 20:
        time.sleep(0.01)
    print("met" if other.exists() else "alone")
""")


def test_threads_asking_at_once_share_one_server_and_run_at_once(probe_env, tmp_path, monkeypatch):
    """Two threads' runs (the family table's release and its companion, ``engine.child.beside``) go to
    one server (before: a server per thread, each preloading torch & co. again) and are forked at once:
    each run waits for the other to have started, so run one after the other, neither would meet it."""
    import threading

    monkeypatch.chdir(tmp_path)
    (tmp_path / "fsmeet.py").write_text(MEET)
    got = {}

    def one(me, other):
        (tmp_path / me).mkdir()
        got[me] = forkserver.run("fsmeet", [str(tmp_path / f"{me}.on"), str(tmp_path / f"{other}.on")], probe_env,
                                 tmp_path / me)

    threads = [threading.Thread(target=one, args=p) for p in (("a", "b"), ("b", "a"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got["a"][:2] == got["b"][:2] == (0, "met\n")
    assert [s.runs for s in forkserver._SERVERS.values()] == [2]


def test_requests_read_before_an_exec_are_run_by_the_server_after_it(probe_env, tmp_path):
    """A server that must exec (a preloaded module started a thread) first lets its runs end, then carries
    the requests it read but did not fork over the exec (``STATE[3]``): each is run and answered by its id."""
    (tmp_path / "queued").write_text(json.dumps({"id": 7, "module": "fsprobe", "argv": ["q"], "cwd": str(tmp_path),
                                                 "stdout": str(tmp_path / "o"), "stderr": str(tmp_path / "e")}) + "\n")
    env = {**probe_env, forkserver.STATE[3]: str(tmp_path / "queued")}
    p = subprocess.run([sys.executable, "-m", forkserver.MODULE], input="", capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60, check=False)
    assert p.returncode == 0 and json.loads(p.stdout) == {"id": 7, "rc": 0}, p.stderr
    assert json.loads((tmp_path / "o").read_text())["argv"] == ["q"] and not (tmp_path / "queued").exists()


def test_a_warmed_server_is_the_one_the_next_run_forks_from(probe_env, tmp_path, monkeypatch):
    """``forkserver.warm``: the family table starts its children's server first, so the preload overlaps the
    parent's first seconds; the run after it forks from that server, not a second one."""
    monkeypatch.chdir(tmp_path)
    forkserver.warm(probe_env)
    (server,) = forkserver._SERVERS.values()
    assert server.runs == 0 and server.proc.poll() is None
    forkserver.warm(probe_env)  # warm again: the same server
    assert json.loads(forkserver.run("fsprobe", ["w"], probe_env, tmp_path)[1])["argv"] == ["w"]
    assert list(forkserver._SERVERS.values()) == [server] and server.runs == 1
