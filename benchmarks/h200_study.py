"""The H200 study's run state: bookkeeping (results saved after every measurement, atomically),
provenance, the ceilings measured in the same run, and the live probe the targets name. The
measurements themselves are ``h200_kernels``' mixins.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import command_line, now_iso, write_json_atomic
from benchmarks.gpu_timing import Clock
from benchmarks.h200_kernels import FlashInferRuns, TorchRuns, _err
from benchmarks.h200_plan import Job


def _smi(fields: str):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


class Study(FlashInferRuns, TorchRuns):
    """One bounded run: ``doc`` is what goes to ``--out``."""

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
