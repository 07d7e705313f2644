"""The FlashInfer modules of ``benchmarks/fix_cost.py``, JIT-built before the cases ask for them:
each wave's modules at once, one thread each, as the project pre-builds (``swa_repro.kernel.jit_warm``;
flashinfer's submodules imported first, in the caller's thread: two threads importing them at once
deadlocked on the H100 on 2026-12-05). A tiny plan selects a module (plan() builds it), a run loads it.

Measured cold on an H100 (16 cores, 2026-12-06), all ten at once (``MAX_JOBS`` 3): decode 12-14 s,
fa2 prefill 92-98 s, fa3 (``backend="auto"`` on sm90; 11 files, about 900 s of nvcc each) 238-245 s.
In two waves, the first wave's fa3 modules were not done after 194 s (``MAX_JOBS`` 4) nor 174 s (6);
the second wave's two fa3 modules alone (8) took 104-109 s. So ``fix_cost_plan.waves`` builds all at
once: a cold call needs about 250 s of builds before every case can run, about 100 s before verify.
"""

from __future__ import annotations

import math
import os
import threading
import time

from benchmarks.fix_cost_plan import module_spec


def error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


class Builds:
    """The modules built in waves (``fix_cost_plan.waves``), each wave's modules at once, one
    daemon thread each (a build past the budget must not hold the exit; its ninja goes on).
    ``MAX_JOBS`` (ninja's -j, read at each build: flashinfer jit/cpp_ext.py) is split among a
    wave's modules unless the caller set it."""

    def __init__(self, torch, plan_waves):
        self.torch, self.done, self.lock = torch, {}, threading.Lock()
        self.events = {n: threading.Event() for w in plan_waves for n in w}
        self.own_jobs = "MAX_JOBS" not in os.environ
        threading.Thread(target=self._waves, args=(plan_waves,), daemon=True).start()

    def _waves(self, plan_waves):
        for wave in plan_waves:
            if self.own_jobs:
                os.environ["MAX_JOBS"] = str(max(2, math.ceil(2 * (os.cpu_count() or 16) / max(len(wave), 1))))
            threads = [threading.Thread(target=self._one, args=(n,), daemon=True) for n in wave]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    def _one(self, name):
        t = time.monotonic()
        try:
            warm_module(self.torch, module_spec(name))
            res = {"s": round(time.monotonic() - t, 1)}
        except Exception as e:  # noqa: BLE001 - recorded; the cases that need it say why
            res = {"error": error(e), "s": round(time.monotonic() - t, 1)}
        with self.lock:
            self.done[name] = res
        self.events[name].set()

    def ready(self, names) -> bool:
        return all(self.events[n].is_set() for n in names)

    def why_not(self, names):
        """None when every module in ``names`` was built, else why not."""
        for n in names:
            if not self.events[n].is_set():
                return f"module {n} not built within the budget"
            if "error" in self.done[n]:
                return f"module {n} not built ({self.done[n]['error']})"
        return None

    def report(self) -> dict:
        with self.lock:
            return {n: dict(self.done.get(n, {"error": "still building at the end"})) for n in self.events}

    def running(self) -> bool:
        return not all(e.is_set() for e in self.events.values())


def warm_module(torch, spec: dict):
    """A tiny plan + run that selects ``spec``'s module: plan() builds it (JIT), run() loads it."""
    import flashinfer

    dev, bf = "cuda", torch.bfloat16
    ws = torch.empty(16 * 1024 * 1024, dtype=torch.uint8, device=dev)
    hq, hk, d, n = 16, 8, 256, 32
    window = 8 if spec["window"] else -1
    cap = 50.0 if spec["cap"] else 0.0
    ind = torch.tensor([0, n], dtype=torch.int32, device=dev)
    q = torch.randn(n, hq, d, dtype=bf, device=dev)
    kv = torch.randn(n, 1, hk, d, dtype=bf, device=dev)
    if spec["kind"] == "ragged":
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=spec["backend"])
        w.plan(ind, ind, hq, hk, d, causal=True, window_left=window, logits_soft_cap=cap, q_data_type=bf)
        w.run(q, kv[:, 0], kv[:, 0])
    elif spec["kind"] == "decode":
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend=spec["backend"], use_tensor_cores=False)
        w.plan(ind, torch.arange(n, dtype=torch.int32, device=dev), torch.ones(1, dtype=torch.int32, device=dev), hq,
               hk, d, 1, window_left=window,
               logits_soft_cap=cap, data_type=bf, q_data_type=bf)
        w.run(q[:1], (kv, kv))
    else:
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=spec["backend"])
        w.plan(ind, ind, torch.arange(n, dtype=torch.int32, device=dev), ind[1:].clone().fill_(1), hq, hk, d, 1,
               custom_mask=torch.ones(n * n, dtype=torch.bool, device=dev), causal=True, window_left=window,
               logits_soft_cap=cap, q_data_type=bf, kv_data_type=bf)
        w.run(q, (kv, kv))
    torch.cuda.synchronize()
