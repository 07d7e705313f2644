"""Kernel model of FlashInfer's batch *paged* prefill (fa2, fa3), as small pure functions.

A model, not the kernel: each function mirrors named lines of the flashinfer sources and is
held to the real kernel by ``tests/test_recordings.py`` (every committed GPU recording).
Line numbers are for the wheels' ``flashinfer/data/include/flashinfer`` (``inc/``) and
``flashinfer/`` (python) trees, 0.6.12 first, then 0.7.2.post1:

========================  ==========================================  ===================
what                      0.6.12                                      0.7.2.post1
========================  ==========================================  ===================
module choice at plan      prefill.py:2035 ``window_left >= 0``        prefill.py:3689
forward overwrites window  prefill.py:2136                             prefill.py:3969
run() consistency assert   prefill.py:2317                             prefill.py:4313
CTA_TILE_Q                 inc/utils.cuh:384 FA2DetermineCtaTileQ      inc/utils.cuh:411
split-KV chunk search      inc/attention/scheduler.cuh:101             scheduler.cuh:101
min chunk, eff. kv length  scheduler.cuh:527, 561                      scheduler.cuh:579, 631
max_batch_size_if_split    scheduler.cuh:717-720                       scheduler.cuh:788-791
per-CTA kv_start, chunk    inc/attention/prefill.cuh:2441-2448         prefill.cuh:3826-3833
mask / window iterations   prefill.cuh:2594-2605, applied 2662         prefill.cuh:4071-4082, 4182
run-time chunk count       prefill.cuh:2727-2728                       prefill.cuh:4293-4294
window element mask        inc/attention/variants.cuh:64, 88-89        variants.cuh:64, 88-89
NUM_MMA_KV (CTA_TILE_KV)   prefill.cuh:2914 ff.                        prefill.cuh:4574 ff.
========================  ==========================================  ===================

Positions: request with ``qo_len`` queries and ``kv_len`` keys; query row ``q`` sits at absolute
position ``kv_len - qo_len + q``. GQA packs rows as ``packed = q * group + head_in_group``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from swa_repro.core.case import Case
from swa_repro.core.reference import intended_interval, intended_mask, interval_to_mask

INT64_MAX = np.iinfo(np.int64).max
# cudaDevAttrMaxSharedMemoryPerMultiprocessor / ...PerBlockOptin on sm80 and sm90 parts.
SMEM_PER_SM = {(8, 0): 167936, (9, 0): 233472}
SMEM_OPTIN = {(8, 0): 166912, (9, 0): 232448}


def ceil_div(a, b):
    return -(-a // b)


# ----------------------------------------------------------------------------- plan time
def use_sliding_window(plan_window_left: int) -> bool:
    """The compiled module is picked from ``window_left >= 0`` at plan (prefill.py:2035)."""
    return plan_window_left >= 0


def fa2_cta_tile_q(avg_packed_qo_len: int, head_dim: int, arch=(9, 0)) -> int:
    """FA2DetermineCtaTileQ (utils.cuh:384 / 411); on sm80+ the 0.7.2 smem probe keeps 16 for
    head_dim <= 256 at 2-byte KV (16*256*2 + 512*64*2 = 73728 B fits 227 KB)."""
    if avg_packed_qo_len > 64 and head_dim < 256:
        return 128
    if arch[0] >= 8:
        return 64 if avg_packed_qo_len > 16 else 16
    return 64


def max_batch_size_if_split(sm_count: int, num_kv_heads: int) -> int:
    """2 CTAs per SM, divided over KV heads (scheduler.cuh:717-720)."""
    return (2 * sm_count) // num_kv_heads


def min_kv_chunk_size(page_size: int) -> int:
    """In pages (scheduler.cuh:527)."""
    return max(128 // page_size, 1)


def effective_kv_pages(kv_pages: int, plan_window_left: int, cta_tile_q: int, page_size: int) -> int:
    """Pages a request can need: the window padded by one query tile (scheduler.cuh:561)."""
    if plan_window_left >= 0:
        return min(ceil_div(plan_window_left + cta_tile_q, page_size), kv_pages)
    return kv_pages


def binary_search_kv_chunk_size(max_bs: int, packed_qo_lens, kv_pages, cta_tile_q: int, min_chunk: int):
    """PrefillBinarySearchKVChunkSize (scheduler.cuh:101): smallest chunk (pages) whose CTA count
    fits ``max_bs``; split iff that chunk is shorter than the longest request."""
    max_kv = max([1, *kv_pages])
    low, high = min_chunk, max_kv
    q_tiles = [ceil_div(p, cta_tile_q) for p in packed_qo_lens]
    while low < high:
        mid = (low + high) // 2
        n = sum(t * ceil_div(max(kv, 1), mid) for t, kv in zip(q_tiles, kv_pages))
        if n > max_bs:
            low = mid + 1
        else:
            high = mid
    return low < max_kv, low


@dataclass
class Fa2Plan:
    use_sliding_window: bool
    cta_tile_q: int
    split_kv: bool
    kv_chunk_size: int  # tokens; meaningful only when split_kv
    num_chunks: list[int]  # per request, as planned (merge_indptr / o_indptr strides)
    num_q_tiles: list[int]


def fa2_plan(case: Case) -> Fa2Plan:
    """PrefillSplitQOKVIndptr (scheduler.cuh:495) for ``enable_cuda_graph=False``."""
    g = case.group_size
    packed = [e * g for e in case.extend_lens]
    kv_pages = [ceil_div(kv, case.page_size) for kv in case.kv_lens]
    cta = fa2_cta_tile_q(sum(packed) // case.batch_size, case.head_dim, case.arch)
    eff = [effective_kv_pages(p, case.plan_window_left, cta, case.page_size) for p in kv_pages]
    split = False
    if case.disable_split_kv:
        chunk_pages = INT64_MAX
    elif case.fixed_split_size > 0:
        chunk_pages = case.fixed_split_size
    else:
        split, chunk_pages = binary_search_kv_chunk_size(
            max_batch_size_if_split(case.sm_count, case.num_kv_heads), packed, eff, cta,
            min_kv_chunk_size(case.page_size))
    num_chunks = [1 if case.disable_split_kv else ceil_div(max(e, 1), chunk_pages) for e in eff]
    if case.fixed_split_size > 0 and not case.disable_split_kv:
        split = any(n > 1 for n in num_chunks)
    chunk_tokens = chunk_pages * case.page_size if chunk_pages != INT64_MAX else INT64_MAX
    return Fa2Plan(use_sliding_window(case.plan_window_left), cta, split, chunk_tokens, num_chunks,
                   [ceil_div(p, cta) for p in packed])


# ----------------------------------------------------------------------------- run time, per CTA
def kernel_window(window_left: int, kv_len: int) -> int:
    """``variant.window_left``: the run's window, or ``kv_len`` when none (variants.cuh:64)."""
    return window_left if window_left >= 0 else kv_len


def cta_kv_start(kv_len, qo_len, q_tile, cta_tile_q, group, window_left):
    """First key of a CTA's KV loop: the window start of its *first* packed row (prefill.cuh:2441).
    Works on numpy arrays of ``q_tile``."""
    w = kernel_window(window_left, kv_len)
    return np.maximum(kv_len + (q_tile * cta_tile_q) // group - (qo_len + w), 0)


def cta_chunk(kv_len, kv_start, kv_tile_idx, kv_chunk_size, partition_kv: bool):
    """``[chunk_start, chunk_end)`` of one CTA (prefill.cuh:2443-2448)."""
    if not partition_kv:
        return kv_start, np.full_like(np.asarray(kv_start), kv_len)
    start = np.minimum(kv_tile_idx * kv_chunk_size + kv_start, kv_len)
    end = np.minimum((kv_tile_idx + 1) * kv_chunk_size + kv_start, kv_len)
    return start, end


def run_num_kv_chunks(kv_len: int, window_left: int, cta_tile_q: int, kv_chunk_size: int) -> int:
    """Chunk count the kernel writes partial outputs with (prefill.cuh:2727): sized from the
    *run's* window, while merge_indptr/o_indptr were sized at plan."""
    return ceil_div(min(max(kv_len, 1), kernel_window(window_left, kv_len) + cta_tile_q), kv_chunk_size)


def row_interval(kv_len, qo_len, q, union_start, union_end, window_left, swa: bool):
    """Keys ``[lo, hi]`` one packed row sees: loop range clipped by the causal limit and, only when
    the sliding-window module was compiled, by the per-element window (variants.cuh:88-89;
    out_of_boundary at prefill.cuh:1076)."""
    pos = kv_len - qo_len + q
    lo = union_start
    if swa:
        lo = np.maximum(lo, pos - kernel_window(window_left, kv_len))
    hi = np.minimum(pos, union_end - 1)
    return lo, hi


def cta_tile_kv(cta_tile_q: int, head_dim: int, arch=(9, 0), version: str = "0.7.2.post1") -> int:
    """KV tile of the FA2 kernel: NUM_MMA_KV * NUM_WARPS_KV * 16 for bf16, no RoPE
    (BatchPrefillWithPagedKVCacheDispatched; 0.7.2 also caps by the opt-in limit)."""
    warps_q = 4 if cta_tile_q > 16 else 1
    warps_kv = 4 // warps_q
    mma_q = 2 if cta_tile_q > 64 else 1
    q_bytes = cta_tile_q * head_dim * 2
    kv_bytes = 2 * head_dim * 16 * warps_kv * 2
    smem = SMEM_PER_SM.get(tuple(arch), SMEM_PER_SM[(9, 0)])
    per_tb = smem // (2 if smem >= 2 * (q_bytes + kv_bytes) else 1)
    if version != "0.6.12":
        per_tb = min(per_tb, SMEM_OPTIN.get(tuple(arch), SMEM_OPTIN[(9, 0)]))
    mma_kv = min((per_tb - q_bytes) // kv_bytes, 8 // mma_q)
    mma_kv = 8 if mma_kv >= 8 else 4 if mma_kv >= 4 else 2 if mma_kv >= 2 else 1
    return mma_kv * warps_kv * 16


def cta_iterations(kv_len, qo_len, q_tile, cta_tile_q, group, window_left, chunk_start, chunk_end, tile_kv):
    """``(num_iterations, mask_iteration, window_iteration)`` of one CTA (prefill.cuh:2559-2605):
    KV tile ``i`` (keys ``chunk_start + i*tile_kv ...``) runs the element mask iff
    ``i >= mask_iteration or i < window_iteration``."""
    size = max(chunk_end - chunk_start, 0)
    causal_end = kv_len - qo_len + ceil_div((q_tile + 1) * cta_tile_q, group)
    n_iter = ceil_div(min(size, max(causal_end - chunk_start, 0)), tile_kv)
    w = kernel_window(window_left, kv_len)
    win_iter = ceil_div(max(kv_len + ceil_div((q_tile + 1) * cta_tile_q, group) - (qo_len + w + chunk_start), 0),
                        tile_kv)
    mask_iter = min(size, max(kv_len + ceil_div(q_tile * cta_tile_q, group) - qo_len - chunk_start, 0)) // tile_kv
    return n_iter, mask_iter, win_iter


def partial_outputs_consistent(qo_len: int, n_plan: int, n_run: int) -> bool:
    """Under split-KV, CTA (row q, chunk k) writes its partial output to slot ``q*n_run + k``
    (prefill.cuh:2733-2735, lse at :2755) while the merge reads row ``q``'s slots
    ``q*n_plan .. q*n_plan + n_plan - 1`` (merge_indptr/o_indptr, scheduler.cuh:596-599).
    They agree iff the strides agree or the request has a single query row."""
    return n_plan == n_run or qo_len == 1


def overflowed_into(case: Case, plan: "Fa2Plan") -> set[int]:
    """Requests whose partial-output slots an earlier request overruns: with ``n_run > n_plan``
    (planned with a window, run without) row q's slots reach past ``qo_len * n_plan``."""
    if not plan.split_kv:
        return set()
    hit: set[int] = set()
    for i, (qo, kv) in enumerate(zip(case.extend_lens, case.kv_lens)):
        n_run = run_num_kv_chunks(kv, case.window_left, plan.cta_tile_q, plan.kv_chunk_size)
        if (qo - 1) * n_run + plan.num_chunks[i] > qo * plan.num_chunks[i]:
            hit.update(range(i + 1, case.batch_size))
    return hit


# ----------------------------------------------------------------------------- per request
STATUSES = ("exact", "leak", "undefined")


@dataclass
class RequestModel:
    prefix_len: int
    extend_len: int
    window_left: int  # intended (the layer's)
    lo: np.ndarray  # (qo, group) first visible key per query row and head-in-group
    hi: np.ndarray  # (qo, group) last visible key
    status: str
    reason: str
    kv_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (q_tiles,) per CTA
    tiles: np.ndarray | None = None  # (q_tiles, kv_len) int8: 0 skipped, 1 masked, 2 unmasked
    num_chunks_plan: int = 1
    num_chunks_run: int = 1

    @property
    def kv_len(self) -> int:
        return self.prefix_len + self.extend_len

    def intended(self) -> np.ndarray:
        return intended_mask(self.prefix_len, self.extend_len, self.window_left)

    def mask(self, head: int | None = None) -> np.ndarray:
        """Effective mask ``(qo, kv)`` of head-in-group ``head``; ``None``: union over heads."""
        if head is not None:
            return interval_to_mask(self.lo[:, head], self.hi[:, head], self.kv_len)
        return interval_to_mask(self.lo.min(1), self.hi.max(1), self.kv_len) if _heads_nested(self) else \
            np.any([interval_to_mask(self.lo[:, h], self.hi[:, h], self.kv_len) for h in range(self.lo.shape[1])], 0)

    def extra_keys(self) -> np.ndarray:
        """Per query row (union over heads): keys seen that the window excludes."""
        ilo, ihi = intended_interval(self.prefix_len, self.extend_len, self.window_left)
        return np.maximum(ilo - self.lo.min(1), 0) + np.maximum(self.hi.max(1) - ihi, 0)

    def missing_keys(self) -> np.ndarray:
        ilo, ihi = intended_interval(self.prefix_len, self.extend_len, self.window_left)
        lo, hi = self.lo.max(1), self.hi.min(1)
        return np.maximum(lo - ilo, 0) + np.maximum(ihi - hi, 0)


def _heads_nested(r: RequestModel) -> bool:
    """Union of per-head intervals is itself an interval when they overlap (always true here,
    since every head keeps its causal key)."""
    return bool(np.all(r.lo.max(1) <= r.hi.min(1) + 1))


def _status(lo, hi, prefix_len, extend_len, window_left):
    ilo, ihi = intended_interval(prefix_len, extend_len, window_left)
    if np.all(lo == ilo[:, None]) and np.all(hi == ihi[:, None]):
        return "exact", "effective mask equals the intended window"
    extra = int((np.maximum(ilo[:, None] - lo, 0)).sum())
    missing = int((np.maximum(lo - ilo[:, None], 0) + np.maximum(ihi[:, None] - hi, 0)).sum())
    return "leak", f"{extra} (query row, head) x key pairs outside the window are attended, {missing} in-window pairs dropped"


@dataclass
class ModelResult:
    case: Case
    backend: str  # resolved: fa2 | fa3
    plan: Fa2Plan | None
    requests: list[RequestModel]

    @property
    def statuses(self) -> list[str]:
        return [r.status for r in self.requests]

    def summary(self) -> dict:
        p = self.plan
        return {
            "backend": self.backend,
            "use_sliding_window": use_sliding_window(self.case.plan_window_left),
            "cta_tile_q": p.cta_tile_q if p else None,
            "split_kv": p.split_kv if p else False,
            "kv_chunk_size": (p.kv_chunk_size if p and p.split_kv else None),
            "status": self.statuses,
            "max_extra_keys_per_row": [int(r.extra_keys().max()) for r in self.requests],
        }


def simulate(case: Case, *, tiles: bool = False) -> ModelResult:
    """Effective masks, statuses and (optionally) the per-CTA tile map of one case, run the
    sglang way: plan with ``case.plan_window_left``, run with ``case.window_left``."""
    backend = case.resolved_backend
    if backend == "fa3":
        return ModelResult(case, "fa3", None, [_fa3_request(case, p, e) for p, e in zip(case.prefix_lens, case.extend_lens)])
    plan = fa2_plan(case)
    reqs = [_fa2_request(case, plan, i, tiles) for i in range(case.batch_size)]
    return ModelResult(case, "fa2", plan, reqs)


def _fa3_request(case: Case, prefix_len: int, extend_len: int) -> RequestModel:
    """FA3 (sm90) masks per element from the module chosen at plan: without the sliding-window
    module the window is ignored entirely, i.e. plain causal attention."""
    kv_len = prefix_len + extend_len
    pos = np.arange(prefix_len, kv_len)[:, None].repeat(case.group_size, 1)
    if use_sliding_window(case.plan_window_left) and case.window_left >= 0:
        lo = np.maximum(pos - case.window_left, 0)
    else:
        lo = np.zeros_like(pos)
    status, reason = _status(lo, pos, prefix_len, extend_len, case.window_left)
    if status != "exact":
        reason = "fa3 module compiled without the window: plain causal; " + reason
    return RequestModel(prefix_len, extend_len, case.window_left, lo, pos.copy(), status, reason)


def _fa2_request(case: Case, plan: Fa2Plan, i: int, tiles: bool) -> RequestModel:
    prefix_len, qo_len, kv_len, g = case.prefix_lens[i], case.extend_lens[i], case.kv_lens[i], case.group_size
    cta, w = plan.cta_tile_q, case.window_left
    packed = np.arange(qo_len * g).reshape(qo_len, g)  # (qo, g)
    q = packed // g
    t = packed // cta  # q tile of each packed row
    n_tiles = plan.num_q_tiles[i]
    kv_start = cta_kv_start(kv_len, qo_len, np.arange(n_tiles), cta, g, w)  # (q_tiles,)
    n_plan = plan.num_chunks[i] if plan.split_kv else 1
    n_run = run_num_kv_chunks(kv_len, w, cta, plan.kv_chunk_size) if plan.split_kv else 1
    # union over this CTA row's chunks k < n_plan of [chunk_start, chunk_end)
    s0, _ = cta_chunk(kv_len, kv_start, 0, plan.kv_chunk_size, plan.split_kv)
    _, e_last = cta_chunk(kv_len, kv_start, n_plan - 1, plan.kv_chunk_size, plan.split_kv)
    lo, hi = row_interval(kv_len, qo_len, q, s0[t], np.asarray(e_last)[t], w, plan.use_sliding_window)
    if not partial_outputs_consistent(qo_len, n_plan, n_run) or i in overflowed_into(case, plan):
        status = "undefined"
        reason = (f"split-KV: plan sized {n_plan} KV chunks of {plan.kv_chunk_size} keys for this request, "
                  f"the kernel writes partial outputs with a stride of {n_run} chunks (window {w} + CTA_TILE_Q {cta}); "
                  "the merge then reads slots other CTAs wrote (a race) or nobody wrote")
    else:
        status, reason = _status(lo, hi, prefix_len, qo_len, w)
        if status == "leak" and not plan.use_sliding_window:
            reason = (f"window element mask compiled out; each CTA of {cta} packed rows starts at the window "
                      f"start of its first row, so later rows see up to {cta // g - 1} extra keys; " + reason)
    tile_map = _fa2_tile_map(case, plan, kv_len, qo_len, kv_start, n_plan) if tiles else None
    return RequestModel(prefix_len, qo_len, w, lo, hi, status, reason, kv_start, tile_map, n_plan, n_run)


def _fa2_tile_map(case, plan, kv_len, qo_len, kv_start, n_chunks) -> np.ndarray:
    """(q_tiles, kv_len) int8: 0 skipped, 1 computed with the element mask, 2 without it."""
    g, cta, w = case.group_size, plan.cta_tile_q, case.window_left
    tkv = cta_tile_kv(cta, case.head_dim, case.arch, case.flashinfer_version)
    out = np.zeros((len(kv_start), kv_len), np.int8)
    for t, s in enumerate(kv_start.tolist()):
        for k in range(n_chunks):
            cs, ce = (int(x) for x in cta_chunk(kv_len, s, k, plan.kv_chunk_size, plan.split_kv))
            n_iter, mask_iter, win_iter = cta_iterations(kv_len, qo_len, t, cta, g, w, cs, ce, tkv)
            for it in range(n_iter):
                a, b = cs + it * tkv, min(cs + (it + 1) * tkv, kv_len)
                out[t, a:b] = 1 if (it >= mask_iter or it < win_iter) else 2
    return out
