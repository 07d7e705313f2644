"""What every fix of ``fix.fixes`` finds first in sglang's ``flashinfer_backend.py``: the classes
and methods by name, the one ``call_begin_forward`` call of ``update_sliding_window`` and the plan
calls of the prefill updater (line numbers: 0.5.23's). A file without them is ``Unknown``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from swa_repro.sglang.fix.source import Source, calls_on
from swa_repro.sglang.patch.classify import REL_PATH

BACKEND, PREFILL, DECODE = "FlashInferAttnBackend", "FlashInferIndicesUpdaterPrefill", "FlashInferIndicesUpdaterDecode"
USW, CBF = "update_sliding_window", "call_begin_forward"
SWA_RAGGED = "prefill_wrapper_ragged_swa"
CAP_HELPER = "_plan_logits_soft_cap"

class Unknown(Exception):
    """The file's structure is not the one the fix was written against (why in the message)."""


@dataclass(frozen=True)
class State:
    state: str  # needed | applied | unknown
    why: str = ""


@dataclass(frozen=True)
class Fix:
    name: str
    summary: str
    requires: tuple = ()
    needs_fixed_31501: bool = False  # the window plumbing of PR #31501 (call_begin_forward's window_left)
    edits: object = field(default=None, repr=False)  # Source -> list[Edit] ([] when applied)
    file: str = str(REL_PATH)  # the file it edits, under the sglang package


def _need(node, what: str):
    if node is None:
        raise Unknown(f"no {what}")
    return node


# ----------------------------------------------------------------------------- shared anchors
def _usw_call(src: Source):
    usw = _need(src.method(PREFILL, USW), f"{PREFILL}.{USW}")
    calls = calls_on(usw, "self", (CBF,))
    if len(calls) != 1:
        raise Unknown(f"{PREFILL}.{USW} makes {len(calls)} self.{CBF}(...) calls, expected 1")
    loop = next((n for n in ast.walk(usw) if isinstance(n, ast.For) and isinstance(n.target, ast.Name)
                 and any(c is calls[0] for c in ast.walk(n))), None)
    return usw, calls[0], _need(loop, f"wrapper loop around self.{CBF} in {USW}").target.id


def _plan_of(src: Source, wrapper: str):
    """``(call_begin_forward, its one <wrapper>.begin_forward call)`` of the prefill updater."""
    cbf = _need(src.method(PREFILL, CBF), f"{PREFILL}.{CBF}")
    calls = calls_on(cbf, wrapper)
    if len(calls) != 1:
        raise Unknown(f"{PREFILL}.{CBF} makes {len(calls)} {wrapper}.begin_forward calls, expected 1")
    return cbf, calls[0]


def _ragged_plan(src: Source):
    return _plan_of(src, "wrapper_ragged")


def _paged_plan(src: Source):
    return _plan_of(src, "wrapper_paged")


def _stmt_holding(fn, call):
    return next(s for s in ast.walk(fn) if isinstance(s, ast.Expr) and s.value is call)


def _assign_to(fn, attr: str):
    """``self.<attr> = ...`` directly in ``fn``'s body."""
    return next((s for s in fn.body if isinstance(s, ast.Assign) and len(s.targets) == 1
                 and ast.unparse(s.targets[0]) == f"self.{attr}"), None)
