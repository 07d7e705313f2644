import math

import numpy as np
import torch

from swa_repro.core.reference import intended_interval, intended_mask, interval_to_mask, masked_attention, visible


def test_visibility_convention():
    assert visible(10, 10, 4) and visible(10, 6, 4) and not visible(10, 5, 4) and not visible(10, 11, 4)
    assert visible(10, 0, -1) and not visible(10, 11, -1)


def test_intended_mask_and_interval_agree():
    for p, e, w in [(0, 12, 4), (5, 3, 0), (100, 20, 1000), (7, 7, -1)]:
        m = intended_mask(p, e, w)
        assert m.shape == (e, p + e)
        lo, hi = intended_interval(p, e, w)
        assert np.array_equal(interval_to_mask(lo, hi, p + e), m)


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
