"""A release's files as an *overlay*: where the cache keeps one and the command that installs into one.

Both engines audit a release from its files put first on ``sys.path`` of this venv in a child
(``engine.child``): sglang's wheel installed with ``--no-deps --target`` (``sglang.provision``),
vLLM's Python files unpacked and its few pure-Python dependencies installed the same way
(``vllm.provision``). uv next to this interpreter (or on PATH) hard-links from its download cache:
1-4 s a release against minutes for an environment (issue 9).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def release_overlay(project: str, version: str) -> Path:
    """Where the cache keeps ``project``'s release overlay: one place for the folder provisioning
    fills (``sglang.provision.overlay_dir``) and the one a copy's bytecode is read from (``bytecode``)."""
    from swa_repro.core.cache import cache_root

    return cache_root() / project / version


def install_command(target: Path) -> list[str]:
    """``pip install --no-deps --target target`` by uv next to this interpreter or on PATH, else
    ``python -m pip``; the caller appends the requirements."""
    uv = Path(sys.executable).with_name("uv")
    uv = str(uv) if uv.is_file() else shutil.which("uv")
    if uv:
        return [uv, "pip", "install", "--python", sys.executable, "--no-deps", "--target", str(target)]
    return [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target)]


MARKER = ".swa-repro-overlay.json"


def linked_copy(overlay: Path, dst: Path, edit, marker: str, ignore=("__pycache__",)) -> dict:
    """``dst`` made anew as a hard-linked copy of ``overlay`` (a release's files: a fixed copy, a kit copy,
    one with the release's own transformers beside it), whole or not at all: the copy is made in a
    ``.partial`` folder beside ``dst``, ``edit(partial)`` changes it and returns its marker's contents
    (a file it changes is unlinked first, never written through the link to the release's), the marker
    goes to ``marker``, and only then does the folder replace ``dst``. ``ignore``: names not copied
    (each copy compiles its own bytecode, or reads its origin's: ``bytecode.share``)."""
    import json
    import os

    partial = dst.with_name(f".{dst.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(overlay, partial, copy_function=os.link, symlinks=True, ignore=shutil.ignore_patterns(*ignore))
    info = edit(partial)
    (partial / marker).write_text(json.dumps(info, indent=1))
    shutil.rmtree(dst, ignore_errors=True)
    partial.rename(dst)
    return info


def refusal(requirement: str, output: str) -> str:
    """One line from the installer's output: no such release, no network, or its last line."""
    project = requirement.split("==")[0]
    low = output.lower()
    if any(s in low for s in ("no solution found", "no matching distribution", "could not find a version",
                              f"no version of {project}")):
        return f"{requirement} is not on the package index: see `pip index versions {project}`"
    if any(s in low for s in ("failed to fetch", "dns error", "connection", "network", "timed out",
                              "temporary failure", "offline")):
        return f"cannot reach the package index to install {requirement} (no network?)"
    last = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return f"installing {requirement} failed: {last[-1] if last else 'no output'}"


def intact(target: Path, dist_glob: str, what: str, say: bool = False) -> dict | None:
    """The cached overlay's marker if it is whole and its files are its wheels' (``record``: RECORD's
    sha256 of each, checked when their stamp changed), else None: made again. ``say``: one stderr
    line on a damaged overlay."""
    from swa_repro.engine import record

    info = record.marker(target / MARKER) if target.is_dir() else None
    bad = record.damaged(target, dist_glob, many=dist_glob.startswith("*")) if info is not None else []
    if say and (bad or (info is None and target.exists())):
        print(f"swa-repro: {what}'s cached overlay {target} is damaged "
              f"({bad[0] if bad else MARKER + ' unreadable'}); installing it again", file=sys.stderr)
    return None if info is None or bad else info


def provisioned(target: Path, dist_glob: str, what: str, install) -> tuple[Path, dict]:
    """``(target, info)``: the overlay cached at ``target`` if intact, else ``install(target)``'s.
    One installer per overlay: two processes (xdist workers, a notebook beside the suite) asking for
    the same release from nothing would share the .partial folder, and the later rename would pull
    the overlay from under a child already importing it. The second waits and takes the first's."""
    from swa_repro.core.cache import locked, unusable

    info = intact(target, dist_glob, what)
    if info is not None:
        return target, {**info, "cached": True}
    try:
        with locked(target.with_name(f".{target.name}.lock")):
            info = intact(target, dist_glob, what, say=True)
            return (target, {**info, "cached": True}) if info is not None else install(target)
    except OSError as e:
        raise unusable(e) from None


def install(target: Path, requirements: list[str], info: dict, more=None) -> tuple[Path, dict]:
    """``install_command`` of ``requirements`` into ``target``'s .partial folder, checked against the
    wheels' RECORDs, ``info`` (with the installer and its seconds) as its marker, then renamed into
    place; ``more(partial)``: requirements known only once the first are there (their own pins), installed
    the same way. A failure is one line (``UsageError``) and leaves nothing."""
    import json
    import os
    import subprocess
    import time

    from swa_repro.core.errors import UsageError
    from swa_repro.engine.record import damaged

    first, project = requirements[0], requirements[0].split("==")[0]
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    t0, done = time.monotonic(), []
    for reqs in (requirements, None):
        reqs = reqs if reqs is not None else (more(partial) if more else [])
        if not reqs:
            continue
        cmd = [*install_command(partial), *reqs]
        # uv's own download cache (the one `make venv` fills): overlays hard-link from it
        p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), check=False)
        if p.returncode != 0 or not (partial / project.replace("-", "_") / "__init__.py").is_file():
            shutil.rmtree(partial, ignore_errors=True)
            raise UsageError(refusal(reqs[0], p.stdout + p.stderr))
        done += reqs
    tool = "uv pip" if Path(cmd[0]).name == "uv" else "pip"
    info = {**info, "installer": f"{tool} install --no-deps --target <overlay> {' '.join(done)}",
            "install_seconds": round(time.monotonic() - t0, 1)}
    bad = damaged(partial, "*.dist-info", many=True)
    if bad:
        shutil.rmtree(partial, ignore_errors=True)
        raise UsageError(f"{first} as installed does not match its RECORD ({bad[0]}); clear uv's cache "
                         f"(`uv cache clean {project}`) and try again")
    (partial / MARKER).write_text(json.dumps(info, indent=1))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target, {**info, "cached": False}
