"""A vLLM release as a cached overlay *without its compiled extension*.

The wheel (~240 MB, ~300 MB of it ``.so``) is fetched once into the shared cache
(``core.cache.cache_root()/wheels/vllm``, ``pip download --no-deps``), and its Python files only
are unpacked into ``cache_root()/vllm/X``: the audit never loads ``vllm._C`` (the FlashInfer calls
are stand-ins, the platform is the audit's). vLLM's pure imports that this venv lacks
(``DEPS``) go into ``X/.deps`` with ``uv pip install --no-deps --target`` (as sglang's overlay).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.engine.overlay import install_command

MIN_RELEASE = (0, 20, 0)
# vLLM's releases from 0.20.0 on, as `pip index versions vllm` listed them (2026-12-05); a newer one
# is tried on the index, an older or unlisted one is refused before any download
RELEASES = ("0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1",
            "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
MARKER = ".swa-repro-overlay.json"
BACKEND = "vllm/v1/attention/backends/flashinfer.py"
DEPS = ("cachetools", "blake3", "cbor2", "py-cpuinfo")  # imported on the way to the backend (0.34.0)
# Pure-Python packages this venv has, but older than a release requires and imports on the way to
# the backend (0.31.0: vllm/tool_parsers/utils.py:14 imports openai.types.responses.NamespaceTool,
# openai>=2.25.0): installed at the release's minimum into .deps, which the child puts before the venv
SHADOW = ("openai",)
_VERSION = re.compile(r"^\d+\.\d+\.\d+(\.post\d+)?$")


def parse(version: str) -> tuple:
    if not _VERSION.match(version or ""):
        raise UsageError(f"--vllm {version!r}: give a release number such as 0.34.0 (see `pip index versions vllm`)")
    nums = [int(x) for x in re.findall(r"\d+", version)]
    return tuple(nums + [0] * (4 - len(nums)))


def check_release(version: str) -> tuple:
    """One line (``UsageError``) for a release the audit does not cover, before any download."""
    v = parse(version)
    if v < MIN_RELEASE:
        raise UsageError(f"--vllm {version}: the audit drives vLLM 0.20.0 and later")
    if version not in RELEASES and v <= parse(RELEASES[-1]):
        raise UsageError(f"--vllm {version}: not a vLLM release (0.20.0 to {RELEASES[-1]}: "
                         f"{', '.join(RELEASES)})")
    return v


def root() -> Path:
    from swa_repro.core.cache import cache_root

    return cache_root()


def whole_wheel(path: Path) -> bool:
    """A wheel whose zip directory reads (a download cut short has none: its end is missing); the
    members' CRCs are checked as :func:`_unpack` extracts them."""
    try:
        with zipfile.ZipFile(path) as z:
            return bool(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def wheel(version: str) -> Path:
    """The release's wheel in the shared cache, downloaded once; a cached one that is not a whole
    zip is removed and downloaded again (issue #43)."""
    folder = root() / "wheels" / "vllm"
    found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    if found and whole_wheel(found[0]):
        return found[0]
    for bad in found:
        print(f"swa-repro: the cached wheel {bad} is damaged (not a whole zip); downloading it again", file=sys.stderr)
        bad.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".dl-{version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(tmp),
           f"vllm=={version}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    got = sorted(tmp.glob("vllm-*.whl"))
    if p.returncode != 0 or not got:
        low = (p.stdout + p.stderr).lower()
        why = ("is not on the package index: see `pip index versions vllm`" if "no matching distribution" in low
               else "could not be downloaded (no network?)")
        raise UsageError(f"vllm=={version} {why}")
    dest = folder / got[0].name
    got[0].rename(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


def provision(version: str) -> tuple[Path, dict]:
    """``(overlay, info)``: the release's Python files and ``.deps``, unpacked now unless cached."""
    check_release(version)
    from swa_repro.core.cache import locked, unusable

    target = root() / "vllm" / version
    info = _current(target)
    if info is not None:
        return target, {**info, "cached": True}
    try:
        with locked(target.with_name(f".{version}.lock")):
            info = _current(target, say=True)
            if info is not None:
                return target, {**info, "cached": True}
            try:
                return _unpack(version, target)
            except (zipfile.BadZipFile, zlib.error, EOFError):  # a wheel whose members do not read: once more
                wheel(version).unlink()
                return _unpack(version, target)
    except OSError as e:
        raise unusable(e) from None


def _current(target: Path, say: bool = False) -> dict | None:
    """The marker of an unpacked overlay whose .deps are the ones this code installs for it and whose
    files are its wheel's (``engine.record``: RECORD's sha256 of each but the ``.so`` it leaves out,
    checked when their stamp changed), ``.deps``' each its own wheel's likewise (a damaged ``openai``
    there is a child that fails or answers from other code); else None (made again; ``say``: one stderr line if damaged)."""
    from swa_repro.engine.record import damaged, marker

    info = marker(target / MARKER) if target.is_dir() else None
    if info is None or info.get("deps") != deps_for(target):
        return None
    bad = damaged(target, "vllm-*.dist-info", skip=lambda rel: rel.endswith(".so"))
    bad = bad or [f".deps/{b}" for b in damaged(target / ".deps", "*.dist-info", many=True)]
    if bad and say:
        print(f"swa-repro: vllm's cached overlay {target} is damaged ({bad[0]}); unpacking it again", file=sys.stderr)
    return None if bad else info


def deps_for(overlay: Path) -> list[str]:
    """``DEPS``, plus each ``SHADOW`` package at the release's minimum where this venv's is older
    (the release's ``Requires-Dist`` in its METADATA)."""
    from importlib import metadata

    from packaging.version import Version

    out = list(DEPS)
    meta = "\n".join(p.read_text() for p in overlay.glob("vllm-*.dist-info/METADATA"))
    for name in SHADOW:
        m = re.search(rf"^Requires-Dist: {name}>=([0-9.]+)", meta, re.M)
        try:
            have = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            have = None
        if m and have is not None and have < Version(m.group(1)):
            out.append(f"{name}=={m.group(1)}")
    return out


def _unpack(version: str, target: Path) -> tuple[Path, dict]:
    t0 = time.monotonic()
    whl = wheel(version)
    partial = target.with_name(f".{version}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist() if not n.endswith(".so")]
        z.extractall(partial, names)
    if not (partial / BACKEND).is_file():
        shutil.rmtree(partial, ignore_errors=True)
        raise UsageError(f"vllm {version} has no {BACKEND}: the audit drives the v1 FlashInfer backend")
    deps = deps_for(partial)
    cmd = install_command(partial / ".deps") + deps
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise UsageError(f"installing {', '.join(deps)} for vllm {version} failed (no network?)")
    from swa_repro.engine.record import damaged

    bad = damaged(partial, "vllm-*.dist-info", skip=lambda rel: rel.endswith(".so"))
    if bad:
        shutil.rmtree(partial, ignore_errors=True)
        whl.unlink()
        raise UsageError(f"vllm {version}'s wheel does not match its RECORD ({bad[0]}): removed; run again to "
                         "download it anew")
    info = {"vllm": version, "wheel": whl.name, "files": len(names), "deps": deps,
            "unpack_seconds": round(time.monotonic() - t0, 1)}
    (partial / MARKER).write_text(json.dumps(info, indent=1))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target, {**info, "cached": False}


def content_digest(overlay: Path) -> str:
    """The release's RECORD (every shipped file's sha256) and the backend file's bytes."""
    h = hashlib.sha256()
    for rec in sorted(overlay.glob("vllm-*.dist-info/RECORD")):
        h.update(rec.read_bytes())
    b = overlay / BACKEND
    h.update(b.read_bytes() if b.is_file() else b"<no backend>")
    return h.hexdigest()
