"""``audit.spans``: the keys each query attends, as ranges, against independent oracles.

* the element rule of FlashInfer's causal and window masks (variants.cuh:79-89), checked key by key;
* run-length encoding, index -> id runs and foreign counts against brute force on random layouts;
* a draft tree's intended ids against ``audit.intended.tree_intended`` (dense, from parent links);
* whole runs: every path x layer of the synthetic audit (installed sglang) gives what the dense
  ``audit.keys.keys_of_run`` gives, for the layer's window, one less and a third;
* a real window (4096 keys, 4352-token prompts): counts from closed forms, no mask built.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import skip_module_unless

from swa_repro.sglang.audit import attended as aa
from swa_repro.sglang.audit import calls as ac
from swa_repro.sglang.audit import env
from swa_repro.sglang.audit import intended as ai
from swa_repro.sglang.audit import keys as ak
from swa_repro.sglang.audit import spans as sp
from swa_repro.sglang.audit.spec import NGRAM_TREES, chain_parents


def visible(qo, kv, causal, window, r, j) -> bool:
    """FlashInfer's element rule (variants.cuh:79-89): causal ``j <= kv - qo + r``, window
    ``j + qo + W >= kv + r``."""
    return (not causal or j <= kv - qo + r) and (window < 0 or j + qo + window >= kv + r)


# ----------------------------------------------------------------------------- one call's ranges
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [-1, 0, 3, 40])
@pytest.mark.parametrize("qo,kv", [(1, 1), (1, 17), (9, 9), (9, 30), (30, 30)])
def test_call_spans_are_the_element_rule(qo, kv, causal, window):
    lo, hi = sp.CallSpans(qo, kv, causal, window).ranges()
    for r in range(qo):
        seen = {j for j in range(kv) if visible(qo, kv, causal, window, r, j)}
        assert seen == set(range(int(lo[0, r, 0]), int(hi[0, r, 0]) + 1)), (r, seen)


@pytest.mark.parametrize("seed", range(6))
def test_mask_runs_are_the_rows(seed):
    mask = np.random.default_rng(seed).random((5, 40)) < [0.1, 0.5, 0.9, 0.0, 1.0][seed % 5]
    lo, hi = sp.mask_runs(mask)
    for r in range(5):
        got = {j for a, b in zip(lo[r], hi[r]) for j in range(a, b + 1)}
        assert got == set(np.nonzero(mask[r])[0].tolist())


@pytest.mark.parametrize("seed", range(6))
def test_key_map_ids_and_foreign_are_brute_force(seed):
    rng = np.random.default_rng(seed)
    k = np.concatenate([np.arange(10, 30), [-1, -1], np.arange(31, 40), [-1], np.arange(5, 9)])
    rng.shuffle(k[rng.integers(0, 3):])  # some layouts keep runs, some scatter every id
    km = sp.KeyMap(k)
    lo, hi = np.sort(rng.integers(0, len(k), (2, 7)), axis=0)
    ilo, ihi = km.ids(lo[:, None], hi[:, None])
    for i in range(7):
        want = {int(k[j]) for j in range(lo[i], hi[i] + 1) if k[j] >= 0}
        assert {x for a, b in zip(ilo[i], ihi[i]) for x in range(a, b + 1)} == want
        assert km.foreign(lo[i], hi[i]) == sum(k[j] < 0 for j in range(lo[i], hi[i] + 1))


@pytest.mark.parametrize("parents", [chain_parents(4), *NGRAM_TREES, [-1, 0, 0, 1, 1, 2]])
@pytest.mark.parametrize("window", [-1, 0, 1, 3, 12])
def test_tree_ranges_are_the_dense_tree_oracle(parents, window):
    committed, n = 10, len(parents)
    nodes = np.arange(n)
    ids = np.arange(committed + n)
    dense = ai.tree_intended(parents, committed, nodes, ids, window)
    lo, hi = sp.tree_ranges(parents, committed, nodes, window)
    for i in range(n):
        assert {x for a, b in zip(lo[i], hi[i]) for x in range(a, b + 1)} == set(np.nonzero(dense[i])[0].tolist())


# ----------------------------------------------------------------------------- at a real window
def test_a_real_window_counts_match_closed_forms():
    """A 4352-token prompt, window 4095 (Gemma-2's 4096 as FlashInfer counts it): compiled in, no
    row sees an extra key; compiled out (plain causal), row ``q`` sees ``q - 4095`` extra."""
    qo = kv = 4352
    w = 4095
    q_pos = np.arange(qo)
    want = sp.window_ranges(q_pos, w)
    km = sp.KeyMap(np.arange(kv))
    for applied, per_row in ((w, np.zeros(qo)), (-1, np.maximum(q_pos - w, 0))):
        lo, hi = sp.CallSpans(qo, kv, True, applied).ranges()
        ilo, ihi = km.ids(lo, hi)
        extra = (sp.size(lo, hi) - sp.overlap(ilo, ihi, want[0][None], want[1][None])).max(0)
        assert np.array_equal(extra, per_row)
    assert int(np.maximum(q_pos - w, 0).sum()) == 256 * 257 // 2


# ----------------------------------------------------------------------------- an fa2 call planned without the window
def _ragged_pair(qo: int, plan_window: int, run_window: int, hq: int = 4, hk: int = 2):
    """One ragged request without a prefix, planned with ``plan_window`` and run with ``run_window``
    (what sglang 0.5.23's ragged prefix extend does with a sliding layer: forward-only window)."""
    import torch

    ind = torch.tensor([0, qo])
    plan = {"qo_indptr": ind, "kv_indptr": ind, "num_qo_heads": hq, "num_kv_heads": hk, "head_dim_qk": 64,
            "window_left": plan_window, "disable_split_kv": True, "fixed_split_size": None, "causal": True}
    fwd = {"window_left": run_window, "causal": True}
    return ac.Pair("eager", env.RAGGED, "auto", 0, (0, plan, ("begin_forward", set())), (1, fwd, ("forward", set()))), plan, fwd


@pytest.mark.parametrize("backend", ["fa2", "fa3", "auto"])
@pytest.mark.parametrize("plan_window", [-1, 40])
def test_a_ragged_call_sees_what_its_backend_lets_it(backend, plan_window):
    """An fa2 ragged call planned without the window starts each CTA at its first row's window
    (flashinfer 0.7.2 prefill.cuh:3037-3039: ``kv + t * CTA_TILE_Q / group - qo - W``; CTA_TILE_Q 128
    for 600 packed rows at head_dim 64); fa3 and an unresolved ``auto`` are plain causal; with the
    window planned every backend applies it per element. Dense and ranges agree."""
    qo, w, g = 300, 40, 2
    p, plan, fwd = _ragged_pair(qo, plan_window, w)
    r, j, h = np.arange(qo)[None, :, None], np.arange(qo)[None, None, :], np.arange(4)[:, None, None]
    if plan_window >= 0:
        want = (j <= r) & (j >= r - w)
    elif backend == "fa2":
        want = (j <= r) & (j >= np.maximum(((r * g + h % g) // 128 * 128) // g - w, 0))
    else:
        want = j <= r
    geo = ac.geometry(env.RAGGED, plan)
    dense = aa._kernel_visible(p, plan, fwd, qo, qo, 4, 0, geo, backend)
    assert np.array_equal(dense, np.broadcast_to(want, (4, qo, qo)))
    lo, hi = sp.kernel_ranges(p, plan, fwd, qo, qo, 0, geo, backend)
    n = lo.shape[0]  # 1, or a column per head in group (head h reads column h % n)
    assert np.array_equal(np.stack([(j[0] >= lo[h % n]) & (j[0] <= hi[h % n]) for h in range(4)]), dense)
    assert sp.kernel_rule(p, plan, fwd, backend) == ("fa2 leak" if backend == "fa2" and plan_window < 0 else "other")


# ----------------------------------------------------------------------------- whole runs, against the dense form
skip_module_unless("sglang")
from swa_repro.sglang.audit import paths as ap  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("path", list(ap.PATHS))
def test_ranges_equal_the_dense_keys_on_every_path(path):
    for what_if in (None, "patched"):
        for cfg in ap.LAYER_CONFIGS:
            run = ap.drive(path, cfg, what_if=what_if)
            if run.error:
                assert run.status == "absent", run.error
                continue
            for w in {run.layer_window, max(run.layer_window - 1, -1), 3}:
                assert sp.keys_of_run(run, w) == ak.keys_of_run(run, w), (what_if, cfg.name, w)
