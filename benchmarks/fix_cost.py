"""The cost of the fix on the GPU (issue #40): per-layer attention time and per-step plan time of
FlashInfer's wrappers planned as sglang 0.5.23 plans them ("shipped") and as the fix does ("fixed"),
at Gemma-2 9B's and Gemma-3 12B's shapes and layer mixes; decode, ragged prefill, EAGLE verify.
What each plan is and where it comes from: ``benchmarks/fix_cost_plan.py``.

    python benchmarks/fix_cost.py --out $ART/fix-cost.json [--budget-s 180] [--quick]
    python benchmarks/fix_cost.py --dry-run            # the cases and modules; no GPU needed

The distinct modules (bf16, head_dim 256) are built first, all at once, each in its own thread
(the project's pre-build, ``swa_repro.kernel.jit_warm``: imports first, in this thread); a case is
measured once its modules are built. Kernels are timed with CUDA events in groups after warm-up
(``gpu_timing.Clock``: the median group), shipped and fixed alternating over ``--rounds``; plans by
wall clock around the plan calls plus a sync (median of ``--plan-reps``). Inputs are random; the KV
pool is page size 1 with shuffled slots, as sglang's. ``--budget-s`` stops cleanly: the file is
rewritten after each case and says what was left out and why; exit 0 unless nothing was measured.

Budget (H100, 16 cores, 2026-12-06): the ten modules' cold JIT builds take about 250 s all at once
(the four fa3 modules dominate: ``fix_cost_jit``; fa2 is done in about 100 s), the 24 cases about
40 s once built. So a cold call with the default ``--budget-s`` 180 should return decode and verify,
not prefill (not re-measured with this build order: with two waves it returned decode and Gemma-3's
verify, 12 of 24 cases); give a cold call 320 s or more for every case; a warm one needs about 60.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import command_line, now_iso, write_json_atomic
from benchmarks.fix_cost_jit import Builds, error
from benchmarks.fix_cost_plan import (
    CHECKPOINTS,
    SGLANG,
    Case,
    case_dict,
    cases,
    dry_run,
    model_shapes,
    modules,
    plans,
    waves,
)

WORKSPACE = 384 * 1024 * 1024  # sglang's SGLANG_FLASHINFER_WORKSPACE_SIZE default (environ.py:1221)


# ----------------------------------------------------------------------------- the three phases
class Bench:
    def __init__(self, torch, args, shapes):
        from benchmarks.gpu_timing import Clock

        self.torch, self.args, self.shapes = torch, args, shapes
        self.clock = Clock(torch, "cuda")
        self.ws = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")

    def _rand(self, *shape):
        return self.torch.randn(*shape, dtype=self.torch.bfloat16, device="cuda")

    def _i32(self, xs):
        return self.torch.tensor(xs, dtype=self.torch.int32, device="cuda")

    def plan_ms(self, fn) -> float:
        torch = self.torch
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(self.args.plan_reps):
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ts)

    def kernels(self, runs: dict) -> dict:
        """``runs[(variant, layer)] = fn``: median ms per call, variants alternating per round."""
        rounds = {k: [] for k in runs}
        for _ in range(self.args.rounds):
            for k, fn in runs.items():
                rounds[k].append(self.clock.time(lambda i, fn=fn: fn(), 1, self.args.target_s)["ms"])
        out = {}
        for (v, layer), xs in rounds.items():
            out[f"{v}_{layer}_ms"] = statistics.median(xs)
            out[f"{v}_{layer}_rounds"] = xs
        return out

    # ---- prefill: one request, no prefix, ragged (:1464-1471)
    def prefill(self, case, shape):
        import flashinfer

        bf = self.torch.bfloat16
        hq, hk, d, s = shape["num_qo_heads"], shape["num_kv_heads"], shape["head_dim"], shape["sm_scale"]
        ps = plans(shape, case)
        n = case.tokens
        ind = self._i32([0, n])
        q, k, v = self._rand(n, hq, d), self._rand(n, hk, d), self._rand(n, hk, d)
        mk = lambda: flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.ws, "NHD", backend="auto")
        shared = mk()
        variants = sorted({v for v, _ in ps} - {"shipped"})
        own = {(v, layer): mk() for v in variants for layer in ("sliding", "full")}  # fixes.py:100-157

        def plan(w, p):
            kw = {} if (p.window < 0 and p.cap == 0) else {"window_left": p.window, "logits_soft_cap": p.cap}
            w.begin_forward(ind, ind, hq, hk, d, q_data_type=bf, **kw)  # :2297-2304 (+ the fix's keywords)

        def plan_variant(v):
            for layer in ("sliding", "full"):  # shipped: the one wrapper, planned twice (:2077)
                plan(shared if v == "shipped" else own[v, layer], ps[v, layer])

        rec = {f"{v}_plan_ms": self.plan_ms(lambda v=v: plan_variant(v)) for v in ("shipped", *variants)}
        cap = shape["cap"]  # the layer's logit_cap, what forward() passes (:1470)

        def fwd(key):
            w = shared if key[0] == "shipped" else own[key]
            return lambda: w.forward(q, k, v, causal=True, sm_scale=s, logits_soft_cap=cap,
                                     window_left=ps[key].run_window)

        rec.update(self.kernels({key: fwd(key) for key in ps}))
        rec["backend_picked"] = {"shipped": shared._backend, **{f"{v}_{layer}": w._backend for (v, layer), w in own.items()}}
        return rec

    # ---- decode: two paged decode wrappers (:1669-1722, :1859-1873, :1566-1574)
    def decode(self, case, shape):
        import flashinfer

        torch, bf = self.torch, self.torch.bfloat16
        hq, hk, d, s, w = (shape[k] for k in ("num_qo_heads", "num_kv_heads", "head_dim", "sm_scale", "window_left"))
        B, C = case.batch, case.tokens
        pool_k, pool_v = self._rand(B * C, 1, hk, d), self._rand(B * C, 1, hk, d)
        slots = torch.randperm(B * C, device="cuda").to(torch.int32).view(B, C)  # the pool hands out slots anywhere
        ls = min(C, w + 1)  # the sliding wrapper's last window + 1 keys (:1686-1696)
        lay = {"full": (slots.reshape(-1), torch.arange(B + 1, dtype=torch.int32, device="cuda") * C),
               "sliding": (slots[:, C - ls:].reshape(-1).contiguous(),
                           torch.arange(B + 1, dtype=torch.int32, device="cuda") * ls)}
        last = torch.ones(B, dtype=torch.int32, device="cuda")
        q = self._rand(B, hq, d)
        ps = plans(shape, case)
        wr = {k: flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.ws, "NHD", backend="fa2", use_tensor_cores=False)
              for k in ps}

        def plan(v):
            for layer in ("sliding", "full"):
                p, (idx, ptr) = ps[v, layer], lay[layer]
                kw = {"logits_soft_cap": p.cap} if p.cap > 0 else {}  # soft_cap.py:121-122
                wr[v, layer].begin_forward(ptr, idx, last, hq, hk, d, 1, data_type=bf, q_data_type=bf,
                                           non_blocking=True, fixed_split_size=None, disable_split_kv=False, **kw)

        rec = {"shipped_plan_ms": self.plan_ms(lambda: plan("shipped")), "fixed_plan_ms": self.plan_ms(lambda: plan("fixed"))}

        def fwd(key):
            return lambda: wr[key].forward(q, (pool_k, pool_v), sm_scale=s, logits_soft_cap=shape["cap"])

        rec.update(self.kernels({k: fwd(k) for k in ps}))
        return rec

    # ---- EAGLE verify: two CUDA-graph-mode paged wrappers under the tree mask
    def verify(self, case, shape):
        import flashinfer

        from swa_repro.sglang.fix.spec_verify import TREE_HELPERS, TREE_MASK

        torch, bf = self.torch, self.torch.bfloat16
        hq, hk, d, s, w, cap = (shape[k] for k in ("num_qo_heads", "num_kv_heads", "head_dim", "sm_scale",
                                                   "window_left", "cap"))
        B, C, n = case.batch, case.tokens, case.draft
        ns = {"torch": torch}
        exec("\n".join(TREE_HELPERS[TREE_HELPERS.index(f"def {TREE_MASK}("):]), ns)  # noqa: S102 - the fix's own mask cut
        cut_fn = ns[TREE_MASK]
        pool_k, pool_v = self._rand(B * (C + n), 1, hk, d), self._rand(B * (C + n), 1, hk, d)
        slots = torch.randperm(B * (C + n), device="cuda").to(torch.int32).view(B, C + n)
        parent = [i - 1 for i in range(n)] if case.topk == 1 else [(i - 1) // 2 for i in range(n)]
        tree = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            tree[i] |= tree[parent[i]]  # ancestor-or-self, as build_tree_kernel_efficient's FULL_MASK
        row = torch.cat([torch.ones(n, C, dtype=torch.bool), tree], 1)  # (n, C + n): committed keys, then the tree
        mask = row.reshape(-1).repeat(B).cuda()  # (B * n * (C + n),)
        qo = torch.arange(B + 1, dtype=torch.int32, device="cuda") * n
        lk = {"first": min(C, w) + n, "all": C + n}  # eagle_info.py:115 widens the planned lengths by the draft
        lay = {k: (slots[:, :L].reshape(-1).contiguous(), torch.arange(B + 1, dtype=torch.int32, device="cuda") * L)
               for k, L in lk.items()}
        last = torch.ones(B, dtype=torch.int32, device="cuda")
        ps = plans(shape, case)
        shared = torch.zeros(B * n * (C + n), dtype=torch.uint8, device="cuda")  # :1134-1138
        own = {key: torch.zeros_like(shared) for key in ps if key[0] != "shipped"}  # spec_verify.py:177-211

        def wrapper(v, layer):
            return flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self.ws, "NHD", use_cuda_graph=True, backend="fa2", qo_indptr_buf=qo.clone(),
                paged_kv_indptr_buf=torch.zeros(B + 1, dtype=torch.int32, device="cuda"),
                paged_kv_indices_buf=torch.zeros(B * (C + n), dtype=torch.int32, device="cuda"),
                paged_kv_last_page_len_buf=last.clone(), custom_mask_buf=shared if v == "shipped" else own[v, layer],
                mask_indptr_buf=torch.zeros(B + 1, dtype=torch.int32, device="cuda"))

        wr = {k: wrapper(*k) for k in ps}
        cut_ms = []

        def plan(v):
            for layer in ("sliding", "full"):
                p = ps[v, layer]
                idx, ptr = lay[p.keys]
                m = mask
                if v != "shipped" and p.window >= 0:
                    t = time.perf_counter()
                    m = cut_fn(mask, ptr, B, n, B * C, p.window)  # call_begin_forward's cut (spec_verify.py:267-283)
                    torch.cuda.synchronize()
                    cut_ms.append((time.perf_counter() - t) * 1e3)
                kw = {"window_left": p.window} if p.window >= 0 else {}
                if p.cap > 0:
                    kw["logits_soft_cap"] = p.cap
                wr[v, layer].begin_forward(qo, ptr, idx, last, hq, hk, d, 1, q_data_type=bf, kv_data_type=bf,
                                           custom_mask=m, non_blocking=True, fixed_split_size=None, **kw)

        rec = {"shipped_plan_ms": self.plan_ms(lambda: plan("shipped"))}
        for v in sorted({v for v, _ in ps} - {"shipped"}):
            cut_ms.clear()
            rec[f"{v}_plan_ms"] = self.plan_ms(lambda v=v: plan(v))
            rec[f"{v}_mask_cut_ms"] = statistics.median(cut_ms)
        q = self._rand(B * n, hq, d)

        def fwd(key):
            p = ps[key]
            return lambda: wr[key].forward(q, (pool_k, pool_v), causal=True, sm_scale=s, window_left=p.run_window,
                                           logits_soft_cap=cap)

        # shipped: both wrappers read the one buffer, last written by the full layers' plan (issue #40 point 1);
        # the same amount of work as their own masks
        rec.update(self.kernels({k: fwd(k) for k in ps}))
        return rec


# ----------------------------------------------------------------------------- provenance and main
def needed(shapes, c) -> list[str]:
    return sorted({p.module for p in plans(shapes[c.model], c).values()})


def provenance(torch) -> dict:
    import flashinfer

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         check=False, capture_output=True, text=True).stdout.strip()
    return {"gpu": torch.cuda.get_device_name(), "driver": smi.split(",")[-1].strip() if smi else None,
            "nvidia_smi": smi, "torch": torch.__version__, "cuda": torch.version.cuda,
            "flashinfer": flashinfer.__version__, "flashinfer_path": str(Path(flashinfer.__file__).parent),
            "cpu_count": os.cpu_count(), "date": now_iso(), "command": command_line(), "sglang": SGLANG}


def parse(argv):
    p = argparse.ArgumentParser(prog="python benchmarks/fix_cost.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="the results JSON (needed unless --dry-run)")
    p.add_argument("--budget-s", type=float, default=180.0, help="stop measuring after this many seconds (builds included)")
    p.add_argument("--quick", action="store_true", help="the shortest and longest length of each phase only")
    p.add_argument("--dry-run", action="store_true", help="list the cases and modules; no GPU")
    p.add_argument("--models", default=",".join(CHECKPOINTS), help=f"comma-separated, of {', '.join(CHECKPOINTS)}")
    p.add_argument("--rounds", type=int, default=5, help="shipped/fixed alternations per kernel")
    p.add_argument("--target-s", type=float, default=0.1, help="timed seconds per kernel per round")
    p.add_argument("--plan-reps", type=int, default=9)
    a = p.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    bad = [m for m in models if m not in CHECKPOINTS]
    if bad or not models:
        p.exit(2, f"fix_cost: --models: unknown {bad[0] if bad else '(none)'}: choose from {', '.join(CHECKPOINTS)}\n")
    if not a.dry_run and a.out is None:
        p.exit(2, "fix_cost: --out PATH is needed (or --dry-run)\n")
    if not (a.budget_s > 0 and 1 <= a.rounds <= 20 and 0 < a.target_s <= 5 and 1 <= a.plan_reps <= 100):
        p.exit(2, "fix_cost: --budget-s > 0, --rounds 1..20, --target-s in (0, 5], --plan-reps 1..100\n")
    a.models = models
    return a


def main(argv=None) -> int:
    a = parse(argv)
    t0 = time.monotonic()
    deadline = t0 + a.budget_s
    shapes, source = model_shapes()
    shapes = {m: shapes[m] for m in a.models}
    todo = cases(a.models, a.quick)
    mods = modules(shapes, todo)
    if a.dry_run:
        print("\n".join(dry_run(todo, shapes, source)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("fix_cost: needs CUDA (it times FlashInfer's kernels); run it on the GPU machine", file=sys.stderr)
        return 2
    import flashinfer
    import flashinfer.decode
    import flashinfer.prefill  # noqa: F401

    doc = {"provenance": provenance(torch), "models": shapes, "models_source": source, "budget_s": a.budget_s,
           "quick": a.quick, "modules": mods, "waves": waves(mods), "status": "running", "records": []}
    builds = Builds(torch, waves(mods))
    bench = Bench(torch, a, shapes)
    reserve = 6.0  # about the longest case's measurement
    pending = list(todo)
    while pending:  # the first case whose modules are all built (or failed), in list order
        c = next((c for c in pending if builds.ready(needed(shapes, c))), None)
        if c is None and time.monotonic() < deadline - reserve:
            time.sleep(0.2)
            continue
        c = c or pending[0]
        pending.remove(c)
        rec = case_dict(c) | {"plans": {f"{v}_{layer}": asdict(p) | {"module": p.module}
                                        for (v, layer), p in plans(shapes[c.model], c).items()}}
        why = builds.why_not(needed(shapes, c))
        if why is None and time.monotonic() > deadline - reserve:
            why = "budget"
        if why is None:
            t = time.monotonic()
            try:
                rec.update(getattr(bench, c.phase)(c, shapes[c.model]))
            except Exception as e:  # noqa: BLE001 - recorded; the next case goes on
                why = error(e)
            rec["wall_s"] = round(time.monotonic() - t, 2)
            torch.cuda.empty_cache()
        if why:
            rec["error"] = why
        doc["records"].append(rec)
        doc["jit"] = builds.report()
        doc["elapsed_s"] = round(time.monotonic() - t0, 1)
        write_json_atomic(a.out, doc)
        print(f"fix_cost {doc['elapsed_s']:6.1f}s {c.key}: " + (rec.get("error") or " ".join(
            f"{k[:-3]} {rec[k]:.3f}" for k in rec if k.endswith("_ms"))), flush=True)
    doc["records"].sort(key=lambda r: todo.index(Case(**{k: r[k] for k in ("model", "phase", "tokens", "batch",
                                                                           "draft", "topk")})))
    measured = [r for r in doc["records"] if not r.get("error")]
    doc["status"] = "complete" if len(measured) == len(todo) else f"partial: {len(measured)} of {len(todo)} cases"
    doc["jit"], doc["elapsed_s"] = builds.report(), round(time.monotonic() - t0, 1)
    write_json_atomic(a.out, doc)
    print(f"fix_cost: {doc['status']}; wrote {a.out}", flush=True)
    rc = 0 if measured else 1
    if builds.running():  # a build past the budget: leave it (its ninja goes on), do not wait on it
        sys.stdout.flush()
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
