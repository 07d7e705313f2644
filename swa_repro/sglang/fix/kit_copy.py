"""A release's overlay (shipped or fixed: ``fix.overlay``) with sglang's test kit edited
(``kit_edits``), as a hard-linked copy in ``sglang-kit/`` beside the overlays, made once and checked
against its wheel's ``RECORD`` each time it is reused (``engine.record``, issue #43), as the
release's and the fixed overlays are: a file damaged in the copy (cut short, edited, replaced) is a
copy made again, never a kit run on other bytes whose result is cached under the intact key
(``provision.content_digest`` reads the RECORD and the replaced files, not the rest)."""

from __future__ import annotations

import shutil
from pathlib import Path

from swa_repro.sglang.fix import kit_edits


def kit_overlay(overlay: Path, names=kit_edits.ORDER) -> Path:
    """A hard-linked copy of ``overlay`` (a release's, shipped or fixed: ``fix.overlay``) whose kit
    has ``names`` applied, in ``sglang-kit/`` beside the overlays; made once, reused after (the kit's
    text, the edits and this file decide its name), by one process at a time. The overlay itself is
    never written to."""
    from swa_repro.core.cache import locked

    with locked(overlay.parent.parent / "sglang-kit" / f".{overlay.parent.name}-{overlay.name}.lock"):
        return _kit_overlay(overlay, names)


KIT_MARKER = ".swa-repro-kit.json"


def _kit_overlay(overlay: Path, names) -> Path:
    import hashlib

    from swa_repro.sglang.fix import kit_anchor, kit_tree

    texts = kit_edits.read(overlay)
    h = hashlib.sha256(",".join(names).encode())
    for p in kit_edits.FILES:
        h.update(texts[p].encode())
    for m in (kit_edits.__file__, kit_anchor.__file__, kit_tree.__file__):
        h.update(Path(m).read_bytes())
    h.update(Path(__file__).read_bytes())
    dst = overlay.parent.parent / "sglang-kit" / f"{overlay.parent.name}-{overlay.name}-{h.hexdigest()[:12]}"
    if kit_intact(dst):
        return dst
    for _ in range(2):  # a file damaged through a hard link is the overlay's too: made again once
        _make_kit_overlay(overlay, dst, names)
        bad = kit_intact(dst, why=True)
        if not bad:
            return dst
    from swa_repro.core.errors import UsageError

    shutil.rmtree(dst, ignore_errors=True)
    raise UsageError(f"the kit copy of {overlay} does not match its wheel's RECORD ({bad[0]}): delete {overlay} "
                     "(it is made again) and run the command again")


def kit_intact(dst: Path, why: bool = False):
    """Whether a kit copy is whole: its marker reads and lists the files it replaced (the kit edits',
    and a fixed overlay's), and every other file is its wheel's (``engine.record``, as the release's
    and fixed overlays are checked, issue #43): a damaged file is a copy made again, never a kit
    run on other bytes cached under the intact key. ``why``: the list of damaged files instead."""
    from swa_repro.engine.record import damaged, marker

    info = marker(dst / KIT_MARKER)
    try:
        bad = damaged(dst, "sglang-*.dist-info", replaced=dict(info["replaced"])) if info else [f"no {KIT_MARKER}"]
    except (TypeError, KeyError, ValueError):  # a marker without its keys, a sha256 no hex digest
        bad = [f"{KIT_MARKER} lacks its replaced files"]
    return bad if why else not bad


def _make_kit_overlay(overlay: Path, dst: Path, names) -> None:
    import hashlib

    from swa_repro.engine.overlay import linked_copy
    from swa_repro.engine.record import marker
    from swa_repro.sglang.fix.overlay import MARKER, replaced

    fixed = marker(overlay / MARKER)

    def edit(partial: Path) -> dict:
        kit_edits.apply_to_site(partial, names)  # replaces the edited files: their links to the overlay break
        done = {**(replaced(fixed) if fixed else {}),
                **{p: hashlib.sha256((partial / p).read_bytes()).hexdigest() for p in kit_edits.FILES}}
        return {"overlay": str(overlay), "edits": list(names), "replaced": done}

    linked_copy(overlay, dst, edit, KIT_MARKER)
