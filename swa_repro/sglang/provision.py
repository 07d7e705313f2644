"""An sglang release as an *overlay*: ``uv pip install --no-deps --target DIR sglang==X``, cached per
release, put first on ``sys.path`` of this venv in a subprocess (``audit.release``).

Why an overlay, not an environment per release (measured on a 2-core host, issue 9): the overlay
takes 1-4 s per release (30-132 MB, hard-linked from the shared download cache) against 95-160 s and
~10 GB per torch stack for a full environment, and the audit of 0.5.23 gave identical findings both
ways: no release's backend branches on the torch or flashinfer version, and the audit replaces
FlashInfer's wrappers with recording stand-ins, so flashinfer only has to import. Every loaded
``sglang.*`` module must come from the overlay (checked by ``audit.release``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.core.versions import SGLANG_MIN_RELEASE as MIN_RELEASE
from swa_repro.core.versions import sglang_release_key as parse

MARKER = ".swa-repro-overlay.json"


def cache_root() -> Path:
    """The user's cache (``core.cache.cache_root``: ``$SWA_REPRO_CACHE``, else
    ``$XDG_CACHE_HOME/swa-repro``, else ``~/.cache/swa-repro``): every checkout shares the overlays."""
    from swa_repro.core.cache import cache_root as root

    return root()


def overlay_dir(version: str) -> Path:
    from swa_repro.engine.overlay import release_overlay

    return release_overlay("sglang", version)


def installer(target: Path, version: str) -> list[str]:
    """``engine.overlay.install_command`` of ``sglang==version``."""
    from swa_repro.engine.overlay import install_command

    return [*install_command(target), f"sglang=={version}"]


def _refusal(version: str, output: str) -> str:
    """One line from the installer's output: no such release, no network, or its last line."""
    low = output.lower()
    if any(s in low for s in ("no solution found", "no matching distribution", "could not find a version",
                              "no version of sglang")):
        return f"sglang=={version} is not on the package index: see `pip index versions sglang`"
    if any(s in low for s in ("failed to fetch", "dns error", "connection", "network", "timed out",
                              "temporary failure", "offline")):
        return f"cannot reach the package index to install sglang=={version} (no network?)"
    last = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return f"installing sglang=={version} failed: {last[-1] if last else 'no output'}"


def provision(version: str, *, any_release: bool = False) -> tuple[Path, dict]:
    """The overlay of ``version`` (installed now unless cached) and how it was made. Releases before
    ``MIN_RELEASE`` are refused (nothing drives them) unless ``any_release`` (a file read from it)."""
    if parse(version) < MIN_RELEASE and not any_release:
        raise UsageError(f"--sglang {version}: the audit drives sglang 0.5.10 and later")
    from swa_repro.core.cache import locked, unusable

    target = overlay_dir(version)
    info = intact(target, version)
    if info is not None:
        return target, info
    # One installer per overlay: two processes (xdist workers, a notebook beside the suite) asking for
    # the same release from nothing would share the .partial folder, and the later rename would pull
    # the overlay from under a child already importing it. The second waits and takes the first's.
    try:
        with locked(target.with_name(f".{version}.lock")):
            info = intact(target, version, say=True)
            return (target, info) if info is not None else _install(version, target)
    except OSError as e:
        raise unusable(e) from None


def intact(target: Path, version: str, say: bool = False) -> dict | None:
    """The cached overlay's info if its marker is whole and its files are its wheel's (``record``:
    RECORD's sha256 of each, checked when their stamp changed), else None: made again. ``say``: one
    stderr line on a damaged overlay."""
    from swa_repro.engine import record

    info = record.marker(target / MARKER) if target.is_dir() else None
    bad = record.damaged(target, "sglang-*.dist-info") if info is not None else []
    if say and (bad or (info is None and target.exists())):
        print(f"swa-repro: sglang {version}'s cached overlay {target} is damaged "
              f"({bad[0] if bad else MARKER + ' unreadable'}); installing it again", file=sys.stderr)
    return None if info is None or bad else {**info, "flashinfer_pin": flashinfer_pin(target), "cached": True}


def _install(version: str, target: Path) -> tuple[Path, dict]:
    partial = target.with_name(f".{version}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    cmd = installer(partial, version)
    env = dict(os.environ)  # uv's own download cache (the one `make venv` fills): overlays hard-link from it
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0 or not (partial / "sglang" / "__init__.py").is_file():
        shutil.rmtree(partial, ignore_errors=True)
        raise UsageError(_refusal(version, p.stdout + p.stderr))
    tool = "uv pip" if Path(cmd[0]).name == "uv" else "pip"
    info = {"sglang": version, "installer": f"{tool} install --no-deps --target <overlay> sglang=={version}",
            "install_seconds": round(time.monotonic() - t0, 1), "flashinfer_pin": flashinfer_pin(partial)}
    from swa_repro.engine.record import damaged

    bad = damaged(partial, "sglang-*.dist-info")
    if bad:
        shutil.rmtree(partial, ignore_errors=True)
        raise UsageError(f"sglang=={version} as installed does not match its RECORD ({bad[0]}); clear uv's cache "
                         "(`uv cache clean sglang`) and try again")
    (partial / MARKER).write_text(json.dumps(info, indent=1))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target, {**info, "cached": False}


def content_digest(overlay: Path) -> str:
    """What an overlay holds, as a sha256: its wheel's RECORD (the sha256 of every file the release
    ships) and the bytes of the files a fixed overlay replaces (``fix.overlay``: the backend, and
    the other files its marker lists), without reading the 30-130 MB of the rest."""
    import hashlib

    from swa_repro.sglang.patch.classify import REL_PATH

    h = hashlib.sha256()
    for rec in sorted(overlay.glob("sglang-*.dist-info/RECORD")):
        h.update(rec.read_bytes())
    backend = overlay / "sglang" / REL_PATH
    h.update(backend.read_bytes() if backend.is_file() else b"<no backend file>")
    marker = overlay / ".swa-repro-fixed.json"  # fix.overlay.MARKER
    if marker.is_file():
        import json

        for rel in sorted(json.loads(marker.read_text()).get("files", {})):  # none: the digest as before
            h.update(rel.encode() + b"\0" + (overlay / rel).read_bytes())
    return h.hexdigest()


def flashinfer_pin(overlay: Path) -> str | None:
    """The flashinfer-python version the release pins (its dist-info METADATA)."""
    for meta in overlay.glob("sglang-*.dist-info/METADATA"):
        m = re.search(r"^Requires-Dist: flashinfer[_-]python(?:\[[^\]]*\])?\s*\(?==\s*([^\s;,)]+)", meta.read_text(), re.M)
        if m:
            return m.group(1)
    return None
