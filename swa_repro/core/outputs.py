"""Output paths, checked before any work: a bad one is one line (UsageError) and nothing is written.

Two kinds: a file a command writes into an existing folder (``mask --out``, ``replay --out``), and
a folder a command creates with its parents when missing (``run --output``, ``record --out``,
``sglang-check --trace-dir``, ``fuzz --out``). Either fails here, not after minutes of work or a
GPU run, when the path cannot be written.
"""

from __future__ import annotations

import os
from pathlib import Path

from swa_repro.core.errors import UsageError


def out_file(path, flag: str, suffixes: tuple[str, ...] = ()) -> Path:
    """A file to write: it has one of ``suffixes`` (if given), is not a folder, and its folder exists
    and is writable (the command does not create folders for it)."""
    p = Path(path)
    if suffixes and p.suffix not in suffixes:
        raise UsageError(f"{flag} {path}: name a {' or '.join(suffixes)} file")
    if os.path.isdir(p):
        raise UsageError(f"{flag} {path} is a folder: name a file in it")
    parent = p.parent
    if not os.path.isdir(parent):
        what = "is a file" if os.path.exists(parent) else "does not exist"
        raise UsageError(f"{flag} {path}: folder {parent} {what}; create it first or name a file in an existing folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: folder {parent} is not writable; name a file in a folder you can write")
    return p


def out_dir(path, flag: str) -> Path:
    """A folder to write into, created with its parents when missing: what exists of it must be
    folders, and the nearest existing one writable."""
    p = Path(path)
    if os.path.exists(p) and not os.path.isdir(p):
        raise UsageError(f"{flag} {path} is a file: give a folder (it is created if missing)")
    have = p
    while not os.path.exists(have) and have != have.parent:  # os.path: False, not raise, on EACCES
        have = have.parent
    if not os.path.isdir(have):
        raise UsageError(f"{flag} {path}: {have} is a file, so the folder cannot be created; give another path")
    if not os.access(have, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {have} is not writable; give a folder you can write")
    return p
