"""The spec-verify window fixes of ``fix.fixes``: ``eagle_verify_window`` (EAGLE at any topk,
Frozen-KV MTP, NGRAM: a draft tree under a custom mask) and ``dflash_verify_window``; see that
module's docstring for why each has its shape.
"""

from __future__ import annotations

import ast

from swa_repro.sglang.fix.anchors import (BACKEND, CBF, PREFILL, USW, Unknown, _need, _usw_call)
from swa_repro.sglang.fix.source import Edit, Source, calls_on, keyword

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


MASK_BUF = "cuda_graph_custom_mask"
MASK_BUF_COMMENT = [
    "# One packed-mask buffer per wrapper: in CUDA-graph mode FlashInfer's",
    "# plan() copies a wrapper's mask to offset 0 of the buffer it was given",
    "# and the captured kernel reads it there, so wrappers planned with",
    "# different masks (sliding-window and full layers) must not share one.",
]


def _mask_buffers(src: Source) -> list[Edit]:
    """Each CUDA-graph prefill wrapper on its own ``cuda_graph_custom_mask`` (upstream #39160's
    cure: "separate packed-mask buffers for SWA and full-attention CUDA graph wrappers"). As shipped
    every wrapper of ``_create_prefill_wrappers`` (0.5.23 :1174-1204) gets the one buffer
    ``init_cuda_graph_state`` allocates (:1134-1138), and FlashInfer's graph-mode ``plan()`` copies
    each wrapper's packed mask to its offset 0 (flashinfer 0.7.2 prefill.py:2809-2824), so the
    windowed tree mask planned into wrapper 0 is overwritten by wrapper 1's. Each buffer has the
    shipped size, one per wrapper as ``cuda_graph_kv_indices`` (:1115-1117); one wrapper (no
    sliding window): the same single buffer."""
    init = _need(src.method(BACKEND, "init_cuda_graph_state"), f"{BACKEND}.init_cuda_graph_state")
    made = _need(next((s for s in ast.walk(init) if isinstance(s, ast.Assign) and len(s.targets) == 1
                       and ast.unparse(s.targets[0]) == f"self.{MASK_BUF}"), None),
                 f"self.{MASK_BUF} = ... in init_cuda_graph_state")
    edits = []
    if not isinstance(made.value, ast.ListComp):
        if not (isinstance(made.value, ast.Call) and ast.unparse(made.value.func) == "torch.zeros"):
            raise Unknown(f"self.{MASK_BUF} is not made by torch.zeros(...)")
        ind = src.indent_of(made)
        alloc = src.seg(made.value).replace("\n", "\n    ")
        edits.append(src.replace(made, "\n".join(
            [MASK_BUF_COMMENT[0], *[f"{ind}{c}" for c in MASK_BUF_COMMENT[1:]],
             f"{ind}self.{MASK_BUF} = [", f"{ind}    {alloc}", f"{ind}    for _ in range(self.num_wrappers)",
             f"{ind}]"])))
    create = _need(src.method(BACKEND, "_create_prefill_wrappers"), f"{BACKEND}._create_prefill_wrappers")
    loop = _need(next((n for n in ast.walk(create) if isinstance(n, ast.For)), None),
                 "the wrapper loop of _create_prefill_wrappers")
    given = [v for n in ast.walk(create) if isinstance(n, ast.Dict)
             for k, v in zip(n.keys, n.values) if isinstance(k, ast.Constant) and k.value == "custom_mask_buf"]
    if len(given) != 1:
        raise Unknown("_create_prefill_wrappers does not pass custom_mask_buf once")
    if ast.unparse(given[0]) == f"self.{MASK_BUF}":
        edits.append(src.replace(given[0], f"self.{MASK_BUF}[{ast.unparse(loop.target)}]"))
    elif ast.unparse(given[0]) != f"self.{MASK_BUF}[{ast.unparse(loop.target)}]":
        raise Unknown(f"_create_prefill_wrappers passes custom_mask_buf={ast.unparse(given[0])}")
    return edits


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
    edits += _mask_buffers(src)
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
