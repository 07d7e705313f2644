"""Run a module of this package against release X's own code: a child process with X's overlay
(``provision``, or ``fix.overlay.fixed_overlay`` with ``--fix``) first on ``sys.path``.

One interpreter cannot hold two sglang releases and the installed one must stay untouched, so the
parent provisions, the child (``python -m MODULE --overlay DIR --out FILE ...``) imports X's
``sglang``, checks every loaded ``sglang.*`` module came from the overlay (:func:`foreign_modules`)
and writes a JSON document. Used by ``audit --sglang`` (``audit.release``) and
``sglang-check --kit-only --sglang`` (``sglang.kit``). The engine-neutral plumbing (the child's
environment, the fork server, ``child_main``) is ``engine.child``; here: sglang's overlays, the
cache key of a run on one and the check that sglang came from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.engine.child import run_in_child, whole_run


# ----------------------------------------------------------------------------- parent
def overlay_for(version: str, fixes=None, *, note=print, doing: str = "running it",
                transformers: str = "venv") -> tuple[Path, dict, dict | None]:
    """``(overlay, provision info, fix info or None)``: the release as shipped, or with ``fixes``;
    ``transformers="release"``: with the transformers it pins beside it (``release_transformers``, the
    provision info's ``transformers``), which no fixed copy has yet (one line)."""
    from swa_repro.sglang.provision import provision

    if fixes and transformers == "release":  # before any install
        raise UsageError("--transformers release goes without --fix for now: the fixed copies carry this venv's "
                         "transformers")
    overlay, info = provision(version)
    shipped, fixed = overlay, None
    if fixes:  # first: a fix set it refuses (one that changes nothing) is its one line, no note before it
        from swa_repro.sglang.fix.overlay import fixed_overlay

        overlay, fixed = fixed_overlay(version, fixes, shipped)
    if transformers == "release":
        from swa_repro.sglang.release_transformers import with_transformers

        overlay, tf = with_transformers(version, shipped)
        info = {**info, "transformers": tf}
    how = "cached" if info["cached"] else f"installed in {info['install_seconds']} s"
    note(f"sglang {version}: overlay {shipped} ({how}); {doing} in a subprocess "
         "(the first import of a release compiles it: a minute or more)")
    if fixes:
        note(f"sglang {version}: with --fix {','.join(fixes)} ({overlay})")
    if transformers == "release":
        note(f"sglang {version}: with the transformers it pins, {info['transformers']['transformers']} ({overlay}; "
             "plain children, not the fork server's)")
    return overlay, info, fixed


def run_child(module: str, overlay: Path, args: list[str], what: str, *, cache: bool = True) -> tuple[dict, float, dict]:
    """``python -m module --overlay overlay --out F *args`` -> (its JSON document, seconds, how); a
    failed child is one UsageError line (its last stderr line).

    Cached by content (``core.cache``): the key is the module and its arguments, the overlay's
    content (``provision.content_digest``: the release's RECORD and the backend file, so a fixed
    overlay differs from the shipped one), the hash of every module the child can import
    (``code_hash``: the layers up to ``sglang``) and this interpreter's torch/numpy/flashinfer. A hit
    costs no child; ``how["cache"]`` says hit / miss / off, ``seconds`` is the child's own run.
    ``cache=False`` (a run on a GPU: the result is the device's, not the code's) always runs it."""
    from swa_repro.core.cache import cached

    if not cache:
        doc = run_in_child(module, overlay, args, what)
        return doc["document"], doc["seconds"], {"cache": "off"}
    parts = {**child_parts(module, overlay), "args": list(args)}
    doc, how = cached("overlay-run", parts, lambda: run_in_child(module, overlay, args, what), valid=whole_run)
    return doc["document"], doc["seconds"], how


def child_parts(module: str, overlay: Path) -> dict:
    """What a child's result depends on besides its arguments: the module, the overlay's content,
    the package code the child can import, this interpreter's libraries (``run_child``) and the
    transformers the child imports (``release_transformers.transformers_of``: the venv's, or the
    release's own with ``--transformers release``)."""
    from swa_repro.core.cache import code_hash, interpreter
    from swa_repro.sglang.provision import content_digest
    from swa_repro.sglang.release_transformers import transformers_of

    return {"module": module, "overlay": content_digest(overlay), "code": code_hash(), "interpreter": interpreter(),
            "transformers": transformers_of(overlay)}


# ----------------------------------------------------------------------------- child
def foreign_modules(overlay: Path) -> list[str]:
    """Loaded ``sglang`` / ``sglang.*`` modules whose file is not under ``overlay``."""
    root = str(overlay.resolve())
    return sorted(k for k, m in list(sys.modules.items())
                  if (k == "sglang" or k.startswith("sglang.")) and getattr(m, "__file__", None)
                  and not str(Path(m.__file__).resolve()).startswith(root))


def import_release(overlay: Path):
    """Quiet warnings/logging, import the overlay's ``sglang`` (first on ``sys.path``) and refuse
    one from elsewhere; the sgl_kernel placeholder where it cannot load (``releases``)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import sglang

    if foreign_modules(overlay):
        raise UsageError(f"sglang came from {sglang.__file__}, not from the overlay {overlay}")
    from swa_repro.sglang import releases

    releases.ensure_sgl_kernel()
    return sglang


def check_no_foreign(overlay: Path) -> int:
    """After the run: every loaded sglang module is the overlay's; how many there are."""
    bad = foreign_modules(overlay)
    if bad:
        raise UsageError(f"{len(bad)} sglang modules did not come from the overlay (e.g. {bad[0]})")
    return sum(1 for k in sys.modules if k == "sglang" or k.startswith("sglang."))
