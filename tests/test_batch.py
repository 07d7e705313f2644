import torch

from swa_repro.core.batch import build_paged_batch, random_inputs
from swa_repro.core.case import Case


def test_round_trip_through_shuffled_pages():
    case = Case((0, 37, 5), (6, 20, 1), num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16)
    qs, ks, vs = random_inputs(case, seed=3, dtype=torch.float32)
    b = build_paged_batch(qs, ks, vs, case.page_size, seed=7)
    assert b.qo_indptr.tolist() == [0, 6, 26, 27]
    assert b.kv_indptr.tolist() == [0, 1, 5, 6]
    assert b.last_page_len.tolist() == [6, 9, 6]
    assert sorted(b.kv_indices.tolist()) != b.kv_indices.tolist()  # pages really shuffled
    for i in range(case.batch_size):
        k, v = b.request_kv(i)
        assert torch.equal(k, ks[i]) and torch.equal(v, vs[i])
    assert torch.equal(b.q, torch.cat(qs))


def test_page_size_one():
    case = Case((3,), (2,), page_size=1)
    qs, ks, vs = random_inputs(case)
    b = build_paged_batch(qs, ks, vs, 1)
    assert b.kv_indptr.tolist() == [0, 5] and b.last_page_len.tolist() == [1]
    k, _ = b.request_kv(0)
    assert torch.equal(k, ks[0])
