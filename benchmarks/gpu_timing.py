"""Timing and checking for the GPU study (METHOD.md): CUDA events around groups of calls after
warm-up, medians, inputs rotated past the L2, sampled rows held to a float32 reference.

Pure torch; the CPU path (``perf_counter``) exists for the smoke test only. The window a row is
held to is ``swa_repro.core.intervals.intended_bounds``'s.
"""

from __future__ import annotations

import math
import time

from swa_repro.core.intervals import intended_bounds

CHECK_ROWS = 24


class Clock:
    """Median per-call time: groups of calls between CUDA events (a short device sleep first lets
    the CPU queue the whole group), inputs rotated; ``perf_counter`` on CPU (smoke test only)."""

    def __init__(self, torch, device: str):
        self.torch, self.cuda = torch, device.startswith("cuda")

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def time(self, fn, n_sets: int, target_s: float, warmup: int = 3, min_groups: int = 5,
             max_groups: int = 40) -> dict:
        torch = self.torch
        fn(0)  # first call: caches, lazy loads
        self.sync()
        t0 = self._one(fn)
        for i in range(warmup if t0 < 20 else 0):  # long calls are warm after one
            fn(i % n_sets)
        self.sync()
        k = min(max(1, math.ceil(0.5 / max(t0, 1e-3))), 20)  # >= 0.5 ms of work per group
        groups = int(min(max(min_groups, target_s * 1e3 / (k * t0)), max_groups))
        per, j = [], 0
        if self.cuda:
            evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                   for _ in range(groups)]
            for a, b in evs:
                torch.cuda._sleep(int(2e5 * k))  # ~0.1 ms per queued call at ~2 GHz
                a.record()
                for _ in range(k):
                    fn(j % n_sets)
                    j += 1
                b.record()
            torch.cuda.synchronize()
            per = sorted(a.elapsed_time(b) / k for a, b in evs)
        else:
            for _ in range(groups):
                t = time.perf_counter()
                for _ in range(k):
                    fn(j % n_sets)
                    j += 1
                per.append((time.perf_counter() - t) * 1e3 / k)
            per.sort()
        n = len(per)
        return {"ms": per[n // 2] if n % 2 else 0.5 * (per[n // 2 - 1] + per[n // 2]),
                "ms_p10": per[n // 10], "ms_p90": per[min(n - 1, (9 * n) // 10)], "reps": n * k}

    def _one(self, fn) -> float:
        torch = self.torch
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(0)
            b.record()
            b.synchronize()
            return a.elapsed_time(b)
        t = time.perf_counter()
        fn(0)
        return (time.perf_counter() - t) * 1e3


def n_input_sets(set_bytes: int, l2_bytes: int) -> int:
    """Enough input sets that the rotation streams several L2s' worth (METHOD.md), at most 8."""
    return int(min(max(math.ceil(4 * l2_bytes / max(set_bytes, 1)), 1), 8))


def sample_positions(seq_len: int, window: int) -> list[int]:
    ps = {round(i * (seq_len - 1) / (CHECK_ROWS - 9)) for i in range(CHECK_ROWS - 8)}
    ps |= {seq_len - 1 - i for i in range(4)}
    if 0 <= window < seq_len:
        ps |= {min(seq_len - 1, window + i) for i in (0, 1, 63, 64)}
    return sorted(p for p in ps if 0 <= p < seq_len)


def check_rows(torch, out, q, k, v, window: int) -> dict:
    """Sampled rows against float32 softmax attention with the *intended* window: q/out
    ``(L, Hq, D)``, k/v ``(L, Hk, D)`` of one request. Buggy variants are expected to fail this."""
    L, hq, d = q.shape
    g = hq // k.shape[1]
    num = den = 0.0
    nan_rows = 0
    first, last = intended_bounds(0, L, window)  # (L,) each row's first and last visible key
    for p in sample_positions(L, window):
        lo, hi = int(first[p]), int(last[p])
        kk = k[lo:hi + 1].float().repeat_interleave(g, 1)  # (n, Hq, D)
        vv = v[lo:hi + 1].float().repeat_interleave(g, 1)
        s = torch.einsum("hd,nhd->hn", q[p].float(), kk) / math.sqrt(d)
        ref = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), vv)
        o = out[p].float()
        if not torch.isfinite(o).all():
            nan_rows += 1
            continue
        num += float(((o - ref) ** 2).sum())
        den += float((ref ** 2).sum())
    return {"rel_err": math.sqrt(num / den) if den > 0 and not nan_rows else None,
            "nan_rows_sampled": nan_rows}
