"""Speculative-decoding verify shapes for the audit: EAGLE draft trees (``topk > 1``) and NGRAM trees,
each with the custom mask and positions sglang hands the target's verify forward, and the tree's
parent links, which the key oracle (``audit.keys``) reads instead of the mask.

What sglang does (0.5.23 line numbers; ``spec/`` = ``srt/speculative/``, ``ops/`` =
``kernels/ops/speculative/``):

* EAGLE drafts ``spec_steps`` levels: level 0 is the root's ``topk`` children, each later level the
  ``topk`` best of the ``topk * topk`` children of the previous level's picks (``select_top_k_tokens``,
  spec/spec_utils.py:417-471: ``parents_list[0] = arange(-1, topk)``, then ``topk_cs_index +
  topk*topk*(i-1) + topk``); ``organize_draft_results`` (spec/eagle_utils.py:100-129) keeps the
  ``num_draft_tokens - 1`` best-scored candidates, sorted by their index, and ``parent_list =
  cat(parents_list[:-1])``.
* ``build_tree_kernel_efficient`` (spec/eagle_utils.py:138-233) lays the verify mask out as
  ``FULL_MASK`` (the FlashInfer backend's mode, :132-135: ``QLEN_ONLY`` on CPU builds only): per
  request ``n x (committed + n)`` row-major, every committed key visible, draft ``x`` seeing the
  root and its ancestors up the ``parent_list`` walk, and ``positions[x] = committed + steps walked``
  (its Triton form, ops/spec_tree.py:52-207, is what :func:`eagle_tree_layout` ports, and
  ``tests/test_audit_spec.py`` runs it against that kernel).
* NGRAM's corpus returns an ``n x n`` ancestor-or-self mask per request (spec/cpp_ngram/
  ngram_corpus.py:118-150 reads row ``r`` as the path to ``r``); the worker prepends ``ones(n,
  committed)`` (spec/ngram_worker.py:355-370) and ``reconstruct_indices_from_tree_mask`` sets
  ``positions = committed + #strict ancestors`` (ops/reconstruct_tree.py:21-28).
* The target's forward reads ``positions = spec_info.positions`` (model_executor/
  forward_batch_info.py:1219-1223): a draft token's real position is ``committed + depth``.

FlashInfer's window cannot see any of this: it keeps key ``kv_idx`` for query ``qo_idx`` when
``kv_idx + qo_len + window_left >= kv_len + qo_idx`` (flashinfer 0.7.2
include/flashinfer/attention/variants.cuh:88-89), i.e. it places a query at its index in the
flattened draft, ``committed + qo_idx``, which for a tree node is past its real position
``committed + depth`` whenever siblings precede it.
"""

from __future__ import annotations

from dataclasses import dataclass

# torch is imported inside the functions: ``audit.table`` reads the path names below without it.


@dataclass(frozen=True)
class Spec:
    """One verify shape: ``kind`` eagle (``topk``, ``steps`` = speculative_num_steps, ``n`` =
    speculative_num_draft_tokens), ngram (hand-made trees of ``n`` nodes) or dflash (a causal block)."""
    kind: str
    n: int
    topk: int = 1
    steps: int = 0

    @property
    def name(self) -> str:
        return f"k{self.topk}s{self.steps}n{self.n}" if self.kind == "eagle" else f"n{self.n}"


# EAGLE trees (topk > 1) the audit drives, eager: (n = speculative_num_draft_tokens, topk, steps) with n
# 4..8; the CUDA-graph verify runs the two largest. Each request gets its own draft, so a batch holds two trees.
EAGLE_TREES = (Spec("eagle", 4, 2, 2), Spec("eagle", 6, 2, 3), Spec("eagle", 5, 4, 2), Spec("eagle", 8, 4, 3))
GRAPH_TREES = (EAGLE_TREES[1], EAGLE_TREES[3])
TREE_PATHS = tuple(f"target_verify_eagle_{t.name}" for t in EAGLE_TREES)
GRAPH_TREE_PATHS = tuple(f"cuda_graph_verify_eagle_{t.name}" for t in GRAPH_TREES)


# ----------------------------------------------------------------------------- EAGLE
@dataclass(frozen=True)
class EagleDraft:
    parent_list: list[int]  # cat(parents_list[:-1]): the candidate index each level's picks came from
    top_scores_index: list[int]  # the n - 1 candidates kept, ascending (organize_draft_results)
    parents: list[int]  # the oracle's links: draft index of each draft token's parent (-1: the root)


def eagle_draft(topk: int, steps: int, n: int, seed: int) -> EagleDraft:
    """An EAGLE draft of one request, scored at random (seeded) the way ``select_top_k_tokens`` and
    ``organize_draft_results`` pick it. Candidate indices follow sglang's score list: level 0 is
    ``0..topk-1``, level ``i >= 1`` is ``topk + (i-1)*topk*topk + beam*topk + child``. The parent
    links are kept as the candidates are made, never read back from a mask."""
    import torch

    if steps < 1 or not 1 <= n - 1 <= topk + (steps - 1) * topk * topk:
        raise ValueError(f"no EAGLE draft of {n} tokens from topk={topk}, steps={steps}")
    g = torch.Generator().manual_seed(seed)
    probs = lambda: sorted(torch.rand(topk, generator=g).mul(0.9).add(0.05).tolist(), reverse=True)  # noqa: E731
    score, parent = {}, {}
    for t, p in enumerate(probs()):
        score[t], parent[t] = p, -1
    beams, parents_list = list(range(topk)), [[-1, *range(topk)]]
    for i in range(1, steps):
        base = topk + (i - 1) * topk * topk
        for j, b in enumerate(beams):
            for t, p in enumerate(probs()):
                c = base + j * topk + t
                score[c], parent[c] = score[b] * p, b
        beams = sorted(range(base, base + topk * topk), key=lambda c: -score[c])[:topk]  # torch.topk: descending
        parents_list.append(beams)
    kept = sorted(sorted(score, key=lambda c: -score[c])[:n - 1])
    parents = [-1] + [0 if parent[c] < 0 else 1 + kept.index(parent[c]) for c in kept]
    return EagleDraft([x for lv in parents_list[:-1] for x in lv], kept, parents)


def eagle_tree_layout(drafts: list[EagleDraft], committed, topk: int, steps: int, n: int):
    """``(custom_mask, positions)`` as ``build_tree_kernel_efficient`` makes them in ``FULL_MASK``
    mode: a line-by-line port of its kernel (ops/spec_tree.py:52-207; the CUDA one in sgl-kernel
    is the same algorithm), which walks ``top_scores_index`` / ``parent_list`` only."""
    import torch

    total = sum(committed) * n + n * n * len(committed)
    mask = torch.ones(total, dtype=torch.bool)  # torch.full(mask_shape, True) (eagle_utils.py:189-198)
    positions = torch.empty(len(committed) * n, dtype=torch.long)
    prefix = 0
    for b, (d, s) in enumerate(zip(drafts, committed)):
        sel, par = d.top_scores_index, d.parent_list
        seq_tree_idx = n * n * b + prefix * n
        positions[b * n] = s
        for x in range(n):
            tti = seq_tree_idx + (s + n) * x + s + 1
            mask[tti - 1] = True
            mask[tti: tti + n - 1] = False
            if x == 0:
                continue
            cur, position = x - 1, 0
            for _ in range(steps):
                position += 1
                mask[tti + cur] = True
                tb = sel[cur] // topk
                if tb == 0:
                    break
                hit = [cp for cp in range(n - 1) if sel[cp] == par[tb]]
                if not hit:
                    break
                cur = hit[0]
            positions[b * n + x] = position + s
        prefix += s
    return mask, positions


# ----------------------------------------------------------------------------- NGRAM
# Two hand-made trees of 8 nodes, node 0 the root (the last verified token), parents before children as
# the corpus's BFS emits them: one branchy (a node's siblings come before it), one deep with a side branch.
NGRAM_TREES = ([-1, 0, 1, 2, 1, 0, 5, 6], [-1, 0, 1, 2, 3, 4, 0, 6])


def ancestor_mask(parents) -> torch.Tensor:
    """``(n, n)``: ``[i, j]`` when ``j`` is ``i`` or one of its ancestors: NGRAM's corpus mask."""
    import torch

    n = len(parents)
    m = torch.eye(n, dtype=torch.bool)
    for i in range(n):
        p = parents[i]
        while p >= 0:
            m[i, p] = True
            p = parents[p]
    return m


def ngram_tree_layout(trees, committed, n: int):
    """``(custom_mask, positions)`` of NGRAM verify: per request ``cat(ones(n, committed), mask)``
    flattened (ngram_worker.py:355-370) and ``committed + #strict ancestors`` (reconstruct_tree.py:21-28)."""
    import torch

    parts, positions = [], []
    for parents, s in zip(trees, committed):
        m = ancestor_mask(parents)
        parts.append(torch.cat([torch.ones(n, s, dtype=torch.bool), m], 1).reshape(-1))
        positions.append(s + (m & torch.ones(n, n, dtype=torch.bool).tril(-1)).sum(1))
    return torch.cat(parts), torch.cat(positions).long()


def chain_parents(n: int) -> list[int]:
    return [-1, *range(n - 1)]
