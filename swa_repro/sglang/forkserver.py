"""A warm interpreter that forks one child per overlay run, so a run does not pay the venv's imports.

A child of ``overlay_run`` (``python -m MODULE --overlay DIR ...``) spent ~8 s of its ~10 s of
start-up importing the venv's third-party modules that sglang pulls in (``python -X importtime``,
0.5.23's backend: torch 2.3 s, rfc3987_syntax 1.3 s, transformers 0.9 s, cutlass 0.6 s, ...) and
0.7 s importing sglang's own modules. The third-party ones are the same for every release and fix
set (they come from the venv, never from an overlay), so the server imports them once and forks a
child per run: the child starts with them loaded, puts its overlay on ``sys.path`` itself (as the
module's ``child_main`` always does) and runs the module as ``__main__``, as ``python -m`` would.
Each run is a fresh fork of the same state, so nothing one run imports or patches reaches the next.

What to preload is learned, not listed: after a run, its child reports the modules it loaded from
the venv or the standard library (never ``sglang``, ``sgl_kernel`` or this package: those are the
overlay's, or the run's), and the server imports them before the next fork. The first run of a
server is therefore as slow as a plain child; the ones after it are not.

Linux only (``fork`` after importing torch is safe while no thread has started: the server checks
and stops forking if one has); ``SWA_REPRO_FORKSERVER=0`` turns it off. The parent keeps one server
per (environment, working directory, thread) and at most :data:`MAX_SERVERS`.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

MAX_SERVERS = 3  # each holds torch & co. (~0.5 GB, shared copy-on-write with its children)
OWN_ROOTS = ("sglang", "sgl_kernel", "swa_repro", "__main__")  # the overlay's or the run's: never preloaded


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get("SWA_REPRO_FORKSERVER", "1") not in ("0", "")


# ----------------------------------------------------------------------------- parent
class Server:
    """One ``python -m swa_repro.sglang.forkserver`` process; :meth:`run` is ``subprocess.run``'s
    ``(returncode, stdout, stderr)`` for one ``python -m module argv``."""

    def __init__(self, env: dict, cwd: str):
        self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd, text=True)
        self.runs = 0

    def run(self, module: str, argv: list[str], tmp: Path) -> tuple[int, str, str]:
        out, err = tmp / "fork.stdout", tmp / "fork.stderr"
        req = {"module": module, "argv": argv, "cwd": os.getcwd(), "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise OSError("the fork server ended")
        self.runs += 1
        return json.loads(reply)["rc"], _read(out), _read(err)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


_SERVERS: dict = {}  # key -> Server, oldest first
_LOCK = threading.Lock()


def run(module: str, argv: list[str], env: dict, tmp: Path) -> tuple[int, str, str] | None:
    """``(returncode, stdout, stderr)`` of ``python -m module argv`` under ``env``, forked from a warm
    server; ``None`` when no server can do it (the caller then runs a plain child)."""
    if not enabled():
        return None
    key = hashlib.sha256(json.dumps([sorted(env.items()), os.getcwd(), threading.get_ident()]).encode()).hexdigest()
    with _LOCK:
        server = _SERVERS.pop(key, None)
        if server is None or server.proc.poll() is not None:
            server = Server(env, os.getcwd())
        _SERVERS[key] = server  # most recently used last
        while len(_SERVERS) > MAX_SERVERS:
            _SERVERS.pop(next(iter(_SERVERS))).close()
    try:
        return server.run(module, argv, tmp)
    except (OSError, ValueError):
        with _LOCK:
            _SERVERS.pop(key, None)
        server.close()
        return None


@atexit.register
def close_all() -> None:
    with _LOCK:
        while _SERVERS:
            _SERVERS.popitem()[1].close()


def _read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except OSError:
        return ""


# ----------------------------------------------------------------------------- server
def _venv_dirs() -> tuple[str, ...]:
    import sysconfig

    return tuple({os.path.realpath(sysconfig.get_path(k)) + os.sep for k in ("purelib", "platlib", "stdlib")})


def loaded_from_venv() -> list[str]:
    """The loaded modules whose file is the venv's or the standard library's, not :data:`OWN_ROOTS`'."""
    dirs = _venv_dirs()
    return sorted(name for name, m in list(sys.modules.items())
                  if name.split(".")[0] not in OWN_ROOTS and isinstance(getattr(m, "__file__", None), str)
                  and os.path.realpath(m.__file__).startswith(dirs))


def _preload(names: list[str]) -> None:
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(names, key=lambda n: (n.count("."), n)):
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except BaseException:  # noqa: BLE001 - a module that cannot load alone is just not preloaded
                    pass


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _child(req: dict, learned: str) -> None:
    """In the fork: ``python -m module argv`` with stdout/stderr to the request's files; never returns."""
    import runpy
    import traceback

    rc = 1
    try:
        os.chdir(req["cwd"])
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the server's requests are not the run's input
        sys.argv = [req["module"], *req["argv"]]
        sys.path[0] = os.getcwd()  # as `python -m` from this directory
        try:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, exit 1
            traceback.print_exc()
        Path(learned).write_text("\n".join(loaded_from_venv()))
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(rc)


def serve() -> int:
    import tempfile

    forking = True
    for line in sys.stdin:
        req = json.loads(line)
        with tempfile.TemporaryDirectory() as tmp:
            learned = os.path.join(tmp, "learned")
            if forking and _threads() == 1:
                pid = os.fork()
                if pid == 0:
                    _child(req, learned)
                rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            else:  # a preloaded module started a thread: fork is no longer safe, run plain children
                forking = False
                p = subprocess.run([sys.executable, "-m", req["module"], *req["argv"]], cwd=req["cwd"],
                                   stdout=open(req["stdout"], "w"), stderr=open(req["stderr"], "w"))
                rc = p.returncode
            if forking and os.path.isfile(learned):
                _preload(Path(learned).read_text().split())
        print(json.dumps({"rc": rc}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve())
