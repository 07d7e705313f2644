"""A recorded call as FlashInfer runs it on a GPU class: the backend each wrapper runs there, and
whether the layer's cap survives. The key verdict (``audit.family.record``) and the live run
(``audit.family_live.executor_for``) both ask it, so it sits below both.
"""

from __future__ import annotations

from swa_repro.engine.families import GpuClass
from swa_repro.sglang.audit import calls as ac
from swa_repro.sglang.audit.env import DECODE


def backend_of(gpu: GpuClass):
    """``(pair, plan) -> backend FlashInfer runs`` on ``gpu`` (decode: fa2, its only backend here)."""
    return lambda p, plan: "fa2" if p.cls == DECODE else gpu.resolve(
        p.backend, int(plan.get("head_dim_qk") or plan.get("head_dim") or 0), plan.get("custom_mask") is not None)


def wrappers(run, gpu: GpuClass) -> dict:
    """Per wrapper class: the backend sglang built it with and what FlashInfer runs on ``gpu``."""
    out = {}
    for p in ac.pairs(run):
        out.setdefault(p.cls.replace("BatchPrefillWith", "").replace("BatchDecodeWith", "Decode:"),
                       set()).add(f"{p.backend} -> {backend_of(gpu)(p, p.plan[1])}")
    return {k: sorted(v) for k, v in out.items()}


def cap_state(run, gpu: GpuClass) -> str:
    """``applied`` (every call plans the layer's cap on a backend that applies one), ``dropped``
    (with which wrapper plans what, or runs on cutlass), ``none`` (the layer has no cap)."""
    cap = float(run.layer_cap or 0.0)
    if cap <= 0:
        return "none"
    why = set()
    for p in ac.pairs(run):
        planned, be = float(p.plan[1].get("logits_soft_cap") or 0.0), backend_of(gpu)(p, p.plan[1])
        short = p.cls.replace("BatchPrefillWith", "").replace("KVCacheWrapper", "").replace("BatchDecodeWithPaged", "Decode")
        if planned != cap:
            why.add(f"{short} plans {planned:g}")
        elif be == "cutlass":
            why.add(f"{short} on cutlass")
    return "applied" if not why else "dropped (" + ", ".join(sorted(why)) + ")"
