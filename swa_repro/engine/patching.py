"""A file patched in place with a backup and reverted byte for byte (sha256-checked), and the
``patch`` command's checks and outputs that do not depend on which file or fix: the same actions
and safety for sglang's backend (``sglang.patch``) and vLLM's (``vllm.patch.cli``); every refusal
leaves the file as it was.

Reads go through ``core.inputs`` (a source that is not UTF-8, has a BOM, is empty or does not parse,
and backup metadata that is not JSON or lacks a key, are one line) and writes through
``core.outputs`` (atomic; a symbolic link is refused, not replaced by a copy: give its target).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import sys
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.core.inputs import read_bytes, read_json, read_source
from swa_repro.core.outputs import (
    backup_paths,
    new_file,
    read_only_reason,
    replace_file,
    untracked_file,
    write_atomic,
)

META_KEYS = ("original_sha256", "patched_sha256", "patched_state")


class PatchError(UsageError):
    """Refused: the message says why and what to do; nothing was written."""


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


def apply_in_place(path: Path, *, edit, label: str, done, state_of=lambda text: "as found",
                   revert: str = "swa-repro patch revert", copy_hint: str = "") -> str:
    """Patch ``path`` in place with a backup; returns a one-line message. ``edit`` (text -> text)
    makes ``label`` (e.g. ``--fix all``), ``done`` (text -> already so?), ``state_of`` (text -> what the
    file is, kept in the backup's metadata); ``revert``: the command the messages name to undo it
    (vLLM's file: ``... revert --vllm``); ``copy_hint``: what else a read-only file's user can do."""
    path = replace_file(path, "--in-place")
    text = read_backend(path)
    data = text.encode()
    state, already = state_of(text), done(text)
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
    _writable(path, ". Write a patched copy with `--out FILE`" + copy_hint)
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


# ----------------------------------------------------------------------------- the command's checks and outputs
def unified_diff(old: str, new: str, path="flashinfer_backend.py") -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        f"a/{path}", f"b/{path}"))


def check_outputs(args) -> None:
    """``--out`` / ``--in-place`` / ``--force`` as the action allows (also ``vllm.patch.cli``'s)."""
    if args.out and args.in_place:
        raise UsageError("choose one of --out FILE and --in-place")
    if (args.out or args.in_place) and args.action != "apply":
        raise UsageError("--out / --in-place go with `apply`")
    if args.force and not args.out:
        raise UsageError("--force goes with `apply --out FILE` (it replaces FILE)")


def check_paths(args, path: Path) -> None:
    """Before any work: the source exists; ``--out`` is a new file (a folder, a link, an existing or
    read-only file, or the source itself is one line). Also ``vllm.patch.cli``'s."""
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"--source {path}: no such file")
    if args.out:
        if args.out.resolve() == path.resolve():
            raise UsageError("--out is the source file itself; use --in-place (it keeps a backup)")
        new_file(args.out, "--out", force=args.force)
        untracked_file(args.out, "--out", force=args.force)  # docs/, recordings/, a tracked file: with --force


def diff_or_copy(args, path: Path, text: str, new: str, same: str, what: str) -> int:
    """``diff``: the unified diff; ``apply --out FILE``: the patched copy (``path`` untouched)."""
    if new == text:
        print(f"swa-repro patch: {path} {same}; nothing to do", file=sys.stderr)
        return 0
    diff = unified_diff(text, new, str(path).lstrip("/"))
    if args.action == "diff":
        sys.stdout.write(diff)
        return 0
    if args.out is None:
        sys.stdout.write(diff)
        raise UsageError("nothing written: choose `--out FILE` (a patched copy) or `--in-place` "
                         "(patch the file, with a backup)")
    write_atomic(args.out, new.encode(), like=path)
    print(f"wrote {args.out} ({what}); {path} unchanged")
    return 0
