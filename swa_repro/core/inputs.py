"""Files the tool reads, checked as they are read: a bad one is one line (UsageError) saying what is
wrong with it, never a ``UnicodeDecodeError``, ``SyntaxError``, ``JSONDecodeError`` or ``KeyError``
from deep inside a command.

One reader per kind: Python source (``patch --source``: UTF-8 without a byte order mark, not empty,
parses), JSON with the keys a command relies on (``patch``'s backup metadata, fuzz recordings), and
``.npz`` arrays (fuzz recordings). Bytes are decoded as they are, so ``\\r\\n`` line ends survive.
"""

from __future__ import annotations

import ast
import json
import os
import stat
import zipfile
from pathlib import Path

from swa_repro.core.errors import UsageError

BOM = b"\xef\xbb\xbf"
# The most a file read here may hold: a backend source is ~100 KB, a fuzz recording's JSON a few MB;
# ``--source /dev/zero`` (or a disk image) read without a cap took all the memory.
MAX_BYTES, MAX_SOURCE_BYTES = 256 << 20, 16 << 20


def read_bytes(path, what: str, limit: int = MAX_BYTES) -> bytes:
    """The file's bytes; a folder, a missing file, an unreadable one, one that is no regular file (a
    device, a pipe: ``/dev/zero`` never ends) or one over ``limit`` bytes is one line."""
    p = Path(path)
    if os.path.isdir(p):
        raise UsageError(f"{what} {p} is a folder: give a file")
    try:
        if not stat.S_ISREG(os.stat(p).st_mode):  # before open(): opening a pipe waits for a writer
            raise UsageError(f"{what} {p} is not a regular file (a device or a pipe): give a file")
        with open(p, "rb") as f:
            data = f.read(limit + 1)  # the size may grow while it is read
    except FileNotFoundError:
        raise UsageError(f"{what} {p}: no such file") from None
    except OSError as e:
        raise UsageError(f"{what} {p} cannot be read: {e.strerror or e}") from None
    if len(data) > limit:
        raise UsageError(f"{what} {p} is over {limit >> 20} MiB, more than any file read here holds: give the right file")
    return data


def read_text(path, what: str, limit: int = MAX_BYTES) -> str:
    """UTF-8 text without a byte order mark (the offsets the edits work at count from the first
    character; a BOM or a NUL is no text sglang ships)."""
    data = read_bytes(path, what, limit)
    if data.startswith(BOM):
        raise UsageError(f"{what} {path} starts with a UTF-8 byte order mark: save it without one")
    nul = data.find(b"\0")
    if nul >= 0:
        raise UsageError(f"{what} {path} is binary (a NUL byte at offset {nul}): give a text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path} is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}): "
                         "save it as UTF-8") from None


def read_source(path, what: str) -> str:
    """Python source that is not empty and parses (line and message of the first error)."""
    text = read_text(path, what, MAX_SOURCE_BYTES)
    if not text.strip():
        raise UsageError(f"{what} {path} is empty: give sglang's flashinfer_backend.py")
    try:
        ast.parse(text)
    except (SyntaxError, ValueError) as e:  # ValueError: a source ast cannot take
        line = f", line {e.lineno}" if getattr(e, "lineno", None) else ""
        raise UsageError(f"{what} {path} does not parse as Python ({getattr(e, 'msg', e)}{line})") from None
    return text


def read_json(path, what: str, keys=()) -> dict:
    """A JSON object holding ``keys`` (what the caller indexes, so a hand edit is one line)."""
    text = read_text(path, what)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{what} {path} is not valid JSON ({str(e)[:80]})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{what} {path} is not a JSON object")
    missing = [k for k in keys if k not in doc]
    if missing:
        raise UsageError(f"{what} {path} lacks {', '.join(missing)}")
    return doc


def read_npz(path, what: str) -> dict:
    """Every array of an ``.npz`` (no pickles), loaded now so a truncated member fails here."""
    import numpy as np

    if not Path(path).is_file():
        raise UsageError(f"{what} {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError, TypeError, zipfile.BadZipFile) as e:
        raise UsageError(f"{what} {path} is not a readable .npz ({type(e).__name__}: {str(e)[:80]})") from None
