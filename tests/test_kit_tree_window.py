"""#40 point 2: which position a tree draft token's sliding window counts from, in sglang's attention kit.

The kit's custom-mask reference (``dense_attention_reference_with_custom_mask``) is run on a CPU as the
kit's text has it (shipped, with ``kit.diff``, with the Triton follow-up), on the kit's own verify shapes
(swa/test_triton.py's tree case: prefixes 3 and 5; swa/test_fa3.py's: 3 and 9; window 4; the kit's
``_draft_tree_mask``), with one-hot values and zero queries: each output row is the mean of the values of
the keys that query attends, so the keys are read off the output. They are held against the project's
own tree oracle (``sglang.audit.intended.tree_intended``: committed + depth, which
``kit_edits.TREE_DECISION`` argues from sglang's and transformers' sources) and against the index rule
(Triton's extend kernel, extend_attention.py:563-569).
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from swa_repro.sglang.audit.intended import tree_intended
from swa_repro.sglang.fix import kit_edits as ke
from swa_repro.sglang.fix.kit_anchor import KitEditError
from swa_repro.sglang.fix.kit_tree import TREE_DECISION, TRITON
from swa_repro.sglang.fix.upstream_diff import VERSION

PARENTS = (-1, 0, 0)  # the kit's tree (_draft_tree_mask, topk > 1: root and two children)
WINDOW = 4
TRITON_TREE, FA3_TREE, PAST = (3, 5), (3, 9), (6, 8)  # prefixes of the kit's / our verify cases


@pytest.fixture(scope="module")
def texts():
    from conftest import release_overlay

    return ke.read(release_overlay(VERSION))


def _functions(text: str, names: tuple[str, ...]) -> dict:
    """The named top-level functions and assignments of a kit file, run alone (they use torch only)."""
    tree = ast.parse(text)
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in names)
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", "") in names for t in n.targets))]
    ns = {"torch": torch, "__name__": "kit"}
    exec(compile(ast.Module(keep, []), "kit", "exec"), ns)  # noqa: S102 - the kit's own text, parsed
    return ns


def _keys(kit: dict[str, str], backend: str, prefixes: tuple[int, ...], topk: int) -> list[np.ndarray]:
    """Per request, the (draft, seq) bool keys each draft token attends under the kit's reference."""
    ns = _functions(kit[ke.DENSE], ("dense_attention_reference_with_custom_mask", "_split_by_lens", "_expand_gqa",
                                    "TREE_WINDOW_BY_INDEX"))
    tree = _functions(kit[ke.VERIFY], ("_draft_tree_mask",))["_draft_tree_mask"]
    n = len(PARENTS)
    dim = max(prefixes) + n  # one-hot over a request's token row: column = the key's index in it
    eye = torch.eye(dim, dtype=torch.float64)
    module = types.SimpleNamespace(head_dim=dim, scaling=1.0, reconstruct_output=lambda x: x,
                                   project_qkv=lambda h: (torch.zeros_like(h), h, h))
    case = types.SimpleNamespace(backend=backend, prefix_lens=prefixes, input_lens=(n,) * len(prefixes),
                                 num_heads=1, num_kv_heads=1, sliding_window_size=WINDOW)
    draft = tree(draft_token_num=n, topk=topk, device="cpu")
    masks = []
    for p in prefixes:
        m = torch.ones(n, p + n, dtype=torch.bool)
        m[:, p:] = draft
        masks.append(m)
    out = ns["dense_attention_reference_with_custom_mask"](
        module, case, [eye[:p] for p in prefixes], torch.cat([eye[p:p + n] for p in prefixes]), masks)
    rows = np.split(out.numpy() > 0, len(prefixes))
    return [r[:, :p + n] for r, p in zip(rows, prefixes, strict=True)]


def _depth(prefixes, parents=PARENTS) -> list[np.ndarray]:
    n = len(parents)
    return [tree_intended(parents, p, np.arange(n), np.arange(p + n), WINDOW) for p in prefixes]


def _index(prefixes, topk) -> list[np.ndarray]:
    """Triton's rule: the query at row i of the flattened draft sits at prefix + i."""
    n = len(PARENTS)
    anc = np.tril(np.ones((n, n), bool)) if topk == 1 else np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
    out = []
    for p in prefixes:
        k = np.arange(p + n)[None, :]
        q = p + np.arange(n)[:, None]
        tree = np.ones((n, p + n), bool)
        tree[:, p:] = anc
        out.append(tree & (k >= q - WINDOW))
    return out


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_the_kit_tree_is_the_oracles_tree(texts):
    """The kit's topk > 1 draft mask is the tree (-1, 0, 0): each row its ancestors and itself."""
    from swa_repro.sglang.audit.intended import tree_oracle

    draft = _functions(texts[ke.VERIFY], ("_draft_tree_mask",))["_draft_tree_mask"](draft_token_num=3, topk=2,
                                                                                      device="cpu")
    assert np.array_equal(draft.numpy(), tree_oracle(PARENTS)[1])


@pytest.mark.parametrize("prefixes", [TRITON_TREE, FA3_TREE, PAST])
def test_kit_diff_windows_a_tree_token_from_its_depth_except_where_a_backend_declares_its_index(texts, prefixes):
    """With ``kit.diff``: FlashInfer's and FA3's tree expectation is the depth (the oracle); Triton's stays
    its index rule, declared (``TREE_WINDOW_BY_INDEX``), so its tests keep passing on what Triton does.
    Shipped, every backend's was the index: FlashInfer's fixed tree verify (depth) would fail it."""
    edited = {**texts, **ke.edit(texts)}
    assert _same(_keys(edited, "flashinfer", prefixes, 2), _depth(prefixes))
    assert _same(_keys(edited, "fa3", prefixes, 2), _depth(prefixes))
    assert _same(_keys(edited, "triton", prefixes, 2), _index(prefixes, 2))
    for backend in ("flashinfer", "fa3", "triton"):
        assert _same(_keys(texts, backend, prefixes, 2), _index(prefixes, 2))
    # where they differ: the node after its sibling (row 2, depth 1) of a request past the window
    past = [p for p in prefixes if p + 1 - WINDOW >= 0]  # key p + 1 - W: in the depth-1 window, not the index 2 one
    for i, p in enumerate(prefixes):
        diff = _depth(prefixes)[i] ^ _index(prefixes, 2)[i]
        assert diff.sum() == (1 if p in past else 0) and (diff.sum() == 0 or diff[2, p + 1 - WINDOW])


@pytest.mark.parametrize("prefixes", [TRITON_TREE, PAST])
def test_a_chain_is_the_same_under_both_rules(texts, prefixes):
    """topk 1: index and depth agree, so every chain case keeps its expectation on every backend."""
    edited = {**texts, **ke.edit(texts)}
    chain = (-1, 0, 1)
    for backend in ("flashinfer", "fa3", "triton"):
        assert _same(_keys(edited, backend, prefixes, 1), _depth(prefixes, chain))
        assert _same(_keys(texts, backend, prefixes, 1), _depth(prefixes, chain))


def test_triton_follow_up_moves_triton_to_the_depth_and_stays_out_of_kit_diff(texts):
    """``kit_tree_verify_triton`` (the Triton finding's kit side) makes Triton's tree expectation the depth;
    it goes on top of ``kit_tree_verify_window`` and is not in ``kit.diff``, so the FlashInfer series never
    changes what Triton's tests expect."""
    both = {**texts, **ke.edit(texts, (*ke.ORDER, TRITON))}
    assert _same(_keys(both, "triton", TRITON_TREE, 2), _depth(TRITON_TREE))
    assert TRITON not in ke.ORDER
    made = ke.diffs(texts)
    assert 'TREE_WINDOW_BY_INDEX = frozenset({"triton"})' in made[ke.ALL]
    assert "frozenset()" not in made[ke.ALL] and "+TREE_WINDOW_BY_INDEX = frozenset()" in made[TRITON]
    with pytest.raises(KitEditError, match="goes on top of kit_tree_verify_window"):
        ke.edit(texts, (TRITON,))
    assert ke.states(both) == dict.fromkeys(ke.EDITS, "applied")
    assert ke.states({**texts, **ke.edit(texts)}) == {**dict.fromkeys(ke.ORDER, "applied"), TRITON: "needed"}


def test_the_decision_cites_its_sources(texts, tmp_path):
    """Each line ``TREE_DECISION`` rests on says what it is said to (0.5.23's package, transformers)."""
    import transformers.masking_utils as mu
    from conftest import release_overlay

    site = release_overlay(VERSION) / "sglang"

    def lines(rel, a, b):
        return "".join((site / rel).read_text().splitlines(keepends=True)[a - 1:b])

    text = " ".join(TREE_DECISION)
    assert "positions = [7, 8, 8, 9]" in lines("srt/speculative/eagle_utils.py", 208, 211)
    assert "cur_seq_len_prefix + cur_block_m * BLOCK_M + offs_m[:, None]" in lines(
        "kernels/ops/attention/extend_attention.py", 563, 569)
    assert "window_kv_start_idx = seq_lens - window_kv_lens" in lines(
        "srt/layers/attention/triton_backend.py", 2869, 2879)
    assert "cache_seqlens_int32 = mask.sum(dim=1)" in lines("srt/layers/attention/flashattention_backend.py",
                                                            1116, 1168)
    assert "metadata_swa.max_seq_len_q = 1" in lines("srt/layers/attention/flashattention_backend.py", 3410, 3472)
    assert "and not is_swa_layer" in lines("srt/layers/attention/flashattention_backend.py", 1586, 1594)
    assert "swa_spec_metadata.cache_seqlens_int32" in lines("srt/layers/attention/flashattention_backend.py",
                                                            1666, 1672)
    assert "(layer.sliding_window_size, 0 if causal" in lines("srt/layers/attention/flashattention_backend.py",
                                                              1567, 1571)
    src = Path(mu.__file__).read_text().splitlines()
    assert src[93].strip().startswith("def inner_mask(") and src[94].strip() == "return kv_idx > q_idx - sliding_window"
    for cite in ("eagle_utils.py:208-211", "extend_attention.py:563-569", "flashattention_backend.py:1116-1168",
                 "masking_utils.py:94-95", "triton_backend.py:2869-2879", ":3410-3472", "#39287"):
        assert cite in text


def test_the_edits_again_on_a_kit_with_the_follow_up_change_nothing(texts, tmp_path, capsys):
    """gpu_kit.sh edits a site with the follow-up; ``kit_edits`` run on it again (its default edits, as
    gpu_fix.sh does) leaves it as it is: the edits under the follow-up are judged without it, not
    inserted a second time."""
    for p, t in texts.items():
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_text(t)
    assert ke.main(["--site", str(tmp_path), "--names", ",".join((*ke.ORDER, TRITON))]) == 0
    both = ke.read(tmp_path)
    assert ke.main(["--site", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("already applied") == len(ke.ORDER)
    assert ke.read(tmp_path) == both and both[ke.DENSE].count("TREE_WINDOW_BY_INDEX = ") == 1
    assert ke.edit(both) == {p: both[p] for p in ke.edit(both)}
