"""A model family's driven calls run on a kernel (``swa-repro audit --model F`` child, ``--live``):
the real FlashInfer on this GPU or the kernel model on CPU, as FlashInfer runs them on each GPU
class, judged against the float64 reference at the window and cap the family's config intends.

Used by ``audit.family.audit_family``; the GPU step is ``scripts/gpu_family.sh`` (issue #25).
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch

from swa_repro.core.checkpoint_config import SLIDING
from swa_repro.engine.families import GPU_CLASSES, GpuClass
from swa_repro.sglang.audit import calls as ac
from swa_repro.sglang.audit.env import DECODE
from swa_repro.sglang.audit.gpu_backends import backend_of


@dataclasses.dataclass
class Job:
    """One family x GPU class whose driven records wait to be run live (``audit.family.audit_family``
    queues them, :func:`run_jobs` runs them all): the records, their ``(run, layer)``, the family's
    small config and ``memo``, shared by the family's GPU classes."""
    recs: list
    runs: list
    small: object
    gpu: GpuClass
    memo: dict

    def driven(self):
        return [(rec, run, layer) for rec, (run, layer) in zip(self.recs, self.runs) if rec.get("status") == "driven"]


# scripts/gpu_family.sh's build step: the warm-up alone (every module JIT-built, flashinfer's cache keeps
# them for the next call on a warm machine), at most this many builds at once (default: one per module)
WARM_ONLY_ENV, BUILD_WORKERS_ENV = "SWA_REPRO_WARM_ONLY", "SWA_REPRO_BUILD_WORKERS"


def run_jobs(jobs: list, executor, deadline: float | None = None) -> dict:
    """Every job's driven calls executed on ``executor`` as FlashInfer runs them on the job's GPU
    class (:func:`executor_for`) and judged (``audit.live.live_of_run``) against the window and cap
    the family's config intends: HF's count of the window on a sliding layer (what the key verdict
    holds the calls to), none on a full one, and the config's cap on both (Gemma-2 caps every layer).
    On a GPU every module all jobs need is built first, at once (one JIT wave for every family, not
    one per family: ``audit.live.warm_calls``), and the float64 references run there too, in row
    blocks (``audit.live._err``: a 4096 window's call at once is GBs of logits). A GPU class whose kernels this card cannot run is said,
    not run. Once per run, layer kind and the backends its wrappers run (``memo``): GPU classes that
    run the same kernels share the result. ``deadline`` (``time.monotonic()``): calls after it are
    said not run. Returns ``{"warmup": {module signature: seconds or error} (empty on CPU),
    "warmup_seconds": the whole warm-up's}``."""
    from swa_repro.sglang.audit.live import live_of_run, unwarmed, warm_calls

    device = getattr(executor, "device", "cpu")  # audit.live.Executor's
    todo, plans = [], []
    for job in jobs:
        why_not = card_cannot_run(job.gpu, device)
        if why_not:
            for rec, _, _ in job.driven():
                rec["live"] = {"not_run": why_not}
            continue
        ex = executor_for(executor, job.gpu, device)
        plans.append((job, ex))
        todo += [(run, ex) for _, run, layer in job.driven() if _key(run, layer, ex) not in job.memo]
    t = time.monotonic()
    workers = int(os.environ.get(BUILD_WORKERS_ENV) or 0) or None
    warmed = warm_calls(todo, workers=workers, deadline=deadline) if todo and device != "cpu" else {}
    warm_s = round(time.monotonic() - t, 1)
    if os.environ.get(WARM_ONLY_ENV):
        for job, _ in plans:
            for rec, _, _ in job.driven():
                rec["live"] = {"not_run": f"a build step ({WARM_ONLY_ENV}): the warm-up alone, no call judged"}
        return {"warmup": warmed, "warmup_seconds": warm_s, "warm_only": True}
    for job, ex in plans:
        for rec, run, layer in job.driven():
            k = _key(run, layer, ex)
            if k not in job.memo:
                window = job.small.intended_window if layer.kind == SLIDING else -1
                job.memo[k] = live_of_run(run, ex, window=window, cap=float(job.small.cap or 0.0), deadline=deadline,
                                          ref_device=None if device == "cpu" else device,
                                          skip=unwarmed(warmed, ex.backend))
            rec["live"] = job.memo[k]
    return {"warmup": warmed, "warmup_seconds": warm_s}


def _key(run, layer, ex) -> tuple:
    return ("live", id(run), layer.kind, tuple((ex.backend(p) if ex.backend else None) or p.backend
                                               for p in ac.pairs(run)))


def card_of(device: str):
    """This device's GPU class (``families.GPU_CLASSES``, by compute capability major), None on CPU."""
    if device == "cpu":
        return None
    major = torch.cuda.get_device_capability(device)[0]
    return next((g for g in GPU_CLASSES.values() if g.arch[0] == major), None)


def card_cannot_run(gpu: GpuClass, device: str) -> str | None:
    """Why this card cannot run what FlashInfer runs on ``gpu`` (None: it can). The kernel model
    (CPU) describes every class; a GPU runs its own class's kernels and, on sm90 or later, sm80's
    (``auto`` there is fa2, which FlashInfer JIT-builds from the same source for any card from sm80);
    sm100's cutlass / trtllm kernels need a Blackwell card."""
    if device == "cpu":
        return None
    card = card_of(device)
    if card is not None and (card.name == gpu.name or (gpu.arch[0] == 8 and card.arch[0] >= 8)):
        return None
    return (f"{gpu.name}'s kernels ({gpu.cards}) do not run on this card ({torch.cuda.get_device_name(device)}, "
            f"sm{''.join(map(str, torch.cuda.get_device_capability(device)))})")


def executor_for(executor, gpu: GpuClass, device: str):
    """``executor`` as FlashInfer runs on ``gpu``: on the card's own class unchanged (FlashInfer
    resolves ``auto`` itself, and the live result says what it ran); otherwise, and on the kernel
    model, each prefill wrapper built with the backend ``gpu`` resolves it to (``audit.gpu_backends.backend_of``;
    decode keeps its own: fa2)."""
    card = card_of(device)
    if card is not None and card.name == gpu.name:
        return executor
    res = backend_of(gpu)
    return dataclasses.replace(executor, backend=lambda p: None if p.cls == DECODE else res(p, p.plan[1]))
