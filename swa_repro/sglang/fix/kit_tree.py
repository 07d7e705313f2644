"""The kit's window for a tree draft token (#40 point 2): why it counts from the token's depth, with the
lines it rests on (:data:`TREE_DECISION`, printed in docs/upstream/README.md), and the kit edits that say
so: ``kit_tree_verify_window`` (:data:`TREE`, in ``kit.diff``: by depth, but for the backends the kit
declares by index, Triton) and its follow-up ``kit_tree_verify_triton`` (:data:`TRITON_TREE`, not in
``kit.diff``: Triton by depth too, the kit side of Triton's own finding)."""

from __future__ import annotations

from swa_repro.sglang.fix.kit_anchor import Anchored, _lines

_REF_MASK = "def dense_attention_reference_with_custom_mask("

# Why a tree draft token's window counts from its depth, each claim with the line it rests on (sglang
# 0.5.23's package, python/sglang/...; transformers 5.12.1). docs/upstream/README.md prints it.
TREE_DECISION = (
    ("A tree draft token's window counts from its position, committed length + its depth in the tree, not "
     "from its index in the flattened draft:"),
    ("- sglang places it there: `build_tree_kernel_efficient` fills verify's positions with the committed "
     "length plus each token's depth (`srt/speculative/eagle_utils.py:208-211`: depths [0, 1, 1, 2] after 7 "
     "tokens are positions [7, 8, 8, 9]); RoPE and the model see that position."),
    ("- Speculative decoding must be lossless: once accepted, the token at depth d is the one a plain decode "
     "would have run at position committed + d, its accepted ancestors the keys just before it, and that "
     "decode windows from its position (the kit's decode reference, `dense_attention.py:827-836`). Counting "
     "from the index instead drops, for a node after its siblings, the oldest keys of its own window."),
    ("- The model's mask is by position: transformers' `sliding_window_overlay` keeps `kv_idx > q_idx - "
     "sliding_window` with `q_idx` the query's cache position (`transformers/masking_utils.py:94-95`)."),
    ("- FA3 already counts so: a sliding layer's tree verify runs one query per draft token over the prefix "
     "and that token's ancestors (`srt/layers/attention/flashattention_backend.py:1116-1168`, "
     "`_init_sliding_window_attn_spec_metadata` :3410-3472, used at :1666-1672, no cascade for sliding "
     "layers :1586-1594) with `window_size=(W, 0)` (:1567-1571), so the query sits at prefix + depth: with `kit.diff` swa/test_fa3.py's "
     "tree case expects what FA3 computes (not run on a GPU here: sgl_kernel's compiled flash_attn ops do "
     "not travel in the bundle)."),
    ("- Triton counts by index: the extend kernel's window mask takes `q_id = prefix_len + the query's row` "
     "(`kernels/ops/attention/extend_attention.py:563-569` for the prefix, :765-778 for the draft), over the "
     "prefix clipped to its last `min(seq_len, W)` keys (`srt/layers/attention/triton_backend.py:2869-2879`, "
     "verify at :1032-1049). A finding of its own, not the FlashInfer series': the kit declares it "
     "(`TREE_WINDOW_BY_INDEX = {\"triton\"}`) so the FlashInfer series leaves Triton's tree cases as "
     "they are, and `kit_tree_verify_triton.diff` (not in `kit.diff`) is its kit side, to go with a "
     "Triton fix such as sgl-project/sglang#39287's (windows by logical positions, FlashInfer and Triton)."),
    ("- FlashInfer's kernel counts by index (`variants.cuh:88-89`); `eagle_verify_window` cuts the window into "
     "the tree mask at each token's tree position, so with the fix FlashInfer matches the depth reference."),
)


# The backends whose tree-verify expectation stays the index in the flattened draft (TREE_DECISION).
_BY_INDEX = _lines(
    "# Backends that window a tree draft token (topk > 1) from its index in the",
    "# flattened draft, not from its position (committed length + its depth,",
    "# build_tree_kernel_efficient's positions): a known deviation, kept as their",
    "# expectation until fixed, not the rule. Triton: the extend kernel's window",
    "# mask takes q_id = prefix_len + the query's row (extend_attention.py's",
    "# `SLIDING_WINDOW_SIZE` mask), so past the window a node after its siblings",
    "# loses the oldest keys of its window.",
    'TREE_WINDOW_BY_INDEX = frozenset({"triton"})',
    "",
    "",
)
TREE = [
    Anchored("custom-mask reference: the backends that window a tree token by its index",
             _lines(f"{_REF_MASK}"), _BY_INDEX + _lines(f"{_REF_MASK}"),
             before="def _copy_dense_weights("),
    Anchored(
        "custom-mask reference: a draft token's window from its tree position", _lines(
            "                query_pos = case.prefix_lens[req_idx] + offset",
            "                # Target-verify draft tokens are appended through the extend",
            "                # kernel, which applies `kv_id >= q_id - sliding_window_size`",
            "                # (see `dense_attention_reference` note). The custom-mask",
            "                # reference must use the same rule."),
        _lines(
            "                query_pos = case.prefix_lens[req_idx] + offset",
            "                if case.backend not in TREE_WINDOW_BY_INDEX:",
            "                    # A draft token sits at its depth in the tree (its",
            "                    # ancestors and itself in the draft part of its mask row),",
            "                    # not at its index in the flattened draft: that is the",
            "                    # position its window counts from, as a decode of the",
            "                    # accepted token would (a chain's are the same).",
            "                    draft = req_mask[offset, case.prefix_lens[req_idx] :]",
            "                    query_pos = case.prefix_lens[req_idx] + int(draft.sum()) - 1"),
        after=_REF_MASK, before="def _copy_dense_weights("),
]

# The Triton finding's kit side (its own PR, with a Triton fix): Triton's tree expectation becomes the
# tree position too. On top of ``kit_tree_verify_window``; not in ORDER, so never in ``kit.diff``.
TRITON_TREE = [
    Anchored("Triton's tree verify expected at the tree position",
             _lines('TREE_WINDOW_BY_INDEX = frozenset({"triton"})'), _lines("TREE_WINDOW_BY_INDEX = frozenset()"),
             before=_REF_MASK),
]
TRITON = "kit_tree_verify_triton"
FOLLOW_UPS = {TRITON: ("kit_tree_verify_window",)}  # a follow-up edit -> the edits it goes on top of
