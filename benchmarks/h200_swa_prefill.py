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
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks` (and `swa_repro`) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import GPU_RESULTS  # noqa: E402
from benchmarks.h200_kernels import _err  # noqa: E402
from benchmarks.h200_plan import (FLEX_COMPILE_EST_S, JIT_EST_S, Job, Shape, ints, module_name,  # noqa: E402,F401
                                  parse_gqa, plan_study, print_plan)
from benchmarks.h200_study import Study, _smi  # noqa: E402


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
