"""The family table's column plan (``arch_cells.plan``) cached by content, as the audits' results are.

Why: a plan reads every model file of the release (``swa_archs.discover``), builds transformers' and the
release's config classes for ~80 architectures and walks each model class for the keys it reads: ~11
CPU-s for 0.5.23, paid again by every process that asks (the table's row, ``tests/test_arch_configs.py``,
``tests/test_hybrid_pool.py``, ``tests/test_swa_archs.py``). It is a pure function of the release's
files (``provision.content_digest``: its RECORD, every file's sha256), of the package's code
(``core.cache.code_hash``) and of the interpreter's libraries (transformers' config classes give the
defaults), so it is keyed on exactly those (``core.cache.cached``; ``SWA_REPRO_NO_CACHE=1`` computes it).
A fresh plan goes through JSON as a stored one does, so both give the same types. On an overlay with
transformers of its own (``--transformers release``) the plan, which builds transformers' config
classes, is made in a child on it (``arch_cells.main``), never with the venv's.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from swa_repro.engine.child import shadowed

KIND = "arch-plan"


def parts(version: str, overlay: Path) -> dict:
    """What a plan depends on besides the code: the release's content and the libraries that read it."""
    from swa_repro.core.cache import code_hash, interpreter
    from swa_repro.sglang.provision import content_digest
    from swa_repro.sglang.release_transformers import transformers_of

    return {"version": version, "overlay": content_digest(Path(overlay)), "code": code_hash(),
            "interpreter": {**interpreter(), "transformers": transformers_of(Path(overlay))}}


def whole(doc) -> bool:
    """A stored plan: its two tables, as :func:`cached_plan` stores them."""
    return isinstance(doc, dict) and isinstance(doc.get("smalls"), dict) and isinstance(doc.get("static"), dict)


def cached_plan(plan):
    """``plan(version, overlay) -> (smalls, static)`` through the result cache (a hit: no model file read)."""

    @functools.wraps(plan)
    def wrapper(version: str, overlay: Path) -> tuple[dict, dict]:
        from swa_repro.core.cache import cached

        def compute():
            if shadowed(overlay):  # the release's own transformers (release_transformers): read in a child
                from swa_repro.engine.child import run_in_child

                return run_in_child(plan.__module__, Path(overlay), ["--version", version],
                                    f"planning sglang {version}'s columns")["document"]
            smalls, static = plan(version, overlay)
            return json.loads(json.dumps({"smalls": smalls, "static": static}, default=str))

        doc, _ = cached(KIND, parts(version, overlay), compute, valid=whole)
        return doc["smalls"], doc["static"]
    wrapper.uncached = plan
    return wrapper
