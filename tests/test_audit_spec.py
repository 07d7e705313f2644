"""Speculative verify shapes (#26): EAGLE trees (topk > 1) and NGRAM trees, eager and CUDA graph.

Oracles, each independent of the code it checks:

* the key oracle (``audit.intended.tree_oracle`` / ``tree_intended``) on a hand-made tree, against key sets
  written out by hand;
* the EAGLE layout the audit hands sglang (``audit.spec.eagle_tree_layout``) against sglang 0.5.23's own
  ``build_tree_kernel_efficient`` Triton kernel (run by Triton's interpreter), and the tree part of that
  mask and its positions against the oracle's ancestors and depths (read from the parent links);
* the fix's tree window (the helpers ``--fix eagle_verify_window`` inserts, exec'd from the fixed 0.5.23
  file) under FlashInfer's per-element rule (variants.cuh:80-89) and fa2's per-tile first key
  (prefill.cuh:3826-3827), against the oracle, per tree, window and tile shape; the alternatives that
  are not exact (FlashInfer's window alone; the mask with an unwidened run window) are shown failing;
* the audit of sglang 0.5.23's own code: every tree path extra (and missing) as shipped, exact with
  the fixes (notebook 04's ``all``: the finding classes' fixes, ``conftest.release_audits``).
"""

from __future__ import annotations

import ast
import enum

import numpy as np
import pytest
import torch

from swa_repro.sglang.audit import attended as aa
from swa_repro.sglang.audit import calls as ac
from swa_repro.sglang.audit import intended as ai
from swa_repro.sglang.audit import keys as ak
from swa_repro.sglang.audit import spec
from swa_repro.sglang.audit import table as at

# ----------------------------------------------------------------------------- the oracle, by hand
# root 0; 1 and 2 its children; 3 under 1; 4 under 2; 5 under 4. Ten committed tokens (0..9), drafts 10..15.
HAND = [-1, 0, 0, 1, 2, 4]
HAND_COMMITTED = 10
HAND_KEYS = {  # (window, node) -> the token indices it intends, worked out by hand
    (2, 0): {8, 9, 10},
    (2, 2): {9, 10, 12},
    (2, 3): {10, 11, 13},
    (2, 5): {12, 14, 15},  # the root is 3 levels up: out of a window of 2
    (3, 5): {10, 12, 14, 15},
    (3, 3): {9, 10, 11, 13},
    (0, 4): {14},
    (-1, 5): {*range(10), 10, 12, 14, 15},
}


def test_tree_oracle_reads_depth_and_ancestors_off_the_parent_links():
    depth, anc = ai.tree_oracle(HAND)
    assert depth.tolist() == [0, 1, 1, 2, 2, 3]
    assert [set(np.nonzero(r)[0].tolist()) for r in anc] == [{0}, {0, 1}, {0, 2}, {0, 1, 3}, {0, 2, 4}, {0, 2, 4, 5}]
    with pytest.raises(ValueError, match="not a tree"):
        ai.tree_oracle([-1, 2, 1])


@pytest.mark.parametrize("window, node", sorted(HAND_KEYS))
def test_tree_oracle_intends_the_window_on_real_positions(window, node):
    toks = np.arange(HAND_COMMITTED + len(HAND) + 2)  # two slots past the draft: never intended
    got = ai.tree_intended(HAND, HAND_COMMITTED, np.array([node]), toks, window)[0]
    assert set(toks[got].tolist()) == HAND_KEYS[window, node]
    foreign = ai.tree_intended(HAND, HAND_COMMITTED, np.array([node]), np.array([-1]), window)
    assert not foreign.any()


def test_the_key_model_starts_each_fa2_cta_at_its_first_rows_window():
    """32 draft rows x 8 heads per KV head: 256 packed rows, CTA_TILE_Q 128 (utils.cuh FA2DetermineCtaTileQ),
    so rows 0-15 share a CTA starting at kv - qo - W and rows 16-31 one starting 16 keys later
    (prefill.cuh:3826-3827), whatever the custom mask allows."""
    plan = {"num_qo_heads": 16, "num_kv_heads": 2, "head_dim_qk": 64}
    got = aa._fa2_cta_start(plan, ([32], [100]), 32, 100, 8, 16)
    first = got.argmax(2)  # (heads, rows): the first key each sees
    assert (first[:, :16] == 100 - 32 - 8).all() and (first[:, 16:] == 100 + 16 - 32 - 8).all()


# ----------------------------------------------------------------------------- the layout vs sglang's kernel
def _overlay(version="0.5.23"):
    from conftest import release_overlay

    return release_overlay(version)


@pytest.fixture(scope="module")
def sglang_tree_kernel():
    """sglang 0.5.23's ``sgl_build_tree_kernel_efficient_triton`` (ops/spec_tree.py), interpreted on the CPU."""
    triton = pytest.importorskip("triton")
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    src = (_overlay() / "sglang" / "kernels" / "ops" / "speculative" / "spec_tree.py").read_text()
    fn = next(n for n in ast.parse(src).body
              if isinstance(n, ast.FunctionDef) and n.name == "sgl_build_tree_kernel_efficient_triton")
    fn.decorator_list = []
    ns = {"tl": tl, "triton": triton}
    exec(compile(ast.Module([fn], []), "spec_tree.py", "exec"), ns)
    return InterpretedFunction(ns[fn.name])


SHAPES = [(2, 2, 4), (2, 3, 6), (4, 2, 5), (4, 3, 8), (2, 4, 8), (4, 3, 6), (3, 3, 7), (1, 4, 5)]  # topk, steps, n


@pytest.mark.parametrize("topk, steps, n", SHAPES)
def test_eagle_layout_is_sglangs_and_agrees_with_the_oracle(sglang_tree_kernel, topk, steps, n):
    committed = [20, 3]
    drafts = [spec.eagle_draft(topk, steps, n, seed) for seed in (1, 2)]
    mask, pos = spec.eagle_tree_layout(drafts, committed, topk, steps, n)
    bs, seq = len(committed), torch.tensor(committed)
    par = torch.tensor([d.parent_list for d in drafts])
    sel = torch.tensor([d.top_scores_index for d in drafts])
    kmask, kpos = torch.ones_like(mask), torch.empty_like(pos)
    links = [torch.full((bs, n), -1) for _ in range(3)]
    sglang_tree_kernel[(bs,)](par, sel, seq, torch.cumsum(seq, 0) - seq, kmask, kpos, *links, topk=topk, depth=steps,
                              draft_token_num=n, tree_mask_mode=0, batch_size=bs, parent_list_stride=par.stride(0),
                              selected_index_stride=sel.stride(0))
    assert torch.equal(mask, kmask) and torch.equal(pos, kpos)
    off = 0
    for b, d in enumerate(drafts):  # the tree part is the oracle's ancestor relation, positions its depths
        s = committed[b]
        depth, anc = ai.tree_oracle(d.parents)
        block = mask[off: off + n * (s + n)].view(n, s + n)
        assert block[:, :s].all() and np.array_equal(block[:, s:].numpy(), anc)
        assert pos[b * n:(b + 1) * n].tolist() == (s + depth).tolist()
        off += n * (s + n)
    if topk > 1:  # a real tree: some node sits before its index in the flattened draft
        assert any((ai.tree_oracle(d.parents)[0] < np.arange(n)).any() for d in drafts)


def test_ngram_layout_positions_are_committed_plus_depth():
    mask, pos = spec.ngram_tree_layout(spec.NGRAM_TREES, [20, 3], 8)
    for b, (parents, s) in enumerate(zip(spec.NGRAM_TREES, [20, 3])):
        assert pos[b * 8:(b + 1) * 8].tolist() == (s + ai.tree_oracle(parents)[0]).tolist()
    assert mask.numel() == 8 * (20 + 8) + 8 * (3 + 8)


# ----------------------------------------------------------------------------- the fix's tree window
class _SpecInputType(enum.Enum):
    EAGLE_VERIFY = 1
    FROZEN_KV_MTP_VERIFY = 2
    NGRAM_VERIFY = 3
    DFLASH_VERIFY = 4


@pytest.fixture(scope="module")
def fix_helpers():
    """The module-level helpers ``--fix eagle_verify_window`` adds to sglang 0.5.23's backend, as written there."""
    from swa_repro.sglang import fix

    text = fix.apply_fixes((_overlay() / "sglang" / "srt" / "layers" / "attention" / "flashinfer_backend.py")
                           .read_text(), ("eagle_verify_window",))
    names = ("_is_spec_tree_verify", "_spec_verify_window_left", "_spec_tree_mask_in_window")
    fns = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name in names]
    ns = {"torch": torch, "SpecInputType": _SpecInputType}
    exec(compile(ast.Module(fns, []), "flashinfer_backend.py", "exec"), ns)
    return {n: ns[n] for n in names}


COMMITTED = (30, 3, 0)
TREES = {  # one tree per request of a three-request batch
    "eagle_k2s3n6": ("eagle", 2, 3, 6),
    "eagle_k4s3n8": ("eagle", 4, 3, 8),
    "eagle_k4s2n5": ("eagle", 4, 2, 5),
    "eagle_k2s4n8": ("eagle", 2, 4, 8),
    "chain_n6": ("eagle", 1, 5, 6),
    "ngram": ("ngram", 0, 0, 8),
    "ngram_deep": ("ngram", 0, 0, 8),
    "random_n12": ("random", 0, 0, 12),
}


def _batch(name):
    """(n, custom_mask, parents per request) laid out as sglang lays the verify out."""
    kind, topk, steps, n = TREES[name]
    if kind == "eagle":
        drafts = [spec.eagle_draft(topk, steps, n, seed) for seed in range(len(COMMITTED))]
        return n, spec.eagle_tree_layout(drafts, COMMITTED, topk, steps, n)[0], [d.parents for d in drafts]
    if kind == "ngram":
        first = 1 if name == "ngram_deep" else 0
        trees = [list(spec.NGRAM_TREES[(first + i) % 2]) for i in range(len(COMMITTED))]
    else:
        g = np.random.default_rng(5)
        trees = [[-1] + [int(g.integers(0, i)) for i in range(1, n)] for _ in COMMITTED]
    return n, spec.ngram_tree_layout(trees, COMMITTED, n)[0], trees


def flashinfer_sees(mask: torch.Tensor, n: int, kv: int, plan_w: int, run_w: int, group: int, tile: int):
    """(group, n, kv): what a paged fa2 prefill lets each (row, head of a KV group) see: the custom mask,
    the window if compiled in at plan (``kv_idx + qo_len + W >= kv_len + qo_idx``), and the CTA's first
    key ``kv_len + q_tile * CTA_TILE_Q / group - (qo_len + W)`` from the run's window, compiled or not."""
    r, j = np.arange(n)[:, None], np.arange(kv)[None, :]
    out = []
    for h in range(group):
        vis = mask.view(n, kv).numpy().copy()
        if plan_w >= 0:
            vis &= j + n + plan_w >= kv + r
        if run_w >= 0:
            first = ((r * group + h) // tile * tile) // group
            vis &= j >= kv + first - (n + run_w)
        out.append(vis)
    return np.stack(out)


def _check(name, window, cta, how, helpers):
    """Per request: does FlashInfer, planned and run as ``how`` says, let each node see its intended keys?"""
    group, tile = cta
    n, mask, parents = _batch(name)
    kv = torch.tensor([s + n for s in COMMITTED])
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.long), kv.cumsum(0)]).to(torch.int32)
    widened = helpers["_spec_verify_window_left"](window, type("S", (), {
        "spec_input_type": _SpecInputType.NGRAM_VERIFY, "draft_token_num": n})())
    before = mask.clone()
    plan_w, run_w, m = {
        "fix": (widened, widened, helpers["_spec_tree_mask_in_window"](mask, kv_indptr, len(COMMITTED), n,
                                                                       sum(COMMITTED), widened)),
        "window_only": (window, window, mask),  # FlashInfer's window on the tree mask (the earlier fix)
        "mask_only": (-1, window, helpers["_spec_tree_mask_in_window"](mask, kv_indptr, len(COMMITTED), n,
                                                                       sum(COMMITTED), widened)),
    }[how]
    assert torch.equal(mask, before)  # a new mask: wrapper 1 plans with sglang's
    exact = []
    for b, s in enumerate(COMMITTED):
        block = m[n * int(kv_indptr[b]): n * int(kv_indptr[b + 1])]
        want = ai.tree_intended(parents[b], s, np.arange(n), np.arange(s + n), window)
        exact.append(all(np.array_equal(v, want) for v in flashinfer_sees(block, n, s + n, plan_w, run_w, group, tile)))
    return exact


CTAS = [(1, 16), (2, 64), (8, 16)]  # (query heads per KV head, CTA_TILE_Q): 8 x 16 puts 2 nodes in a tile


@pytest.mark.parametrize("name", list(TREES))
@pytest.mark.parametrize("window", [0, 1, 3, 8])
@pytest.mark.parametrize("cta", CTAS)
def test_fixed_tree_window_is_exact(fix_helpers, name, window, cta):
    assert all(_check(name, window, cta, "fix", fix_helpers))


@pytest.mark.parametrize("how, name, cta", [
    ("window_only", "ngram", (1, 16)),  # node 5 (depth 1) of the first tree: FlashInfer puts it at committed + 5
    ("window_only", "eagle_k4s3n8", (2, 64)),
    ("mask_only", "ngram", (8, 16)),  # the run's window still starts each 2-node tile at its first node's window
])
def test_flashinfers_own_window_is_not_exact_for_a_tree(fix_helpers, how, name, cta):
    exact = _check(name, 8, cta, how, fix_helpers)
    assert exact[0] is False  # the 30-token request: its window starts inside the committed tokens
    assert all(_check(name, 8, cta, "fix", fix_helpers))


def test_the_widened_window_is_for_tree_verifies_only(fix_helpers):
    widen = fix_helpers["_spec_verify_window_left"]
    tree = type("S", (), {"spec_input_type": _SpecInputType.EAGLE_VERIFY, "draft_token_num": 6})()
    dflash = type("S", (), {"spec_input_type": _SpecInputType.DFLASH_VERIFY, "draft_token_num": 6})()
    assert (widen(8, tree), widen(-1, tree), widen(8, dflash), widen(8, None)) == (13, -1, 8, 8)


# ----------------------------------------------------------------------------- sglang 0.5.23's own code
NEW = [*at.VERIFY[1:], *at.GRAPH_VERIFY[1:]]  # the tree and NGRAM paths, eager and CUDA graph


def test_the_tables_list_every_path():
    from swa_repro.sglang.audit import paths as ap

    assert set(at._PATH_ORDER) == set(ap.PATHS) and len(at._PATH_ORDER) == len(ap.PATHS)
    assert set(NEW) <= set(at.CLASSES["eagle_verify_window"].paths)
    assert set(at.VERIFY) <= set(at.PREFILL) and set(at.GRAPH_VERIFY) <= set(at.GRAPH)
    assert {p.split("_")[-1] for p in NEW if "_eagle_" in p} == {t.name for t in spec.EAGLE_TREES}


@pytest.fixture(scope="module")
def audits_0523():
    """0.5.23's whole audit as shipped and with the fixes: the same two child runs (one cache key
    each) that notebook 04 and test_graph_verify read (``conftest.release_audits``), so the suite
    computes them once (issue #24); the tests below read the tree and NGRAM paths of them."""
    from conftest import release_audits

    return release_audits("0.5.23")


def _swa(doc, path):
    (d,) = [d for d in doc["driven"] if d["path"] == path and d["layer"] == "swa8"]
    return d["key_verdict"], sum(s["missing_keys"] for s in d["keys"].values())


@pytest.mark.slow
@pytest.mark.parametrize("path", NEW)
def test_0523_tree_verify_as_shipped_and_fixed(audits_0523, path):
    shipped, fixed = audits_0523["shipped"], audits_0523["fixed"]
    assert not shipped["not_driven"] and not fixed["not_driven"]
    verdict, missing = _swa(shipped, path)
    assert verdict == "extra" and missing > 0  # the first min(seq, 8) keys under a mask laid out for the whole sequence
    assert _swa(fixed, path) == ("exact", 0)
    assert not [f for f in fixed["findings"] if f["path"] == path and f["effect"] == "wrong"]
    assert {d["key_verdict"] for d in fixed["driven"] if d["path"] == path} == {"exact"}


# ----------------------------------------------------------------------------- the batch sglang is handed
@pytest.mark.parametrize("path", ["target_verify_eagle_k4s3n8", "target_verify_ngram", "cuda_graph_verify_eagle_k2s3n6"])
def test_the_batch_positions_are_the_oracles(path):
    """The positions the driven batch carries (what sglang's forward reads) are committed + the
    oracle's depth, and the query rows the keys are judged for are the tree's nodes."""
    pytest.importorskip("sglang")
    from swa_repro.sglang.audit import paths as ap

    run = ap.drive(path, ap.LayerConfig(8, 0.0))
    assert run.status == "driven", run.error
    tree = run.snapshot["spec_tree"]
    want = np.concatenate([c + ai.tree_oracle(p)[0] for c, p in zip(tree["committed"], tree["parents"])])
    assert run.snapshot["positions"].tolist() == want.tolist()
    for p in ac.pairs(run):
        for rk in ak.call_keys(p, run.snapshot, 8):
            assert rk.q_pos.tolist() == want[rk.rows].tolist()
