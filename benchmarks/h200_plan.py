"""The H200 study's plan, computed without a GPU: shapes, measurements in run order, modules to
build, and how long it should all take (``--dry-run`` prints it). See ``h200_swa_prefill``.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.common import computed_pairs, min_bytes, useful_flops

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
