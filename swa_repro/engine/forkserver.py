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
overlay's, or the run's), and the server imports them before the next fork. What a server learned is
kept in the user's cache (:func:`preload_file`, per interpreter), and a new server preloads it before
its first fork: without it, each command's first run imported torch & co. itself and the server then
imported them again for the next one (~8 CPU-s of each ``audit --release-table`` run, issue #41). With
nothing learned yet, a server preloads the installed :data:`SAFE_ROOTS` themselves first (``preload_seed``).

Linux only. ``fork`` is safe while the server has no thread but its main one: a preloaded module
that starts one (pandas and datasets start pyarrow's pool: none of :data:`SAFE_ROOTS`) is left out
from then on (:func:`serve`). ``SWA_REPRO_FORKSERVER=0`` turns it off. The parent keeps one server
per (environment, working directory) and at most :data:`MAX_SERVERS`, shared by its threads: runs asked
at once (the family table's ``--jobs``, its companion, ``engine.child.beside``) are forked at once and
each answered by its id. Before, each asking thread had a server of its own, and each preloaded torch &
co. again (~10 CPU-s each on 2 busy cores: three of them in one release's row of the family table).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MAX_SERVERS = 3  # each holds torch & co. (~0.5 GB, shared copy-on-write with its children)
MODULE = "swa_repro.engine.forkserver"  # this file, run as ``python -m`` (where its __name__ is __main__)
STATE = ("SWA_REPRO_FORKSERVER_DENY", "SWA_REPRO_FORKSERVER_KNOWN", "SWA_REPRO_FORKSERVER_EXECS",
         "SWA_REPRO_FORKSERVER_QUEUED")  # over an exec; QUEUED: the requests read and not yet forked
LEARNED = "SWA_REPRO_FORKSERVER_LEARNED"  # where the server keeps what it learned (:func:`preload_file`)
MAX_EXECS = 2
# A run forked from the server computes single-threaded (its tensors are small: tests/conftest.py
# measured one OpenMP thread faster on 2 cores), and the server has no pool thread to fork over.
SINGLE_THREADED = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
OWN_ROOTS = ("sglang", "sgl_kernel", "swa_repro", "__main__")  # the overlay's or the run's: never preloaded


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get("SWA_REPRO_FORKSERVER", "1") not in ("0", "")


# ----------------------------------------------------------------------------- parent
class Server:
    """One ``python -m swa_repro.engine.forkserver`` process; :meth:`run` is ``subprocess.run``'s
    ``(returncode, stdout, stderr)`` for one ``python -m module argv``, from any thread: each request
    carries an id, and a reader thread hands each reply to the run that waits for it."""

    def __init__(self, env: dict, cwd: str):
        self.proc = subprocess.Popen([sys.executable, "-m", MODULE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=learned_env(env),
                                     cwd=cwd, text=True)
        self.runs = 0
        self._write, self._replies, self._ended = threading.Lock(), {}, False
        self._cond = threading.Condition()
        threading.Thread(target=self._read_replies, name="swa-repro-forkserver-replies", daemon=True).start()

    def _read_replies(self) -> None:
        try:
            for line in self.proc.stdout:
                reply = json.loads(line)
                with self._cond:
                    self._replies[reply["id"]] = reply
                    self._cond.notify_all()
        except (OSError, ValueError, KeyError, TypeError):  # a server that ended or wrote no reply: ended
            pass
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def run(self, module: str, argv: list[str], tmp: Path) -> tuple[int, str, str]:
        out, err = tmp / "fork.stdout", tmp / "fork.stderr"
        with self._write:
            self.runs += 1
            rid = self.runs
            req = {"id": rid, "module": module, "argv": argv, "cwd": os.getcwd(), "stdout": str(out),
                   "stderr": str(err)}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        with self._cond:
            while rid not in self._replies and not self._ended:
                self._cond.wait()
            reply = self._replies.pop(rid, None)
        if reply is None:
            raise OSError("the fork server ended")
        return reply["rc"], _read(out), _read(err)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def preload_file(env: dict) -> Path:
    """What servers of this interpreter learned: ``pycache``'s sibling in the cache of ``env``
    (``$SWA_REPRO_CACHE``, else ``core.cache.cache_root``), one file per interpreter and venv."""
    from swa_repro.core.cache import cache_root

    root = Path(env["SWA_REPRO_CACHE"]).expanduser() if env.get("SWA_REPRO_CACHE") else cache_root()
    tag = hashlib.sha256(f"{sys.executable}\0{sys.prefix}\0{sys.version}".encode()).hexdigest()[:16]
    return root / "forkserver" / f"preload-{tag}.txt"


def learned_env(env: dict) -> dict:
    """The server's environment: ``env``, where to keep what it learns and, from an earlier server, a
    copy of it to preload (``serve`` reads the copy and removes it)."""
    path = preload_file(env)
    out = {**env, LEARNED: str(path)}
    try:
        known = path.read_text()
        fd, carried = tempfile.mkstemp(prefix="swa-repro-forkserver-")
        os.write(fd, known.encode())
        os.close(fd)
        out[STATE[1]] = carried
    except OSError:  # none yet, or unreadable: learned again
        pass
    return out


def keep_learned(path: str | None, known: set) -> None:
    """Write ``known`` to ``path`` (whole or not at all); a cache that cannot be written keeps nothing."""
    if not path:
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        Path(tmp).write_text("\n".join(sorted(known)))
        os.replace(tmp, path)
    except OSError:
        pass


_SERVERS: dict = {}  # key -> Server, oldest first
_GAVE_UP: set = set()  # keys whose server could not stay fork-safe (serve's exit 3): plain children for them
_LOCK = threading.Lock()


# Set by an import in the parent to the default a child computes the same way: never part of a key.
# torch/_inductor/runtime/cache_dir_utils.py:17 (torch 2.x) writes TORCHINDUCTOR_CACHE_DIR into
# os.environ the first time torch._dynamo is imported (transformers' masking_utils does it), so the
# parent's environment gains it between two runs, and each run after it would start a second server.
SELF_SET = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
# pytest's name of the test and phase running now: each test of a file that ran a child started a server of its
# own (a ~13 s preload each: test_server_run's three). A run reads it only to name a metric dump (sglang
# 0.5.23 test/test_utils.py:2805), and a fork sees the value its server was started under: never a key either.
PER_TEST = frozenset({"PYTEST_CURRENT_TEST"})


def server_key(env: dict) -> str:
    """One server per (environment, working directory), the environment less :data:`SELF_SET` and :data:`PER_TEST`."""
    kept = sorted((k, v) for k, v in env.items() if k not in SELF_SET | PER_TEST)
    return hashlib.sha256(json.dumps([kept, os.getcwd()]).encode()).hexdigest()


def warm(env: dict) -> None:
    """Start the server a later :func:`run` under ``env`` forks from, so that its preload (torch & co.,
    ~8 s of one core) overlaps what the caller does first (the family table: ~5 s of overlays, cache
    keys and imports before its first child) instead of delaying that child."""
    key = server_key(env)
    if enabled() and key not in _GAVE_UP:
        with _LOCK:
            if key not in _SERVERS or _SERVERS[key].proc.poll() is not None:
                _SERVERS[key] = Server(env, os.getcwd())


def run(module: str, argv: list[str], env: dict, tmp: Path) -> tuple[int, str, str] | None:
    """``(returncode, stdout, stderr)`` of ``python -m module argv`` under ``env``, forked from a warm
    server; ``None`` when no server can do it (the caller then runs a plain child)."""
    key = server_key(env)
    if not enabled() or key in _GAVE_UP:
        return None
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
            if _SERVERS.get(key) is server:  # not a new one another thread started meanwhile
                _SERVERS.pop(key)
        server.close()
        if server.proc.returncode == 3:
            _GAVE_UP.add(key)
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
# The venv's packages a server may preload: where sglang's import spends its time (python -X importtime,
# 0.5.23: torch, rfc3987_syntax's grammar, transformers, ml_dtypes, scipy, openai, sympy, ...) and what they
# import, all pure Python or self-contained native code. Never a package that loads a CUDA library,
# stub or JIT runtime (flashinfer, cutlass, triton, tilelang, tvm_ffi, torchvision, ...): loaded ahead
# of sglang, tilelang's libcudart stub made flashinfer.comm raise AttributeError inside a
# `try: ... except ImportError` of sglang's (0.5.15.post1 moe/token_dispatcher/flashinfer.py:29-31),
# where a plain run gets the ImportError. The standard library is always preloadable.
SAFE_ROOTS = frozenset("""
    torch torchgen functorch numpy scipy sympy mpmath networkx ml_dtypes einops
    transformers tokenizers safetensors huggingface_hub sentencepiece tiktoken regex gguf compressed_tensors
    rfc3987_syntax lark jsonschema jsonschema_specifications referencing rpds mistral_common pycountry
    pydantic pydantic_core pydantic_extra_types annotated_types annotated_doc typing_extensions typing_inspection
    openai httpx httpcore h11 anyio sniffio aiohttp aiohappyeyeballs aiosignal yarl multidict frozenlist propcache
    requests urllib3 idna certifi charset_normalizer fsspec filelock packaging tqdm rich pygments
    jinja2 markupsafe yaml msgspec orjson pybase64 zmq psutil uvicorn fastapi starlette python_multipart
    dill cloudpickle multiprocess six attr attrs dateutil
""".split())


def _venv_dirs() -> tuple[str, str]:
    """(the standard library's folders, the venv's site-packages folders), each ending in a separator."""
    import sysconfig

    std = {os.path.realpath(sysconfig.get_path(k)) + os.sep for k in ("stdlib", "platstdlib")}
    site = {os.path.realpath(sysconfig.get_path(k)) + os.sep for k in ("purelib", "platlib")}
    return tuple(std), tuple(site)


def loaded_from_venv() -> list[str]:
    """The loaded modules a server may preload: the standard library's, and the venv's under
    :data:`SAFE_ROOTS` (never :data:`OWN_ROOTS`, the overlay's or the run's)."""
    std, site = _venv_dirs()

    def preloadable(name, m) -> bool:
        f = getattr(m, "__file__", None)
        if name.split(".")[0] in OWN_ROOTS or not isinstance(f, str):
            return False
        f = os.path.realpath(f)
        return f.startswith(std) and not f.startswith(site) or f.startswith(site) and name.split(".")[0] in SAFE_ROOTS

    return sorted(name for name, m in list(sys.modules.items()) if preloadable(name, m))


def _preload(names, denied: set) -> str | None:
    """Import ``names`` (parents first) but those under ``denied`` roots; stop at the first import
    that starts a thread (a library with a pool of its own) and return its root: this
    process may then no longer fork."""
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(names, key=lambda n: (n.count("."), n)):
            if name in sys.modules or name.split(".")[0] in denied:
                continue
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - a module that cannot load alone is just not preloaded
                pass
            if _threads() > 1:
                return name.split(".")[0]
    return None


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
    """Answer each request line with ``{"id": its id, "rc": N}`` as its run ends, forking each request
    as it comes, while earlier runs still go (requests from several threads of the parent); learn and
    preload as each run ends. When a preloaded module started a thread, the server forks no more: once
    its runs have ended it starts itself again (``exec``: the same pipes, nothing of this process kept,
    the requests read and not forked carried over) with that module's root left out and what it had
    learned preloaded; after :data:`MAX_EXECS` it ends instead, and its parent runs plain children."""
    from swa_repro.engine.preload_seed import seed

    for k in SINGLE_THREADED:  # numpy's OpenBLAS starts its pool at import unless told one thread
        os.environ.setdefault(k, "1")
    denied = set(filter(None, os.environ.pop(STATE[0], "").split(",")))
    known, queued = (_carried(os.environ.pop(k, None)) for k in (STATE[1], STATE[3]))
    known = seed(set(known.decode().split()), SAFE_ROOTS)
    execs = int(os.environ.pop(STATE[2], "0"))
    learned_to = os.environ.pop(LEARNED, None)  # not the runs' environment
    threaded, pending, eof = _preload(known, denied), {}, False  # pending: pid -> (request id, its folder)
    while not (eof or threaded) or pending:
        for pid in list(pending):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                continue
            rid, tmp = pending.pop(pid)
            before = len(known)
            known |= set(_read(Path(tmp, "learned")).split())
            shutil.rmtree(tmp, ignore_errors=True)
            if len(known) > before:
                keep_learned(learned_to, known)
            threaded = threaded or _preload(known, denied)
            print(json.dumps({"id": rid, "rc": os.waitstatus_to_exitcode(status)}), flush=True)
        while not threaded and b"\n" in queued:
            line, queued = queued.split(b"\n", 1)
            req, tmp = json.loads(line), tempfile.mkdtemp(prefix="swa-repro-fork-")
            pid = os.fork()
            if pid == 0:
                _child(req, os.path.join(tmp, "learned"))
            pending[pid] = (req.get("id"), tmp)
        if eof or threaded:  # runs still going: no more requests are forked until they end
            time.sleep(0.02)
        elif select.select([0], [], [], 0.02 if pending else None)[0]:
            chunk = os.read(0, 1 << 16)
            eof, queued = not chunk, queued + chunk
    if not threaded:
        return 0
    if execs >= MAX_EXECS:
        return 3
    os.execve(sys.executable, [sys.executable, "-m", MODULE], {
        **os.environ, STATE[0]: ",".join(sorted(denied | {threaded})), STATE[1]: _carry(" ".join(sorted(known)).encode()),
        STATE[2]: str(execs + 1), STATE[3]: _carry(queued), **({LEARNED: learned_to} if learned_to else {})})


def _carry(data: bytes) -> str:
    """A temporary file holding ``data`` over an exec (:func:`_carried` reads and removes it)."""
    fd, path = tempfile.mkstemp(prefix="swa-repro-forkserver-")
    os.write(fd, data)
    os.close(fd)
    return path


def _carried(path: str | None) -> bytes:
    if not path:
        return b""
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""
    finally:
        Path(path).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(serve())
