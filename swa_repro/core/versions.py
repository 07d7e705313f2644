"""The flashinfer versions the kernel model covers, and which of them real-kernel runs back.

Every version an sglang 0.5.x release pins is modelled from its own sources
(``docs/flashinfer_versions.md``). "Recorded" is read from the tree, never listed here: a version
counts as recorded when ``recordings/<version>/`` or ``recordings/fuzz/<version>/`` holds a
``.json`` file (``swa-repro record`` / ``swa-repro fuzz --mode live`` write them on a GPU).
"""

from __future__ import annotations

import re
from pathlib import Path

from swa_repro.core.errors import UsageError

# Oldest first (the order :func:`nearest_modelled` walks).
FLASHINFER_VERSIONS = ("0.6.7.post2", "0.6.11.post1", "0.6.12", "0.6.14", "0.6.18", "0.7.2", "0.7.2.post1")
RECORDINGS_ROOT = Path(__file__).resolve().parents[2] / "recordings"
_VERSION = re.compile(r"v?(\d+(?:\.\d+)*)(?:[.-]?post(\d+))?")


def version_key(version: str) -> tuple[int, ...] | None:
    """``0.7.2.post1`` -> ``(0, 7, 2, 1)``: release padded to three numbers, then post (0 if none);
    anything after (``rc1``, ``+cu128``) is ignored. ``None`` if it does not start with a number."""
    m = _VERSION.match(version.strip())
    if not m:
        return None
    release = [int(x) for x in m.group(1).split(".")][:3]
    return (*release, *[0] * (3 - len(release)), int(m.group(2) or 0))


def nearest_modelled(version: str) -> str:
    """The modelled version closest to ``version`` in version order: of its two neighbours, the one
    sharing the longer leading part, then the smaller step at the first differing number; the
    older on a tie. An unparsable string gets the newest."""
    key = version_key(version)
    if key is None:
        return FLASHINFER_VERSIONS[-1]

    def distance(v: str) -> tuple[int, int]:
        other = version_key(v)
        same = next((i for i, (a, b) in enumerate(zip(key, other)) if a != b), len(key))
        return -same, abs(key[same] - other[same]) if same < len(key) else 0

    older = [v for v in FLASHINFER_VERSIONS if version_key(v) <= key]
    newer = [v for v in FLASHINFER_VERSIONS if version_key(v) > key]
    candidates = ([older[-1]] if older else []) + ([newer[0]] if newer else [])
    return min(candidates, key=distance)  # min keeps the first (older) on a tie


def live_check_command(version: str) -> str:
    return f"swa-repro fuzz --mode live --flashinfer-version {version}"


def unmodelled_message(version: str) -> str:
    """One line for a version the model does not cover."""
    near = nearest_modelled(version)
    return (f"flashinfer {version!r} is not modelled; nearest modelled: {near} (pass --flashinfer-version {near}). "
            f"Check how well it describes yours on a GPU with flashinfer {version} installed: `{live_check_command(near)}`")


def recorded_in(version: str, root=RECORDINGS_ROOT) -> list[str]:
    """Which of ``recordings/<version>/`` and ``recordings/fuzz/<version>/`` hold real-kernel runs."""
    root = Path(root)
    dirs = [root / version, root / "fuzz" / version]
    return [f"{d.relative_to(root.parent)}/" for d in dirs
            if d.is_dir() and any(not p.name.endswith(".report.json") for p in d.glob("*.json"))]


def evidence_note(version: str, root=RECORDINGS_ROOT) -> str:
    """What backs the model of ``version``: recordings of the real kernel, or the sources alone."""
    where = recorded_in(version, root)
    if where:
        return f"modelled from source; held to real-kernel recordings of {version} ({', '.join(where)})"
    return (f"modelled from source; no real-kernel recording of {version} yet: check it with "
            f"`{live_check_command(version)}` on a GPU with flashinfer {version}")


# ----------------------------------------------------------------------------- sglang releases
# Here, not in sglang.provision (which re-exports them), so the evidence layer's `bundle --sglang` refuses a
# version that is no release before it asks pip (layers: evidence sits below sglang).
SGLANG_MIN_RELEASE = (0, 5, 10)  # the oldest release the adapters in `releases` were written against
_SGLANG_VERSION = re.compile(r"^\d+\.\d+\.\d+(\.post\d+|rc\d+)?$")


def sglang_release_key(version: str) -> tuple:
    """``0.5.15.post1`` -> (0, 5, 15, 1); refuses anything that is not a plain release number."""
    if not _SGLANG_VERSION.match(version or ""):
        raise UsageError(f"--sglang {version!r}: give a release number such as 0.5.23 "
                         "(see `pip index versions sglang`)")
    nums = [int(x) for x in re.findall(r"\d+", version)]
    return tuple(nums + [0] * (4 - len(nums)))


# Every sglang release from SGLANG_MIN_RELEASE to the newest this project was checked against (PyPI's
# `pip index versions sglang`, 2026-12-06). A version in this range that is not one of them (a
# mistyped post release) is refused before any install; a newer one goes to the installer.
SGLANG_RELEASES = ("0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14",
                   "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")


def check_sglang_release(version: str, flag: str = "--sglang") -> tuple:
    """One line for a version from ``SGLANG_MIN_RELEASE`` to the newest known that is not a release, naming
    the releases either side of it (``vllm.provision.check_release``'s rule, for sglang)."""
    v = sglang_release_key(version)
    if v < SGLANG_MIN_RELEASE or version in SGLANG_RELEASES or v > sglang_release_key(SGLANG_RELEASES[-1]):
        return v
    below = [r for r in SGLANG_RELEASES if sglang_release_key(r) < v][-1:]
    above = [r for r in SGLANG_RELEASES if sglang_release_key(r) > v][:1]
    raise UsageError(f"{flag} {version}: not an sglang release; the nearest are {' and '.join(below + above)} "
                     f"(see `pip index versions sglang`)")
