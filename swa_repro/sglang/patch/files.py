"""On disk: find the installed backend file, patch it in place with a backup, revert byte for
byte (sha256-checked); every refusal leaves the file as it was.

Reads go through ``core.inputs`` (a source that is not UTF-8, has a BOM, is empty or does not parse,
and backup metadata that is not JSON or lacks a key, are one line) and writes through
``core.outputs`` (atomic; a symbolic link is refused, not replaced by a copy: give its target).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.core.inputs import read_bytes, read_json, read_source
from swa_repro.core.outputs import backup_paths, read_only_reason, replace_file, write_atomic
from swa_repro.sglang.patch.classify import REL_PATH, PatchError, classify
from swa_repro.sglang.patch.edit import transform

META_KEYS = ("original_sha256", "patched_sha256", "patched_state")

__all__ = ["apply_in_place", "backup_info", "backup_paths", "installed_path", "read_backend", "revert_in_place",
           "sha256_hex"]


def installed_path(rel=REL_PATH) -> Path:
    """flashinfer_backend.py (or ``rel``, another file under the package) of the importable sglang,
    found without importing sglang."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("sglang is not installed in this Python "
                         f"({sys.executable}); install it (`pip install sglang==0.5.15.post1`) "
                         "or pass --source FILE")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        what = "FlashInfer backend file" if Path(rel) == REL_PATH else Path(rel).name
        raise PatchError(f"{path} does not exist: this sglang has no {what}; pass --source FILE")
    return path


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_backend(path: Path) -> str:
    """The backend file's text, checked (``core.inputs.read_source``): one reader for every action."""
    return read_source(path, "--source")


def backup_info(path: Path) -> dict | None:
    """The metadata of swa-repro's backup beside ``path`` (None: none). A hand-edited or truncated
    one is one line that says where the original is."""
    bak, meta = backup_paths(path)
    if not meta.exists():
        return None
    try:
        info = read_json(meta, "swa-repro's backup metadata", META_KEYS)
    except UsageError as e:
        keep = f"the original is kept in {bak}" if bak.exists() else f"no backup {bak.name} is beside it"
        raise PatchError(f"{e}; nothing was changed ({keep}: restore it by hand, then delete both)") from None
    return info


def _writable(path: Path, hint: str = ""):
    why = read_only_reason(path)
    if why:
        raise PatchError(f"{why}; nothing was changed{hint}")


def apply_in_place(path: Path, target="fixed", *, edit=None, label=None, done=None,
                   revert="swa-repro patch revert") -> str:
    """Patch ``path`` in place with a backup; returns a one-line message. By default to PR #31501's
    ``target`` state; ``edit`` (text -> text), ``label`` (what it makes, e.g. ``--fix all``) and
    ``done`` (text -> already so?) patch it with anything else (``swa-repro patch --fix``);
    ``revert``: the command the messages name to undo it (vLLM's file: ``... revert --vllm``)."""
    path = replace_file(path, "--in-place")
    text = read_backend(path)
    data = text.encode()
    if edit is None:
        state = classify(text).state
        label, already = target, state == target
        edit = lambda t: transform(t, target)  # noqa: E731 - refuses unknown
    else:
        state, already = "as found", done(text)
    bak, meta = backup_paths(path)
    info = backup_info(path)
    if info and sha256_hex(data) == info["patched_sha256"]:
        if already:
            return f"already {label} (patched by swa-repro; `{revert}` restores it)"
        raise PatchError(f"{path} was patched to {info['patched_state']} by swa-repro; run "
                         f"`{revert}` first; nothing was changed")
    if info and sha256_hex(data) != info["original_sha256"]:
        raise PatchError(f"{path} changed since swa-repro's backup {bak} (sha256 {sha256_hex(data)[:12]} "
                         f"is neither the original {str(info['original_sha256'])[:12]} nor the "
                         f"patched {str(info['patched_sha256'])[:12]}); nothing was changed. If sglang "
                         f"was reinstalled, delete {bak} and {meta} and try again")
    if already:
        return f"already {label}; nothing written"
    _writable(path, ". Write a patched copy with `--out FILE`, or use swa_repro.sglang.patch.patched() in-process")
    new = edit(text).encode()
    for own in (bak, meta):
        if own.is_symlink() or own.is_dir():
            raise PatchError(f"{own} is not a regular file: swa-repro keeps its backup there; move it away; "
                             "nothing was changed")
    try:
        write_atomic(bak, data, like=path)
        if sha256_hex(bak.read_bytes()) != sha256_hex(data):
            raise PatchError(f"backup {bak} did not verify; nothing was changed")
        write_atomic(meta, (json.dumps({
            "file": str(path), "original_sha256": sha256_hex(data), "original_state": state,
            "patched_sha256": sha256_hex(new), "patched_state": label,
            "tool": "swa-repro patch apply --in-place"}, indent=1) + "\n").encode(), like=path)
        write_atomic(path, new, like=path)
    except BaseException:  # all or nothing: no backup of a file left as it was
        bak.unlink(missing_ok=True)
        meta.unlink(missing_ok=True)
        raise
    return f"patched {path} ({state} -> {label}); backup {bak}; `{revert}` undoes it"


def revert_in_place(path: Path) -> str:
    """Restore the backed-up original bytes (checked by sha256) and drop the backup."""
    path = replace_file(path, "revert")
    bak, meta = backup_paths(path)
    if not meta.exists() or not bak.exists():
        raise PatchError(f"no swa-repro backup next to {path} ({bak.name}); nothing to revert")
    info = backup_info(path)
    cur, orig = sha256_hex(path.read_bytes()), read_bytes(bak, "swa-repro's backup")
    if sha256_hex(orig) != info["original_sha256"]:
        raise PatchError(f"backup {bak} does not match its recorded sha256; nothing was changed")
    if cur == info["original_sha256"]:
        bak.unlink()
        meta.unlink()
        return f"{path} is already the original; removed the stale backup"
    if cur != info["patched_sha256"]:
        raise PatchError(f"{path} changed since swa-repro patched it (sha256 {cur[:12]}, "
                         f"expected {str(info['patched_sha256'])[:12]}); nothing was changed. The "
                         f"original is kept in {bak}")
    _writable(path)
    write_atomic(path, orig, like=path)
    if sha256_hex(path.read_bytes()) != info["original_sha256"]:
        raise PatchError(f"restored {path} does not verify; the original is still in {bak}")
    bak.unlink()
    meta.unlink()
    return f"restored {path} byte for byte (sha256 {info['original_sha256'][:12]})"
