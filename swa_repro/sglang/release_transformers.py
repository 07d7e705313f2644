"""``audit --transformers release``: the release's model classes built with the transformers it pins.

Why: the audit's children import this venv's transformers (5.12.1), but a server running sglang
0.5.23 has the one its wheel pins (``Requires-Dist: transformers==5.19.0``, ``provision.transformers_pin``).
Where the release's code reads a config attribute only the newer transformers defines (0.5.23's
``gemma4_unified.py:73`` reads ``Gemma4VisionConfig.model_patch_size``; ``configs/nemotron_h.py:430``
``NemotronHConfig.n_groups``), the family table said "not built" for the audit's venv, not the release.

How (opt-in; ``venv``, the default, is the audit as before):

* the pinned transformers is an overlay of its own (``engine.overlay.install``: ``--no-deps
  --target <cache>/transformers/X``), with the few of its own requirements this venv does not satisfy
  (5.19.0 asks ``tokenizers>=0.23.1,<0.24``; the venv has 0.22.2), each at the release's own ``==`` pin
  where it has one (0.5.23: ``tokenizers==0.23.2``), else at transformers' specifier (:func:`deps`);
* the audit then runs on a hard-linked copy of the release's overlay with that transformers beside
  ``sglang/`` (:func:`with_transformers`), so every child of the audit (the family child, the column
  plan, the release's config classes, its ServerArgs) finds it right after the release's own files,
  before the venv's. Such a copy shadows a package the fork server has already imported from the
  venv, so its children run as plain ones (``engine.child.shadowed``), and its content (the RECORDs,
  ``provision.content_digest``) and :func:`transformers_of` are part of every cache key: a venv
  result is never served for a release one, nor the other way round.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from swa_repro.core.errors import UsageError

CHOICES = ("venv", "release")
MARKER = ".swa-repro-transformers.json"


def check(choice: str | None) -> str:
    """``--transformers`` -> ``venv`` / ``release``; anything else is one line."""
    choice = choice or "venv"
    if choice not in CHOICES:
        raise UsageError(f"--transformers {choice}: choose venv (this environment's, the default) or release "
                         "(the version the release's wheel pins)")
    return choice


def transformers_of(overlay: Path) -> dict:
    """Which transformers a child on ``overlay`` imports: the overlay's own (a :func:`with_transformers`
    copy) or the venv's; part of every key of a result such a child makes."""
    own = sorted(Path(overlay).glob("transformers-*.dist-info"))
    if own:
        return {"version": own[0].name.removeprefix("transformers-").removesuffix(".dist-info"), "from": "overlay"}
    from importlib import metadata

    return {"version": metadata.version("transformers"), "from": "venv"}


def transformers_overlay(version: str, overlay: Path) -> tuple[Path, dict]:
    """``(dir, info)``: the transformers sglang ``version`` (its overlay ``overlay``) pins, installed once
    into the cache (``engine.overlay.provisioned``: the lock, the .partial folder, the RECORD check)."""
    from swa_repro.engine.overlay import install, provisioned, release_overlay
    from swa_repro.sglang.provision import transformers_pin

    pin = transformers_pin(overlay)
    if pin is None:
        raise UsageError(f"--transformers release: sglang {version}'s METADATA pins no transformers "
                         "(no `Requires-Dist: transformers==X`); audit it with --transformers venv")
    info = {"transformers": pin, "pinned_by": f"sglang {version}'s METADATA: Requires-Dist: transformers=={pin}"}
    return provisioned(release_overlay("transformers", pin), "*.dist-info", f"transformers {pin}",
                       lambda t: install(t, [f"transformers=={pin}"], info, more=lambda p: deps(p, overlay)))


def deps(partial: Path, overlay: Path) -> list[str]:
    """transformers' own requirements (its METADATA, extras left out) that this venv does not satisfy,
    each as the release pins it (``provision.pin``) where that pin satisfies transformers, else as
    transformers asks it."""
    from importlib import metadata

    from packaging.requirements import Requirement

    from swa_repro.sglang.provision import pin

    out = []
    for meta in partial.glob("transformers-*.dist-info/METADATA"):
        for line in re.findall(r"^Requires-Dist: (.+)$", meta.read_text(), re.MULTILINE):
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                if req.specifier.contains(metadata.version(req.name), prereleases=True):
                    continue
            except metadata.PackageNotFoundError:
                pass
            mine = pin(overlay, re.sub(r"[-_.]+", "[-_.]", re.escape(req.name)))
            out.append(f"{req.name}=={mine}" if mine and req.specifier.contains(mine, prereleases=True)
                       else f"{req.name}{req.specifier}")
    return out


def with_transformers(version: str, overlay: Path) -> tuple[Path, dict]:
    """``(dir, info)``: a hard-linked copy of ``overlay`` (the release as shipped) with its pinned
    transformers' files beside ``sglang/``, cached; ``info`` says which transformers and from where."""
    from swa_repro.core.cache import cache_root, locked
    from swa_repro.engine.record import damaged, marker

    tf, tinfo = transformers_overlay(version, overlay)
    pin = tinfo["transformers"]
    dst = cache_root() / "sglang-transformers" / f"{overlay.name}+transformers-{pin}"
    with locked(dst.with_name(f".{dst.name}.lock")):
        info = marker(dst / MARKER) if dst.is_dir() else None
        if info is None or damaged(dst, "*.dist-info", many=True):
            info = _link(overlay, tf, dst, {k: v for k, v in tinfo.items() if k != "cached"})
    return dst, {**info, "overlay": str(tf)}


def _link(overlay: Path, tf: Path, dst: Path, info: dict) -> dict:
    """``engine.overlay.linked_copy`` of the release's overlay, with the transformers overlay's files linked in."""
    from swa_repro.engine.overlay import linked_copy

    def edit(partial: Path) -> dict:
        for src in tf.rglob("*"):
            rel = src.relative_to(tf)
            if src.is_dir() or rel.parts[0].startswith(".") or "__pycache__" in rel.parts:  # its marker, uv's .lock
                continue
            (partial / rel).parent.mkdir(parents=True, exist_ok=True)
            os.link(src, partial / rel)
        return info

    return linked_copy(overlay, dst, edit, MARKER)
