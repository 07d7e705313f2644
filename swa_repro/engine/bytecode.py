"""One compiled copy of a release for all its overlays: a fixed or kit overlay reads the bytecode of
the release's own overlay for every file it shares with it.

A fixed overlay (``fix.overlay``) or a kit overlay (``fix.kit_edits``) is a hard-linked copy of the
release's overlay (``provision``) with a few files replaced. Python keys compiled bytecode by the
source's path (``PYTHONPYCACHEPREFIX`` mirrors it: the Makefile sets one), so every such copy
compiled sglang's ~1000 imported modules again: ~12 s of CPU per overlay on 2 cores, for files
that are byte for byte the release's (the same inode). :func:`share` makes a child look up the
bytecode of a linked file under the release overlay's path instead. The cached ``.pyc`` stays
valid by CPython's own check (the source's mtime and size, which a hard link shares), and the
loader sets each code object's file name to the module's real path (``_imp._fix_co_filename``), so
tracebacks and ``__file__`` name the overlay that was imported. A replaced file has its own inode
and keeps its own bytecode.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MARKER = ".swa-repro-overlay.json"  # provision.MARKER: the release overlay's own, hard-linked into every copy


def origin_of(overlay: Path) -> Path | None:
    """The release overlay that ``overlay`` was copied from, or None (it is one, or not a copy)."""
    from swa_repro.engine.overlay import release_overlay

    try:
        origin = release_overlay("sglang", json.loads((overlay / MARKER).read_text())["sglang"])
    except (OSError, ValueError, KeyError):
        return None
    return origin if origin.is_dir() and origin.resolve() != overlay.resolve() else None


def share(overlay: Path) -> bool:
    """In a child, before it imports sglang: linked files of ``overlay`` use their origin's bytecode.
    Returns whether anything was changed (``overlay`` is a copy of a release overlay)."""
    import _frozen_importlib_external as ext  # the loader's own module: SourceLoader.get_code looks the name up there

    origin = origin_of(overlay)
    if origin is None:
        return False
    own, base = str(overlay.resolve()) + os.sep, origin.resolve()
    cache_from_source = ext.cache_from_source

    def aliased(path, *args, **kwargs):
        if isinstance(path, str) and path.startswith(own):
            twin = base / path[len(own):]
            try:
                a, b = os.stat(path), os.stat(twin)
                if (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev):
                    path = str(twin)
            except OSError:
                pass
        return cache_from_source(path, *args, **kwargs)

    ext.cache_from_source = aliased
    return True
