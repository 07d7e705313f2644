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

import re
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
    """``engine.overlay.refusal`` for ``sglang==version``."""
    from swa_repro.engine.overlay import refusal

    return refusal(f"sglang=={version}", output)


def provision(version: str, *, any_release: bool = False) -> tuple[Path, dict]:
    """The overlay of ``version`` (installed now unless cached: ``engine.overlay.provisioned``) and how it
    was made. Releases before ``MIN_RELEASE`` are refused (nothing drives them) unless ``any_release`` (a
    file read from it)."""
    if parse(version) < MIN_RELEASE and not any_release:
        raise UsageError(f"--sglang {version}: the audit drives sglang 0.5.10 and later")
    from swa_repro.engine.overlay import provisioned

    target, info = provisioned(overlay_dir(version), "sglang-*.dist-info", f"sglang {version}",
                               lambda t: _install(version, t))
    return target, ({**info, "flashinfer_pin": flashinfer_pin(target)} if info["cached"] else info)


def _install(version: str, target: Path) -> tuple[Path, dict]:
    """``engine.overlay.install`` of ``sglang==version`` (``installer``'s requirement)."""
    from swa_repro.engine.overlay import install

    req = installer(target, version)[-1]
    got, info = install(target, [req], {"sglang": version})
    info["flashinfer_pin"] = flashinfer_pin(got)
    return got, info


def content_digest(overlay: Path) -> str:
    """What an overlay holds, as a sha256: its wheel's RECORD (the sha256 of every file the release
    ships) and the bytes of the files a fixed overlay replaces (``fix.overlay``: the backend, and
    the other files its marker lists), without reading the 30-130 MB of the rest."""
    import hashlib

    from swa_repro.sglang.patch.classify import REL_PATH

    h = hashlib.sha256()
    for rec in sorted(overlay.glob("*.dist-info/RECORD")):  # a release's own transformers too (release_transformers)
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
    return pin(overlay, "flashinfer[_-]python")


def transformers_pin(overlay: Path) -> str | None:
    """The transformers version the release pins (``Requires-Dist: transformers==X`` in its dist-info
    METADATA: 0.5.23 pins 5.19.0): what a server running the release imports, which
    ``audit --transformers release`` builds its model classes with (``release_transformers``)."""
    return pin(overlay, "transformers")


def pin(overlay: Path, project: str) -> str | None:
    """The ``==`` version the release's METADATA requires of ``project`` (a regex of its name), or None."""
    for meta in overlay.glob("sglang-*.dist-info/METADATA"):
        m = re.search(rf"^Requires-Dist: {project}(?:\[[^\]]*\])?\s*\(?==\s*([^\s;,)]+)", meta.read_text(),
                      re.MULTILINE)
        if m:
            return m.group(1)
    return None
