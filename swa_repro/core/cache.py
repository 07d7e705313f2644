"""The user's cache of expensive results, keyed by content: never stale, shared by every checkout.

Where: ``$SWA_REPRO_CACHE``, else ``$XDG_CACHE_HOME/swa-repro``, else ``~/.cache/swa-repro`` (as uv
and pip keep theirs), so a fresh clone on the same machine reuses what another one computed.

What: a JSON document per *key*, a sha256 over everything that determines it (which computation,
its arguments, the inputs' content and the hash of the code that computes it: :func:`code_hash`).
A change of any of them is a new key, so an entry is never read for inputs it was not made from;
old entries are only disk (remove the folder at any time). A computation that fails writes
nothing. Two processes asking for the same key (pytest-xdist workers, a notebook beside the suite)
compute it once: the second waits on a file lock and reads the first one's result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # swa_repro/


def cache_root() -> Path:
    """``$SWA_REPRO_CACHE``, else ``$XDG_CACHE_HOME/swa-repro``, else ``~/.cache/swa-repro``. A
    relative ``$SWA_REPRO_CACHE`` is made absolute from the working directory of the first call, and
    put back in the environment, so the processes this one starts (notebook kernels, in notebooks/)
    share one cache instead of each making its own under its own working directory."""
    if os.environ.get("SWA_REPRO_CACHE"):
        root = os.path.abspath(Path(os.environ["SWA_REPRO_CACHE"]).expanduser())
        os.environ["SWA_REPRO_CACHE"] = root
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache") / "swa-repro"


_CODE: dict = {}


def code_hash(subpackages=("core", "kernel", "evidence", "sglang"), root: Path = PACKAGE) -> str:
    """sha256 over the path and bytes of every ``.py`` file (and stub) under ``root``'s
    ``subpackages`` and its ``__init__.py``. The default is every layer up to ``sglang``: all the
    code a release's child process can import (``tests/test_layers.py`` holds the layers: nothing
    there imports ``notebook`` or ``cli``). Memoized per process (the files do not change under a
    running program; a test passes another ``root``)."""
    k = (str(root), tuple(subpackages))
    if k not in _CODE:
        h = hashlib.sha256()
        files = [root / "__init__.py"] + sorted(f for s in subpackages for f in (root / s).rglob("*.py")
                                                if "__pycache__" not in f.parts)
        for f in files:
            if f.is_file():
                h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
        _CODE[k] = h.hexdigest()
    return _CODE[k]


def key_of(parts: dict) -> str:
    """The key of a document: sha256 of ``parts`` (JSON, sorted keys), 24 hex digits."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock on ``path`` (created), held for the block; released when the process ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_atomic(path: Path, text: str) -> None:
    """``path`` holds either its old content or all of ``text``, never a part (rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def disabled() -> bool:
    """``SWA_REPRO_NO_CACHE=1``: compute everything, read and write nothing."""
    return os.environ.get("SWA_REPRO_NO_CACHE", "") not in ("", "0")


def cached(kind: str, parts: dict, compute) -> tuple[dict, dict]:
    """``(document, how)``: the cached document of ``parts`` or ``compute()``'s, stored.
    ``how``: ``{"cache": "hit" | "miss" | "off", "key": ..., "file": ...}``."""
    key = key_of({"kind": kind, **parts})
    path = cache_root() / "results" / kind / f"{key}.json"
    if disabled():
        return compute(), {"cache": "off", "key": key}
    how = {"key": key, "file": str(path)}
    doc = _read(path)
    if doc is not None:
        return doc, {**how, "cache": "hit"}
    with locked(path.with_suffix(".lock")):
        doc = _read(path)  # another process may have made it while this one waited
        if doc is not None:
            return doc, {**how, "cache": "hit"}
        doc = compute()
        write_atomic(path, json.dumps({"key_parts": {"kind": kind, **parts}, "document": doc}, default=str))
    return doc, {**how, "cache": "miss"}


def cached_cells(kind: str, common: dict, cells: list[dict], compute) -> tuple[list, dict]:
    """Documents of several cells that one computation makes together (a release's child serves
    every family and GPU class): each cell is its own entry, keyed on ``common`` and the cell, so a
    later request for fewer or more cells reuses the ones made. ``compute(missing cells)`` -> their
    documents, in order, called at most once. ``how``: ``cache`` hit / miss / partial / off, and
    how many cells were computed."""
    if disabled():
        return list(compute(cells)), {"cache": "off", "computed": len(cells)}
    folder = cache_root() / "results" / kind
    paths = [folder / f"{key_of({'kind': kind, **common, **c})}.json" for c in cells]
    docs = [_read(p) for p in paths]
    computed = 0
    if any(d is None for d in docs):
        with locked(folder / f"{key_of({'kind': kind, **common})}.lock"):
            docs = [_read(p) for p in paths]  # another process may have made them while this one waited
            missing = [i for i, d in enumerate(docs) if d is None]
            if missing:
                new = list(compute([cells[i] for i in missing]))
                for i, d in zip(missing, new):
                    write_atomic(paths[i], json.dumps({"key_parts": {"kind": kind, **common, **cells[i]},
                                                       "document": d}, default=str))
                    docs[i] = d
                computed = len(missing)
    state = "hit" if not computed else "miss" if computed == len(cells) else "partial"
    return docs, {"cache": state, "computed": computed, "cells": len(cells), "folder": str(folder)}


def _read(path: Path):
    try:
        return json.loads(path.read_text())["document"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def interpreter() -> dict:
    """What of the running interpreter a result may depend on: Python's version and the versions
    of the libraries a child computes with (the audit and the kit run on this venv's torch)."""
    from importlib import metadata

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {"python": sys.version.split()[0], **{d: version(d) for d in ("torch", "numpy", "flashinfer-python")}}
