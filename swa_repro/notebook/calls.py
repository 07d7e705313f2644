"""One ``plan()`` + ``forward()``/``run()`` the way sglang issues it, on the real kernel (live) or
on the CPU stand-in wrapper (model), with each row's error against the float64 reference.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import numpy as np
import torch

from swa_repro.core.case import Case
from swa_repro.core.intervals import nan_max
from swa_repro.kernel.probe import RANDOM_ATOL as TOL  # bf16 output vs float64 attention with the same mask


@dataclass(frozen=True)
class Call:
    """What one call did: ``error`` (e.g. run()'s AssertionError, with the line that raised it) or
    per request the ``(qo,)`` max |o - reference| over heads and dims."""
    api: str
    error: str | None
    err_vs_reference: list = field(default_factory=list)  # per request (qo,) float
    module: dict = field(default_factory=dict)  # uri, use_sliding_window
    plan_info: dict = field(default_factory=dict)  # live: cta_tile_q, split_kv
    err_vs_model: list = field(default_factory=list)  # live only

    @property
    def wrong_rows(self) -> list[int]:
        """Per request: rows over the tolerance ``TOL`` (a NaN row is wrong)."""
        return [int((~(np.asarray(e) <= TOL)).sum()) for e in self.err_vs_reference]

    @property
    def max_err(self) -> list[float]:
        return [nan_max(e, float("nan")) for e in self.err_vs_reference]


def _model_wrapper(case: Case):
    from swa_repro.kernel.wrappers import GpuSpec, ModelPagedPrefillWrapper

    gpu = GpuSpec(sm_count=case.sm_count, arch=case.arch, flashinfer_version=case.flashinfer_version)
    return ModelPagedPrefillWrapper(torch.empty(1, dtype=torch.uint8), "NHD", backend=case.backend, gpu=gpu)


def model_call(case: Case, api: str = "forward", seed: int = 0) -> Call:
    """sglang's calls on the CPU stand-in wrapper: ``plan(window_left=case.plan_window_left)`` then
    ``forward(window_left=W)`` or ``run(window_left=W)``; per-row max error vs the reference."""
    from swa_repro.core.batch import LAYOUT_SEED, build_paged_batch, random_inputs
    from swa_repro.core.intervals import Intervals
    from swa_repro.core.reference import interval_attention, row_max_abs

    qs, ks, vs = random_inputs(case, seed=seed)
    b = build_paged_batch(qs, ks, vs, case.page_size, seed=LAYOUT_SEED)
    w = _model_wrapper(case)
    w.plan(b.qo_indptr, b.kv_indptr, b.kv_indices, b.last_page_len, case.num_qo_heads, case.num_kv_heads,
           case.head_dim, case.page_size, causal=True, window_left=case.plan_window_left,
           q_data_type=torch.bfloat16, disable_split_kv=case.disable_split_kv,
           fixed_split_size=case.fixed_split_size if case.fixed_split_size > 0 else None)
    module = dict(w._module)
    try:
        if api == "forward":
            o = w.forward(b.q, (b.k_cache, b.v_cache), causal=True, window_left=case.window_left)
        else:
            o = w.run(b.q, (b.k_cache, b.v_cache), window_left=case.window_left)
    except AssertionError as e:
        fr = traceback.extract_tb(e.__traceback__)[-1]
        return Call(api, f"AssertionError at {fr.filename.rsplit('/', 1)[-1]}:{fr.lineno}: {fr.line}", [], module)
    qi = b.qo_indptr.tolist()
    ivs = [Intervals.intended(p, e, case.window_left, case.num_qo_heads)  # (qo, Hq)
           for p, e in zip(case.prefix_lens, case.extend_lens)]
    errs = [row_max_abs(o[qi[i]:qi[i + 1]], interval_attention(qs[i], ks[i], vs[i], iv.lo, iv.hi))
            for i, iv in enumerate(ivs)]
    return Call(api, None, errs, module)


def call(case: Case, mode: str, api: str = "forward", seed: int = 0) -> Call:
    """One plan + forward/run, on the real kernel (live) or the model wrapper (model)."""
    if mode == "live":
        from swa_repro.kernel.live import run_live

        r = run_live(case, seed=seed, api=api)
        return Call(api, r.error, list(r.err_vs_reference), r.module, r.plan_info, list(r.err_vs_model))
    return model_call(case, api, seed)


def module_uri(case: Case) -> str:
    """The JIT module ``plan()`` selects for ``case``, named by flashinfer's own
    ``get_batch_prefill_uri`` when flashinfer imports (it does on CPU), else by its key."""
    try:
        from swa_repro.kernel.live import module_key
        from swa_repro.kernel.live import module_uri as uri

        k = module_key(case)
        return uri(k[0], k[1:])
    except Exception:
        return f"batch_prefill ({case.resolved_backend}) ... use_swa_{case.plan_window_left >= 0} ..."
