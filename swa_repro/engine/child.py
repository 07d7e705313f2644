"""A module of this package run as a child against a release's overlay (``python -m MODULE --overlay
DIR --out FILE ...``): the parent's side (the environment, a fork from the warm server or a plain
child, the document read back) and the child's (``--overlay`` first on ``sys.path``, the release's
bytecode shared, one stderr line on failure). Engine-neutral: ``sglang.overlay_run`` adds sglang's
overlays, cache key and import check on top, ``vllm.audit.drive`` / ``vllm.audit.live`` are such children too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.engine import bytecode, forkserver


# ----------------------------------------------------------------------------- parent
def whole_run(d) -> bool:
    """A cached child run is used only with its document (a non-empty dict) and its seconds."""
    return isinstance(d, dict) and isinstance(d.get("document"), dict) and bool(d["document"]) and "seconds" in d


def run_module(module: str, argv: list[str], env: dict, tmp: Path, fork: bool = True) -> tuple[int, str, str]:
    """``python -m module argv`` under ``env`` -> ``(returncode, stdout, stderr)``: forked from a warm
    server (``forkserver``: the venv's imports done once), else (or ``fork=False``) a plain child."""
    forked = forkserver.run(module, argv, env, tmp) if fork else None
    if forked is None:
        p = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, env=env)
        forked = (p.returncode, p.stdout, p.stderr)
    return forked


def shadowed(overlay: Path) -> list[str]:
    """The packages the fork server imports from the venv (``forkserver.SAFE_ROOTS``) of which
    ``overlay`` has its own copy (an sglang release with its pinned transformers,
    ``sglang.release_transformers``): a fork would run on the server's, already imported, so such an
    overlay's children run as plain ones."""
    return sorted(n for n in forkserver.SAFE_ROOTS if (Path(overlay) / n / "__init__.py").is_file())


def child_env() -> dict:
    """The child's environment: this package importable, and the release's bytecode kept. Without
    it every child compiled the release from source again (cProfile of a family audit: 20.5 s of
    ``compile()``) wherever ``PYTHONDONTWRITEBYTECODE`` is set (this project's CI image): as the
    Makefile does, bytecode goes to one folder, ``$PYTHONPYCACHEPREFIX`` or the cache's ``pycache/``."""
    from swa_repro.core.cache import cache_root

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", str(cache_root() / "pycache"))
    return env


def run_in_child(module: str, overlay: Path, args: list[str], what: str) -> dict:
    """``{"document": the child's JSON, "seconds": its run}`` of ``python -m module --overlay overlay
    --out F *args``; a failed child is one UsageError line (its last stderr line)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        t0 = time.monotonic()
        rc, _, stderr = run_module(module, ["--overlay", str(overlay), "--out", str(out), *args], child_env(), Path(tmp),
                                   fork=not shadowed(overlay))
        if rc != 0 or not out.is_file():
            last = [ln for ln in stderr.splitlines() if ln.strip()]
            raise UsageError(f"{what} failed: {last[-1] if last else f'exit {rc}'}")
        return {"document": json.loads(out.read_text()), "seconds": round(time.monotonic() - t0, 1)}


_BESIDE: list = []  # the one helper thread's executor, made on first use


def beside(fn, *args):
    """``fn(*args)`` on this process's one helper thread -> its ``Future``: work independent of what the
    caller does meanwhile (a release's ServerArgs child beside its family child: the second core). One
    thread for the process, so at most one such task runs at a time however many callers; a child run
    from it forks from the same warm server as the caller's (``forkserver``: runs asked at once are
    forked at once)."""
    from concurrent.futures import ThreadPoolExecutor

    if not _BESIDE:
        _BESIDE.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="swa-repro-beside"))
    return _BESIDE[0].submit(fn, *args)


# ----------------------------------------------------------------------------- child
def child_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {prog}")
    p.add_argument("--overlay", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    return p


def child_main(parser: argparse.ArgumentParser, run, argv=None) -> int:
    """Parse, put the overlay first on ``sys.path`` (before anything imports sglang), ``run(overlay,
    args)`` -> document written to ``--out``; any error is one stderr line for the parent, exit 2."""
    a = parser.parse_args(argv)
    overlay = a.overlay.resolve()
    sys.path.insert(0, str(overlay))
    bytecode.share(overlay)  # a fixed or kit overlay: the release's compiled modules, not a second compile
    try:
        doc = run(overlay, a)
    except Exception as e:  # one line for the parent, never a traceback
        print(f"{type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 2
    a.out.write_text(json.dumps(doc, default=str))
    return 0
