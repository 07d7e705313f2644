"""What notebook 03 shows of the installed sglang backend and of one harness run: a method's source as
loaded, patched or not (``patch.swap``), the file's diff against its fixed form and its digest (the
in-memory patch must leave the file unchanged), and the plan and forward arguments of the SWA layer's
call (``harness.run_case``'s trace). Reading, not driving: the driving is ``harness``'s.
"""

from __future__ import annotations

import hashlib
import inspect

import torch

from swa_repro.engine.patching import unified_diff
from swa_repro.sglang.harness import HarnessResult, backend_module, swa_forward_index
from swa_repro.sglang.patch import classify, edit, files, swap
from swa_repro.sglang.trace import decode


def method_source(name: str, patched: bool | None = None) -> str:
    """``inspect.getsource`` of ``FlashInferIndicesUpdaterPrefill.<name>`` as loaded
    (``patched=None``), or inside ``swap.patched()`` / ``swap.unpatched()``."""
    fb = backend_module()
    cls = fb.FlashInferIndicesUpdaterPrefill
    if patched is None:
        return inspect.getsource(getattr(cls, name))
    with (swap.patched(fb) if patched else swap.unpatched(fb)):
        return inspect.getsource(getattr(cls, name))


def patch_diff() -> str:
    """Unified diff of the installed backend file against its fixed form (empty when it is fixed)."""
    path = files.installed_path()
    text = path.read_text()
    if classify.classify(text).state == "fixed":
        return ""
    return unified_diff(text, edit.transform(text, "fixed"), "flashinfer_backend.py")


def file_digest() -> str:
    """sha256 of the installed backend file: the in-memory patch must leave it unchanged."""
    return hashlib.sha256(files.installed_path().read_bytes()).hexdigest()


def swa_plan_kwargs(result: HarnessResult) -> dict:
    """The plan kwargs sglang gave the wrapper the SWA layer's forward() ran on (scalars only)."""
    fwd = swa_forward_index(result.trace)
    w = result.trace.calls[fwd].wrapper
    kw = next(k for k in reversed(result.plan_kwargs) if k["wrapper"] == w)
    return {k: v for k, v in kw.items() if v is not None}


def swa_forward_kwargs(result: HarnessResult) -> dict:
    """The keyword arguments of the SWA layer's forward() call (scalars only)."""
    c = result.trace.calls[swa_forward_index(result.trace)]
    return {k: v for k, v in decode(c.kwargs).items() if not torch.is_tensor(v)}
