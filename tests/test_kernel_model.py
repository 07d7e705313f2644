"""The kernel model's invariants. Agreement with the real kernel: tests/test_recordings.py."""

import itertools
import random

import numpy as np
import pytest

from swa_repro.core.case import Case, CaseError
from swa_repro.kernel.model import (
    binary_search_kv_chunk_size, cta_kv_start, fa2_cta_tile_q, fa2_plan, partial_outputs_consistent,
    run_num_kv_chunks, simulate,
)
from swa_repro.core.reference import intended_interval, intended_mask


def random_cases(n, seed=0, **fixed):
    rng = random.Random(seed)
    for _ in range(n):
        hk = rng.choice([1, 2, 4, 8])
        b = rng.randint(1, 4)
        kw = dict(
            prefix_lens=[rng.choice([0, rng.randint(0, 300), rng.randint(0, 3000)]) for _ in range(b)],
            extend_lens=[rng.choice([1, rng.randint(1, 40), rng.randint(1, 400)]) for _ in range(b)],
            num_kv_heads=hk, num_qo_heads=hk * rng.choice([1, 2, 4, 8]), head_dim=rng.choice([64, 128, 256]),
            page_size=rng.choice([1, 16]), window_left=rng.choice([0, 4, 64, 128, 1024]),
            backend=rng.choice(["fa2", "fa3"]), disable_split_kv=rng.random() < 0.3,
        )
        kw.update(fixed)
        yield Case(**kw)


@pytest.mark.parametrize("case", list(random_cases(60, seed=1)), ids=lambda c: "")
def test_plan_with_window_is_exact(case):
    res = simulate(case.with_(plan_window_left=case.window_left))
    assert res.statuses == ["exact"] * case.batch_size
    for r, p, e in zip(res.requests, case.prefix_lens, case.extend_lens):
        assert np.array_equal(r.mask(), intended_mask(p, e, case.window_left))


@pytest.mark.parametrize("case", list(random_cases(60, seed=2, backend="fa3")), ids=lambda c: "")
def test_fa3_without_plan_window_is_plain_causal(case):
    res = simulate(case)
    for r, p, e in zip(res.requests, case.prefix_lens, case.extend_lens):
        assert np.array_equal(r.mask(), intended_mask(p, e, -1))
        assert r.status == ("exact" if np.array_equal(intended_mask(p, e, -1), intended_mask(p, e, case.window_left)) else "leak")


@pytest.mark.parametrize("case", list(random_cases(80, seed=3, backend="fa2")), ids=lambda c: "")
def test_fa2_bug_is_a_tile_granular_leak_when_defined(case):
    res = simulate(case)
    g, cta = case.group_size, res.plan.cta_tile_q
    for r, p, e, kv in zip(res.requests, case.prefix_lens, case.extend_lens, case.kv_lens):
        if r.status == "undefined":
            assert res.plan.split_kv and r.num_chunks_run != r.num_chunks_plan and e > 1
            continue
        ilo, ihi = intended_interval(p, e, case.window_left)
        packed = np.arange(e * g).reshape(e, g)
        # DEVELOPERS' formula: kv_start = max(0, kv_len - qo_len + floor(t*CTA_TILE_Q/g) - W)
        expect_lo = np.maximum(kv - e + (packed // cta) * cta // g - case.window_left, 0)
        assert np.array_equal(r.lo, expect_lo)
        assert np.array_equal(r.hi, np.repeat(ihi[:, None], g, 1))  # causal limit, nothing missing
        assert np.all(r.lo <= ilo[:, None])  # a leak never drops an in-window key
        assert int(r.extra_keys().max()) <= cta // g + 1


def test_seed_case_numbers():
    """prefix 0, extend 6/8/12, window 4, 4/4 heads: one 16-row CTA per request starting at key 0,
    so each request equals plain causal attention (the upstream regression's only failing case is 12)."""
    bug = simulate(Case((0, 0, 0), (6, 8, 12), window_left=4))
    assert bug.plan.cta_tile_q == 16 and not bug.plan.split_kv
    assert bug.statuses == ["leak", "leak", "leak"]
    assert [int(r.extra_keys().max()) for r in bug.requests] == [1, 3, 7]  # e - 1 - W
    for r, e in zip(bug.requests, (6, 8, 12)):
        assert np.array_equal(r.mask(), intended_mask(0, e, -1))
    short = simulate(Case((0, 0, 0), (3, 4, 5), window_left=4))
    assert short.statuses == ["exact", "exact", "exact"]  # never reaches past the window
    assert simulate(Case((3, 4, 5), (2, 2, 2), window_left=4)).statuses == ["exact", "leak", "leak"]


def test_split_kv_long_request_is_undefined_and_single_row_is_not():
    long = Case((4000,), (50,), window_left=128)
    res = simulate(long)
    assert res.plan.split_kv and res.requests[0].status == "undefined"
    assert res.requests[0].num_chunks_plan == 32 and res.requests[0].num_chunks_run == 2
    assert simulate(long.with_(disable_split_kv=True)).statuses == ["leak"]
    assert simulate(long.with_(extend_lens=(1,))).statuses == ["exact"]  # row 0's slots line up
    mixed = simulate(Case((3000, 0, 100), (20, 200, 50), window_left=64))
    assert mixed.statuses == ["undefined", "leak", "leak"]  # only the request longer than W + CTA


def test_plan_window_but_run_without_overruns_later_requests():
    res = simulate(Case((3000, 0, 100), (20, 200, 50), window_left=-1, plan_window_left=64))
    assert res.statuses == ["undefined"] * 3


def test_cta_tile_q_table():
    assert fa2_cta_tile_q(65, 128) == 128
    assert fa2_cta_tile_q(65, 256) == 64
    assert fa2_cta_tile_q(64, 128) == 64
    assert fa2_cta_tile_q(16, 128) == 16
    assert fa2_cta_tile_q(17, 64) == 64


def test_binary_search_matches_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        b = rng.randint(1, 5)
        packed = [rng.randint(1, 600) for _ in range(b)]
        pages = [rng.randint(0, 400) for _ in range(b)]
        max_bs, cta, mn = rng.randint(8, 264), rng.choice([16, 64, 128]), rng.choice([1, 8, 128])
        split, chunk = binary_search_kv_chunk_size(max_bs, packed, pages, cta, mn)
        tiles = [-(-p // cta) for p in packed]
        max_kv = max([1, *pages])
        fits = [c for c in range(mn, max(max_kv, mn) + 1)
                if sum(t * -(-max(k, 1) // c) for t, k in zip(tiles, pages)) <= max_bs]
        expect = min(fits) if fits and min(fits) < max_kv else max(mn, max_kv)
        assert chunk == min(expect, max(mn, max_kv)) or (not fits and chunk == max(mn, max_kv))
        assert split == (chunk < max_kv)


@pytest.mark.parametrize("case", list(random_cases(40, seed=4, backend="fa2")), ids=lambda c: "")
def test_run_chunk_count_matches_plan_when_windows_agree(case):
    fixed = case.with_(plan_window_left=case.window_left)
    plan = fa2_plan(fixed)
    if plan.split_kv:
        for kv, n in zip(fixed.kv_lens, plan.num_chunks):
            assert run_num_kv_chunks(kv, fixed.window_left, plan.cta_tile_q, plan.kv_chunk_size) == n


def test_kv_start_formula_and_consistency_rule():
    assert list(cta_kv_start(100, 50, np.arange(4), 16, 1, 8)) == [42, 58, 74, 90]
    assert list(cta_kv_start(100, 50, np.arange(2), 16, 4, 8)) == [42, 46]
    assert list(cta_kv_start(10, 10, np.arange(1), 16, 1, -1)) == [0]
    assert partial_outputs_consistent(5, 3, 3) and partial_outputs_consistent(1, 30, 2)
    assert not partial_outputs_consistent(2, 30, 2)


def test_tile_map_agrees_with_intervals():
    """Unmasked tiles must lie inside every row's visible interval; skipped keys outside them."""
    for case in [Case((200,), (100,), num_qo_heads=32, num_kv_heads=8, window_left=64, disable_split_kv=True),
                 Case((0, 50), (300, 130), window_left=32, plan_window_left=32),
                 Case((1000,), (256,), window_left=100, head_dim=64, disable_split_kv=True)]:
        res = simulate(case, tiles=True)
        g, cta = case.group_size, res.plan.cta_tile_q
        for r in res.requests:
            for t in range(r.tiles.shape[0]):
                rows = [(p // g, p % g) for p in range(t * cta, min((t + 1) * cta, r.extend_len * g))]
                lo = min(r.lo[q, h] for q, h in rows)
                hi = max(r.hi[q, h] for q, h in rows)
                computed = np.nonzero(r.tiles[t])[0]
                assert computed.min() <= lo and computed.max() >= hi - 0  # loop covers all visible keys
                for j in np.nonzero(r.tiles[t] == 2)[0]:
                    assert all(r.lo[q, h] <= j <= r.hi[q, h] for q, h in rows)


def test_union_mask_is_union_of_heads():
    res = simulate(Case((40,), (30,), num_qo_heads=6, num_kv_heads=2, window_left=5, disable_split_kv=True))
    r = res.requests[0]
    union = np.any([r.mask(h) for h in range(3)], 0)
    assert np.array_equal(r.mask(), union)


@pytest.mark.parametrize("kw,msg", [
    (dict(window_left=-2), "window_left"), (dict(num_qo_heads=6, num_kv_heads=4), "multiple"),
    (dict(num_qo_heads=2, num_kv_heads=4), "num_kv_heads"), (dict(head_dim=96), "head_dim"),
    (dict(extend_lens=()), "empty"), (dict(prefix_lens=(0, 0)), "one prefix length"),
    (dict(backend="fa4"), "backend"), (dict(extend_lens=(0,)), "extend"),
])
def test_case_errors_say_what_to_change(kw, msg):
    base = dict(prefix_lens=(0,), extend_lens=(8,))
    base.update(kw)
    with pytest.raises(CaseError, match=msg):
        Case(**base)
