"""Model families and GPU classes for ``swa-repro audit --sglang X --model FAMILY --gpu CLASS``: what
is sglang's of them. The families and GPU classes themselves, and a family's small config, are both
engines' (``engine.families``); here the releases the family audit covers, the families a release
serves (its model files' ``EntryClass``), ``--model`` / ``--gpu`` checked, and a release's source line.

Nothing here imports torch or sglang: the CLI checks its arguments with it before any work.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.engine.families import DEFAULT_GPU, FAMILIES, GPU_CLASSES, MODELS, GpuClass
from swa_repro.sglang import model_configs as mc

RELEASES = ("0.5.14", "0.5.23")  # first and last release the family audit and its fixes cover (fix/__init__)


def check_release(version: str) -> None:
    """One line for a release the family audit does not cover (``doctor --model``, notebook 07)."""
    from swa_repro.core.versions import sglang_release_key as parse

    lo, hi = RELEASES
    if not parse(lo) <= parse(version) <= parse(hi):
        raise UsageError(f"sglang {version} is outside {lo}-{hi}, the releases the family audit covers: "
                         f"install one of them (pip install sglang=={hi}) or pick sglang_release={hi}")


# ----------------------------------------------------------------------------- bad input, before any work
def families_of(overlay: Path) -> dict[str, str]:
    """family -> sglang model file of the release in ``overlay`` (its ``EntryClass`` lists the
    architecture), for every family the release serves."""
    models = overlay / "sglang" / "srt" / "models"
    out = {}
    for fam, (_, _, arch) in MODELS.items():
        p = mc.model_file_in(models, arch)
        if p is not None:
            out[fam] = p.name
    return out


def check_args(family: str | None, gpu: str | None) -> tuple[list[str], GpuClass]:
    """``--model`` / ``--gpu`` -> (families asked for, GPU class); one line for anything unknown."""
    if gpu is not None and gpu not in GPU_CLASSES:
        raise UsageError(f"--gpu {gpu!r}: choose one of {', '.join(GPU_CLASSES)}")
    names = [x.strip() for x in (family or "").split(",") if x.strip()]
    if not names:
        raise UsageError(f"--model selects no family; choose from {', '.join(FAMILIES)} or all")
    bad = [x for x in names if x != "all" and x not in FAMILIES]
    if bad:
        raise UsageError(f"--model {bad[0]!r}: unknown family; choose from {', '.join(FAMILIES)} or all, or give a "
                         "checkpoint's config.json or the folder holding it")
    return (list(FAMILIES) if "all" in names else names), GPU_CLASSES[gpu or DEFAULT_GPU]


def check_release_has(version: str, overlay: Path, families: list[str], explicit: bool) -> list[str]:
    """The families the release serves; a family asked for by name that it does not is one line
    (``--model all`` keeps the ones it has)."""
    have = families_of(overlay)
    missing = [f for f in families if f not in have]
    if missing and explicit:
        arch = MODELS[missing[0]][2]
        raise UsageError(f"--model {missing[0]}: not in this release: sglang {version} has no model file for "
                         f"{arch}; it serves {', '.join(have) or 'none of the families'}")
    return [f for f in families if f in have]


def rel_line(path: str, lineno: int) -> str:
    """``.../site/sglang/srt/x.py``, 12 -> ``sglang/srt/x.py:12`` (the release's own file)."""
    m = re.search(r".*/(sglang/.*)$", "/" + str(path).replace("\\", "/"))
    return f"{m.group(1) if m else path}:{lineno}"


def def_line(obj) -> str:
    """Where the release defines ``obj`` (a class or function): ``sglang/srt/x.py:12``. Once per object in a
    process (a class's line is found by parsing its whole file again each time: a family audit asks ~440
    times for a few dozen classes, ~3 CPU-s of 0.5.23's table child); the files do not change under it."""
    try:
        return _def_line(obj)
    except TypeError:  # unhashable
        return _def_line.__wrapped__(obj)


@functools.cache
def _def_line(obj) -> str:
    import inspect

    return rel_line(inspect.getsourcefile(obj), inspect.getsourcelines(obj)[1])
