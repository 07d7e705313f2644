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
* ``soft_cap_prefill`` / ``soft_cap_decode``: plan with the model's attention soft cap
  (``hf_text_config.attn_logit_softcapping``, what gemma2.py gives its layers as ``logit_cap``),
  read once per indices updater. A ``fast_prefill_plan`` replay (:180) takes no cap and keeps the
  captured module; ``fast_decode_plan`` takes it (flashinfer decode.py ``fast_decode_plan``).
* ``soft_cap_cuda_graph``: both of the above. Capture plans go through the same
  ``call_begin_forward``; replays never re-pick the module (the live audit's note, ``audit.live``).

A layer whose cap is not the planned one (grok.py's fallback of 30 without the config key, a
``logit_capping_method`` other than tanh, a layer of cap 0 in a capped model) is refused with a
ValueError that names both caps (``_check_logits_soft_cap``; ``fix.cap_safety`` drives it).

Limits: with the sliding-window KV pool, a tree verify's whole-sequence indices for wrapper 0 also
name slots outside the window: the planned window skips the tiles before it, the mask the rest, but
they are listed. The tree window needs ``FULL_MASK`` (the FlashInfer path's mode: sglang builds
``QLEN_ONLY`` only on CPU, eagle_utils.py:132-135).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from swa_repro.sglang.fix.source import Edit, Source, calls_on, keyword
from swa_repro.sglang.patch.classify import classify as classify_31501
from swa_repro.sglang.patch.edit import transform as transform_31501

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
RAGGED_GATES = ("self.is_multimodal", "self.enable_mis", "self.enable_deterministic", "self.use_paged")


def _ragged_gates(src: Source, init, made) -> list[str]:
    """What keeps a backend off ragged prefill for good (``init_forward_metadata``'s ``use_ragged``,
    :1048-1062: multimodal, multi-item scoring, deterministic, ``SGLANG_FLASHINFER_USE_PAGED``; a
    draft backend's ``skip_prefill``): the attributes the release sets in ``__init__`` before the
    ragged wrapper and reads there, so no wrapper is built for a backend that never plans it."""
    ifm = _need(src.method(BACKEND, "init_forward_metadata"), f"{BACKEND}.init_forward_metadata")
    read = {ast.unparse(n) for n in ast.walk(ifm) if isinstance(n, ast.Attribute)}
    set_before = {ast.unparse(t) for s in ast.walk(init) if isinstance(s, ast.Assign) and s.lineno < made.lineno
                  for t in s.targets}
    gates = [g for g in RAGGED_GATES if g in read and g in set_before]
    return (["skip_prefill"] if "skip_prefill" in [a.arg for a in init.args.args] else []) + gates


def _ragged_common(src: Source) -> list[Edit]:
    """The sliding-window layers' own ragged wrapper: created next to the shared one where ragged
    prefill can run, planned with the window for wrapper 0 in ``update_sliding_window``, and chosen
    per layer (``_ragged_wrapper``)."""
    edits = []
    init = _need(src.method(BACKEND, "__init__"), f"{BACKEND}.__init__")
    made = _need(next((s for s in ast.walk(init) if isinstance(s, ast.Assign) and len(s.targets) == 1
                       and ast.unparse(s.targets[0]) == "self.prefill_wrapper_ragged"), None),
                 "self.prefill_wrapper_ragged = ... in the backend's __init__")
    if not (isinstance(made.value, ast.Call) and ast.unparse(made.value.func) == "BatchPrefillWithRaggedKVCacheWrapper"):
        raise Unknown("self.prefill_wrapper_ragged is not built by BatchPrefillWithRaggedKVCacheWrapper(...)")
    if not any(isinstance(n, ast.Attribute) and n.attr == SWA_RAGGED for n in ast.walk(init)):
        args = ", ".join([src.seg(a) for a in made.value.args] + [src.seg(k) for k in made.value.keywords])
        gates = _ragged_gates(src, init, made)
        edits.append(src.insert_lines_after(made, [
            "# The sliding-window layers' own ragged wrapper: plan() compiles window_left",
            "# in, and the shared one above stays planned for the full-attention layers.",
            f"self.{SWA_RAGGED} = None",
            "if model_runner.sliding_window_size is not None and not (",
            *[f"    {'or ' if i else ''}{g}" for i, g in enumerate(gates)],
            "):",
            f"    self.{SWA_RAGGED} = BatchPrefillWithRaggedKVCacheWrapper(",
            f"        {args}",
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


# ----------------------------------------------------------------------------- spec-verify windows
WINDOW_GATE = "_plans_window"


def _window_gate(src: Source):
    """``window_left=(W if (wrapper_id == 0 and not use_ragged and spec_info is None) else -1)`` in
    update_sliding_window's call (PR #31501), and its ``spec_info is None`` test (or, fixed, the
    ``_plans_window(spec_info)`` call that replaced it)."""
    usw, call, loop = _usw_call(src)
    kw = keyword(call, "window_left")
    if kw is None:
        raise Unknown(f"{USW} passes no window_left (PR #31501's plumbing): fix paged_only_window first")
    test = next((n for n in ast.walk(kw.value) if ast.unparse(n) in ("spec_info is None", f"{WINDOW_GATE}(spec_info)")),
                None)
    if test is None:
        raise Unknown(f"{USW}'s window_left is not gated on `spec_info is None`")
    return usw, loop, test


TREE_KINDS = ("EAGLE_VERIFY", "FROZEN_KV_MTP_VERIFY", "NGRAM_VERIFY")  # verify with a tree mask, no kv_start_idx
SPEC_KINDS = (*TREE_KINDS, "DFLASH_VERIFY")
TREE_TEST, TREE_WINDOW, TREE_MASK = "_is_spec_tree_verify", "_spec_verify_window_left", "_spec_tree_mask_in_window"


def _gate_lines(kinds: list[str]) -> list[str]:
    """The module-level gate, ruff-formatted, naming ``kinds`` in ``SPEC_KINDS`` order."""
    return [
        f"def {WINDOW_GATE}(spec_info) -> bool:",
        '    """Whether a sliding-window plan carries the layer\'s window_left: FlashInfer',
        "    compiles it in at plan(), a window given only to forward() is ignored. Verify",
        "    inputs listed here plan it too (a tree verify widened by its draft, its mask",
        '    cut on the tree\'s positions)."""',
        "    return spec_info is None or spec_info.spec_input_type in (",
        *[f"        SpecInputType.{k}," for k in kinds],
        "    )",
        "",
        ""]


def _gate_edit(src: Source, kinds, gate):
    """``spec_info is None`` -> ``_plans_window(spec_info)``, a module-level function whose tuple
    of verify kinds grows by the kinds of each fix (a function, so the call line stays as short as
    before); ``gate``: :func:`_window_gate`'s answer."""
    order = lambda k: SPEC_KINDS.index(k) if k in SPEC_KINDS else len(SPEC_KINDS)  # noqa: E731
    usw, loop, test = gate
    helper = src.func(WINDOW_GATE)
    if helper is None:
        anchor = _need(src.cls(PREFILL), f"class {PREFILL}")
        return [src.insert_lines_before(anchor, _gate_lines(sorted(kinds, key=order)), indent=""),
                src.replace(test, f"{WINDOW_GATE}(spec_info)")]
    ret = helper.body[-1]
    tup = ret.value.values[-1].comparators[0] if isinstance(ret, ast.Return) and isinstance(ret.value, ast.BoolOp) \
        else None
    if not isinstance(tup, ast.Tuple):
        raise Unknown(f"{WINDOW_GATE}() is not `return spec_info is None or spec_info.spec_input_type in (...)`")
    have = [ast.unparse(e).removeprefix("SpecInputType.") for e in tup.elts]
    add = [k for k in kinds if k not in have]
    if not add:
        return []
    kinds = sorted(have + add, key=order)
    a = src.starts[helper.lineno - 1]
    b = src.starts[helper.end_lineno]
    return [Edit(a, b, "".join(f"{ln}{src.nl}" for ln in _gate_lines(kinds)[:-2]))]


def _dflash(src: Source):
    if "DFLASH_VERIFY" not in src.text:
        raise Unknown("this release has no DFlash verify (SpecInputType.DFLASH_VERIFY)")
    return _gate_edit(src, ("DFLASH_VERIFY",), _window_gate(src))


TREE_HELPERS = [  # module level, next to the prefill indices updater; sglang's names and layouts
    f"def {TREE_TEST}(spec_info) -> bool:",
    '    """A verify whose queries are the nodes of a draft tree under a custom mask',
    "    (EAGLE, Frozen-KV MTP, NGRAM): their generate_attn_arg_prefill reads each request",
    "    from its first token on (no kv_start_idx) and returns the tree mask laid out for",
    '    the whole sequence."""',
    "    return spec_info is not None and spec_info.spec_input_type in {",
    *[f"        SpecInputType.{k}," for k in TREE_KINDS],
    "    }",
    "",
    "",
    f"def {TREE_WINDOW}(window_left: int, spec_info) -> int:",
    '    """The window a tree verify plans and runs its sliding-window wrapper with.',
    "    FlashInfer places a query at its index in the flattened draft (kv_idx + qo_len +",
    "    window_left >= kv_len + qo_idx), but a draft token's position is committed + its",
    "    depth in the tree, up to draft_token_num - 1 earlier: widened by that, the window",
    "    never cuts a key the query's real window holds, and it still skips every older KV",
    f'    tile; the exact cut is in the tree mask ({TREE_MASK})."""',
    f"    if window_left is None or window_left < 0 or not {TREE_TEST}(spec_info):",
    "        return window_left",
    "    return window_left + max(spec_info.draft_token_num - 1, 0)",
    "",
    "",
    f"def {TREE_MASK}(",
    "    custom_mask: torch.Tensor,",
    "    kv_indptr: torch.Tensor,",
    "    bs: int,",
    "    draft_token_num: int,",
    "    paged_kernel_lens_sum: int,",
    "    window_left: int,",
    ") -> torch.Tensor:",
    '    """A tree verify mask (per request draft_token_num rows of committed +',
    "    draft_token_num keys, the last draft_token_num the tree:",
    "    build_tree_kernel_efficient's FULL_MASK, NGRAM's ones + corpus mask) cut to each",
    "    query's window on real positions: a draft token sits at committed + its strict",
    "    ancestors in the mask (the positions build_tree_kernel_efficient and",
    "    reconstruct_indices_from_tree_mask give it). window_left is the planned one, the",
    f"    layer's widened by draft_token_num - 1 ({TREE_WINDOW});",
    "    only the keys it still lets in are touched: the committed keys just before each",
    "    query's window and the tree keys. A new mask: wrapper 1 plans with the original.",
    '    """',
    "    n = draft_token_num",
    "    window = window_left - (n - 1)  # the layer's",
    "    device = custom_mask.device",
    "    total = paged_kernel_lens_sum * n + n * n * bs",
    "    # one spare element at the end takes the writes of positions outside the mask",
    "    out = torch.cat(",
    "        [custom_mask[:total].to(torch.bool), custom_mask.new_zeros(1, dtype=torch.bool)]",
    "    )",
    "    kv_lens = (kv_indptr[1 : bs + 1] - kv_indptr[:bs]).to(torch.int64)",
    "    committed = kv_lens - n",
    "    node = torch.arange(n, device=device)",
    "    row_start = (",
    "        kv_indptr[:bs].to(torch.int64)[:, None] * n + node[None, :] * kv_lens[:, None]",
    "    )",
    "    tree_at = row_start[:, :, None] + committed[:, None, None] + node[None, None, :]",
    "    tree_at = torch.where(tree_at < total, tree_at, total)",
    "    tree = out[tree_at]",
    "    depth = (tree & (node[None, None, :] < node[None, :, None])).sum(-1)",
    "    # ancestors further up than the window",
    "    out[tree_at] = tree & (depth[:, :, None] - depth[:, None, :] <= window)",
    "    # committed key committed - window + k, k in [1 - n, n - 1): seen from depth <= k",
    "    k = torch.arange(1 - n, n - 1, device=device)",
    "    col = committed[:, None, None] - window + k[None, None, :]",
    "    at = row_start[:, :, None] + col",
    "    cut = (",
    "        (col >= 0)",
    "        & (col < committed[:, None, None])",
    "        & (k < depth[:, :, None])",
    "        & (at < total)",
    "    )",
    "    out[torch.where(cut, at, total)] = False",
    "    return out[:total]",
    "",
    "",
]


def _tree_helpers(src: Source) -> list[Edit]:
    if src.func(TREE_MASK) is not None:
        return []
    anchor = _need(src.cls(PREFILL), f"class {PREFILL}")
    return [src.insert_lines_before(anchor, TREE_HELPERS, indent="")]


def _usw_window_value(src: Source):
    """The ``window_left`` value of update_sliding_window's call when not -1: the IfExp's body."""
    _, call, _ = _usw_call(src)
    kw = keyword(call, "window_left")
    if not isinstance(kw.value, ast.IfExp):
        raise Unknown(f"{USW}'s window_left is not `<window> if <gate> else -1`")
    return kw.value.body


def _paged_forward_window(src: Source):
    """``layer.sliding_window_size`` in the window_left of forward_extend's paged ``forward()``."""
    fe = _need(src.method(BACKEND, "forward_extend"), f"{BACKEND}.forward_extend")
    calls = calls_on(fe, "prefill_wrapper_paged", ("forward",))
    if len(calls) != 1:
        raise Unknown(f"forward_extend makes {len(calls)} prefill_wrapper_paged.forward(...) calls, expected 1")
    kw = _need(keyword(calls[0], "window_left"), "window_left in forward_extend's paged forward()")
    hits = [n for n in ast.walk(kw.value) if isinstance(n, ast.Attribute) and ast.unparse(n) == "layer.sliding_window_size"]
    done = any(isinstance(n, ast.Call) and ast.unparse(n.func) == TREE_WINDOW for n in ast.walk(kw.value))
    if len(hits) != 1:
        raise Unknown("forward_extend's paged forward() does not pass layer.sliding_window_size once")
    return hits[0], done


def _eagle(src: Source):
    """EAGLE / Frozen-KV MTP / NGRAM verify (``TREE_KINDS``) on the sliding-window wrapper."""
    gate = _window_gate(src)
    usw, loop = gate[:2]
    edits = _gate_edit(src, TREE_KINDS, gate)
    edits += _tree_helpers(src)
    body = _usw_window_value(src)
    if not (isinstance(body, ast.Call) and ast.unparse(body.func) == TREE_WINDOW):
        edits.append(src.replace(body, f"{TREE_WINDOW}({src.seg(body)}, spec_info)"))
    branch = next((n for n in ast.walk(usw) if isinstance(n, ast.If) and ast.unparse(n.test) == f"{loop} == 0"), None)
    branch = _need(branch, f"`if {loop} == 0:` branch in {USW}")
    if not any(f"{TREE_TEST}(spec_info)" in ast.unparse(s) for s in branch.body):
        edits.append(src.insert_lines_after(branch.body[-1], [
            f"if {TREE_TEST}(spec_info):",
            "    # its kv indices start at each request's first token and its tree",
            "    # mask spans the whole sequence: keep both whole, as for wrapper 1;",
            "    # call_begin_forward cuts the window into the mask",
            "    paged_kernel_lens = seq_lens",
            "    paged_kernel_lens_sum = seq_lens_sum",
            "    kv_start_idx = None"],
            indent=src.indent_of(branch.body[0])))
    cbf = _need(src.method(PREFILL, CBF), f"{PREFILL}.{CBF}")
    if "window_left" not in [a.arg for a in cbf.args.args]:
        raise Unknown(f"{PREFILL}.{CBF} takes no window_left (PR #31501's plumbing)")
    if not any(f"{TREE_MASK}(" in ast.unparse(s) for s in cbf.body):
        spec_if = _need(next((s for s in cbf.body if isinstance(s, ast.If) and ast.unparse(s.test) == "spec_info is None"),
                             None), f"`if spec_info is None:` in {PREFILL}.{CBF}")
        if not any(isinstance(n, ast.Name) and n.id == "custom_mask" for st in spec_if.orelse for n in ast.walk(st)):
            raise Unknown(f"{PREFILL}.{CBF}'s spec branch does not set custom_mask")
        edits.append(src.insert_lines_after(spec_if, [
            "if (",
            "    window_left >= 0",
            "    and custom_mask is not None",
            f"    and {TREE_TEST}(spec_info)",
            "):",
            "    # FlashInfer's window places a query at its index in the flattened",
            "    # draft, not at its position in the tree: cut the window into the",
            "    # tree mask, on real positions",
            f"    custom_mask = {TREE_MASK}(",
            "        custom_mask,",
            "        kv_indptr,",
            "        bs,",
            "        spec_info.draft_token_num,",
            "        paged_kernel_lens_sum,",
            "        window_left,",
            "    )"]))
    window, done = _paged_forward_window(src)
    if not done:
        edits.append(src.replace(window, f"{TREE_WINDOW}(\n{src.indent_of(window)}    layer.sliding_window_size, "
                                         f"forward_batch.spec_info\n{src.indent_of(window)})"))
    return edits


# ----------------------------------------------------------------------------- soft cap
def _cap_helper(src: Source) -> list[Edit]:
    if src.func(CAP_HELPER) is not None:
        return []
    anchor = _need(src.cls(DECODE), f"class {DECODE}")
    return [src.insert_lines_before(anchor, [
        f"def {CAP_HELPER}(model_runner) -> float:",
        '    """The attention logits soft cap to plan with: FlashInfer compiles it in at',
        "    plan(), and a cap passed only to forward() is never applied. Read from the",
        "    model config, where the layers take their logit_cap from (gemma2.py:",
        '    config.attn_logit_softcapping)."""',
        '    config = getattr(model_runner.model_config, "hf_text_config", None)',
        '    cap = getattr(config, "attn_logit_softcapping", None)',
        "    return float(cap) if cap is not None and cap > 0 else 0.0",
        "",
        ""], indent="")]


CAP_CHECK = "_check_logits_soft_cap"


def _cap_check_method(src: Source) -> list[Edit]:
    """A backend method that refuses a layer whose cap is not the one planned: FlashInfer compiles
    the cap in at plan(), so such a layer would run with the planned cap (a capped plan and a layer
    cap of 0: the kernel divides by it), and it applies tanh only (radix_attention.py:73 also lets
    a layer ask for another method, as grok.py:426 does)."""
    if src.method(BACKEND, CAP_CHECK) is not None:
        return []
    idx = _need(src.method(BACKEND, "_get_wrapper_idx"), f"{BACKEND}._get_wrapper_idx")
    return [src.insert_lines_before(idx, [
        f"def {CAP_CHECK}(self, layer: RadixAttention, planned: float):",
        '    """FlashInfer compiles the logits soft cap in at plan(): a layer asking for',
        "    another cap would silently run with the planned one (a capped plan divides",
        '    by a layer cap of 0), so refuse instead."""',
        "    cap = float(layer.logit_cap or 0.0)",
        '    method = getattr(layer, "logit_capping_method", "tanh")',
        '    if cap > 0 and method != "tanh":',
        "        raise ValueError(",
        '            f"layer {layer.layer_id} asks for a {method!r} logits soft cap;"',
        '            " FlashInfer applies tanh only: use another attention backend"',

        "        )",
        "    if cap != planned:",
        "        raise ValueError(",
        '            f"layer {layer.layer_id} asks for logits_soft_cap={cap}, but"',
        '            f" FlashInfer was planned with {planned}"',
        '            " (hf_text_config.attn_logit_softcapping) and compiles the cap in"',
        '            " at plan(): use another attention backend for this model"',
        "        )",
        ""], indent=src.indent_of(idx))]


def _checks_cap(fn, updater: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == CAP_CHECK
               for n in ast.walk(fn))


def _cap_attr(src: Source, cls: str) -> list[Edit]:
    init = _need(src.method(cls, "__init__"), f"{cls}.__init__")
    if _assign_to(init, "logits_soft_cap") is not None:
        return []
    after = _need(_assign_to(init, "sliding_window_size"), f"self.sliding_window_size = ... in {cls}.__init__")
    return [src.insert_lines_after(after, [f"self.logits_soft_cap = {CAP_HELPER}(model_runner)"])]


def _soft_cap_prefill(src: Source):
    cbf, ragged = _ragged_plan(src)
    _, paged = _paged_plan(src)
    splat = next((k for k in paged.keywords if k.arg is None), None)
    if splat is None or ast.unparse(splat.value) != "paged_plan_kwargs":
        raise Unknown("the paged plan call takes no **paged_plan_kwargs")
    done = keyword(ragged, "logits_soft_cap") is not None
    paged_done = '"logits_soft_cap"' in src.seg(cbf) or "'logits_soft_cap'" in src.seg(cbf)
    fe = _need(src.method(BACKEND, "forward_extend"), f"{BACKEND}.forward_extend")
    checked = _checks_cap(fe, "indices_updater_prefill")
    if done and paged_done and checked:
        return []
    edits = _cap_helper(src) + _cap_attr(src, PREFILL) + _cap_check_method(src)
    if not checked:
        read = _need(next((s for s in fe.body if isinstance(s, ast.Assign) and ast.unparse(s) ==
                           "logits_soft_cap = layer.logit_cap"), None),
                     "`logits_soft_cap = layer.logit_cap` in forward_extend")
        edits.append(src.insert_lines_after(read, [
            f"self.{CAP_CHECK}(layer, self.indices_updater_prefill.logits_soft_cap)"]))
    if not done:
        edits.append(src.add_keyword(ragged, "logits_soft_cap=self.logits_soft_cap"))
    if not paged_done:
        fast = "uses_fast_prefill" if any(isinstance(n, ast.Name) and n.id == "uses_fast_prefill"
                                          for n in ast.walk(cbf)) else None
        if fast is None:
            raise Unknown(f"{PREFILL}.{CBF} has no uses_fast_prefill")
        edits.append(src.insert_lines_before(_stmt_holding(cbf, paged), [
            f"if self.logits_soft_cap > 0 and not {fast}:",
            "    # plan() compiles the cap in; a fast_prefill_plan replay keeps the",
            "    # module it captured",
            '    paged_plan_kwargs["logits_soft_cap"] = self.logits_soft_cap']))
    return edits


def _soft_cap_decode(src: Source):
    cbf = _need(src.method(DECODE, CBF), f"{DECODE}.{CBF}")
    calls = calls_on(cbf, "wrapper")
    if not calls:
        raise Unknown(f"{DECODE}.{CBF} makes no wrapper.begin_forward call")
    todo = [c for c in calls if keyword(c, "logits_soft_cap") is None]
    fd = _need(src.method(BACKEND, "forward_decode"), f"{BACKEND}.forward_decode")
    checked = _checks_cap(fd, "indices_updater_decode")
    if not todo and checked:
        return []
    edits = _cap_helper(src) + _cap_attr(src, DECODE) + _cap_check_method(src) + [
        src.add_keyword(c, "logits_soft_cap=self.logits_soft_cap") for c in todo]
    if not checked:
        fwd = [c for c in ast.walk(fd) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
               and c.func.attr == "forward" and ast.unparse(c.func.value) == "decode_wrapper"]
        if len(fwd) != 1:
            raise Unknown(f"forward_decode makes {len(fwd)} decode_wrapper.forward(...) calls, expected 1")
        stmt = next(s for s in fd.body if any(n is fwd[0] for n in ast.walk(s)))
        edits.append(src.insert_lines_before(stmt, [
            f"self.{CAP_CHECK}(layer, self.indices_updater_decode.logits_soft_cap)"]))
    return edits


# ----------------------------------------------------------------------------- the registry
FIXES = {f.name: f for f in (
    Fix("paged_only_window", "plan the paged-only sliding-window wrapper with window_left (PR #31501)",
        edits=_paged_only),
    Fix("ragged_no_prefix_window", "a ragged wrapper of the sliding-window layers' own, planned with "
        "window_left; the no-prefix forward passes the layer's window", edits=_ragged_no_prefix),
    Fix("ragged_prefix_window", "the same wrapper for the with-prefix ragged forward", edits=_ragged_prefix),
    Fix("eagle_verify_window", "EAGLE / NGRAM tree verify: wrapper 0 keeps the whole sequence and its tree "
        "mask, the window is cut into the mask on each draft token's tree position, and plan and forward "
        "take it widened by draft_token_num - 1", needs_fixed_31501=True, edits=_eagle),
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
