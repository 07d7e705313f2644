"""What the simplest alternative to the ragged-window fix costs on the GPU: prefill of a hybrid
sliding-window model through the ragged wrappers (ours: the sliding-window layers get a ragged
wrapper of their own, planned with ``window_left``) or through the paged wrappers
(``alt_paged_for_swa``: no ragged prefill for sliding-window models).

Both are what sglang 0.5.23 builds: the ragged wrapper with ``backend="auto"`` (fa3 on sm90,
flashinfer_backend.py:501/523), the paged ones with ``self.prefill_backend = "fa2"`` (:335/538), page
size 1, bf16, causal. Head dim 64 and these plans are the modules the fixed live audit builds
(``audit.paths.HEADS``), so on a machine that ran it nothing new is compiled. Only ``run()`` is
timed (CUDA events, median of ``--iters``): a plan is made once per batch and serves every layer
of its kind. The sliding-window layer of the ragged path attends only the new tokens, as sglang's
no-prefix extend does; the paged path reads the same keys through the KV pool's indices.

``python benchmarks/alt_cost.py --out alt-cost.json`` (CUDA only; exits 2 without it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys

SHAPES = ((4, 4096, 1024), (1, 16384, 4096))  # (requests, new tokens each, window_left)
HEADS = dict(num_qo_heads=32, num_kv_heads=8, head_dim=64)
MIX = {"gemma2 (1 local : 1 global)": (1, 1), "gemma3 (5 local : 1 global)": (5, 1)}


def _time(fn, iters: int) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def measure(bs: int, n: int, window: int, iters: int) -> dict:
    """Per-layer milliseconds of run(), for a sliding-window and a full layer, on each path."""
    import flashinfer
    import torch

    dev, dt = "cuda", torch.bfloat16
    hq, hk, d = HEADS["num_qo_heads"], HEADS["num_kv_heads"], HEADS["head_dim"]
    total = bs * n
    indptr = torch.arange(0, total + 1, n, dtype=torch.int32, device=dev)  # (bs + 1,)
    q = torch.randn(total, hq, d, dtype=dt, device=dev)
    k = torch.randn(total, hk, d, dtype=dt, device=dev)
    v = torch.randn(total, hk, d, dtype=dt, device=dev)
    kv_cache = torch.stack([k, v], 1).unsqueeze(2)  # (pages, 2, page_size 1, hk, d): NHD
    pages = torch.randperm(total, device=dev).to(torch.int32)  # the pool hands out slots anywhere
    cache = torch.empty_like(kv_cache)
    cache[pages.long()] = kv_cache
    last = torch.ones(bs, dtype=torch.int32, device=dev)
    ws = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device=dev)
    out = {}
    for kind, wl in (("swa", window), ("full", -1)):
        rag = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="auto")
        rag.plan(indptr, indptr, hq, hk, d, causal=True, window_left=wl, q_data_type=dt, kv_data_type=dt)
        pag = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
        pag.plan(indptr, indptr, pages, last, hq, hk, d, 1, causal=True, window_left=wl, q_data_type=dt,
                 kv_data_type=dt)
        ref = rag.run(q, k, v)
        got = pag.run(q, cache)
        out[kind] = {"ragged_ms": _time(lambda: rag.run(q, k, v), iters),
                     "paged_ms": _time(lambda: pag.run(q, cache), iters),
                     "max_abs_diff": float((ref.float() - got.float()).abs().max())}
    for name, (local, glob) in MIX.items():
        ours = local * out["swa"]["ragged_ms"] + glob * out["full"]["ragged_ms"]
        alt = local * out["swa"]["paged_ms"] + glob * out["full"]["paged_ms"]
        out.setdefault("mix", {})[name] = {"ours_ms": ours, "alt_ms": alt, "alt_over_ours": alt / ours}
    return {"requests": bs, "tokens_each": n, "window_left": window, **HEADS, "layers": out}


def provenance(command: str) -> dict:
    import flashinfer
    import torch

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return {"gpu": torch.cuda.get_device_name(), "nvidia_smi": smi, "torch": torch.__version__,
            "cuda": torch.version.cuda, "flashinfer": flashinfer.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "command": command}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/alt_cost.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args(argv)
    if not 1 <= a.iters <= 1000:
        print("alt_cost: --iters must be 1..1000", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("alt_cost: needs CUDA (it times FlashInfer's kernels); run it on the GPU machine", file=sys.stderr)
        return 2
    doc = {"provenance": provenance(" ".join(["python benchmarks/alt_cost.py", *(argv or sys.argv[1:])])),
           "shapes": [measure(bs, n, w, a.iters) for bs, n, w in SHAPES]}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    for s in doc["shapes"]:
        print(f"{s['requests']}x{s['tokens_each']} window {s['window_left']}: " + "; ".join(
            f"{k} ours {m['ours_ms']:.3f} ms, alt {m['alt_ms']:.3f} ms ({m['alt_over_ours']:.2f}x)"
            for k, m in s["layers"]["mix"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
