"""The simplest fix a maintainer would suggest first, per finding, to weigh ours against.

Each is an edit of the release's own ``flashinfer_backend.py`` (``fix.source`` primitives, like the
fixes) that ``fix.overlay.fixed_overlay`` applies when its name is among the fixes, so the audit
asks the same key-level question of it (``swa-repro audit`` via ``audit_release(..., fixes=(name,))``)
and the GPU measures its cost (``benchmarks/alt_cost.py``). Not offered by ``patch --fix``.

* ``alt_paged_for_swa`` (for ``ragged_no_prefix_window`` / ``ragged_prefix_window``): no ragged
  prefill for sliding-window models: ``self.use_paged`` (:453) also when the runner has a sliding
  window, so every prefill of such a model takes the paged path, which plans the window since PR
  #31501. Exact, and one statement; its cost is the full layers' prefill going paged too.
* ``alt_eagle_gate_only`` (for ``eagle_verify_window``): only let EAGLE verify through the window
  gate (:2097), keeping wrapper 0's trimmed keys (:2046). Not exact: EAGLE's
  ``generate_attn_arg_prefill`` takes no ``kv_start_idx`` (:2281), so the trimmed keys are the
  sequence's first ones, not its last (the audit shows which queries lose keys).

``PRIOR`` keeps a fix as it was before a review found it wrong, applied after the fixes like an
alternative, so the audit and the kit can show they catch it (not in ``upstream.audits``' run):

* ``prior_eagle_shared_mask_buf`` (for ``eagle_verify_window``, issue #40): every CUDA-graph verify
  wrapper back on one packed-mask buffer, as the fix left them before per-wrapper buffers
  (``spec_verify._mask_buffers``): at replay the sliding-window wrapper reads the full wrapper's
  unwindowed tree mask.

For the others ours is already the minimal change: ``dflash_verify_window`` is the gate alone (one
line), and ``soft_cap_*`` pass the config's cap to the plans that lacked it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from swa_repro.sglang.fix.anchors import BACKEND, Unknown, _assign_to, _need
from swa_repro.sglang.fix.spec_verify import _gate_edit, _window_gate
from swa_repro.sglang.fix.source import Source, apply_edits


@dataclass(frozen=True)
class Alternative:
    name: str
    findings: tuple  # the finding classes (fix.ORDER names) it answers
    summary: str
    edits: object  # Source -> list[Edit]


def _paged_for_swa(src: Source):
    init = _need(src.method(BACKEND, "__init__"), f"{BACKEND}.__init__")
    stmt = _need(_assign_to(init, "use_paged"), "self.use_paged = ... in the backend's __init__")
    old = ast.unparse(stmt.value)
    if "sliding_window_size" in old:
        return []
    return [src.replace(stmt, "\n".join([
        "# Sliding-window models prefill paged only: one ragged wrapper serves both",
        f"{src.indent_of(stmt)}# layer kinds and cannot carry the sliding-window layers' window_left.",
        f"{src.indent_of(stmt)}self.use_paged = (",
        f"{src.indent_of(stmt)}    {old}",
        f"{src.indent_of(stmt)}    or model_runner.sliding_window_size is not None",
        f"{src.indent_of(stmt)})"]))]


def _eagle_gate_only(src: Source):
    return _gate_edit(src, ("EAGLE_VERIFY",), _window_gate(src))


ALTERNATIVES = {a.name: a for a in (
    Alternative("alt_paged_for_swa", ("ragged_no_prefix_window", "ragged_prefix_window"),
                "no ragged prefill for sliding-window models (SGLANG_FLASHINFER_USE_PAGED implied)",
                _paged_for_swa),
    Alternative("alt_eagle_gate_only", ("eagle_verify_window",),
                "plan window_left for EAGLE verify too, keeping wrapper 0's trimmed keys", _eagle_gate_only),
)}


def _shared_mask_buf(src: Source):
    from swa_repro.sglang.fix.spec_verify import MASK_BUF

    own = f"self.{MASK_BUF}[i]"
    hits = [n for n in ast.walk(src.tree) if isinstance(n, ast.Subscript) and ast.unparse(n) == own]
    if len(hits) != 1:
        raise Unknown(f"{own} is not passed once (apply eagle_verify_window first)")
    return [src.replace(hits[0], f"self.{MASK_BUF}[0]")]


PRIOR = {a.name: a for a in (
    Alternative("prior_eagle_shared_mask_buf", ("eagle_verify_window",),
                "eagle_verify_window before #40: every CUDA-graph verify wrapper on one packed-mask buffer",
                _shared_mask_buf),
)}
EDITS = {**ALTERNATIVES, **PRIOR}  # what fix.overlay applies after the fixes


def apply_alternative(text: str, name: str) -> str:
    """``text`` with alternative (or prior fix) ``name``; raises ``Unknown`` (why) where its anchor
    is not there."""
    try:
        return apply_edits(text, EDITS[name].edits(Source(text)))
    except SyntaxError as e:
        raise Unknown(f"does not parse: {e}") from None
