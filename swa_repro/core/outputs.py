"""Output paths, checked before any work, and the one writer: a bad path is one line (UsageError)
and nothing is written.

Three kinds: a file a command writes into an existing folder (``mask --out``, ``replay --out``,
``patch apply --out``), a file it rewrites in place (``patch apply --in-place``, ``patch revert``),
and a folder it creates with its parents when missing (``run --output``, ``record --out``,
``sglang-check --trace-dir``, ``fuzz --out``; ``bundle --out`` through :func:`fresh_dir`, which
also takes back what it made when the command fails). Either fails here, not after minutes of work
or a GPU run, when the path cannot be written.

A read-only place is judged by its permission bits as well as ``os.access``: as root ``os.access``
says yes to everything, and ``--out`` must refuse what ``--in-place`` refuses. Every file write is
:func:`write_atomic` (a temp file in the same folder, then ``os.replace``): a reader sees the old
bytes or the new, never half; a link is never written through or replaced.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from swa_repro.core.errors import UsageError

# The checkout this package runs from, and its folders of tracked evidence and notebooks: never a
# default or silent output (a run into docs/live replaced the H200's figures with the CPU model's).
REPO = Path(__file__).resolve().parents[2]
TRACKED_DIRS = ("docs", "recordings", "notebooks", "benchmarks")

# The tool's own files beside a file patched in place (``engine.patching``): never an output.
BACKUP_SUFFIX, META_SUFFIX = ".swa-repro.bak", ".swa-repro.json"


def backup_paths(path) -> tuple[Path, Path]:
    """The backup of a file patched in place and its metadata (sha256s, states)."""
    p = Path(path)
    return p.with_name(p.name + BACKUP_SUFFIX), p.with_name(p.name + META_SUFFIX)


def read_only_reason(path) -> str | None:
    """Why ``path`` (a folder, or a file in one) cannot be written, or None: a read-only file
    system, no access, or no write bit (root passes ``os.access``; the bits still say read-only)."""
    p = Path(path)
    d = p if os.path.isdir(p) else p.parent
    if os.statvfs(d).f_flag & os.ST_RDONLY:
        return f"{d} is on a read-only file system"
    for q in dict.fromkeys((d, p)):
        if os.path.lexists(q) and (not os.access(q, os.W_OK) or not os.stat(q).st_mode & 0o222):
            return f"{q} is read-only"
    return None


def out_file(path, flag: str, suffixes: tuple[str, ...] = ()) -> Path:
    """A file to write: it has one of ``suffixes`` (if given), is not a folder, and its folder exists
    and is writable (the command does not create folders for it)."""
    p = Path(path)
    if suffixes and p.suffix not in suffixes:
        raise UsageError(f"{flag} {path}: name a {' or '.join(suffixes)} file")
    if p.is_symlink():
        raise UsageError(f"{flag} {path} is a symbolic link to {os.path.realpath(p)}: name a regular file "
                         "(a link is never written through)")
    if os.path.isdir(p):
        raise UsageError(f"{flag} {path} is a folder: name a file in it")
    not_regular(p, flag)
    parent = p.parent
    if not os.path.isdir(parent):
        what = "is a file" if os.path.exists(parent) else "does not exist"
        raise UsageError(f"{flag} {path}: folder {parent} {what}; create it first or name a file in an existing folder")
    why = read_only_reason(parent)
    if why:
        raise UsageError(f"{flag} {path}: {why}; name a file in a folder you can write")
    return p


def not_regular(path, flag: str) -> None:
    """An existing output that is no regular file (a device such as ``/dev/null``, a pipe, a socket)
    is refused, ``--force`` or not: ``os.replace`` would put a file in its place (as root, over a device
    node)."""
    p = Path(path)
    if os.path.exists(p) and not p.is_dir() and not p.is_file():
        raise UsageError(f"{flag} {path} is not a regular file (a device, pipe or socket): name a file")


def new_file(path, flag: str, *, force: bool = False, force_flag: str = "--force") -> Path:
    """A file a command creates (``patch apply --out``): :func:`out_file`'s checks, and it is not a
    link, not one of the tool's own backups, not a file patched in place (its backup would no
    longer match), and not an existing file unless ``force`` (a typo must not overwrite one)."""
    p = out_file(path, flag)
    if p.name.endswith((BACKUP_SUFFIX, META_SUFFIX)):
        raise UsageError(f"{flag} {path} is one of swa-repro's own backup files: name another file")
    if any(q.exists() for q in backup_paths(p)):
        raise UsageError(f"{flag} {path} was patched in place by swa-repro (a backup is beside it): "
                         f"`swa-repro patch revert --source {path}` first, or name another file")
    if p.exists() and not force:
        raise UsageError(f"{flag} {path} exists: name a new file, or add {force_flag} to replace it")
    why = read_only_reason(p)
    if why:
        raise UsageError(f"{flag} {path}: {why}")
    return p


def replace_file(path, flag: str) -> Path:
    """A file a command rewrites in place: a regular file, not a link (replacing a link would turn it
    into a copy and leave its target as it was), in a writable place."""
    p = Path(path)
    if p.is_symlink():
        raise UsageError(f"{flag}: {path} is a symbolic link to {os.path.realpath(p)}; give that file "
                         "(--source TARGET) so the link stays a link")
    if not p.is_file():
        raise UsageError(f"{flag}: {path} is not a regular file")
    return p


def write_atomic(path, data: bytes, like=None) -> None:
    """``data`` to ``path`` all or nothing: :func:`atomic_path` and one synced write."""
    with atomic_path(path, like) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_path(path, like=None):
    """A temp path in ``path``'s folder for a writer (``np.savez``, ``zipfile``, :func:`write_atomic`),
    moved onto ``path`` by ``os.replace`` when the block ends without error: a reader sees the old bytes
    or the new, a link is replaced, never written through. The file gets ``like``'s permission bits,
    else the replaced file's, else the umask's (as ``open()`` would, not mkstemp's 0600). On any
    failure the temp file is removed and ``path`` is as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + path.suffix)
    os.close(fd)
    try:
        yield tmp
        like = like if like is not None and Path(like).exists() else (path if path.is_file() else None)
        if like is not None:  # the file it replaces keeps its permission bits
            shutil.copymode(like, tmp)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _in_checkout(path) -> Path | None:
    """``path``, its links resolved, relative to this checkout; None outside it (or where the package
    is not a checkout)."""
    p = Path(path).expanduser().resolve()  # a link to notebooks/ is notebooks/
    if not (REPO / "pyproject.toml").is_file():
        return None
    try:
        return p.relative_to(REPO)
    except ValueError:
        return None


def _git_tracks(rel: Path) -> bool:
    try:
        git = subprocess.run(["git", "-C", str(REPO), "ls-files", "--", str(rel)], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return git.returncode == 0 and bool(git.stdout.strip())


def tracked_reason(path) -> str | None:
    """Why the folder ``path``, its links resolved, must not be written without ``--force``: it is this
    checkout, in one of its folders of committed evidence and notebooks (:data:`TRACKED_DIRS`), or
    holds files git tracks. None outside the checkout (or where the package is not a checkout)."""
    rel = _in_checkout(path)
    if rel is None:
        return None
    p = REPO / rel
    if not rel.parts:
        return f"{p} is the project's checkout"
    if rel.parts[0] in TRACKED_DIRS:
        return f"{p} is in {rel.parts[0]}/, the project's committed files"
    return f"{p} holds files git tracks" if _git_tracks(rel) else None


def tracked_file_reason(path) -> str | None:
    """:func:`tracked_reason` for a file a command writes (``mask --out``, ``replay --out``): git tracks
    it, or its folder, links resolved, is one of :data:`TRACKED_DIRS`. A new file beside the
    checkout's own (``m.json`` in its root) is no one's evidence and is let through."""
    p = Path(path)
    rel = _in_checkout(p.parent)
    if rel is None:
        return None
    rel = rel / p.name
    if rel.parts[0] in TRACKED_DIRS:
        return f"{REPO / rel} is in {rel.parts[0]}/, the project's committed files"
    return f"{REPO / rel} is a file git tracks" if _git_tracks(rel) else None


def untracked_dir(path, flag: str, *, force: bool = False) -> Path:
    """:func:`out_dir`, and not a folder of tracked files (:func:`tracked_reason`) unless ``force``."""
    p = out_dir(path, flag)
    why = None if force else tracked_reason(p)
    if why:
        raise UsageError(f"{flag} {path}: {why}; give another folder (e.g. under artifacts/), or add --force to "
                         "write there")
    return p


def untracked_file(path, flag: str, *, force: bool = False) -> Path:
    """A file named by ``flag``, not in the committed folders nor tracked (:func:`tracked_file_reason`)
    unless ``force``."""
    why = None if force else tracked_file_reason(path)
    if why:
        raise UsageError(f"{flag} {path}: {why}; name a file elsewhere (e.g. under artifacts/), or add --force "
                         "to write there")
    return Path(path)


def keep_fuller(path, cover: dict, read_cover, flag: str = "--out", *, force: bool = False) -> None:
    """A table is never replaced by one that covers less (a 1-release table over the committed 9):
    ``cover`` (dimension -> values) must hold every value of the table at ``path``
    (``read_cover(its JSON)``), unless ``force``; an unreadable table there is not replaced either."""
    path = Path(path)
    if force or not os.path.lexists(path):
        return
    try:
        old = read_cover(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"{flag}: {path} exists and is not a table swa-repro can read: give --out another "
                         "folder, or add --force to replace it") from None
    less = [f"{k} {', '.join(map(str, sorted(set(v) - set(cover.get(k, ())))))}" for k, v in old.items()
            if set(v) - set(cover.get(k, ()))]
    if less:
        raise UsageError(f"{flag}: {path} also covers {'; '.join(less)}, which this table does not: give --out "
                         "a new folder for a partial table, or add --force to replace it")


def nonempty(text: str) -> str:
    """argparse ``type`` of a path flag: ``""`` would read as the current folder (``Path("")`` is
    ``.``), so ``--out ""`` wrote where the command ran; refused as the flag's one-line error."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a path (an empty one would be the current folder)")
    return text


def nonempty_path(text: str) -> Path:
    return Path(nonempty(text))


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
    why = read_only_reason(have)
    if why:
        raise UsageError(f"{flag} {path}: {why}; give a folder you can write")
    return p


@contextlib.contextmanager
def fresh_dir(path, flag: str):
    """A new or empty folder a command fills (``bundle --out``). If the command fails, what it made
    goes (the folder and the parents it created, or what it put in a folder that was empty), so
    the corrected command is not refused as "not empty"."""
    p = out_dir(path, flag)
    if p.is_dir() and any(p.iterdir()):
        raise UsageError(f"{flag} {path} exists and is not empty: give a new or empty folder")
    top = None  # the highest folder this call creates
    q = p
    while not os.path.lexists(q) and q != q.parent:
        top, q = q, q.parent
    p.mkdir(parents=True, exist_ok=True)
    try:
        yield p
    except BaseException:
        if top is not None:
            shutil.rmtree(top, ignore_errors=True)
        else:
            for child in list(p.iterdir()):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        raise
