"""Dense per-request K/V -> FlashInfer's paged layout (NHD), with pages in shuffled order.

The fields are exactly what ``BatchPrefillWithPagedKVCacheWrapper.plan()`` takes:
``qo_indptr`` (tokens), ``kv_indptr`` (pages), ``kv_indices`` (page ids), ``last_page_len``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from swa_repro.core.case import Case

# Page order (``build_paged_batch(seed=...)``) of every batch a kernel run is compared on: the
# probe's zero batch, its random-data batch and ``live.run_live``'s share one layout.
LAYOUT_SEED = 0


@dataclass
class PagedBatch:
    q: torch.Tensor  # (total_qo, Hq, D)
    k_cache: torch.Tensor  # (num_pages, page_size, Hk, D)
    v_cache: torch.Tensor  # (num_pages, page_size, Hk, D)
    qo_indptr: torch.Tensor  # (B+1,) int32
    kv_indptr: torch.Tensor  # (B+1,) int32, in pages
    kv_indices: torch.Tensor  # (nnz_pages,) int32
    last_page_len: torch.Tensor  # (B,) int32
    page_size: int

    def to(self, device) -> "PagedBatch":
        return PagedBatch(*(getattr(self, f).to(device) for f in
                            ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "last_page_len")),
                          self.page_size)

    def request_kv(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather request ``i``'s dense K/V back from the pages: ``(kv, Hk, D)`` each."""
        pages = self.kv_indices[self.kv_indptr[i]: self.kv_indptr[i + 1]].long()
        n = (len(pages) - 1) * self.page_size + int(self.last_page_len[i]) if len(pages) else 0
        k = self.k_cache[pages].reshape(-1, *self.k_cache.shape[2:])[:n]
        v = self.v_cache[pages].reshape(-1, *self.v_cache.shape[2:])[:n]
        return k, v


def build_paged_batch(qs, ks, vs, page_size: int, *, shuffle: bool = True, seed: int = 0,
                      device="cpu", spare_pages: int = 1) -> PagedBatch:
    """Lay per-request dense ``q (qo,Hq,D)``, ``k/v (kv,Hk,D)`` into a paged cache.

    Pages are handed out in a seeded random order (and ``spare_pages`` unused pages are added)
    so that a kernel that ignored ``kv_indices`` would be caught.
    """
    if not ks:
        raise ValueError("empty batch")
    hk, d = ks[0].shape[1:]
    n_pages = [max(1, math.ceil(k.shape[0] / page_size)) for k in ks]
    total = sum(n_pages) + spare_pages
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(total, generator=gen) if shuffle else torch.arange(total)
    dtype = ks[0].dtype
    k_cache = torch.zeros(total, page_size, hk, d, dtype=dtype)
    v_cache = torch.zeros(total, page_size, hk, d, dtype=dtype)
    kv_indices, kv_indptr, qo_indptr, last = [], [0], [0], []
    cursor = 0
    for q, k, v, n in zip(qs, ks, vs, n_pages):
        ids = order[cursor: cursor + n]
        cursor += n
        for j, pid in enumerate(ids.tolist()):
            sl = slice(j * page_size, min((j + 1) * page_size, k.shape[0]))
            k_cache[pid, : sl.stop - sl.start] = k[sl].cpu()
            v_cache[pid, : sl.stop - sl.start] = v[sl].cpu()
        kv_indices += ids.tolist()
        kv_indptr.append(kv_indptr[-1] + n)
        qo_indptr.append(qo_indptr[-1] + q.shape[0])
        last.append(k.shape[0] - (n - 1) * page_size if k.shape[0] else 0)
    i32 = dict(dtype=torch.int32)
    return PagedBatch(
        q=torch.cat([q.cpu() for q in qs]), k_cache=k_cache, v_cache=v_cache,
        qo_indptr=torch.tensor(qo_indptr, **i32), kv_indptr=torch.tensor(kv_indptr, **i32),
        kv_indices=torch.tensor(kv_indices, **i32), last_page_len=torch.tensor(last, **i32),
        page_size=page_size,
    ).to(device)


def random_inputs(case: Case, *, seed: int = 0, dtype=torch.bfloat16, device="cpu"):
    """Seeded per-request q ``(qo,Hq,D)`` and k/v ``(kv,Hk,D)`` for ``case``."""
    gen = torch.Generator().manual_seed(seed)
    qs, ks, vs = [], [], []
    for e, kv in zip(case.extend_lens, case.kv_lens):
        qs.append(torch.randn(e, case.num_qo_heads, case.head_dim, generator=gen).to(dtype).to(device))
        ks.append(torch.randn(kv, case.num_kv_heads, case.head_dim, generator=gen).to(dtype).to(device))
        vs.append(torch.randn(kv, case.num_kv_heads, case.head_dim, generator=gen).to(dtype).to(device))
    return qs, ks, vs
