"""On disk: find the installed sglang's backend file, and patch it in place to PR #31501's state
(or with any edit). The backup, the byte-for-byte revert and every refusal are the engine's
(``engine.patching``); here what is sglang's: where the file is, and the fix it gets by default.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from swa_repro.engine.patching import PatchError
from swa_repro.engine.patching import apply_in_place as engine_apply
from swa_repro.sglang.patch.classify import REL_PATH, classify
from swa_repro.sglang.patch.edit import transform

COPY_HINT = ", or use swa_repro.sglang.patch.patched() in-process"


def installed_path(rel=REL_PATH) -> Path:
    """flashinfer_backend.py (or ``rel``, another file under the package) of the importable sglang,
    found without importing sglang."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("sglang is not installed in this Python "
                         f"({sys.executable}); install it (`pip install sglang==0.5.15.post1`) "
                         "or pass --source FILE")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        what = "FlashInfer backend file" if Path(rel) == REL_PATH else Path(rel).name
        raise PatchError(f"{path} does not exist: this sglang has no {what}; pass --source FILE")
    return path


def apply_in_place(path: Path, target="fixed", *, edit=None, label=None, done=None,
                   revert="swa-repro patch revert") -> str:
    """Patch ``path`` in place with a backup; returns a one-line message. By default to PR #31501's
    ``target`` state; ``edit`` (text -> text), ``label`` (what it makes, e.g. ``--fix all``) and
    ``done`` (text -> already so?) patch it with anything else (``swa-repro patch --fix``);
    ``revert``: the command the messages name to undo it (vLLM's file: ``... revert --vllm``)."""
    if edit is None:
        label = target
        edit = lambda t: transform(t, target)  # noqa: E731 - refuses unknown
        return engine_apply(path, edit=edit, label=label, done=lambda t: classify(t).state == target,
                            state_of=lambda t: classify(t).state, revert=revert, copy_hint=COPY_HINT)
    return engine_apply(path, edit=edit, label=label, done=done, revert=revert, copy_hint=COPY_HINT)
