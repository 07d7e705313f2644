"""One source edit per finding class (``audit.table.CLASSES``), for sglang 0.5.14-0.5.23's
``srt/layers/attention/flashinfer_backend.py``.

FlashInfer picks its compiled module at ``plan()``: ``window_left >= 0`` compiles the per-element
window mask in, ``logits_soft_cap > 0`` the tanh cap (flashinfer 0.7.2 prefill.py ``plan``; the
deprecated ``forward()`` only overwrites ``_window_left`` / ``_logits_soft_cap``, prefill.py:3969-3970).
Each fix makes the plan carry what the layer asks for, on its paths only; every other call keeps
its arguments. Line numbers below are 0.5.23's.

* ``paged_only_window``: PR #31501 (``patch.edit.transform``; 0.5.16 shipped it).
* ``ragged_no_prefix_window`` / ``ragged_prefix_window``: the one ragged wrapper is shared by
  sliding-window and full layers (:523, planned twice in ``update_sliding_window``, :2077, the full
  layers' plan last), so a window cannot be planned into it. The fix gives the sliding-window
  layers their own ragged wrapper planned with ``window_left`` (``_ragged_wrapper``); a runtime
  ``window_left=-1`` on a window-compiled module is *not* full attention on sm90 (fa3 skips tiles
  from ``window_left``: hopper/utils.cuh:38-46) nor under split-KV (the chunk size comes from the
  planned window: scheduler.cuh:632), so full layers keep the shared wrapper, planned as before.
  The no-prefix forward (:1464) also passes the layer's window (it passed none, so ``forward()``
  reset ``_window_left`` to -1).
* ``eagle_verify_window``: the verifies whose queries are draft-tree nodes under a custom mask
  (EAGLE, Frozen-KV MTP, NGRAM: ``TREE_KINDS``). Wrapper 0 was planned over the first
  ``min(seq, window)`` keys (their ``generate_attn_arg_prefill`` takes no ``kv_start_idx``, :2284;
  eagle_info.py:90-155, ngram_info.py:60-117) under a tree mask laid out for the whole sequence,
  with no window (the gate, :2097). Planning FlashInfer's window alone is not exact for a tree:
  FlashInfer keeps key ``kv_idx`` for row ``qo_idx`` when ``kv_idx + qo_len + window_left >=
  kv_len + qo_idx`` (flashinfer 0.7.2 variants.cuh:88-89), so it places draft token ``i`` at
  ``committed + i``, while its position is ``committed + depth(i)`` (build_tree_kernel_efficient,
  speculative/eagle_utils.py:138-233 and kernels/ops/speculative/spec_tree.py:142-207; NGRAM:
  reconstruct_tree.py:21-28; the forward reads them, forward_batch_info.py:1219-1223): a node
  after its siblings lost its oldest in-window keys (the audit's ``target_verify_eagle_k*`` paths:
  missing keys). The same runtime value also starts each fa2 CTA at its first row's window
  (prefill.cuh:3826-3827), compiled in or not, so no windowless plan is exact either. The fix:
  wrapper 0 keeps the whole sequence and the tree mask (like wrapper 1); plan and ``forward()``
  both take the window widened by ``draft_token_num - 1`` (``_spec_verify_window_left``: a node's
  position is at most that far before its flattened index, so the widened window never cuts an
  intended key, and KV tiles older than it are still skipped); and ``call_begin_forward`` ANDs
  the window on real positions into the tree mask (``_spec_tree_mask_in_window``: depth = the
  node's strict ancestors in the mask, as sglang computes positions; it touches only the keys
  the widened window still lets in, and returns a new mask, so wrapper 1 keeps the original). A
  topk-1 chain takes the same code (depth = index there, so the cut is the plain window).
* ``dflash_verify_window``: DFlash trims with ``kv_start_idx`` (:2268) request-granularly; the fix
  plans the window in so the cut is per element.
* ``soft_cap_prefill`` / ``soft_cap_decode``: plan with the cap the model's attention layers use
  (each RadixAttention's ``logit_cap``, read at start-up from ``model_runner.model``: gemma2.py's
  from ``attn_logit_softcapping``, grok.py:425's with its fallback of 30; a runner whose model holds
  no layer, as the test kit's, names it in ``hf_text_config``; layers of different caps are refused). A ``fast_prefill_plan`` replay (:180) takes no cap and keeps the
  captured module; ``fast_decode_plan`` takes it (flashinfer decode.py ``fast_decode_plan``).
* ``soft_cap_cuda_graph``: both of the above. Capture plans go through the same
  ``call_begin_forward``; replays never re-pick the module (the live audit's note, ``audit.live``).

A layer whose cap is not the planned one (a ``logit_capping_method`` other than tanh, grok.py:426;
a layer of cap 0 in a capped model the kit's runner describes by config) is refused with a
ValueError that names both caps (``_check_logits_soft_cap``; ``fix.cap_safety`` drives it).

Limits: with the sliding-window KV pool, a tree verify's whole-sequence indices for wrapper 0 also
name slots outside the window: the planned window skips the tiles before it, the mask the rest, but
they are listed. The tree window needs ``FULL_MASK`` (the FlashInfer path's mode: sglang builds
``QLEN_ONLY`` only on CPU, eagle_utils.py:132-135).
"""

from __future__ import annotations

import ast

from swa_repro.sglang.fix.anchors import (BACKEND, CBF, PREFILL, SWA_RAGGED, USW, Fix, Unknown,
                                          _assign_to, _need, _ragged_plan, _usw_call)
from swa_repro.sglang.fix.soft_cap import _soft_cap_decode, _soft_cap_prefill
from swa_repro.sglang.fix.source import Edit, Source, keyword
from swa_repro.sglang.fix.spec_verify import _dflash, _eagle
from swa_repro.sglang.patch.classify import classify as classify_31501
from swa_repro.sglang.patch.edit import transform as transform_31501

# ----------------------------------------------------------------------------- paged-only window
def _paged_only(src: Source):
    s = classify_31501(src.text)
    if s.state == "fixed":
        return []
    if s.state != "unfixed":
        raise Unknown("; ".join(s.reasons))
    new = transform_31501(src.text, "fixed")
    return [Edit(0, len(src.text), new)]


# ----------------------------------------------------------------------------- ragged windows
def _swa_backend(src: Source, kw) -> str:
    """The sliding-window ragged wrapper's ``backend=``: the shared one's, except cutlass (sm100,
    0.5.23 :501-522), whose prefill plans no ``window_left`` (flashinfer 0.7.2 prefill.py ``plan``):
    fa2 there, so the full layers keep cutlass on the shared wrapper."""
    if kw.arg != "backend":
        return src.seg(kw)
    be = src.seg(kw.value)
    return f'backend="fa2" if {be} == "cutlass" else {be}'


def _ragged_common(src: Source) -> list[Edit]:
    """The sliding-window layers' own ragged wrapper: created next to the shared one whenever the
    runner has a window (as the shared one is created whatever the backend's switches: a hand copy of
    ``init_forward_metadata``'s ``use_ragged`` would miss a path that plans it, and plan() would get
    ``None``), planned with the window for wrapper 0 in ``update_sliding_window``, and chosen per
    layer (``_ragged_wrapper``)."""
    edits = []
    init = _need(src.method(BACKEND, "__init__"), f"{BACKEND}.__init__")
    made = _need(next((s for s in ast.walk(init) if isinstance(s, ast.Assign) and len(s.targets) == 1
                       and ast.unparse(s.targets[0]) == "self.prefill_wrapper_ragged"), None),
                 "self.prefill_wrapper_ragged = ... in the backend's __init__")
    if not (isinstance(made.value, ast.Call) and ast.unparse(made.value.func) == "BatchPrefillWithRaggedKVCacheWrapper"):
        raise Unknown("self.prefill_wrapper_ragged is not built by BatchPrefillWithRaggedKVCacheWrapper(...)")
    if not any(isinstance(n, ast.Attribute) and n.attr == SWA_RAGGED for n in ast.walk(init)):
        args = [src.seg(a) for a in made.value.args] + [_swa_backend(src, k) for k in made.value.keywords]
        edits.append(src.insert_lines_after(made, [
            "# The sliding-window layers' own ragged wrapper: plan() compiles window_left",
            "# in, and the shared one above stays planned for the full-attention layers.",
            f"self.{SWA_RAGGED} = None",
            "if model_runner.sliding_window_size is not None:",
            f"    self.{SWA_RAGGED} = BatchPrefillWithRaggedKVCacheWrapper(",
            *[f"        {a}," for a in args],
            "    )"]))
    idx = _need(src.method(BACKEND, "_get_wrapper_idx"), f"{BACKEND}._get_wrapper_idx")
    if src.method(BACKEND, "_ragged_wrapper") is None:
        edits.append(src.insert_lines_after(idx, [
            "",
            "def _ragged_wrapper(self, layer: RadixAttention):",
            '    """The ragged wrapper planned with this layer\'s window (plan() compiles it)."""',
            f"    swa_wrapper = self.{SWA_RAGGED}",
            "    if swa_wrapper is not None and self._get_wrapper_idx(layer) == 0:",
            "        return swa_wrapper",
            "    return self.prefill_wrapper_ragged"], indent=src.indent_of(idx)))
    pinit = _need(src.method(PREFILL, "__init__"), f"{PREFILL}.__init__")
    if _assign_to(pinit, SWA_RAGGED) is None:
        shared = _need(_assign_to(pinit, "prefill_wrapper_ragged"), f"self.prefill_wrapper_ragged = ... in {PREFILL}.__init__")
        edits.append(src.insert_lines_after(shared, [f"self.{SWA_RAGGED} = attn_backend.{SWA_RAGGED}"]))
    usw, call, loop = _usw_call(src)
    first = src.seg(call.args[0]) if call.args else ""
    if first != "self.prefill_wrapper_ragged" and SWA_RAGGED not in first:  # not as shipped, nor fixed
        raise Unknown(f"{USW} does not pass self.prefill_wrapper_ragged first to {CBF}")
    if first == "self.prefill_wrapper_ragged":
        arg = call.args[0]
        ind = src.indent_of(arg)
        edits.append(src.replace(arg, f"(\n{ind}    self.{SWA_RAGGED}\n{ind}    if {loop} == 0\n"
                                      f"{ind}    else self.prefill_wrapper_ragged\n{ind})"))
    if keyword(call, "ragged_window_left") is None:
        local = any(isinstance(n, ast.Name) and n.id == "sliding_window_size" and isinstance(n.ctx, ast.Store)
                    for n in ast.walk(usw))
        window = "sliding_window_size" if local else "self.sliding_window_size"
        edits.append(src.add_keyword(call, f"ragged_window_left={window} if {loop} == 0 else -1"))
    cbf, ragged = _ragged_plan(src)
    if "ragged_window_left" not in [a.arg for a in cbf.args.args]:
        edits.append(src.add_parameter(cbf, "ragged_window_left: int = -1"))
    if keyword(ragged, "window_left") is None:
        edits.append(src.add_keyword(ragged, "window_left=ragged_window_left"))
    return edits


def _forward_extend_ragged_calls(src: Source):
    fe = _need(src.method(BACKEND, "forward_extend"), f"{BACKEND}.forward_extend")
    plain = [c for c in ast.walk(fe) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
             and c.func.attr in ("forward", "forward_return_lse")
             and ast.unparse(c.func.value) in ("self.prefill_wrapper_ragged", "self._ragged_wrapper(layer)")]
    by = {}
    for c in plain:
        by.setdefault(c.func.attr, []).append(c)
    if len(by.get("forward", [])) != 1 or len(by.get("forward_return_lse", [])) != 1:
        raise Unknown("forward_extend does not make one ragged forward() (no prefix) and one "
                      "forward_return_lse() (with prefix)")
    return by["forward"][0], by["forward_return_lse"][0]


def _ragged_no_prefix(src: Source):
    fwd, _ = _forward_extend_ragged_calls(src)
    if ast.unparse(fwd.func.value) == "self._ragged_wrapper(layer)" and keyword(fwd, "window_left"):
        return []
    edits = _ragged_common(src)
    edits.append(src.replace(fwd.func.value, "self._ragged_wrapper(layer)"))
    if keyword(fwd, "window_left") is None:
        edits.append(src.add_keyword(fwd, "window_left=layer.sliding_window_size"))
    return edits


def _ragged_prefix(src: Source):
    _, lse = _forward_extend_ragged_calls(src)
    if ast.unparse(lse.func.value) == "self._ragged_wrapper(layer)":
        return []
    if keyword(lse, "window_left") is None:
        raise Unknown("the ragged forward_return_lse() passes no window_left")
    return _ragged_common(src) + [src.replace(lse.func.value, "self._ragged_wrapper(layer)")]


# ----------------------------------------------------------------------------- the registry
FIXES = {f.name: f for f in (
    Fix("paged_only_window", "plan the paged-only sliding-window wrapper with window_left (PR #31501)",
        edits=_paged_only),
    Fix("ragged_no_prefix_window", "a ragged wrapper of the sliding-window layers' own, planned with "
        "window_left; the no-prefix forward passes the layer's window", edits=_ragged_no_prefix),
    Fix("ragged_prefix_window", "the same wrapper for the with-prefix ragged forward", edits=_ragged_prefix),
    Fix("eagle_verify_window", "EAGLE / NGRAM tree verify: wrapper 0 keeps the whole sequence and its tree "
        "mask, the window is cut into the mask on each draft token's tree position, plan and forward "
        "take it widened by draft_token_num - 1, and each CUDA-graph verify wrapper has its own packed-mask "
        "buffer", needs_fixed_31501=True, edits=_eagle),
    Fix("dflash_verify_window", "DFlash verify: plan window_left", needs_fixed_31501=True, edits=_dflash),
    Fix("soft_cap_prefill", "ragged and paged prefill plans carry the model's logits soft cap; "
        "forward_extend refuses a layer whose cap is another",
        edits=_soft_cap_prefill),
    Fix("soft_cap_decode", "decode plans carry the model's logits soft cap; forward_decode refuses a "
        "layer whose cap is another", edits=_soft_cap_decode),
    Fix("soft_cap_cuda_graph", "CUDA-graph capture plans carry the cap (soft_cap_prefill + soft_cap_decode)",
        requires=("soft_cap_prefill", "soft_cap_decode"), edits=lambda src: []),
)}
ORDER = tuple(FIXES)  # paged_only_window first: the spec-verify fixes edit the gate it adds
