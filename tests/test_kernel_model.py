"""The kernel model's invariants. Agreement with the real kernel: tests/test_recordings.py."""

import itertools
import random

import numpy as np
import pytest

from swa_repro.core.case import Case
from swa_repro.core.errors import CaseError
from swa_repro.core.intervals import ceil_div, intended_bounds
from swa_repro.core.reference import intended_mask
from swa_repro.core.versions import FLASHINFER_VERSIONS, version_key
from swa_repro.evidence.cases import CASES
from swa_repro.kernel import model, partials
from swa_repro.kernel.model import (
    CtaGeometry, binary_search_kv_chunk_size, fa2_cta_tile_q, fa2_plan, geometry, partial_outputs_consistent,
    simulate,
)


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


def case_id(c: Case) -> str:
    """The test id of a random case: enough to rebuild it."""
    split = "_nosplit" if c.disable_split_kv else ""
    return (f"{c.backend}_p{'-'.join(map(str, c.prefix_lens))}_e{'-'.join(map(str, c.extend_lens))}"
            f"_h{c.num_qo_heads}x{c.num_kv_heads}_d{c.head_dim}_ps{c.page_size}_w{c.window_left}{split}")


@pytest.mark.parametrize("case", list(random_cases(60, seed=1)), ids=case_id)
def test_plan_with_window_is_exact(case):
    res = simulate(case.with_(plan_window_left=case.window_left))
    assert res.statuses == ["exact"] * case.batch_size
    for r, p, e in zip(res.requests, case.prefix_lens, case.extend_lens):
        assert np.array_equal(r.mask(), intended_mask(p, e, case.window_left))


@pytest.mark.parametrize("case", list(random_cases(60, seed=2, backend="fa3")), ids=case_id)
def test_fa3_without_plan_window_is_plain_causal(case):
    res = simulate(case)
    for r, p, e in zip(res.requests, case.prefix_lens, case.extend_lens):
        assert np.array_equal(r.mask(), intended_mask(p, e, -1))
        assert r.status == ("exact" if np.array_equal(intended_mask(p, e, -1), intended_mask(p, e, case.window_left)) else "leak")


@pytest.mark.parametrize("case", list(random_cases(80, seed=3, backend="fa2")), ids=case_id)
def test_fa2_bug_is_a_tile_granular_leak_when_defined(case):
    res = simulate(case)
    g, cta = case.group_size, res.plan.cta_tile_q
    for r, p, e, kv in zip(res.requests, case.prefix_lens, case.extend_lens, case.kv_lens):
        if r.status == "undefined":
            assert res.plan.split_kv and r.num_chunks_run != r.num_chunks_plan and e > 1
            continue
        ilo, ihi = intended_bounds(p, e, case.window_left)
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
        tiles = [ceil_div(p, cta) for p in packed]
        max_kv = max([1, *pages])
        fits = [c for c in range(mn, max(max_kv, mn) + 1)
                if sum(t * ceil_div(max(k, 1), c) for t, k in zip(tiles, pages)) <= max_bs]
        expect = min(fits) if fits and min(fits) < max_kv else max(mn, max_kv)
        assert chunk == min(expect, max(mn, max_kv)) or (not fits and chunk == max(mn, max_kv))
        assert split == (chunk < max_kv)


@pytest.mark.parametrize("case", list(random_cases(40, seed=4, backend="fa2")), ids=case_id)
def test_run_chunk_count_matches_plan_when_windows_agree(case):
    fixed = case.with_(plan_window_left=case.window_left)
    plan = fa2_plan(fixed)
    if plan.split_kv:
        for i, n in enumerate(plan.num_chunks):
            assert geometry(fixed, plan, i).num_chunks_run() == n


def test_kv_start_formula_and_consistency_rule():
    kv_start = lambda kv, qo, cta, g, w, n: list(CtaGeometry(qo, kv, cta, g, w).kv_range(np.arange(n))[0])  # noqa: E731
    assert kv_start(100, 50, 16, 1, 8, 4) == [42, 58, 74, 90]
    assert kv_start(100, 50, 16, 4, 8, 2) == [42, 46]
    assert kv_start(10, 10, 16, 1, -1, 1) == [0]
    assert partial_outputs_consistent(5, 3, 3) and partial_outputs_consistent(1, 30, 2)
    assert not partial_outputs_consistent(2, 30, 2)


def test_cta_geometry_ranges():
    """kv 100, qo 50 (queries at 50..99), 16-row tiles, MHA, window 8, chunks of 32 keys."""
    geo = CtaGeometry(qo_len=50, kv_len=100, cta_tile_q=16, group=1, window_left=8, kv_chunk_size=32,
                      partition_kv=True)
    assert [int(x) for x in geo.kv_range(1)] == [58, 82]  # rows 66..81: window of 66 to causal end of 81
    assert [int(x) for x in geo.chunk(1, 0)] == [58, 90] and [int(x) for x in geo.chunk(1, 1)] == [90, 100]
    assert geo.num_chunks_run() == 1  # min(100, 8 + 16) keys in chunks of 32
    assert geo.num_iterations(1, (58, 90), 16) == 2  # keys 58..81
    assert geo.mask_iteration(1, (58, 90), 16) == 0  # key 66 (row 66's diagonal) is in tile 0
    assert geo.window_iteration(1, (58, 90), 16) == 1  # row 81's window starts at 73 > 58
    rows, start, end = np.array([16, 31]), np.full(2, 58), np.full(2, 90)  # queries 66 and 81, tile 1
    lo, hi = geo.row_bounds(rows, start, end, swa=False)
    assert list(lo) == [58, 58] and list(hi) == [66, 81]
    lo, _ = geo.row_bounds(rows, start, end, swa=True)
    assert list(lo) == [58, 73]


# ----------------------------------------------------------------------------- per flashinfer version
def newer_or_equal(version: str, than: str) -> bool:
    return version_key(version) >= version_key(than)


@pytest.mark.parametrize("version", FLASHINFER_VERSIONS)
def test_kv_tile_optin_cap_from_0_6_14(version, monkeypatch):
    """b.1: the opt-in cap exists from 0.6.14 (prefill.cuh:3680) and never binds on sm80/sm90; with a
    smaller opt-in limit it would shrink the tile of exactly the versions that have it."""
    assert model.version_facts(version).kv_tile_optin_cap == newer_or_equal(version, "0.6.14")
    for arch, cta, hd in itertools.product([(8, 0), (9, 0)], [16, 64, 128], [64, 128, 256]):
        assert model.cta_tile_kv(cta, hd, arch, version) == model.cta_tile_kv(cta, hd, arch, "0.6.12")
    monkeypatch.setitem(model.SMEM_OPTIN, (9, 0), 40000)  # 16x128 Q (4 KB) + one 32 KB NUM_MMA_KV step
    assert model.cta_tile_kv(16, 128, version=version) == (64 if newer_or_equal(version, "0.6.14") else 128)


def same_intervals(a, b) -> bool:
    return all(np.array_equal(x.lo, y.lo) and np.array_equal(x.hi, y.hi) for x, y in zip(a.requests, b.requests))


def reverse_case(version, prefix_lens=(2000, 2000), extend_lens=(200, 200)):
    """The helper's b.5 example: planned with window 64, run without; GQA 4, page 1."""
    return Case(prefix_lens, extend_lens, num_qo_heads=16, num_kv_heads=4, page_size=1, window_left=-1,
                plan_window_left=64, flashinfer_version=version)


@pytest.mark.parametrize("version", FLASHINFER_VERSIONS)
def test_partial_buffer_rows_per_version(version):
    """b.5: 3984 slots written; 0.6.x R = 28 CTAs x 128 = 3584 (tmp_v holds 7168 rows), 0.7.2+
    R = 3584 / 4 = 896 (1792 rows), so only 0.7.2+ spill onto tmp_s, into request 1's LSEs."""
    case = reverse_case(version)
    plan = fa2_plan(case)
    assert plan.split_kv and plan.cta_tile_q == 128 and plan.num_chunks == [2, 2] and plan.num_q_tiles == [7, 7]
    o_indptr, written = partials.slots_written(case.extend_lens, plan.num_chunks,
                                               [geometry(case, plan, i).num_chunks_run() for i in range(2)])
    assert list(o_indptr) == [0, 400, 800] and max(int(w.max()) for w in written) + 1 == 3984
    new = newer_or_equal(version, "0.7.2")
    assert model.version_facts(version).partial_rows_per_group == new
    assert model.partial_buffer_rows(case, plan) == (896 if new else 3584)
    hit = model.overflowed_into(case, plan)
    assert set(hit) == {1}  # request 0 overruns request 1's slots in every version
    assert ("tmp_s" in hit[1]) == new


@pytest.mark.parametrize("version", FLASHINFER_VERSIONS)
def test_spill_makes_a_fresh_request_undefined_from_0_7_2(version):
    """b.5 seen in statuses: a 100-token fresh request in front is exact (n_run == n_plan, nothing
    overruns it) until 0.7.2 sizes tmp_v so small that later rows land on its LSEs."""
    res = simulate(reverse_case(version, (0, 2000, 2000), (100, 200, 200)))
    assert res.statuses == ["undefined" if newer_or_equal(version, "0.7.2") else "exact", "undefined", "undefined"]
    assert np.array_equal(res.requests[0].mask(), intended_mask(0, 100, -1))


@pytest.mark.parametrize("version", FLASHINFER_VERSIONS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_recording_cases_agree_across_versions(case, version):
    """On every committed recording case, every version gives the masks, statuses and plan of the
    recorded 0.7.2.post1 model; b.5 cannot apply (sglang's direction never writes more than planned)."""
    ref, res = simulate(case), simulate(case.with_(flashinfer_version=version))
    assert res.statuses == ref.statuses and res.summary() == ref.summary()
    assert same_intervals(res, ref)
    assert res.plan is None or model.overflowed_into(res.case, res.plan) == {}


@pytest.mark.parametrize("case", list(random_cases(40, seed=5, backend="fa2", window_left=-1, plan_window_left=64)),
                         ids=case_id)
def test_reverse_cases_differ_across_versions_only_by_b5(case):
    """Planned with a window, run without: masks agree in all versions; a status differs only where
    0.7.2+'s smaller tmp_v spills onto tmp_s (b.5), and then it is 'undefined' there."""
    by_v = {v: simulate(case.with_(flashinfer_version=v)) for v in FLASHINFER_VERSIONS}
    old, new = by_v["0.6.7.post2"], by_v["0.7.2.post1"]
    for v, res in by_v.items():
        assert same_intervals(res, old)
        assert res.statuses == (new if newer_or_equal(v, "0.7.2") else old).statuses
    for i, (a, b) in enumerate(zip(old.statuses, new.statuses)):
        if a != b:
            assert b == "undefined" and "tmp_s" in model.overflowed_into(new.case, new.plan)[i]


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
