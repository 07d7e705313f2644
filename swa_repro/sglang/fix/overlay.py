"""A release's overlay with the fixes applied, for ``swa-repro audit --sglang X --fix NAMES``.

A hard-linked copy of the release's own overlay (``provision``) in which only the files the fixes
edit (``sglang/srt/layers/attention/flashinfer_backend.py``; a model file for a family's fix, e.g.
``sglang/srt/models/commandr.py``) are replaced by their fixed text: every other module is that
release's, byte for byte, and the overlay as shipped is never written to (a replaced file is
unlinked first, which breaks its link). Cached per release, fixes and fix code. The marker lists
every replaced file (``file``: the backend, ``files``: the others, with their sha256), which
``provision.content_digest`` reads.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from swa_repro.sglang.patch.classify import REL_PATH

MARKER = ".swa-repro-fixed.json"


def code_key(names) -> str:
    """Changes with the fix names and with the code that makes the edits."""
    h = hashlib.sha256(",".join(names).encode())
    here = Path(__file__).resolve().parent
    edits = ("__init__.py", "anchors.py", "fixes.py", "soft_cap.py", "source.py", "spec_verify.py", "alternatives.py",
             "family_fixes.py")
    code = [here / n for n in edits] + sorted((here.parent / "patch").glob("*.py"))
    for f in code:
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def fixed_overlay(version: str, names, overlay: Path) -> tuple[Path, dict]:
    """``overlay`` (release ``version`` as shipped) with ``names`` applied; ``(dir, info)``. Made by one
    process at a time (two xdist workers making it from nothing would share its .partial folder)."""
    from swa_repro.core.cache import locked

    with locked(overlay.parent.parent / "sglang-fixed" / f".{version}.lock"):
        return _fixed_overlay(version, names, overlay)


def intact(dst: Path) -> dict | None:
    """The fixed copy's marker if it is whole and every file is the release's (its RECORD) or the
    fix's (the marker's ``fixed_sha256``): a damaged copy is made again (``engine.record``, issue #43)."""
    from swa_repro.engine.record import damaged, marker

    info = marker(dst / MARKER)
    try:
        return None if damaged(dst, "sglang-*.dist-info", replaced=replaced(info)) else info
    except (TypeError, KeyError, AttributeError, ValueError):  # a marker without its keys, a sha256 no hex digest
        return None


def replaced(info: dict) -> dict[str, str]:
    """The files a fixed copy's marker says the fixes replaced: relative path -> their sha256 hex
    (``record.damaged``'s ``replaced``; also a kit copy's of a fixed overlay, ``kit_edits``)."""
    files = {info["file"]: info, **(info.get("files") or {})}
    return {rel: v["fixed_sha256"] for rel, v in files.items() if v["original_sha256"]}


def _fixed_overlay(version: str, names, overlay: Path) -> tuple[Path, dict]:
    from swa_repro.engine.patching import sha256_hex
    from swa_repro.sglang.fix import BACKEND, apply_fixes, by_file
    from swa_repro.sglang.fix.alternatives import EDITS, apply_alternative

    dst = overlay.parent.parent / "sglang-fixed" / f"{version}-{code_key(names)}"
    src = overlay / "sglang" / REL_PATH
    original = src.read_bytes()
    fixed = apply_fixes(original.decode(), [n for n in names if n not in EDITS])  # refuses before any copy
    for alt in (n for n in names if n in EDITS):  # a maintainer's first idea, weighed in the audit
        fixed = apply_alternative(fixed, alt)
    fixed = fixed.encode()
    others = {}  # the other files' fixed bytes (a family's model file), each refused before any copy
    for rel, ns in by_file(names).items():
        if rel != BACKEND:
            path = overlay / "sglang" / rel
            if not path.is_file():
                from swa_repro.engine.patching import PatchError

                raise PatchError(f"--fix {','.join(ns)}: sglang {version} has no {rel}; nothing was written")
            others[rel] = (path.read_bytes(), apply_fixes(path.read_text(), ns, rel).encode())
    _refuse_unchanged(version, names, fixed != original or any(old != new for old, new in others.values()))
    made = intact(dst)
    if made is not None and _holds(made, fixed, others):
        return dst, made
    info = {"sglang": version, "fixes": list(names), "file": f"sglang/{REL_PATH}",
            "original_sha256": sha256_hex(original), "fixed_sha256": sha256_hex(fixed), "overlay": str(overlay)}
    if others:
        info["files"] = {f"sglang/{r}": {"original_sha256": sha256_hex(old), "fixed_sha256": sha256_hex(new)}
                         for r, (old, new) in others.items()}

    def edit(partial: Path) -> dict:
        for rel, data in [(str(REL_PATH), fixed)] + [(r, new) for r, (_, new) in others.items()]:
            target = partial / "sglang" / rel
            target.unlink()  # break the hard link: the shipped overlay keeps its file
            target.write_bytes(data)
        return info

    from swa_repro.engine.overlay import linked_copy

    return dst, linked_copy(overlay, dst, edit, MARKER)


def _holds(info: dict, fixed: bytes, others: dict) -> bool:
    """Whether a fixed copy's marker records the bytes these fixes make now (about 0.2 s to make them
    for ``--fix all``). ``code_key`` hashes the fix code as it is on disk when asked, but the edits are
    made by the code this process imported: a copy made by a process whose fix modules changed on disk
    under it (a long test run across an edit or a checkout) carried the new key and the old fix, and
    every later audit reused it (seen: 0.5.20's copy without the per-wrapper mask buffers)."""
    from swa_repro.engine.patching import sha256_hex

    want = {info["file"]: sha256_hex(fixed), **{f"sglang/{r}": sha256_hex(new) for r, (_, new) in others.items()}}
    have = {info["file"]: info["fixed_sha256"], **{r: v["fixed_sha256"] for r, v in (info.get("files") or {}).items()}}
    return have == want


def _refuse_unchanged(version: str, names, changed: bool) -> None:
    """A fix set that changes no file of the release (``ragged_prefix_full_layers`` on 0.5.21+, which
    plan the full layers' prefix themselves) would give a copy equal to the release labelled "FIXED
    COPY": one line, exit 2, as a fix whose file the release lacks is (``PatchError``), before any copy."""
    if changed:
        return
    from swa_repro.engine.patching import PatchError

    one = len(names) == 1
    raise PatchError(f"--fix {','.join(names)} changes nothing in sglang {version}: its code already has "
                     f"{'this fix (it reads' if one else 'these fixes (each reads'} applied), so a fixed copy would be the "
                     "release as it ships: drop --fix, or name a fix the release needs (`swa-repro patch status "
                     "--fix all` on its file)")
