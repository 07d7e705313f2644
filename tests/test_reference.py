import math

import numpy as np
import pytest
import torch

from swa_repro.core.intervals import Intervals, ceil_div, intended_bounds, nan_max, qo_head_columns, status_of
from swa_repro.core.reference import intended_mask, interval_attention, masked_attention, visible


def test_visibility_convention():
    assert visible(10, 10, 4) and visible(10, 6, 4) and not visible(10, 5, 4) and not visible(10, 11, 4)
    assert visible(10, 0, -1) and not visible(10, 11, -1)


@pytest.mark.parametrize("p,e,w", [(0, 12, 4), (5, 3, 0), (100, 20, 1000), (7, 7, -1)])
def test_element_and_interval_forms_of_the_window_agree(p, e, w):
    m = intended_mask(p, e, w)
    assert m.shape == (e, p + e)
    assert np.array_equal(Intervals.intended(p, e, w).mask(), m)
    lo, hi = intended_bounds(p, e, w)
    assert np.array_equal(lo, m.argmax(1)) and np.array_equal(hi, np.arange(p, p + e))


def test_diff_counts_extra_and_missing_keys_per_row_and_head():
    """Window 2 at prefix 3: rows see [1, 3], [2, 4]. Column 0 exact; column 1 row 0 sees [0, 2]
    (one extra, one missing), row 1 sees nothing (three missing)."""
    iv = Intervals(3, 2, np.array([[1, 0], [2, -1]]), np.array([[3, 2], [4, -1]]))
    extra, missing = iv.diff(2)
    assert extra.tolist() == [[0, 1], [0, 0]] and missing.tolist() == [[0, 1], [0, 3]]
    assert status_of(iv, 2)[0] == "leak" and "1 (query row, head)" in status_of(iv, 2)[1]
    assert status_of(Intervals.intended(3, 2, 2, heads=2), 2)[0] == "exact"
    assert status_of(iv, 2, broken="NaN in 1 rows") == ("undefined", "NaN in 1 rows")
    assert not iv.mask(1)[1].any() and iv.mask().sum(1).tolist() == [4, 3]  # union: [0, 3] and [2, 4]


def test_columns_map_to_query_heads():
    assert qo_head_columns(8, 2).tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    g = Intervals(0, 3, np.array([[0, 1]] * 3), np.array([[0, 1], [1, 1], [2, 2]]))
    hq = g.per_qo_head(4)
    assert hq.heads == 4 and hq.lo[:, 2].tolist() == [0, 0, 0] and g.equals(hq) and hq.equals(g)
    assert not g.equals(Intervals.intended(0, 3, -1, heads=2))
    with pytest.raises(ValueError, match="extend_len"):
        Intervals(0, 4, g.lo, g.hi)


def test_ceil_div_and_nan_max():
    assert ceil_div(7, 2) == 4 and ceil_div(8, 2) == 4 and ceil_div(0, 3) == 0
    assert ceil_div(np.array([1, 16, 17]), 16).tolist() == [1, 1, 2]
    assert nan_max([1.0, np.nan, 3.0]) != nan_max([1.0, np.nan, 3.0])  # NaN is the worst error
    assert nan_max([1.0, np.nan, 3.0], skip_nan=True) == 3.0
    assert nan_max([np.nan], skip_nan=True) is None and nan_max([], empty=0.0) == 0.0


def test_interval_attention_matches_masked_attention():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, h, 32, generator=g) for n, h in ((9, 4), (15, 2), (15, 2)))
    lo = torch.randint(0, 6, (9, 4), generator=g).numpy()
    hi = lo + torch.randint(-1, 9, (9, 4), generator=g).numpy()  # includes empty rows (hi < lo)
    mask = np.stack([(np.arange(15) >= lo[:, h, None]) & (np.arange(15) <= hi[:, h, None]) for h in range(4)])
    ref = masked_attention(q, k, v, mask)
    got = interval_attention(q, k, v, lo, hi, max_elems=50)  # forces several row chunks
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_masked_attention_matches_explicit_softmax():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, h, 8, generator=g) for n, h in ((3, 4), (5, 2), (5, 2)))
    mask = intended_mask(2, 3, 1)
    out = masked_attention(q, k, v, mask)
    assert out.dtype == torch.float64 and out.shape == (3, 4, 8)
    for i in range(3):
        for h in range(4):
            keys = np.nonzero(mask[i])[0]
            s = torch.tensor([float(q[i, h].double() @ k[j, h // 2].double()) / math.sqrt(8) for j in keys])
            p = torch.softmax(s.double(), 0)
            expect = sum(p[n] * v[j, h // 2].double() for n, j in enumerate(keys))
            assert torch.allclose(out[i, h], expect)


def test_empty_rows_are_zero():
    q = torch.randn(2, 1, 4)
    k = v = torch.randn(3, 1, 4)
    out = masked_attention(q, k, v, np.zeros((2, 3), bool))
    assert torch.count_nonzero(out) == 0
