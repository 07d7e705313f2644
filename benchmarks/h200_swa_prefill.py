"""H200 study: what planning FlashInfer's paged prefill with the window costs and saves.

One bounded run (``--budget-s``) measures, on bf16 random data with CUDA events, warm-up and medians:

* FlashInfer ``BatchPrefillWithPagedKVCacheWrapper`` (fa2, fa3), driven the way sglang drives it
  (page_size 1, ``plan()`` without ``causal``, then ``forward(causal=True, window_left=W)``:
  sglang 0.5.15.post1 ``flashinfer_backend.py:1960`` plan, ``:1138`` forward), three variants:
  ``buggy`` plan(window_left=-1) as in 0.5.15.post1 (``update_sliding_window`` ->
  ``call_begin_forward`` at ``:1398`` gives no window), ``fixed`` plan(window_left=W) as in
  PR #31501, ``causal`` plan(-1) + forward(-1). The module is chosen at plan from
  ``window_left >= 0`` (flashinfer 0.6.12 ``prefill.py:2035``, 0.7.2.post1 ``prefill.py:3689``);
  ``forward`` overwrites ``self._window_left`` (0.6.12 ``prefill.py:2136``, 0.7.2.post1 ``:3969``).
* ``torch`` ``flex``: compiled FlexAttention with a sliding-window block mask; ``sdpa``:
  ``scaled_dot_product_attention`` with an explicit boolean mask (memory-efficient kernel).
* The ceilings in the same run: a large bf16 ``torch.matmul`` and a device-to-device copy.

Useful FLOPs count only the in-window causal pairs (``benchmarks.common.useful_flops``).
Results go to ``--out`` after every measurement (atomic rename), so a killed run leaves data.

Order of work: [fa3 modules built by a child process | fa2 modules + flex compiles in this one]
-> ceilings -> every timing with the CPUs quiet -> the live probe (8k tokens). ``--serial-jit`` builds in
this process, one module after another (uncontended JIT times, slower). ``--dry-run`` needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (GPU_RESULTS, command_line, computed_pairs, min_bytes, now_iso,  # noqa: E402
                               useful_flops, write_json_atomic)
from benchmarks.gpu_timing import Clock, check_rows, n_input_sets  # noqa: E402

# Guesses for planning only (the brief's build times; a rate well under an H200's bf16 peak).
JIT_EST_S = {"fa2": 30.0, "fa3": 100.0}
FLEX_COMPILE_EST_S = (30.0, 8.0)  # first shape, each further shape
EFF_TFLOPS = {"fa2": 350.0, "fa3": 450.0, "flex": 300.0, "sdpa": 200.0}
STARTUP_EST_S = 25.0
WORKSPACE_BYTES = 512 << 20


@dataclass(frozen=True)
class Shape:
    seq_len: int
    batch: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads


@dataclass(frozen=True)
class Job:
    backend: str  # fa2 | fa3 | torch
    variant: str  # fixed | buggy | causal | flex | sdpa
    shape: Shape
    window: int  # -1 for causal

    @property
    def module(self) -> str:
        if self.backend == "torch":
            return f"{self.variant}/{self.shape.seq_len}x{self.shape.batch}/{self.shape.num_qo_heads}:{self.shape.num_kv_heads}/hd{self.shape.head_dim}"
        return module_name(self.backend, self.shape.head_dim, self.variant == "fixed")

    def flops(self) -> int:
        s = self.shape
        return useful_flops(s.seq_len, s.batch, self.window, s.num_qo_heads, s.head_dim)

    def bytes(self) -> int:
        s = self.shape
        return min_bytes(s.seq_len, s.batch, s.num_qo_heads, s.num_kv_heads, s.head_dim)

    def est_kernel_s(self) -> float:
        s = self.shape
        kind = self.variant if self.backend == "torch" else self.backend
        pairs = computed_pairs(self.variant, s.seq_len, self.window, self.backend, 128, s.group)
        return s.batch * s.num_qo_heads * pairs * 4 * s.head_dim / (EFF_TFLOPS[kind] * 1e12)

    def est_measure_s(self, target_s: float) -> float:
        k = self.est_kernel_s()
        return 0.2 + 4 * k + max(target_s, 5 * k)  # setup+check, first/one/check calls, timed groups


def module_name(backend: str, head_dim: int, swa: bool) -> str:
    return f"{backend}/hd{head_dim}/{'swa' if swa else 'noswa'}"


def parse_gqa(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        try:
            hq, hk = (int(x) for x in part.split(":"))
        except ValueError:
            raise SystemExit(f"--gqa {text!r}: give QO:KV pairs like 32:4,32:8")
        if hk < 1 or hq % hk:
            raise SystemExit(f"--gqa {part}: num_qo_heads must be a positive multiple of num_kv_heads")
        out.append((hq, hk))
    return out


def ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise SystemExit(f"expected comma-separated integers, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-lens", type=ints, default=[4096, 16384, 32768])
    p.add_argument("--batch", type=int, default=4, help="size of the 'batch' shape (equal requests); 1 is always run")
    p.add_argument("--windows", type=ints, default=[128, 1024, 4096])
    p.add_argument("--gqa", type=parse_gqa, default=[(32, 4), (32, 8)], help="QO:KV head pairs (8:1 and 4:1)")
    p.add_argument("--head-dims", type=ints, default=[128])
    p.add_argument("--fa3-head-dims", type=ints, default=[128], help="fa3 modules take ~100 s each to build")
    p.add_argument("--backends", default="fa2,fa3,flex,sdpa")
    p.add_argument("--page-size", type=int, default=1, help="sglang plans with page_size 1")
    p.add_argument("--plan-causal", action="store_true",
                   help="pass causal=True to plan() (sglang does not; forward() sets it either way)")
    p.add_argument("--budget-s", type=float, default=480.0, help="stop cleanly after this many seconds")
    p.add_argument("--target-s", type=float, default=0.2, help="timed GPU seconds per measurement")
    p.add_argument("--out", type=Path, default=GPU_RESULTS)
    p.add_argument("--serial-jit", action="store_true", help="build every module here, one after another")
    p.add_argument("--no-probe", action="store_true", help="skip timing swa_repro.kernel.probe on 8k tokens")
    p.add_argument("--dry-run", action="store_true", help="print shapes, FLOPs, modules and time estimate; no GPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": sdpa-only smoke test
    p.add_argument("--build-only", default=None, help=argparse.SUPPRESS)  # child: build this backend's modules
    p.add_argument("--build-log", type=Path, default=None, help=argparse.SUPPRESS)
    return p


# ----------------------------------------------------------------------------- the study's plan
def plan_study(args) -> dict:
    """Everything the run will do, computed without a GPU: shapes, jobs in run order, modules."""
    backends = [b for b in args.backends.split(",") if b]
    bad = set(backends) - {"fa2", "fa3", "flex", "sdpa"}
    if bad:
        raise SystemExit(f"--backends: unknown {sorted(bad)}; use fa2,fa3,flex,sdpa")
    if any(w < 0 for w in args.windows):
        raise SystemExit("--windows must be >= 0 (the causal variant is always run)")
    batches = sorted({1, args.batch})
    shapes = [Shape(L, b, hq, hk, d) for d in args.head_dims for L in args.seq_lens
              for b in batches for hq, hk in args.gqa]
    jobs, modules = [], []
    for be in ("fa3", "fa2"):  # fa3 first: its buggy variant is the headline
        if be not in backends:
            continue
        dims = [d for d in args.head_dims if be == "fa2" or d in args.fa3_head_dims]
        for d in dims:
            modules += [module_name(be, d, False), module_name(be, d, True)]
        for s in (s for s in shapes if s.head_dim in dims):
            jobs.append(Job(be, "causal", s, -1))
            for w in args.windows:
                jobs += [Job(be, "fixed", s, w), Job(be, "buggy", s, w)]
    for v in ("flex", "sdpa"):
        if v in backends:
            jobs += [Job("torch", v, s, w) for s in shapes for w in args.windows]
    flex_shapes = [s for s in shapes] if "flex" in backends else []
    est_jit = {m: JIT_EST_S[m.split("/")[0]] for m in modules}
    est_flex = sum(FLEX_COMPILE_EST_S[0 if i == 0 else 1] for i in range(len(flex_shapes)))
    fa3_build = sum(v for m, v in est_jit.items() if m.startswith("fa3"))
    fa2_build = sum(v for m, v in est_jit.items() if m.startswith("fa2"))
    timing = sum(j.est_measure_s(args.target_s) for j in jobs)
    phase1 = (fa3_build + fa2_build + est_flex) if args.serial_jit else max(fa3_build, fa2_build + est_flex)
    return {"shapes": shapes, "jobs": jobs, "modules": modules, "flex_shapes": flex_shapes,
            "est_jit_s": est_jit, "est_flex_compile_s": est_flex, "est_phase1_s": phase1,
            "est_timing_s": timing, "est_total_s": STARTUP_EST_S + 5 + phase1 + timing}


def print_plan(study: dict, args) -> None:
    print(f"{len(study['shapes'])} shapes, {len(study['jobs'])} measurements, modules:")
    for m, s in study["est_jit_s"].items():
        print(f"  {m:22s} est. JIT {s:5.0f} s")
    print(f"flex compiles: {len(study['flex_shapes'])} shapes, est. {study['est_flex_compile_s']:.0f} s")
    print(f"{'backend':7s} {'variant':7s} {'L':>6s} {'B':>2s} {'heads':>6s} {'D':>4s} {'W':>5s} "
          f"{'useful GFLOP':>13s} {'min MB':>8s} {'est ms':>8s}")
    for j in study["jobs"]:
        s = j.shape
        print(f"{j.backend:7s} {j.variant:7s} {s.seq_len:6d} {s.batch:2d} {s.num_qo_heads:3d}:{s.num_kv_heads:<2d} "
              f"{s.head_dim:4d} {j.window:5d} {j.flops() / 1e9:13.1f} {j.bytes() / 1e6:8.1f} "
              f"{j.est_kernel_s() * 1e3:8.2f}")
    print(f"estimate: startup+peak {STARTUP_EST_S + 5:.0f} s, builds/compiles {study['est_phase1_s']:.0f} s "
          f"({'serial' if args.serial_jit else 'overlapped'}), timings {study['est_timing_s']:.0f} s, "
          f"total {study['est_total_s']:.0f} s against --budget-s {args.budget_s:.0f}")


# ----------------------------------------------------------------------------- measurement
class Study:
    def __init__(self, args, torch):
        self.args, self.torch = args, torch
        self.device = args.device
        self.clock = Clock(torch, self.device)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget_s
        self.doc = {"provenance": {}, "peak_bf16_tflops": None, "copy_tbps": None, "status": "running",
                    "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "jit": [], "records": [], "timeline": []}
        self.jit: dict[str, dict] = {}
        self.l2 = 60 << 20
        self.children: list = []

    # -- bookkeeping
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def mark(self, phase: str):
        self.doc["timeline"].append({"phase": phase, "t_s": round(time.monotonic() - self.t0, 2)})
        print(f"[{time.monotonic() - self.t0:7.1f} s] {phase}", flush=True)
        self.save()

    def save(self):
        write_json_atomic(self.args.out, self.doc)

    def add_jit(self, entry: dict):
        self.jit[entry["module"]] = entry
        self.doc["jit"].append(entry)
        self.save()

    def record(self, job: Job, **kw):
        s = job.shape
        r = {"backend": job.backend, "variant": job.variant, "seq_len": s.seq_len, "batch": s.batch,
             "window": job.window, "num_qo_heads": s.num_qo_heads, "num_kv_heads": s.num_kv_heads,
             "head_dim": s.head_dim, "page_size": self.args.page_size if job.backend != "torch" else None,
             "module": job.module, "useful_flops": job.flops(), "min_bytes": job.bytes()}
        ms = kw.get("ms")
        if ms and not kw.get("error"):
            tf = job.flops() / (ms * 1e-3) / 1e12
            r["useful_tflops"] = tf
            peak, bw = self.doc["peak_bf16_tflops"], self.doc["copy_tbps"]
            if peak:
                r["peak_fraction"] = tf / peak
            if peak and bw:
                r["floor_ms"] = max(job.flops() / (peak * 1e12), job.bytes() / (bw * 1e12)) * 1e3
        if job.module in self.jit and "jit_s" in self.jit[job.module]:
            r["jit_s"] = self.jit[job.module]["jit_s"]
        r.update(kw)
        self.doc["records"].append(r)
        self.save()
        tag = r.get("error") or f"{ms:9.3f} ms {r.get('useful_tflops', 0):7.1f} TF/s err {r.get('rel_err')}"
        print(f"  {job.backend:5s} {job.variant:6s} L={s.seq_len:6d} B={s.batch} {s.num_qo_heads}:{s.num_kv_heads} "
              f"W={job.window:5d}  {tag}", flush=True)

    def skip(self, job: Job, why: str):
        self.record(job, error=f"skipped: {why}")

    # -- provenance and ceilings
    def provenance(self):
        torch = self.torch
        prov = {"date": now_iso(), "command": command_line(), "torch": torch.__version__,
                "cuda": torch.version.cuda, "python": sys.version.split()[0]}
        prov["flashinfer"] = None
        if {"fa2", "fa3"} & set(self.args.backends.split(",")):
            try:
                import flashinfer
                prov["flashinfer"] = getattr(flashinfer, "__version__", "unknown")
                prov["flashinfer_path"] = str(Path(flashinfer.__file__).parent)
            except Exception as e:  # noqa: BLE001 - recorded; the torch backends still run
                prov["flashinfer_error"] = f"{type(e).__name__}: {e}"
        if self.device.startswith("cuda"):
            p = torch.cuda.get_device_properties(0)
            prov.update(gpu=torch.cuda.get_device_name(0), sm_count=p.multi_processor_count,
                        capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1))
            self.l2 = getattr(p, "L2_cache_size", self.l2) or self.l2
            prov["l2_bytes"] = self.l2
            prov["driver"] = _smi("driver_version")
            prov["gpu_state_start"] = _smi("clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu")
        else:
            prov.update(gpu=f"cpu ({os.cpu_count()} cores; smoke test, not a GPU measurement)", driver=None)
        prov["cpu_count"] = os.cpu_count()
        self.doc["provenance"] = prov
        self.save()

    def ceilings(self):
        torch, dev = self.torch, self.device
        n = 8192 if dev.startswith("cuda") else 256
        a = [torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        b = [torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        t = self.clock.time(lambda i: torch.matmul(a[i], b[i]), 2, 0.3, warmup=3)
        self.doc["peak_bf16_tflops"] = 2 * n**3 / (t["ms"] * 1e-3) / 1e12
        self.doc["peak_detail"] = {"m=n=k": n, **t}
        a = b = None  # free before the copy test
        nbytes = (1 << 30) if dev.startswith("cuda") else (16 << 20)
        src = torch.randn(nbytes // 2, device=dev, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        t = self.clock.time(lambda i: dst.copy_(src), 1, 0.2, warmup=3)
        self.doc["copy_tbps"] = 2 * nbytes / (t["ms"] * 1e-3) / 1e12
        self.doc["copy_detail"] = {"bytes_each_way": nbytes, **t}
        src = dst = None
        self.mark(f"ceilings: bf16 matmul {self.doc['peak_bf16_tflops']:.0f} TFLOP/s, "
                  f"copy {self.doc['copy_tbps']:.2f} TB/s")

    # -- flashinfer
    def paged_inputs(self, s: Shape, seed: int):
        torch, dev, ps = self.torch, self.device, self.args.page_size
        pages = math.ceil(s.seq_len / ps)
        n_pages = s.batch * pages
        gen = torch.Generator(device=dev).manual_seed(seed)
        i32 = dict(dtype=torch.int32, device=dev)
        meta = {"qo_indptr": torch.arange(s.batch + 1, **i32) * s.seq_len,
                "kv_indptr": torch.arange(s.batch + 1, **i32) * pages,
                "kv_indices": torch.randperm(n_pages, generator=gen, device=dev).to(torch.int32),  # shuffled pages
                "last_page_len": torch.full((s.batch,), s.seq_len - (pages - 1) * ps, **i32)}
        set_bytes = min_bytes(s.seq_len, s.batch, s.num_qo_heads, s.num_kv_heads, s.head_dim)
        bf = dict(dtype=torch.bfloat16, device=dev, generator=gen)
        sets = [(torch.randn(s.batch * s.seq_len, s.num_qo_heads, s.head_dim, **bf),
                 torch.randn(n_pages, ps, s.num_kv_heads, s.head_dim, **bf),
                 torch.randn(n_pages, ps, s.num_kv_heads, s.head_dim, **bf))
                for _ in range(n_input_sets(set_bytes, self.l2))]
        return meta, sets

    def wrapper(self, backend: str):
        import flashinfer
        if not hasattr(self, "_ws"):
            self._ws = self.torch.empty(WORKSPACE_BYTES, dtype=self.torch.uint8, device=self.device)
        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._ws, "NHD", backend=backend)

    def plan_wrapper(self, w, meta, s: Shape, plan_window: int):
        bf16 = self.torch.bfloat16
        w.plan(meta["qo_indptr"], meta["kv_indptr"], meta["kv_indices"], meta["last_page_len"],
               s.num_qo_heads, s.num_kv_heads, s.head_dim, self.args.page_size,
               causal=self.args.plan_causal, window_left=plan_window, q_data_type=bf16, kv_data_type=bf16)

    def build_module(self, backend: str, head_dim: int, swa: bool) -> dict:
        """First plan+run wall time minus the steady-state plan+run: the module's JIT build."""
        s = Shape(512, 1, 32, 4, head_dim)
        meta, sets = self.paged_inputs(s, 1)
        q, kc, vc = sets[0]
        walls = []
        for _ in range(2):
            t = time.perf_counter()
            w = self.wrapper(backend)
            self.plan_wrapper(w, meta, s, 64 if swa else -1)
            w.forward(q, (kc, vc), causal=True, window_left=64)
            self.torch.cuda.synchronize()
            walls.append(time.perf_counter() - t)
        return {"module": module_name(backend, head_dim, swa), "first_s": walls[0], "steady_s": walls[1],
                "jit_s": walls[0] - walls[1]}

    def run_flashinfer(self, jobs: list[Job]):
        torch = self.torch
        by_shape: dict[tuple, list[Job]] = {}
        for j in jobs:
            by_shape.setdefault((j.backend, j.shape), []).append(j)
        for (backend, s), js in by_shape.items():
            if self.left() < min(j.est_measure_s(self.args.target_s) for j in js):
                for j in js:
                    self.skip(j, "budget")
                continue
            meta, sets = self.paged_inputs(s, self.args.seed)
            q0, kc0, vc0 = sets[0]
            k0, v0 = self.dense_kv(meta, kc0, vc0, s)
            for j in js:
                if self.left() < j.est_measure_s(self.args.target_s):
                    self.skip(j, "budget")
                    continue
                if self.jit.get(j.module, {}).get("error"):
                    self.skip(j, f"module {j.module} not built ({self.jit[j.module]['error']})")
                    continue
                try:
                    w = self.wrapper(backend)
                    self.plan_wrapper(w, meta, s, j.window if j.variant == "fixed" else -1)
                    fwd_w = j.window  # causal jobs carry -1

                    def fn(i, w=w, fwd_w=fwd_w):
                        q, kc, vc = sets[i]
                        return w.forward(q, (kc, vc), causal=True, window_left=fwd_w)

                    t = self.clock.time(fn, len(sets), self.args.target_s)
                    out = torch.full_like(q0, float("nan"))  # poisoned: unwritten rows stay NaN
                    w.run(q0, (kc0, vc0), out=out)  # forward() left self._window_left = fwd_w
                    torch.cuda.synchronize()
                    chk = check_rows(torch, out[: s.seq_len], q0[: s.seq_len], k0, v0, j.window)
                    self.record(j, **t, **chk, nan_frac=float(torch.isnan(out).float().mean()),
                                n_input_sets=len(sets), plan_causal=self.args.plan_causal,
                                **_plan_info(w, backend))
                    del out
                except Exception as e:  # noqa: BLE001 - recorded; the study goes on
                    self.record(j, error=_err(e))
                    self._assert_cuda_alive()
            meta = sets = q0 = kc0 = vc0 = k0 = v0 = None  # free before the next shape
            torch.cuda.empty_cache()

    def dense_kv(self, meta, kc, vc, s: Shape):
        """Request 0's K/V back out of the shuffled pages: ``(L, Hk, D)`` each."""
        pages = meta["kv_indices"][: int(meta["kv_indptr"][1])].long()
        k = kc[pages].reshape(-1, s.num_kv_heads, s.head_dim)[: s.seq_len]
        v = vc[pages].reshape(-1, s.num_kv_heads, s.head_dim)[: s.seq_len]
        return k, v

    # -- torch baselines
    def dense_inputs(self, s: Shape, seed: int):
        torch = self.torch
        gen = torch.Generator(device=self.device).manual_seed(seed)
        bf = dict(dtype=torch.bfloat16, device=self.device, generator=gen)
        set_bytes = min_bytes(s.seq_len, s.batch, s.num_qo_heads, s.num_kv_heads, s.head_dim)
        return [(torch.randn(s.batch, s.num_qo_heads, s.seq_len, s.head_dim, **bf),
                 torch.randn(s.batch, s.num_kv_heads, s.seq_len, s.head_dim, **bf),
                 torch.randn(s.batch, s.num_kv_heads, s.seq_len, s.head_dim, **bf))
                for _ in range(n_input_sets(set_bytes, self.l2))]

    def flex_fn(self):
        if not hasattr(self, "_flex"):
            import torch._dynamo
            from torch.nn.attention.flex_attention import flex_attention
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, 256)
            self._flex = self.torch.compile(flex_attention, dynamic=False)
        return self._flex

    def flex_block_mask(self, s: Shape, window: int):
        from torch.nn.attention.flex_attention import create_block_mask
        _flex_window(self.torch, self.device).fill_(window)
        return create_block_mask(_swa_mask_mod, None, None, s.seq_len, s.seq_len, device=self.device)

    def compile_flex(self, s: Shape):
        """First call wall time minus a steady call: the compile cost of this shape."""
        torch = self.torch
        sets = self.dense_inputs(s, 1)[:1]
        q, k, v = sets[0]
        bm = self.flex_block_mask(s, self.args.windows[0])
        walls = []
        for _ in range(2):
            t = time.perf_counter()
            self.flex_fn()(q, k, v, block_mask=bm, enable_gqa=s.group > 1)
            self.clock.sync()
            walls.append(time.perf_counter() - t)
        name = Job("torch", "flex", s, 0).module
        self.add_jit({"module": name, "first_s": walls[0], "steady_s": walls[1], "jit_s": walls[0] - walls[1],
                      "contended": not self.args.serial_jit})
        del sets, q, k, v, bm
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def run_torch(self, jobs: list[Job]):
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        by_shape: dict[tuple, list[Job]] = {}
        for j in jobs:
            by_shape.setdefault((j.variant, j.shape), []).append(j)
        for (variant, s), js in by_shape.items():
            if self.left() < min(j.est_measure_s(self.args.target_s) for j in js):
                for j in js:
                    self.skip(j, "budget")
                continue
            try:
                sets = self.dense_inputs(s, self.args.seed)
                if variant == "sdpa":  # repeat K/V to Hq heads outside the timed region
                    sets = [(q, k.repeat_interleave(s.group, 1), v.repeat_interleave(s.group, 1))
                            for q, k, v in sets]
            except Exception as e:  # noqa: BLE001
                for j in js:
                    self.record(j, error=_err(e))
                self._assert_cuda_alive()
                continue
            q0, k0, v0 = sets[0]
            for j in js:
                if self.left() < j.est_measure_s(self.args.target_s):
                    self.skip(j, "budget")
                    continue
                try:
                    extra = {}
                    if variant == "flex":
                        if j.module not in self.jit:
                            if self.left() < FLEX_COMPILE_EST_S[1] + j.est_measure_s(self.args.target_s):
                                self.skip(j, "budget (shape not compiled)")
                                continue
                            self.compile_flex(s)
                        bm = self.flex_block_mask(s, j.window)
                        f = self.flex_fn()

                        def fn(i, bm=bm, f=f):
                            q, k, v = sets[i]
                            return f(q, k, v, block_mask=bm, enable_gqa=s.group > 1)
                        extra["block_sparsity"] = float(bm.sparsity())
                    else:
                        ones = torch.ones(s.seq_len, s.seq_len, dtype=torch.bool, device=self.device)
                        mask = ones.tril() & ones.triu(-j.window)  # (L, L): p - W <= key <= p
                        del ones

                        kernel = self.sdpa_backend(sdpa_kernel, SDPBackend, sets[0], mask)

                        def fn(i, mask=mask, kernel=kernel):
                            q, k, v = sets[i]
                            with sdpa_kernel([kernel]):
                                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                        extra["sdpa_backend"] = kernel.name
                    t = self.clock.time(fn, len(sets), self.args.target_s)
                    out = fn(0)
                    self.clock.sync()
                    chk = check_rows(torch, out[0].transpose(0, 1), q0[0].transpose(0, 1),
                                     k0[0].transpose(0, 1)[:, ::s.group] if variant == "sdpa" else k0[0].transpose(0, 1),
                                     v0[0].transpose(0, 1)[:, ::s.group] if variant == "sdpa" else v0[0].transpose(0, 1),
                                     j.window)
                    self.record(j, **t, **chk, nan_frac=float(torch.isnan(out).float().mean()),
                                n_input_sets=len(sets), **extra)
                    del out
                except Exception as e:  # noqa: BLE001
                    self.record(j, error=_err(e))
                    self._assert_cuda_alive()
            sets = q0 = k0 = v0 = None
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()

    def sdpa_backend(self, sdpa_kernel, SDPBackend, qkv, mask):
        """First SDPA kernel that takes an explicit mask here: memory-efficient, then cuDNN on
        CUDA; the math kernel only on CPU (on the GPU it would hold (B, H, L, L) scores)."""
        names = ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION") if self.device.startswith("cuda") else ("MATH",)
        last = None
        for name in names:
            kernel = getattr(SDPBackend, name, None)
            if kernel is None:
                continue
            try:
                with sdpa_kernel([kernel]):
                    self.torch.nn.functional.scaled_dot_product_attention(*qkv, attn_mask=mask)
                return kernel
            except RuntimeError as e:
                last = e
        raise RuntimeError(f"no SDPA kernel with an explicit mask among {names}: {last}")

    def _assert_cuda_alive(self):
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()  # a sticky CUDA error raises here and ends the run

    # -- optional: the live probe the targets name (8k tokens <= 10 s)
    def probe(self):
        try:
            from swa_repro.core.case import Case
            from swa_repro.kernel.probe import probe_case
        except Exception as e:  # noqa: BLE001
            self.doc["probe_8k"] = {"error": f"swa_repro.kernel.probe unavailable: {_err(e)}"}
            return
        case = Case(prefix_lens=(0,), extend_lens=(8192,), window_left=1024, plan_window_left=-1, backend="fa2",
                    name="bench-probe-8k")  # Case's default heads/page size (what the notebooks probe)
        res = {"case": case.to_dict()}
        try:
            for key in ("first_s", "warm_s"):
                t = time.perf_counter()
                pr = probe_case(case)
                self.torch.cuda.synchronize()
                res[key] = time.perf_counter() - t
                res[key.replace("_s", "_timings")] = getattr(pr, "timings", None)
        except Exception as e:  # noqa: BLE001
            res["error"] = _err(e)
        self.doc["probe_8k"] = res
        self.save()


_FLEX_WINDOW = None


def _flex_window(torch, device):
    """One 0-d tensor read by the mask at run time: a new window refills it, no recompile."""
    global _FLEX_WINDOW
    if _FLEX_WINDOW is None:
        _FLEX_WINDOW = torch.zeros((), dtype=torch.int64, device=device)
    return _FLEX_WINDOW


def _swa_mask_mod(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= _FLEX_WINDOW)


def _plan_info(w, backend: str) -> dict:
    """fa2 plan_info: ``[3]`` CTA_TILE_Q, ``[14]`` split_kv (GUIDE; the PrefillPlanInfo layout)."""
    if backend != "fa2":
        return {}
    try:
        pi = list(w._plan_info)
        return {"plan_cta_tile_q": int(pi[3]), "plan_split_kv": bool(pi[14])}
    except Exception:  # noqa: BLE001 - informational only
        return {}


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _smi(fields: str):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


# ----------------------------------------------------------------------------- orchestration
def child_build(args) -> int:
    """Child process: build one backend's modules, one JSON line per module on --build-log."""
    import torch
    study = Study(args, torch)
    dims = args.fa3_head_dims if args.build_only == "fa3" else args.head_dims
    with open(args.build_log, "a") as log:
        for d in (d for d in args.head_dims if d in dims):
            for swa in (False, True):
                try:
                    e = study.build_module(args.build_only, d, swa)
                except Exception as ex:  # noqa: BLE001
                    e = {"module": module_name(args.build_only, d, swa), "error": _err(ex)}
                print(json.dumps(e), file=log, flush=True)
    return 0


def build_in_process(study: Study, backend: str):
    for m in (m for m in study.plan["modules"] if m.startswith(backend + "/")):
        _, hd, swa = m.split("/")
        est = JIT_EST_S[backend]
        if study.left() < est:
            study.add_jit({"module": m, "error": "skipped: budget"})
            continue
        try:
            e = study.build_module(backend, int(hd[2:]), swa == "swa")
        except Exception as ex:  # noqa: BLE001
            e = {"module": m, "error": _err(ex)}
        e["contended"] = not study.args.serial_jit
        study.add_jit(e)
        study.mark(f"built {m}: {e.get('jit_s', float('nan')):.1f} s" if "jit_s" in e else f"build {m} failed")


def start_child_build(study: Study, backend: str):
    log = study.args.out.with_name(study.args.out.stem + f".build_{backend}.jsonl")
    log.unlink(missing_ok=True)
    out_log = open(log.with_suffix(".log"), "w")
    argv = [sys.executable, str(Path(__file__).resolve()), "--build-only", backend, "--build-log", str(log),
            "--head-dims", ",".join(map(str, study.args.head_dims)),
            "--fa3-head-dims", ",".join(map(str, study.args.fa3_head_dims)),
            "--page-size", str(study.args.page_size), "--out", str(log.with_suffix(".child.json"))]
    # own process group (not session): ninja/nvcc die with it, and with the device command
    proc = subprocess.Popen(argv, stdout=out_log, stderr=subprocess.STDOUT, process_group=0)
    study.children.append(proc)
    return proc, log


def kill_group(proc):
    """End a child we started, with its build tools (its own process group, by id)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def finish_child_build(study: Study, proc, log: Path, backend: str, reserve_s: float):
    """Wait for the child while the rest of the run still fits; else end it (its process group)."""
    while proc.poll() is None and study.left() > reserve_s:
        time.sleep(1.0)
    if proc.poll() is None:
        kill_group(proc)
        study.mark(f"{backend} build stopped: budget")
    done = {}
    if log.exists():
        for line in log.read_text().splitlines():
            try:
                e = json.loads(line)
                done[e["module"]] = e
            except (ValueError, KeyError):  # a line cut short by the kill
                continue
    for m in (m for m in study.plan["modules"] if m.startswith(backend + "/")):
        e = done.get(m, {"module": m, "error": "build did not finish within the budget"})
        e["contended"] = True
        study.add_jit(e)


def run(args) -> int:
    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: this study needs the H200 (use --dry-run here)", file=sys.stderr)
        return 2
    study = Study(args, torch)
    study.plan = plan_study(args)
    jobs = study.plan["jobs"]
    study.doc["estimate_s"] = {k: study.plan[k] for k in ("est_phase1_s", "est_timing_s", "est_total_s")}

    def on_term(signum, frame):  # a timeout's SIGTERM: keep what we have
        study.doc["status"] = f"terminated by signal {signum}"
        study.save()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    try:
        return _run_phases(study, args, jobs)
    except BaseException as e:
        if study.doc["status"] == "running":
            study.doc["status"] = f"aborted: {_err(e)}"
            study.save()
        raise
    finally:
        for proc in study.children:
            kill_group(proc)


def _run_phases(study: Study, args, jobs: list[Job]) -> int:
    study.provenance()
    fa_jobs = {b: [j for j in jobs if j.backend == b] for b in ("fa3", "fa2")}
    torch_jobs = [j for j in jobs if j.backend == "torch"]
    # phase 1: builds and compiles (CPU-bound), timings wait for a quiet machine
    child = None
    if fa_jobs["fa3"] and not args.serial_jit:
        child = start_child_build(study, "fa3")
        study.mark("fa3 modules building in a child process")
    if fa_jobs["fa2"]:
        build_in_process(study, "fa2")
    for s in study.plan["flex_shapes"]:
        rest = sum(j.est_measure_s(args.target_s) for j in jobs)
        if study.left() < rest + FLEX_COMPILE_EST_S[1]:
            break  # later flex timings compile their shape inline, if time remains
        try:
            study.compile_flex(s)
        except Exception as e:  # noqa: BLE001
            study.add_jit({"module": Job("torch", "flex", s, 0).module, "error": _err(e)})
            study._assert_cuda_alive()
    study.mark("phase 1 done: fa2 modules, flex compiles")
    if fa_jobs["fa3"]:
        if child:
            reserve = sum(j.est_measure_s(args.target_s) for j in fa_jobs["fa2"] + torch_jobs)
            finish_child_build(study, *child, "fa3", reserve_s=min(reserve, 0.5 * args.budget_s))
        else:
            build_in_process(study, "fa3")
        study.mark("fa3 modules ready")
    study.doc["provenance"]["gpu_state_before_timing"] = _smi("clocks.sm,clocks.mem,temperature.gpu,power.draw")
    study.ceilings()  # right before the timings: the same clocks, and it warms the GPU up
    # phase 2: timings, most telling first
    for b in ("fa3", "fa2"):
        if fa_jobs[b]:
            study.run_flashinfer(fa_jobs[b])
            study.mark(f"{b} timed")
    if torch_jobs:
        study.run_torch(torch_jobs)
        study.mark("torch baselines timed")
    if not args.no_probe and args.device.startswith("cuda") and study.left() > 60:
        study.probe()
        study.mark("probe timed")
    study.doc["provenance"]["gpu_state_end"] = _smi("clocks.sm,clocks.mem,temperature.gpu,power.draw")
    errs = [str(r["error"]) for r in study.doc["records"] if r.get("error")]
    budget = sum(e.startswith("skipped: budget") for e in errs)
    study.doc["status"] = ("complete" if not budget else f"budget: {budget} measurements skipped") + \
        (f"; {len(errs) - budget} not measured (see their error)" if len(errs) > budget else "")
    study.mark(f"done: {study.doc['status']}")
    print_summary(study.doc)
    return 0


def print_summary(doc: dict):
    print(f"\npeak bf16 {doc['peak_bf16_tflops']:.0f} TFLOP/s, copy {doc['copy_tbps']:.2f} TB/s; "
          f"{len(doc['records'])} records -> status {doc['status']}")
    print(f"{'backend':6s} {'variant':6s} {'L':>6s} {'B':>2s} {'heads':>5s} {'W':>5s} {'ms':>9s} {'TF/s':>7s} "
          f"{'peak':>5s} {'err':>8s}")
    for r in doc["records"]:
        if r.get("error"):
            continue
        err = "nan" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"
        print(f"{r['backend']:6s} {r['variant']:6s} {r['seq_len']:6d} {r['batch']:2d} "
              f"{r['num_qo_heads']:2d}:{r['num_kv_heads']:<2d} {r['window']:5d} {r['ms']:9.3f} "
              f"{r['useful_tflops']:7.1f} {r.get('peak_fraction', 0):5.2f} {err:>8s}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.build_only:
        return child_build(args)
    if args.dry_run:
        print_plan(plan_study(args), args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
