"""An overlay (a release's files in the cache: ``sglang.provision``, ``vllm.provision`` and its
``.deps``, their fixed and kit copies) checked against its wheel's ``RECORD`` before it is used (issue #43).

Why: a damaged file in a cached overlay (cut short, edited, replaced) made the release "not have" a
model it has, and the result computed on it was cached under the intact release's key (the key
reads the RECORD, not the files). Each file ``RECORD`` lists with a sha256 must hash to it; a file
a fixed copy replaced must hash to what the fix wrote (``replaced``); a file the overlay leaves out
on purpose (vLLM's compiled ``.so``: ``skip``) is not read.

Fast: hashing every listed file of a release takes ~0.3-0.5 s (sglang 0.5.23: 5,781 files, 115 MB),
so it runs only when the overlay's *stamp* changed: a sha256 over each listed file's path, size,
inode, mtime and ctime (``os.stat``, ~0.1 s for 5,781 files), saved in :data:`STAMP` after a check
that passed. Writing into a file, truncating it, replacing it or resetting its mtime all change the
stamp (``ctime`` cannot be set back), so the full check runs and finds it. Hard-linking the files
(a fixed copy) changes their ctime too: one full check again, then the new stamp.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
from pathlib import Path

STAMP = ".swa-repro-verified.json"


def listed(overlay: Path, dist_glob: str, skip=None, many: bool = False) -> list[tuple[str, str]] | str:
    """``[(relative path, urlsafe-b64 sha256)]`` of the files the RECORD lists with a hash, or why
    there is no usable RECORD. ``many``: a site of several distributions (vLLM's ``.deps``), every
    RECORD matching ``dist_glob`` (at least one)."""
    recs = sorted(overlay.glob(f"{dist_glob}/RECORD"))
    bare = [d.name for d in overlay.glob(dist_glob) if many and not (d / "RECORD").is_file()]
    if bare:  # a distribution whose files nothing vouches for
        return f"{bare[0]} has no RECORD"
    if not recs if many else len(recs) != 1:
        return f"{len(recs)} RECORD files ({'at least ' * many}1 expected)"
    rows = []
    for rec in recs:
        try:
            rows += list(csv.reader(io.StringIO(rec.read_text())))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            return f"{rec.relative_to(overlay)} does not read ({e})"
    out = [(r[0], r[1].split("=", 1)[1]) for r in rows if len(r) >= 2 and r[1].startswith("sha256=")
           and not (skip and skip(r[0]))]
    return out or "its RECORD lists no file with a sha256"


def _stamp(overlay: Path, files: list[str]) -> str:
    h = hashlib.sha256()
    for rel in files:
        try:
            st = os.stat(overlay / rel)
            h.update(f"{rel}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n".encode())
        except OSError:
            h.update(f"{rel}\0missing\n".encode())
    return h.hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def damaged(overlay: Path, dist_glob: str, *, skip=None, replaced: dict | None = None,
            many: bool = False) -> list[str]:
    """The overlay's files that are not what its wheel's RECORD (or ``replaced``: relative path ->
    sha256 hex of the file a fix wrote) says; empty: intact. The full check runs only when the
    stamp differs from the one saved after the last check that passed (module docstring).
    ``many``: every distribution's RECORD in the folder (:func:`listed`)."""
    rows = listed(overlay, dist_glob, skip, many)
    if isinstance(rows, str):
        return [rows]
    replaced = replaced or {}
    files = [rel for rel, _ in rows] + sorted(set(replaced) - {rel for rel, _ in rows})
    files += [str(p.relative_to(overlay)) for p in sorted(overlay.glob(f"{dist_glob}/RECORD"))]
    stamp = _stamp(overlay, files)
    saved = overlay / STAMP
    try:
        if json.loads(saved.read_text()).get("stamp") == stamp:
            return []
    except (OSError, ValueError, AttributeError):
        pass
    bad = []
    want = {**dict(rows), **{rel: base64.urlsafe_b64encode(bytes.fromhex(h)).rstrip(b"=").decode()
                             for rel, h in replaced.items()}}
    for rel, digest in want.items():
        try:
            if _b64((overlay / rel).read_bytes()) != digest:
                bad.append(f"{rel}: sha256 differs from the RECORD's")
        except OSError as e:
            bad.append(f"{rel}: {e.strerror or e}")
    if not bad:
        from swa_repro.core.cache import write_atomic

        try:  # replaced, never written through: a fixed copy's stamp may be a hard link to the release's
            write_atomic(saved, json.dumps({"stamp": stamp, "files": len(files)}))
        except OSError:  # a read-only cache: the full check runs each time
            pass
    return bad


def marker(path: Path) -> dict | None:
    """An overlay's marker (``.swa-repro-overlay.json``, ``.swa-repro-fixed.json``) if it is a whole
    JSON object, else None: a marker cut short means an overlay to make again, not an error on
    every later run."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) and doc else None
