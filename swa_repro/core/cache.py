"""The user's cache of expensive results, keyed by content: never stale, shared by every checkout.

Where: ``$SWA_REPRO_CACHE``, else ``$XDG_CACHE_HOME/swa-repro``, else ``~/.cache/swa-repro`` (as uv
and pip keep theirs), so a fresh clone on the same machine reuses what another one computed.

What: a JSON document per *key*, a sha256 over everything that determines it (which computation,
its arguments, the inputs' content and the hash of the code that computes it: :func:`code_hash`).
A change of any of them is a new key, so an entry is never read for inputs it was not made from;
old entries are only disk (remove the folder at any time). A computation that fails writes
nothing. Two processes asking for the same key (pytest-xdist workers, a notebook beside the suite)
compute it once: the second waits on a file lock and reads the first one's result.

Trust (issue #43): an entry is used only if it is *the* entry of its key and whole. It holds its
``key_parts`` (which must hash, :func:`key_of`, to the key it is read under: a file copied or linked
from another cell's entry is not it), the sha256 of its document (a document edited or cut short,
say a path list emptied, no longer matches) and a document of the shape its consumer expects
(``valid``: by default a non-empty dict; ``{}``, ``0``, a list or a folder in the entry's place
are not). Anything else is a miss: recomputed and written again. A cache that cannot be written
(its root a file, read-only, a full disk) costs only the keeping: the computed result is returned
and one warning line goes to stderr (:func:`_store`); the verdict is the uncached run's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from swa_repro.core import outputs

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


def unusable(e: OSError):
    """The one line (``UsageError``, exit 2) for a cache folder that cannot hold an overlay or a
    wheel (its root a file, read-only, a full disk): results can be recomputed, a release's files cannot."""
    from swa_repro.core.errors import UsageError

    return UsageError(f"the cache folder {cache_root()} cannot be written ({e.strerror or e}): set SWA_REPRO_CACHE "
                      "to a writable folder (or free space there)")


_CODE: dict = {}


def code_hash(subpackages=("core", "kernel", "evidence", "engine", "sglang"), root: Path = PACKAGE) -> str:
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
    """``path`` holds either its old content or all of ``text``, never a part: ``core.outputs.write_atomic``
    (on any failure, a full disk, a read-only folder, Ctrl-C, the temp file is removed and the error
    raised); a folder in the entry's place is removed first (it is no entry, and ``os.replace``
    cannot put a file over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    outputs.write_atomic(path, text.encode())


def disabled() -> bool:
    """``SWA_REPRO_NO_CACHE=1``: compute everything, read and write nothing."""
    return os.environ.get("SWA_REPRO_NO_CACHE", "") not in ("", "0")


def cached(kind: str, parts: dict, compute, valid=None) -> tuple[dict, dict]:
    """``(document, how)``: the cached document of ``parts`` or ``compute()``'s, stored.
    ``how``: ``{"cache": "hit" | "miss" | "off" | "unwritable", "key": ..., "file": ...}``.
    ``valid(document)``: the consumer's shape check (default :func:`filled`); an entry failing it is a miss."""
    key_parts = {"kind": kind, **parts}
    key = key_of(key_parts)
    path = cache_root() / "results" / kind / f"{key}.json"
    if disabled():
        return compute(), {"cache": "off", "key": key}
    how = {"key": key, "file": str(path)}
    doc = _read(path, key, valid)
    if doc is not None:
        return doc, {**how, "cache": "hit"}
    with _try_lock(path.with_suffix(".lock")) as ok:
        doc = _read(path, key, valid) if ok else None  # another process may have made it while this one waited
        if doc is not None:
            return doc, {**how, "cache": "hit"}
        doc = compute()
        stored = ok and _store(path, key_parts, doc)
    return doc, {**how, "cache": "miss" if stored else "unwritable"}


def cached_cells(kind: str, common: dict, cells: list[dict], compute, valid=None) -> tuple[list, dict]:
    """Documents of several cells that one computation makes together (a release's child serves
    every family and GPU class): each cell is its own entry, keyed on ``common`` and the cell, so a
    later request for fewer or more cells reuses the ones made. ``compute(missing cells)`` -> their
    documents, in order, called at most once. ``how``: ``cache`` hit / miss / partial / off, and
    how many cells were computed. ``valid``: as :func:`cached`'s, per cell."""
    if disabled():
        return list(compute(cells)), {"cache": "off", "computed": len(cells)}
    folder = cache_root() / "results" / kind
    parts = [{"kind": kind, **common, **c} for c in cells]
    keys = [key_of(p) for p in parts]
    paths = [folder / f"{k}.json" for k in keys]
    docs = [_read(p, k, valid) for p, k in zip(paths, keys)]
    computed, kept = 0, True
    if any(d is None for d in docs):
        with _try_lock(folder / f"{key_of({'kind': kind, **common})}.lock") as ok:
            if ok:  # another process may have made them while this one waited
                docs = [_read(p, k, valid) for p, k in zip(paths, keys)]
            missing = [i for i, d in enumerate(docs) if d is None]
            if missing:
                new = list(compute([cells[i] for i in missing]))
                for i, d in zip(missing, new):
                    kept = bool(ok and _store(paths[i], parts[i], d)) and kept
                    docs[i] = d
                computed = len(missing)
    state = "hit" if not computed else "miss" if computed == len(cells) else "partial"
    return docs, {"cache": state if kept else "unwritable", "computed": computed, "cells": len(cells),
                  "folder": str(folder)}


def filled(doc) -> bool:
    """The default shape of a document: a dict with something in it."""
    return isinstance(doc, dict) and bool(doc)


def _digest(doc) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _read(path: Path, key: str, valid=None):
    """The document of the entry at ``path`` if it is the entry of ``key`` and whole, else None
    (see the module's "Trust")."""
    try:
        entry = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("key_parts"), dict) or "document" not in entry:
        return None
    doc = entry["document"]
    try:
        if key_of(entry["key_parts"]) != key or entry.get("sha256") != _digest(doc):
            return None
    except (TypeError, ValueError):  # key_parts or a document json cannot sort
        return None
    return doc if (valid or filled)(doc) else None


def _store(path: Path, key_parts: dict, doc) -> bool:
    """Write the entry of ``doc``; a cache that cannot be written says so on one line and keeps nothing."""
    try:
        write_atomic(path, json.dumps({"key_parts": key_parts, "sha256": _digest(doc), "document": doc}, default=str))
        return True
    except OSError as e:
        _warn(path.parent, e)
        return False


_WARNED: set = set()


def _warn(where: Path, e: OSError) -> None:
    """One stderr line per cache folder and process: the result stands, it is not kept."""
    if str(where) not in _WARNED:
        _WARNED.add(str(where))
        print(f"swa-repro: warning: the result cache cannot be written ({where}: {e.strerror or e}); "
              "the result is computed, not kept (set SWA_REPRO_CACHE to a writable folder)", file=sys.stderr)


@contextlib.contextmanager
def _try_lock(path: Path):
    """:func:`locked`, yielding True; False (after one warning) where the lock cannot be made: a
    cache folder that is a file or read-only. The computation then runs unlocked and is not kept."""
    try:
        cm = locked(path)
        cm.__enter__()
    except OSError as e:
        _warn(path.parent, e)
        yield False
        return
    try:
        yield True
    finally:
        cm.__exit__(None, None, None)


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
