"""Split-KV partial outputs: where the CTAs write them and what the buffers around them hold.

Under split-KV each CTA writes one partial output row (tmp_v) and LSE (tmp_s) per query row and KV
chunk; the merge then combines row ``q``'s ``n_plan`` slots. The kernel addresses them with the
chunk count of the *run* (``n_run``), the merge and ``o_indptr`` with the plan's. Line numbers:
0.6.12, then 0.7.2.post1; every version's are in :mod:`swa_repro.kernel.sources` (b.5).
"""

from __future__ import annotations

import numpy as np

from swa_repro.core.intervals import ceil_div


def buffer_rows(num_ctas: int, cta_tile_q: int, group: int, per_group: bool) -> int:
    """``R``, the rows tmp_v/tmp_s are sized for: ``padded_batch_size * cta_tile_q``, from 0.7.2
    divided by the GQA group (scheduler.cuh:772-776 / 876-888). ``padded_batch_size`` is the CTA
    count without CUDA graphs (scheduler.cuh:602 / 672). tmp_v is sized in floats but written as
    2-byte DTypeO (prefill.cuh:2914 / 4574), so it holds ``2 R`` partial rows; tmp_s follows it."""
    rows = num_ctas * cta_tile_q
    return ceil_div(rows, group) if per_group else rows


def slots_written(qo_lens, n_plan, n_run) -> tuple[np.ndarray, list[np.ndarray]]:
    """``o_indptr`` ``(batch + 1,)`` as planned (scheduler.cuh:597-599 / 667-669) and, per request,
    the slots its CTAs write: row ``q``, planned chunk ``k`` at ``o_indptr[i] + q*n_run + k``
    (prefill.cuh:2470, 2736-2738 / 3872, 4311-4314; the LSE at the same slot, :2755 / :4333)."""
    o_indptr = np.cumsum([0, *(qo * n for qo, n in zip(qo_lens, n_plan))])
    return o_indptr, [(o_indptr[i] + np.arange(qo)[:, None] * r + np.arange(n)).ravel()
                      for i, (qo, n, r) in enumerate(zip(qo_lens, n_plan, n_run))]


def overruns(qo_lens, n_plan, n_run, rows: int, head_dim: int) -> dict[int, str]:
    """Requests whose merge reads slots another request's CTAs overwrote, and how. Only rows written
    with more chunks than planned (``n_run > n_plan``) can: they reach into later requests' slots,
    and a slot past tmp_v's ``2 R`` rows lands on tmp_s, where one 2-byte row of ``heads x head_dim``
    covers the 4-byte LSEs (``heads`` each) of ``head_dim / 2`` slots from the batch's first on."""
    if all(r <= n for r, n in zip(n_run, n_plan)):
        return {}
    o_indptr, written = slots_written(qo_lens, n_plan, n_run)
    hit = {}
    for i in range(len(qo_lens)):
        if any(w.max() >= o_indptr[j + 1] for j, w in enumerate(written[:i])):
            hit[i] = "an earlier request's partial rows, written with more chunks than planned, overrun its slots"
    spilled = np.unique(np.concatenate(written) - 2 * rows)
    per_row = head_dim // 2
    lse_hit = np.zeros(rows, bool)  # (R,) tmp_s slots a spilled row overwrote
    for s in spilled[(spilled >= 0) & (spilled * per_row < rows)]:
        lse_hit[s * per_row:(s + 1) * per_row] = True
    for i in range(len(qo_lens)):
        if lse_hit[o_indptr[i]:o_indptr[i + 1]].any():
            why = f"partial rows written past tmp_v's {2 * rows} rows (R = {rows}) overwrote its merge LSEs in tmp_s"
            hit[i] = f"{hit[i]}; {why}" if i in hit else why
    return hit
