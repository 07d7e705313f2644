"""Kernel model of FlashInfer's batch *paged* prefill (fa2, fa3), as small pure functions.

A model, not the kernel: each function mirrors named lines of the flashinfer sources and is
held to the real kernel by ``tests/test_recordings.py`` (every committed GPU recording).
Docstrings cite 0.6.12's line, then 0.7.2.post1's. Every modelled version's lines, with a verdict
per fact, are data in :mod:`swa_repro.kernel.sources` (``docs/flashinfer_versions.md``): the formulas
are the same in substance in all of them; what differs is in :data:`VERSION_FACTS`.

Positions: request with ``qo_len`` queries and ``kv_len`` keys; query row ``q`` sits at absolute
position ``kv_len - qo_len + q``. GQA packs rows as ``packed = q * group + head_in_group``.

The *ragged* prefill kernel is this model at page size 1: it starts each CTA where the paged one
does (0.7.2 prefill.cuh:3037-3043 ragged, :3826-3831 paged) and is planned by the same scheduler
with page size 1 (0.6.12 prefill.py:3162). ``kernel.wrappers.RaggedModelWrapper`` and
``sglang.audit.keys`` use it so; an H100 run of Gemma-2's ragged calls on fa2 agrees
(``recordings/family-live/0.5.23/call-20261205T1844-h100-gemma2-ragged-eagle``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from swa_repro.core.case import Case
from swa_repro.core.intervals import Intervals, IntervalsView, ceil_div, status_of
from swa_repro.kernel import partials

INT64_MAX = np.iinfo(np.int64).max
# cudaDevAttrMaxSharedMemoryPerMultiprocessor / ...PerBlockOptin on sm80 and sm90 parts.
SMEM_PER_SM = {(8, 0): 167936, (9, 0): 233472}
SMEM_OPTIN = {(8, 0): 166912, (9, 0): 232448}


# ----------------------------------------------------------------------------- per version
@dataclass(frozen=True)
class VersionFacts:
    """What the model must know about one flashinfer release beyond the shared algorithm."""
    kv_tile_optin_cap: bool  # NUM_MMA_KV's smem budget capped by the per-block opt-in (0.6.14 prefill.cuh:3680)
    partial_rows_per_group: bool  # tmp_v/tmp_s rows divided by the GQA group (0.7.2 scheduler.cuh:876-888)


VERSION_FACTS: dict[str, VersionFacts] = {
    "0.6.7.post2": VersionFacts(kv_tile_optin_cap=False, partial_rows_per_group=False),
    "0.6.11.post1": VersionFacts(kv_tile_optin_cap=False, partial_rows_per_group=False),
    "0.6.12": VersionFacts(kv_tile_optin_cap=False, partial_rows_per_group=False),
    "0.6.14": VersionFacts(kv_tile_optin_cap=True, partial_rows_per_group=False),
    "0.6.18": VersionFacts(kv_tile_optin_cap=True, partial_rows_per_group=False),
    "0.7.2": VersionFacts(kv_tile_optin_cap=True, partial_rows_per_group=True),
    "0.7.2.post1": VersionFacts(kv_tile_optin_cap=True, partial_rows_per_group=True),
}


def version_facts(version: str) -> VersionFacts:
    try:
        return VERSION_FACTS[version]
    except KeyError:
        raise ValueError(f"flashinfer {version!r} has no VERSION_FACTS entry; modelled: "
                         f"{', '.join(VERSION_FACTS)}") from None


# ----------------------------------------------------------------------------- plan time
def use_sliding_window(plan_window_left: int) -> bool:
    """The compiled module is picked from ``window_left >= 0`` at plan (prefill.py:2035 / :3689)."""
    return plan_window_left >= 0


def fa2_cta_tile_q(avg_packed_qo_len: int, head_dim: int, arch=(9, 0)) -> int:
    """FA2DetermineCtaTileQ (utils.cuh:384 / 411). The head_dim >= 512 branches (0.6.14+) and the
    smem probe on the 16 branch (0.6.18+) change nothing for head_dim <= 256 at 2-byte KV: the probe
    needs at most 16*256*2 + 512*64*2 = 73728 B, which every sm80+ part has."""
    if avg_packed_qo_len > 64 and head_dim < 256:
        return 128
    if arch[0] >= 8:
        return 64 if avg_packed_qo_len > 16 else 16
    return 64


def max_batch_size_if_split(sm_count: int, num_kv_heads: int) -> int:
    """2 CTAs per SM, divided over KV heads (scheduler.cuh:717-720 / 788-791)."""
    return (2 * sm_count) // num_kv_heads


def min_kv_chunk_size(page_size: int) -> int:
    """In pages (scheduler.cuh:527 / 579)."""
    return max(128 // page_size, 1)


def effective_kv_pages(kv_pages: int, plan_window_left: int, cta_tile_q: int, page_size: int) -> int:
    """Pages a request can need: the window padded by one query tile (scheduler.cuh:561 / 631)."""
    if plan_window_left >= 0:
        return min(ceil_div(plan_window_left + cta_tile_q, page_size), kv_pages)
    return kv_pages


def binary_search_kv_chunk_size(max_bs: int, packed_qo_lens, kv_pages, cta_tile_q: int, min_chunk: int):
    """PrefillBinarySearchKVChunkSize (scheduler.cuh:101 in both): smallest chunk (pages) whose CTA
    count fits ``max_bs``; split iff that chunk is shorter than the longest request."""
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
    """PrefillSplitQOKVIndptr (scheduler.cuh:495 / 545) for ``enable_cuda_graph=False``."""
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
@dataclass(frozen=True)
class CtaGeometry:
    """One request's FA2 CTA grid at run time, in the manner of flash-attention's
    ``flash_attn/cute/block_info.py``: each method answers one question and returns a range.

    CTA ``(q_tile, kv_tile_idx)`` holds packed rows ``[q_tile*cta_tile_q, (q_tile+1)*cta_tile_q)``
    (packed row ``p`` is query ``p // group``) and KV chunk ``kv_tile_idx``. ``q_tile`` may be an
    int or a numpy array."""
    qo_len: int
    kv_len: int
    cta_tile_q: int
    group: int
    window_left: int  # the run's window (what forward() passed); -1 none
    kv_chunk_size: int = INT64_MAX  # tokens, when partition_kv
    partition_kv: bool = False

    @property
    def window(self) -> int:
        """``variant.window_left``: the run's window, or ``kv_len`` when none (variants.cuh:64, both)."""
        return self.window_left if self.window_left >= 0 else self.kv_len

    def kv_range(self, q_tile):
        """``[start, end)`` keys the query tile may need: from the window start of its *first*
        packed row (``kv_start_idx``, prefill.cuh:2441 / 3826) to the causal end of its last
        (prefill.cuh:2559-2566 / 4036-4043)."""
        start = np.maximum(self.kv_len + (q_tile * self.cta_tile_q) // self.group - (self.qo_len + self.window), 0)
        end = np.minimum(self.kv_len - self.qo_len + ceil_div((q_tile + 1) * self.cta_tile_q, self.group), self.kv_len)
        return start, end

    def chunk(self, q_tile, kv_tile_idx: int):
        """``[chunk_start, chunk_end)`` of CTA ``(q_tile, kv_tile_idx)`` (prefill.cuh:2443-2448 / 3828-3833)."""
        start, _ = self.kv_range(q_tile)
        if not self.partition_kv:
            return start, np.full_like(np.asarray(start), self.kv_len)
        return (np.minimum(kv_tile_idx * self.kv_chunk_size + start, self.kv_len),
                np.minimum((kv_tile_idx + 1) * self.kv_chunk_size + start, self.kv_len))

    def num_chunks_run(self) -> int:
        """Chunk count the kernel writes partial outputs with (prefill.cuh:2727-2728 / 4293-4294):
        sized from the *run's* window, while merge_indptr/o_indptr were sized at plan."""
        return ceil_div(min(max(self.kv_len, 1), self.window + self.cta_tile_q), self.kv_chunk_size)

    def row_bounds(self, q, start, end, swa: bool):
        """Keys ``[lo, hi]`` query row ``q`` sees when its CTAs cover ``[start, end)``: clipped by
        the causal limit (``out_of_boundary``, prefill.cuh:1076 / 1734) and, only when the
        sliding-window module was compiled, by the per-element window (variants.cuh:88-89, both)."""
        pos = self.kv_len - self.qo_len + q
        lo = np.maximum(start, pos - self.window) if swa else start
        return lo, np.minimum(pos, end - 1)

    def num_iterations(self, q_tile: int, chunk, tile_kv: int) -> int:
        """KV tiles of ``tile_kv`` keys the CTA's loop runs over its chunk (prefill.cuh:2559 / 4036)."""
        return ceil_div(max(min(int(chunk[1]), int(self.kv_range(q_tile)[1])) - int(chunk[0]), 0), tile_kv)

    def mask_iteration(self, q_tile: int, chunk, tile_kv: int) -> int:
        """First KV tile that needs the causal element mask (prefill.cuh:2599-2605 / 4076-4082)."""
        size = max(int(chunk[1]) - int(chunk[0]), 0)
        diag = self.kv_len + ceil_div(q_tile * self.cta_tile_q, self.group) - self.qo_len
        return min(size, max(diag - int(chunk[0]), 0)) // tile_kv

    def window_iteration(self, q_tile: int, chunk, tile_kv: int) -> int:
        """KV tiles before this one need the window element mask (prefill.cuh:2594 / 4071)."""
        last = self.kv_len + ceil_div((q_tile + 1) * self.cta_tile_q, self.group)
        return ceil_div(max(last - (self.qo_len + self.window + int(chunk[0])), 0), tile_kv)


def cta_tile_kv(cta_tile_q: int, head_dim: int, arch=(9, 0), version: str = "0.7.2.post1") -> int:
    """KV tile of the FA2 kernel: NUM_MMA_KV * NUM_WARPS_KV * 16 for bf16, no RoPE
    (BatchPrefillWithPagedKVCacheDispatched, prefill.cuh:2914 ff. / 4574 ff.; the opt-in cap per
    :data:`VERSION_FACTS`)."""
    warps_q = 4 if cta_tile_q > 16 else 1
    warps_kv = 4 // warps_q
    mma_q = 2 if cta_tile_q > 64 else 1
    q_bytes = cta_tile_q * head_dim * 2
    kv_bytes = 2 * head_dim * 16 * warps_kv * 2
    smem = SMEM_PER_SM.get(tuple(arch), SMEM_PER_SM[(9, 0)])
    per_tb = smem // (2 if smem >= 2 * (q_bytes + kv_bytes) else 1)
    if version_facts(version).kv_tile_optin_cap:
        per_tb = min(per_tb, SMEM_OPTIN.get(tuple(arch), SMEM_OPTIN[(9, 0)]))
    mma_kv = min((per_tb - q_bytes) // kv_bytes, 8 // mma_q)
    mma_kv = 8 if mma_kv >= 8 else 4 if mma_kv >= 4 else 2 if mma_kv >= 2 else 1
    return mma_kv * warps_kv * 16


def partial_outputs_consistent(qo_len: int, n_plan: int, n_run: int) -> bool:
    """Under split-KV, CTA (row q, chunk k) writes its partial output to slot ``q*n_run + k``
    (prefill.cuh:2736-2738 / 4298-4314, lse at :2755 / :4333) while the merge reads row ``q``'s
    slots ``q*n_plan .. q*n_plan + n_plan - 1`` (merge_indptr/o_indptr, scheduler.cuh:596-599 / 666-669).
    They agree iff the strides agree or the request has a single query row."""
    return n_plan == n_run or qo_len == 1


def geometry(case: Case, plan: Fa2Plan, i: int) -> CtaGeometry:
    """Request ``i``'s CTA grid as run with ``case.window_left`` after ``plan``."""
    return CtaGeometry(case.extend_lens[i], case.kv_lens[i], plan.cta_tile_q, case.group_size, case.window_left,
                       plan.kv_chunk_size, plan.split_kv)


def partial_buffer_rows(case: Case, plan: Fa2Plan) -> int:
    """``R`` of the partial-output buffers (:func:`partials.buffer_rows`), as this version sizes it."""
    ctas = sum(t * n for t, n in zip(plan.num_q_tiles, plan.num_chunks))
    return partials.buffer_rows(ctas, plan.cta_tile_q, case.group_size,
                                version_facts(case.flashinfer_version).partial_rows_per_group)


def overflowed_into(case: Case, plan: Fa2Plan) -> dict[int, str]:
    """Requests another request's split-KV writes overrun, and how (:func:`partials.overruns`)."""
    if not plan.split_kv:
        return {}
    runs = [geometry(case, plan, i).num_chunks_run() for i in range(case.batch_size)]
    return partials.overruns(case.extend_lens, plan.num_chunks, runs, partial_buffer_rows(case, plan), case.head_dim)


# ----------------------------------------------------------------------------- per request
@dataclass
class RequestModel(IntervalsView):
    """One request as the model predicts it. ``intervals`` columns are heads-in-group ``(qo, group)``
    (every KV head sees the same); ``status``/``reason`` by :func:`~swa_repro.core.intervals.status_of`."""
    intervals: Intervals
    window_left: int  # intended (the layer's)
    status: str
    reason: str
    kv_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (q_tiles,) per CTA
    tiles: np.ndarray | None = None  # (q_tiles, kv_len) int8: 0 skipped, 1 masked, 2 unmasked
    num_chunks_plan: int = 1
    num_chunks_run: int = 1

    def extra_keys(self) -> np.ndarray:
        """``(qo,)`` keys outside the window attended, the most any head-in-group of the row sees
        (:meth:`Intervals.diff`)."""
        return self.intervals.diff(self.window_left)[0].max(1)


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
    overrun = overflowed_into(case, plan)
    reqs = [_fa2_request(case, plan, i, tiles, overrun.get(i)) for i in range(case.batch_size)]
    return ModelResult(case, "fa2", plan, reqs)


def model_intervals(case: Case) -> list[Intervals]:
    """Per request, the model's intervals with one column per query head (what a probe reads)."""
    return [r.intervals.per_qo_head(case.num_qo_heads) for r in simulate(case).requests]


def _fa3_request(case: Case, prefix_len: int, extend_len: int) -> RequestModel:
    """FA3 (sm90) masks per element from the module chosen at plan: without the sliding-window
    module the window is ignored entirely, i.e. plain causal attention."""
    applied = case.window_left if use_sliding_window(case.plan_window_left) else -1
    iv = Intervals.intended(prefix_len, extend_len, applied, heads=case.group_size)
    status, reason = status_of(iv, case.window_left)
    if status != "exact":
        reason = "fa3 module compiled without the window: plain causal; " + reason
    return RequestModel(iv, case.window_left, status, reason)


def _fa2_request(case: Case, plan: Fa2Plan, i: int, tiles: bool, overrun: str | None) -> RequestModel:
    geo, g, cta = geometry(case, plan, i), case.group_size, plan.cta_tile_q
    packed = np.arange(geo.qo_len * g).reshape(geo.qo_len, g)  # (qo, g)
    t = packed // cta  # q tile of each packed row
    q_tiles = np.arange(plan.num_q_tiles[i])
    kv_start, _ = geo.kv_range(q_tiles)  # (q_tiles,)
    n_plan = plan.num_chunks[i] if plan.split_kv else 1
    n_run = geo.num_chunks_run() if plan.split_kv else 1
    # union over this CTA row's chunks k < n_plan of [chunk_start, chunk_end)
    start, _ = geo.chunk(q_tiles, 0)
    _, end = geo.chunk(q_tiles, n_plan - 1)
    lo, hi = geo.row_bounds(packed // g, start[t], end[t], plan.use_sliding_window)
    iv = Intervals(case.prefix_lens[i], geo.qo_len, lo, hi)
    broken = None if partial_outputs_consistent(geo.qo_len, n_plan, n_run) else (
        f"split-KV: plan sized {n_plan} KV chunks of {plan.kv_chunk_size} keys for this request, the kernel "
        f"writes partial outputs with a stride of {n_run} chunks (window {geo.window_left} + CTA_TILE_Q {cta}); "
        "the merge then reads slots other CTAs wrote (a race) or nobody wrote")
    broken = broken or (overrun and "split-KV: " + overrun)
    status, reason = status_of(iv, case.window_left, broken)
    if status == "leak" and not plan.use_sliding_window:
        reason = (f"window element mask compiled out; each CTA of {cta} packed rows starts at the window "
                  f"start of its first row, so later rows see up to {cta // g - 1} extra keys; " + reason)
    tile_map = _fa2_tile_map(case, geo, kv_start, n_plan) if tiles else None
    return RequestModel(iv, case.window_left, status, reason, kv_start, tile_map, n_plan, n_run)


def _fa2_tile_map(case: Case, geo: CtaGeometry, kv_start, n_chunks: int) -> np.ndarray:
    """(q_tiles, kv_len) int8: 0 skipped, 1 computed with the element mask, 2 without it."""
    tkv = cta_tile_kv(geo.cta_tile_q, case.head_dim, case.arch, case.flashinfer_version)
    out = np.zeros((len(kv_start), geo.kv_len), np.int8)
    for t in range(len(kv_start)):
        for k in range(n_chunks):
            chunk = tuple(int(x) for x in geo.chunk(t, k))
            mask_from, window_until = geo.mask_iteration(t, chunk, tkv), geo.window_iteration(t, chunk, tkv)
            for it in range(geo.num_iterations(t, chunk, tkv)):
                a, b = chunk[0] + it * tkv, min(chunk[0] + (it + 1) * tkv, geo.kv_len)
                out[t, a:b] = 1 if (it >= mask_from or it < window_until) else 2
    return out
