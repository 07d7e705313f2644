"""On disk: find the installed backend file, patch it in place with a backup, revert byte for
byte (sha256-checked); every refusal leaves the file as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from swa_repro.sglang.patch.classify import REL_PATH, PatchError, classify
from swa_repro.sglang.patch.edit import transform


def installed_path() -> Path:
    """flashinfer_backend.py of the importable sglang, found without importing sglang."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("sglang is not installed in this Python "
                         f"({sys.executable}); install it (`pip install sglang==0.5.15.post1`) "
                         "or pass --source FILE")
    path = Path(list(spec.submodule_search_locations)[0]) / REL_PATH
    if not path.is_file():
        raise PatchError(f"{path} does not exist: this sglang has no FlashInfer backend file; "
                         "pass --source FILE")
    return path


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def backup_paths(path: Path):
    return (path.with_name(path.name + ".swa-repro.bak"),
            path.with_name(path.name + ".swa-repro.json"))


def _read_only_reason(path: Path):
    d = path.parent
    if os.statvfs(d).f_flag & os.ST_RDONLY:
        return f"{d} is on a read-only file system"
    for p in (d, path):
        if p.exists() and (not os.access(p, os.W_OK) or not os.stat(p).st_mode & 0o222):
            return f"{p} is read-only"
    return None


def atomic_write(path: Path, data: bytes, like: Path | None = None):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if like is not None and like.exists():
            shutil.copymode(like, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def apply_in_place(path: Path, target="fixed", *, edit=None, label=None, done=None) -> str:
    """Patch ``path`` in place with a backup; returns a one-line message. By default to PR #31501's
    ``target`` state; ``edit`` (text -> text), ``label`` (what it makes, e.g. ``--fix all``) and
    ``done`` (text -> already so?) patch it with anything else (``swa-repro patch --fix``)."""
    data = path.read_bytes()
    text = data.decode()
    if edit is None:
        state = classify(text).state
        label, already = target, state == target
        edit = lambda t: transform(t, target)  # noqa: E731 - refuses unknown
    else:
        state, already = "as found", done(text)
    bak, meta = backup_paths(path)
    info = json.loads(meta.read_text()) if meta.exists() else None
    if info and sha256_hex(data) == info["patched_sha256"]:
        if already:
            return f"already {label} (patched by swa-repro; `swa-repro patch revert` restores it)"
        raise PatchError(f"{path} was patched to {info['patched_state']} by swa-repro; run "
                         "`swa-repro patch revert` first; nothing was changed")
    if info and sha256_hex(data) != info["original_sha256"]:
        raise PatchError(f"{path} changed since swa-repro's backup {bak} (sha256 {sha256_hex(data)[:12]} "
                         f"is neither the original {info['original_sha256'][:12]} nor the "
                         f"patched {info['patched_sha256'][:12]}); nothing was changed. If sglang "
                         f"was reinstalled, delete {bak} and {meta} and try again")
    if already:
        return f"already {label}; nothing written"
    new = edit(text).encode()
    why = _read_only_reason(path)
    if why:
        raise PatchError(f"{why}; nothing was changed. Write a patched copy with `--out FILE`, "
                         "or use swa_repro.sglang.patch.patched() in-process")
    atomic_write(bak, data, like=path)
    if sha256_hex(bak.read_bytes()) != sha256_hex(data):
        raise PatchError(f"backup {bak} did not verify; nothing was changed")
    atomic_write(meta, (json.dumps({
        "file": str(path), "original_sha256": sha256_hex(data), "original_state": state,
        "patched_sha256": sha256_hex(new), "patched_state": label,
        "tool": "swa-repro patch apply --in-place"}, indent=1) + "\n").encode(), like=path)
    atomic_write(path, new, like=path)
    return f"patched {path} ({state} -> {label}); backup {bak}; `swa-repro patch revert` undoes it"


def revert_in_place(path: Path) -> str:
    """Restore the backed-up original bytes (checked by sha256) and drop the backup."""
    bak, meta = backup_paths(path)
    if not meta.exists() or not bak.exists():
        raise PatchError(f"no swa-repro backup next to {path} ({bak.name}); nothing to revert")
    info = json.loads(meta.read_text())
    cur, orig = sha256_hex(path.read_bytes()), bak.read_bytes()
    if sha256_hex(orig) != info["original_sha256"]:
        raise PatchError(f"backup {bak} does not match its recorded sha256; nothing was changed")
    if cur == info["original_sha256"]:
        bak.unlink()
        meta.unlink()
        return f"{path} is already the original; removed the stale backup"
    if cur != info["patched_sha256"]:
        raise PatchError(f"{path} changed since swa-repro patched it (sha256 {cur[:12]}, "
                         f"expected {info['patched_sha256'][:12]}); nothing was changed. The "
                         f"original is kept in {bak}")
    why = _read_only_reason(path)
    if why:
        raise PatchError(f"{why}; nothing was changed")
    atomic_write(path, orig, like=path)
    if sha256_hex(path.read_bytes()) != info["original_sha256"]:
        raise PatchError(f"restored {path} does not verify; the original is still in {bak}")
    bak.unlink()
    meta.unlink()
    return f"restored {path} byte for byte (sha256 {info['original_sha256'][:12]})"
