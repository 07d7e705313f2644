"""``audit.rowsets`` (per-row id sets as flat ranges) and ``rows.encode_flat`` against the per-row
Python forms they replace, on random sets: unions, coverage counts, padding, run encoding."""

from __future__ import annotations

import numpy as np
import pytest

from swa_repro.sglang.audit import rows as R
from swa_repro.sglang.audit import rowsets as rs


def random_ranges(rng, n_rows=12, per_row=6, span=60):
    t = rng.integers(0, n_rows, n_rows * per_row) * 3  # sparse row ids
    lo = rng.integers(-2, span, len(t))
    hi = lo + rng.integers(-3, 12, len(t))  # some empty
    return t, lo, hi


def python_sets(t, lo, hi) -> dict:
    out: dict = {}
    for a, b, c in zip(t.tolist(), lo.tolist(), hi.tolist()):
        out.setdefault(a, set()).update(range(b, c + 1))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_union_is_each_rows_merge(seed):
    t, lo, hi = random_ranges(np.random.default_rng(seed))
    u = rs.union(rs.RowRanges(t, lo, hi))
    for row in sorted(set(t.tolist())):
        got = [[int(a), int(b)] for a, b in zip(u.lo[u.t == row], u.hi[u.t == row])]
        assert got == R.merge(zip(lo[t == row], hi[t == row])), row
    assert np.all(np.diff(u.t) >= 0)


@pytest.mark.parametrize("seed", range(8))
def test_covered_and_overlap_count_ids(seed):
    rng = np.random.default_rng(seed)
    t, lo, hi = random_ranges(rng)
    u, sets = rs.union(rs.RowRanges(t, lo, hi)), python_sets(t, lo, hi)
    qt = rng.integers(0, 40, 200)
    qx = rng.integers(-5, 80, 200)
    want = [sum(1 for i in sets.get(a, ()) if i <= x) for a, x in zip(qt.tolist(), qx.tolist())]
    assert rs.covered(u, qt, qx).tolist() == want
    qlo = rng.integers(-5, 80, 200)
    qhi = qlo + rng.integers(-3, 30, 200)
    got = rs.overlap_sizes(u, qt, qlo, qhi).tolist()
    assert got == [len(sets.get(a, set()) & set(range(b, c + 1))) for a, b, c in zip(qt.tolist(), qlo.tolist(),
                                                                                        qhi.tolist())]


def test_padded_lays_rows_out_in_order():
    u = rs.union(rs.RowRanges(np.array([5, 5, 2, 9]), np.array([10, 0, 3, 1]), np.array([12, 4, 3, 1])))
    lo, hi, n = rs.padded(u, np.array([9, 5, 2, 7]))
    assert n.tolist() == [1, 2, 1, 0]
    assert lo.tolist() == [[1, 0], [0, 10], [3, 0], [0, 0]] and hi.tolist() == [[1, 0], [4, 12], [3, 0], [0, 0]]


def _lines_and_flat(rng, n_rows, kinds):
    """Rows along positions with a sliding window, some shape changes, steps that break, gaps."""
    q = np.cumsum(rng.choice([1, 1, 1, 1, 2], n_rows)) + 100
    t = np.arange(n_rows) * 2 + 1
    wt, wlo, whi, st, slo, shi = [], [], [], [], [], []
    for k, (row, p) in enumerate(zip(t.tolist(), q.tolist())):
        kind = kinds[k * len(kinds) // n_rows]
        wt.append(row), wlo.append(max(p - 16, 0)), whi.append(p)
        if kind == "tree" and k % 3 == 0:  # an extra intended id now and then: another shape
            wt.append(row), wlo.append(p + 40), whi.append(p + 40)
        st.append(row), slo.append(0 if kind == "causal" else (p // 8) * 8 - 16), shi.append(p)
        if kind == "leak" and k % 5 == 0:
            st.append(row), slo.append(p + 3), shi.append(p + 3 + k % 2)
    want = rs.union(rs.RowRanges(np.array(wt), np.array(wlo), np.array(whi)))
    seen = rs.union(rs.RowRanges(np.array(st), np.array(slo), np.array(shi)))
    lines = []
    for row, p in zip(t.tolist(), q.tolist()):
        w = [[int(a), int(b)] for a, b in zip(want.lo[want.t == row], want.hi[want.t == row])]
        s = [[int(a), int(b)] for a, b in zip(seen.lo[seen.t == row], seen.hi[seen.t == row])]
        lines.append((p, w, s))
    return q, t, want, seen, lines


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kinds", [("window",), ("causal",), ("window", "leak", "tree", "causal"), ("tree", "leak")])
def test_encode_flat_is_encode(seed, kinds):
    q, t, want, seen, lines = _lines_and_flat(np.random.default_rng(seed), 90, kinds)
    runs = R.encode_flat(q, t, want, seen)
    assert runs == R.encode(lines)
    assert R.decode(runs) == lines
