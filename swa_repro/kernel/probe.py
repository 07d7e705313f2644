"""The effective mask read off a real kernel (or any attention callable), key by key.

Method: ``q = 0`` so every logit ties and softmax is uniform over the keys a row actually sees;
``V`` is one-hot per block of ``D = head_dim`` keys: launch ``b`` sets ``V[j, h, :] =
onehot(j - b*D)`` for keys ``j`` in block ``b`` and 0 elsewhere, so ``o[row, head, d] =
1/n_visible(row, head)`` iff key ``b*D + d`` is visible. ``ceil(max_kv/D)`` launches cover every
key of every request of the batch at once. The reduction (first/last/count of visible keys,
value consistency, NaN, a bitwise digest) runs on the tensors' device.

The decoding is device-agnostic: :func:`probe_from_attention_fn` drives any
``attn_fn(batch: PagedBatch, repeat: int) -> o (total_qo, Hq, D)``; :func:`probe_case` drives
FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` on CUDA (planned once, the sglang way, see
``live.KernelRunner``). Before repeat ``r >= 1`` the kernel runner fills the float workspace with
a byte pattern, so reads of split-KV partial outputs that no CTA wrote show up as run-to-run
differences instead of silently reusing the previous launch's values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from swa_repro.core.batch import LAYOUT_SEED, PagedBatch, build_paged_batch, random_inputs
from swa_repro.core.case import Case
from swa_repro.core.intervals import Intervals, IntervalsView, ceil_div, nan_max, status_of
from swa_repro.core.reference import interval_attention, masked_attention, row_max_abs
from swa_repro.kernel.live import KernelRunner
from swa_repro.kernel.model import model_intervals

RTOL = 2.0 ** -5  # |o - 1/count| <= RTOL/count: bf16 rounding of 1/n plus the split-KV merge
RANDOM_ATOL = 3e-2  # bf16 output of random data vs float64 attention with the same mask
_P = 2147483647  # digest modulus (2**31 - 1)
_M = 1000003


# ----------------------------------------------------------------------------- CPU stand-in kernels
def mask_attention_fn(case: Case, masks, dtype=torch.bfloat16):
    """CPU stand-in kernel: ``attn_fn(batch, repeat)`` computing float64 attention with given
    per-request masks (bool ``(Hq, qo, kv)`` or ``(qo, kv)``), rounded to ``dtype`` like a kernel."""
    def attn_fn(batch: PagedBatch, repeat: int = 0) -> torch.Tensor:
        outs = []
        qi = batch.qo_indptr.tolist()
        for i, m in enumerate(masks):
            k, v = batch.request_kv(i)
            outs.append(masked_attention(batch.q[qi[i]:qi[i + 1]], k, v, m).to(dtype))
        return torch.cat(outs).to(batch.q.device)
    return attn_fn


def model_masks(case: Case) -> list[np.ndarray]:
    """Per request bool ``(Hq, qo, kv)`` masks of the kernel model."""
    return [np.stack([iv.mask(h) for h in range(iv.heads)]) for iv in model_intervals(case)]


# ----------------------------------------------------------------------------- result
@dataclass
class ProbeRequest(IntervalsView):
    """One request read off a kernel: ``(qo, heads)`` arrays unless said. ``heads`` are query heads
    for a fresh probe; a recording that stored only KV head 0's group has heads-in-group (the
    ``intervals`` columns say which, :meth:`Intervals.per_qo_head` maps them). ``status`` and
    ``reason``: from :func:`status_of` and the flags, unless given (a recording's, as recorded)."""
    intervals: Intervals  # first/last visible key, -1 where a row sees no key
    window_left: int
    count: np.ndarray
    contiguous: np.ndarray  # count == hi - lo + 1
    consistent: np.ndarray  # every nonzero probe output ~= 1/count
    nan: np.ndarray
    repeat_equal: np.ndarray  # every probe repeat gave bitwise the same outputs
    err_vs_reference: np.ndarray  # (qo,) random data vs the intended window, float32
    err_vs_model: np.ndarray  # (qo,) vs the kernel model's masks
    err_vs_probed: np.ndarray  # (qo,) vs attention with the probed intervals
    random_equal: np.ndarray  # (qo,) repeated random-data runs bitwise equal
    status: str = ""
    reason: str = ""

    def __post_init__(self):
        if not self.status:
            self.status, self.reason = status_of(self.intervals, self.window_left, self.broken())

    def broken(self) -> str | None:
        """Why the output is not one softmax over one key set per row, or None."""
        rows = lambda flags: int(np.asarray(flags).reshape(self.extend_len, -1).any(1).sum())  # noqa: E731
        checks = (
            (rows(self.nan), "NaN in {} rows"),
            (rows(~self.consistent), "{} rows whose outputs are not 1/count (inconsistent)"),
            (rows(~self.contiguous), "{} rows with non-contiguous visible keys"),
            (rows(~self.repeat_equal), "{} rows differ between probe repeats"),
            (rows(~self.random_equal), "{} rows differ between random-data runs"),
            (rows(~(self.err_vs_probed <= RANDOM_ATOL)),
             "{} rows of random data do not match attention with the probed mask (max err {:.3g})"),
        )
        why = [text.format(n, nan_max(self.err_vs_probed, float("nan"))) for n, text in checks if n]
        return "; ".join(why) or None


@dataclass
class ProbeResult:
    case: Case
    requests: list[ProbeRequest]
    plan_info: dict = field(default_factory=dict)  # cta_tile_q, split_kv, module, ...
    repeats: int = 2
    launches: int = 0
    timings: dict = field(default_factory=dict)  # seconds: jit_build, plan, probe, random
    source: str = "kernel"

    @property
    def statuses(self) -> list[str]:
        return [r.status for r in self.requests]

    @property
    def reasons(self) -> list[str]:
        return [r.reason for r in self.requests]

    def union_masks(self) -> list[np.ndarray]:
        return [r.mask() for r in self.requests]

    def summary(self) -> dict:
        mx = lambda x: nan_max(x, skip_nan=True)  # noqa: E731
        return {
            "source": self.source, "repeats": self.repeats, "launches": self.launches,
            "plan_info": self.plan_info, "timings": self.timings,
            "status": self.statuses, "reason": self.reasons,
            "nan_rows": [int(r.nan.any(1).sum()) for r in self.requests],
            "max_err_vs_reference": [mx(r.err_vs_reference) for r in self.requests],
            "max_err_vs_model": [mx(r.err_vs_model) for r in self.requests],
        }


# ----------------------------------------------------------------------------- decoding
def probe_layout(case: Case, dtype=torch.bfloat16, device="cpu") -> PagedBatch:
    """Zero q/k/v in the paged layout the probe and the random-data runs share."""
    z = lambda n, h: torch.zeros(n, h, case.head_dim, dtype=dtype)  # noqa: E731
    return build_paged_batch([z(e, case.num_qo_heads) for e in case.extend_lens],
                             [z(kv, case.num_kv_heads) for kv in case.kv_lens],
                             [z(kv, case.num_kv_heads) for kv in case.kv_lens],
                             case.page_size, seed=LAYOUT_SEED, device=device)


def slot_positions(batch: PagedBatch, kv_lens) -> torch.Tensor:
    """``(num_pages, page_size)`` absolute key position held by each cache slot, -1 if unused."""
    dev, ps = batch.k_cache.device, batch.page_size
    indptr = batch.kv_indptr.long()
    n_pages = indptr[1:] - indptr[:-1]
    req = torch.repeat_interleave(torch.arange(len(n_pages), device=dev), n_pages)  # (nnz,)
    j = torch.arange(len(req), device=dev) - indptr[:-1][req]  # page number inside its request
    pos = j[:, None] * ps + torch.arange(ps, device=dev)  # (nnz, ps)
    pos = torch.where(pos < torch.as_tensor(kv_lens, device=dev)[req][:, None], pos, -1)
    out = torch.full((batch.k_cache.shape[0], ps), -1, dtype=torch.long, device=dev)
    out[batch.kv_indices.long()] = pos
    return out


def _digest_weights(nbytes: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(12345)
    return torch.randint(1, 1 << 20, (nbytes,), generator=g, dtype=torch.int64).to(device)


def _probe_once(batch: PagedBatch, slot_pos, attn_fn, repeat: int, n_blocks: int):
    """One full sweep of launches; returns per (row, head) stats and a bitwise digest."""
    t, hq, d = batch.q.shape
    dev = batch.q.device
    hk = batch.k_cache.shape[2]
    big = torch.iinfo(torch.int64).max
    lo = torch.full((t, hq), big, dtype=torch.int64, device=dev)
    hi = torch.full((t, hq), -1, dtype=torch.int64, device=dev)
    cnt = torch.zeros(t, hq, dtype=torch.int64, device=dev)
    vmin = torch.full((t, hq), float("inf"), device=dev)
    vmax = torch.full((t, hq), float("-inf"), device=dev)
    nan = torch.zeros(t, hq, dtype=torch.bool, device=dev)
    digest = torch.zeros(t, hq, dtype=torch.int64, device=dev)
    ar = torch.arange(d, device=dev)
    weights = None
    for b in range(n_blocks):
        rel = slot_pos - b * d  # (P, ps)
        sel = (slot_pos >= 0) & (rel >= 0) & (rel < d)
        onehot = (rel.clamp(0, d - 1)[..., None] == ar) & sel[..., None]  # (P, ps, D)
        batch.v_cache.copy_(onehot[:, :, None, :].expand(-1, -1, hk, -1))
        o = attn_fn(batch, repeat)
        if tuple(o.shape) != (t, hq, d):
            raise ValueError(f"attention returned shape {tuple(o.shape)}, expected {(t, hq, d)}")
        of = o.float()
        isn = torch.isnan(of)
        nz = (of != 0) & ~isn
        c = nz.sum(-1)
        has = c > 0
        first = torch.where(nz, ar, d).amin(-1)
        last = torch.where(nz, ar, -1).amax(-1)
        lo = torch.where(has, torch.minimum(lo, b * d + first), lo)
        hi = torch.where(has, torch.maximum(hi, b * d + last), hi)
        cnt += c
        vmin = torch.minimum(vmin, torch.where(nz, of, float("inf")).amin(-1))
        vmax = torch.maximum(vmax, torch.where(nz, of, float("-inf")).amax(-1))
        nan |= isn.any(-1)
        raw = o.contiguous().view(torch.uint8).view(t, hq, -1).long()  # every bit of the output
        if weights is None:
            weights = _digest_weights(raw.shape[-1], dev)
        digest = (digest * _M + (raw * weights).sum(-1)) % _P
    lo = torch.where(cnt > 0, lo, -1)
    return {"lo": lo, "hi": hi, "count": cnt, "vmin": vmin, "vmax": vmax, "nan": nan, "digest": digest}


def probe_from_attention_fn(case: Case, attn_fn, repeats: int = 2, *, random_runs: int = 2, seed: int = 0,
                            dtype=torch.bfloat16, device="cpu", source: str = "attention_fn") -> ProbeResult:
    """Read the effective mask of ``attn_fn(batch, repeat) -> o (total_qo, Hq, D)`` for ``case``.

    ``repeats`` full probe sweeps are compared bitwise; ``random_runs`` runs on seeded random data
    are held against float64 attention with the intended window, the kernel model's masks and
    the probed intervals.
    """
    if repeats < 1 or random_runs < 0:
        raise ValueError("repeats must be >= 1 and random_runs >= 0")
    batch = probe_layout(case, dtype, device)
    slot_pos = slot_positions(batch, case.kv_lens)
    n_blocks = ceil_div(max(case.kv_lens), case.head_dim)
    t0 = time.perf_counter()
    runs = [_probe_once(batch, slot_pos, attn_fn, r, n_blocks) for r in range(repeats)]
    _sync(device)
    t_probe = time.perf_counter() - t0
    first = runs[0]
    same = torch.ones_like(first["nan"])
    for other in runs[1:]:
        for key in ("lo", "hi", "count", "nan", "digest"):
            same &= first[key] == other[key]
        for key in ("vmin", "vmax"):  # inf == inf is True; NaN never reaches vmin/vmax
            same &= first[key] == other[key]
    count = first["count"]
    countf = count.clamp(min=1).double()
    tol = RTOL / countf
    consistent = (count == 0) | (((first["vmin"].double() - 1 / countf).abs() <= tol)
                                 & ((first["vmax"].double() - 1 / countf).abs() <= tol))
    contiguous = (count == 0) | (count == first["hi"] - first["lo"] + 1)
    host = {k: v.cpu().numpy() for k, v in dict(first, consistent=consistent, contiguous=contiguous, same=same).items()}

    t1 = time.perf_counter()
    rnd = _random_checks(case, attn_fn, random_runs, seed, dtype, device, batch, host)
    _sync(device)
    t_random = time.perf_counter() - t1

    qi = batch.qo_indptr.tolist()
    reqs = []
    for i, (p, e) in enumerate(zip(case.prefix_lens, case.extend_lens)):
        sl = slice(qi[i], qi[i + 1])
        iv = Intervals(p, e, host["lo"][sl].astype(np.int32), host["hi"][sl].astype(np.int32))
        reqs.append(ProbeRequest(
            iv, case.window_left, count=host["count"][sl].astype(np.int32), contiguous=host["contiguous"][sl],
            consistent=host["consistent"][sl], nan=host["nan"][sl], repeat_equal=host["same"][sl],
            **{k: v[i] for k, v in rnd.items()}))
    return ProbeResult(case, reqs, repeats=repeats, launches=n_blocks * repeats + random_runs,
                       timings={"probe": round(t_probe, 4), "random": round(t_random, 4)}, source=source)


def _random_checks(case, attn_fn, runs, seed, dtype, device, layout: PagedBatch, host):
    """Per request: errors of random-data output and bitwise equality between runs."""
    qs, ks, vs = random_inputs(case, seed=seed, dtype=dtype)
    batch = build_paged_batch(qs, ks, vs, case.page_size, seed=LAYOUT_SEED, device=device)
    for f in ("qo_indptr", "kv_indptr", "kv_indices", "last_page_len"):
        if not torch.equal(getattr(batch, f).cpu(), getattr(layout, f).cpu()):
            raise RuntimeError(f"random-data batch has a different {f} than the probed layout")
    n = case.batch_size
    nan_rows = [np.full(e, np.nan, np.float32) for e in case.extend_lens]
    out = {"err_vs_reference": nan_rows, "err_vs_model": list(nan_rows), "err_vs_probed": list(nan_rows),
           "random_equal": [np.ones(e, bool) for e in case.extend_lens]}
    if runs == 0:
        return out
    outs = [attn_fn(batch, r) for r in range(runs)]
    o0 = outs[0]
    eq = torch.ones(o0.shape[0], dtype=torch.bool, device=o0.device)
    for o in outs[1:]:
        eq &= (o0.contiguous().view(torch.uint8).view(o0.shape[0], -1)
               == o.contiguous().view(torch.uint8).view(o0.shape[0], -1)).all(-1)
    eq = eq.cpu().numpy()
    qi = batch.qo_indptr.tolist()
    model = model_intervals(case)
    res = {k: [] for k in out}
    for i in range(n):
        sl = slice(qi[i], qi[i + 1])
        q, o = qs[i].to(device), o0[sl]
        k, v = ks[i].to(device), vs[i].to(device)
        p, e = case.prefix_lens[i], case.extend_lens[i]
        intended = Intervals.intended(p, e, case.window_left, case.num_qo_heads)
        probed = Intervals(p, e, host["lo"][sl], host["hi"][sl])
        for key, iv in (("err_vs_reference", intended), ("err_vs_model", model[i]), ("err_vs_probed", probed)):
            res[key].append(row_max_abs(o, interval_attention(q, k, v, iv.lo, iv.hi)))
        res["random_equal"].append(eq[sl])
    return res


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def probe_case(case: Case, repeats: int = 2, *, random_runs: int = 2, seed: int = 0, api: str = "forward",
               runner=None) -> ProbeResult:
    """Probe the real FlashInfer kernel on CUDA: plan once with ``case.plan_window_left``, then
    ``forward(window_left=case.window_left)`` per block (sglang <= 0.5.15.post1's calls)."""
    runner = runner or KernelRunner(case, probe_layout(case, device="cuda"))
    res = probe_from_attention_fn(case, runner.attn_fn(api), repeats, random_runs=random_runs, seed=seed,
                                  device=runner.device, source=f"flashinfer {runner.flashinfer_version} {api}()")
    res.plan_info = runner.describe()
    res.timings = {"jit_build": round(runner.build_seconds, 3), "plan": round(runner.plan_seconds, 4), **res.timings}
    return res
