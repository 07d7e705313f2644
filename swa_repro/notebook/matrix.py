"""What the bug does to real models, and the backend matrix, from the kernel model (+ recordings).

* :func:`model_matrix`: each model of ``model_configs`` x prompt length x cached prefix, run the
  sglang way: paged-only prefill, page size 1, KV trimmed to the last ``W + extend`` keys
  (flashinfer_backend.py:1698-1704, so the kernel sees ``prefix = min(P, W)``), planned without
  ``window_left`` and forwarded with it. Per cell: leaked keys per query (max/mean), status, and
  the output error those keys cause on random data (float64, sampled rows, CPU-cheap).
* :func:`backend_matrix`: fa2 / fa3 / auto on sm90 x split-KV on/off x flashinfer 0.6.12 /
  0.7.2.post1, effective-mask status per cell, with the committed GPU recording of that cell next
  to it where one exists (``recordings.load_recordings``).
* :func:`probe_4972`: flashinfer #4972 (fa2, non-causal sliding window, qo_len < kv_len, split-KV)
  on the installed flashinfer; CUDA only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from swa_repro.core.case import Case
from swa_repro.core.errors import CaseError
from swa_repro.core.intervals import ceil_div, intended_bounds
from swa_repro.kernel.model import simulate

PROMPTS = (1024, 8192, 32768)
PREFIXES = (0, 4096)


@dataclass
class Cell:
    model: str
    window_left: int
    prompt: int
    prefix: int
    status: str  # exact | leak | undefined | no window | not modelled
    max_leak: int  # keys per query outside the window (max over queries, union over heads)
    mean_leak: float
    err: float | None  # max |out - reference| over sampled rows, random data; None: not estimated
    note: str = ""
    leak_frac: float | None = None  # fraction of queries attending some key outside the window; None: no window

    def to_dict(self):
        return asdict(self)


def sglang_case(spec, prompt: int, prefix: int, *, plan_window_left: int = -1, backend: str = "fa2",
                disable_split_kv: bool = False, flashinfer_version: str = "0.6.12") -> Case:
    """The case sglang hands the SWA paged wrapper for one request of ``prompt`` new tokens after
    ``prefix`` cached ones (page size 1; KV trimmed to the last ``W + extend`` keys, :1698)."""
    w = spec.window_left
    return Case(prefix_lens=(min(prefix, w),), extend_lens=(prompt,), num_qo_heads=spec.num_qo_heads,
                num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, page_size=1, window_left=w,
                plan_window_left=w if plan_window_left >= 0 else -1, backend=backend,
                disable_split_kv=disable_split_kv, flashinfer_version=flashinfer_version,
                name=f"{spec.name}_p{prompt}_x{prefix}")


def output_error(req, group: int, head_dim: int, rows: int = 8, seed: int = 0) -> float:
    """Max |attention under the effective mask - under the intended one| over ``rows`` sampled
    query rows (the leakiest first), one KV head's group, each row with its own random N(0,1)
    q/k/v over the keys it could see (window + one tile at most), float32: cheap at any length."""
    extra = req.extra_keys()
    if not extra.any():
        return 0.0
    order = np.argsort(-extra, kind="stable")
    pick = np.unique(np.concatenate([order[: rows // 2], np.linspace(0, len(extra) - 1, rows // 2).astype(int)]))
    ilo, ihi = intended_bounds(req.prefix_len, req.extend_len, req.window_left)
    lo, hi = req.intervals.lo, req.intervals.hi  # (qo, group)
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    for r in pick:
        a, b = int(min(lo[r].min(), ilo[r])), int(max(hi[r].max(), ihi[r]))
        keys = torch.arange(a, b + 1)
        k = torch.randn(len(keys), head_dim, generator=g)
        v = torch.randn(len(keys), head_dim, generator=g)
        q = torch.randn(group, head_dim, generator=g)
        s = (q @ k.T) / math.sqrt(head_dim)  # (group, keys)
        eff = (keys >= torch.as_tensor(lo[r])[:, None]) & (keys <= torch.as_tensor(hi[r])[:, None])
        ref = (keys >= int(ilo[r])) & (keys <= int(ihi[r]))
        o_eff = torch.softmax(s.masked_fill(~eff, -math.inf), -1) @ v
        o_ref = torch.softmax(s.masked_fill(~ref[None], -math.inf), -1) @ v
        worst = max(worst, float((o_eff - o_ref).abs().max()))
    return worst


def model_cell(spec, prompt: int, prefix: int, *, estimate_error: bool = True) -> Cell:
    if not spec.has_window:
        return Cell(spec.name, spec.window_left, prompt, prefix, "no window", 0, 0.0, None,
                    "sglang serves this model without a window: " + spec.window_rule)
    try:
        case = sglang_case(spec, prompt, prefix)
    except CaseError as e:
        return Cell(spec.name, spec.window_left, prompt, prefix, "not modelled", 0, 0.0, None, str(e))
    req = simulate(case).requests[0]
    extra = req.extra_keys()
    frac = float((extra > 0).mean())
    if req.status == "undefined":
        return Cell(spec.name, spec.window_left, prompt, prefix, "undefined", int(extra.max()), float(extra.mean()),
                    None, req.reason, frac)
    err = output_error(req, case.group_size, case.head_dim) if estimate_error else None
    return Cell(spec.name, spec.window_left, prompt, prefix, req.status, int(extra.max()), float(extra.mean()), err,
                leak_frac=frac)


def model_matrix(specs=None, prompts=PROMPTS, prefixes=PREFIXES, *, estimate_error: bool = True) -> list[Cell]:
    from swa_repro.sglang.model_configs import model_specs

    return [model_cell(s, p, x, estimate_error=estimate_error)
            for s in (specs or model_specs()) for p in prompts for x in prefixes]


def leak_grid(windows, prompts, *, num_qo_heads=8, num_kv_heads=4, head_dim=256, prefix=0) -> np.ndarray:
    """``(len(windows), len(prompts))`` max leaked keys per query (NaN: undefined) for a heatmap of
    prompt length x window, sglang's paged-only layout, fa2, planned without the window."""
    out = np.zeros((len(windows), len(prompts)))
    for i, w in enumerate(windows):
        for j, p in enumerate(prompts):
            c = Case(prefix_lens=(min(prefix, w),), extend_lens=(p,), num_qo_heads=num_qo_heads,
                     num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=1, window_left=w, plan_window_left=-1,
                     flashinfer_version="0.6.12")
            r = simulate(c).requests[0]
            out[i, j] = np.nan if r.status == "undefined" else r.extra_keys().max()
    return out


# ----------------------------------------------------------------------------- backend matrix
BACKENDS = ("fa2", "fa3", "auto")
VERSIONS = ("0.6.12", "0.7.2.post1")


def backend_matrix(base: Case, recordings=None) -> list[dict]:
    """Status per (backend, split-KV, flashinfer version) of ``base`` planned without the window,
    from the model; ``recorded``: the GPU recording's statuses for the same case, if committed."""
    recs = {}
    for r in recordings or []:
        recs[_key(r.case)] = r
    rows = []
    for b in BACKENDS:
        for split_off in (False, True):
            for ver in VERSIONS:
                c = base.with_(backend=b, disable_split_kv=split_off, flashinfer_version=ver, plan_window_left=-1)
                m = simulate(c)
                rec = recs.get(_key(c))
                rows.append({"backend": b, "resolved": c.resolved_backend, "split_kv": "off" if split_off else
                             ("on" if m.plan and m.plan.split_kv else "allowed (not split)"),
                             "flashinfer": ver, "model": _worst(m.statuses),
                             "max_extra_keys": int(max(r.extra_keys().max() for r in m.requests)),
                             "recorded": _worst(rec.statuses) if rec else None,
                             "recording": rec.name if rec else None})
    return rows


def _key(c: Case):
    d = c.to_dict()
    d.pop("name", None)
    d.pop("sm_count", None)
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))


def _worst(statuses) -> str:
    for s in ("undefined", "leak", "exact"):
        if s in statuses:
            return s
    return "-"


def load_recordings_or_empty():
    """Committed GPU recordings, or [] with why (none committed yet / module missing)."""
    try:
        from swa_repro.evidence.recordings import load_recordings
    except ImportError as e:
        return [], f"recordings unavailable: {e}"
    recs = load_recordings()
    return recs, f"{len(recs)} committed recording(s)"


# ----------------------------------------------------------------------------- flashinfer #4972
@dataclass
class Probe4972:
    ran: bool
    detected: bool | None
    why: str
    bad_rows: list | None = None
    max_err: float | None = None


def probe_4972(qo_len=300, kv_len=4096, window_left=333, num_qo_heads=8, num_kv_heads=2, head_dim=128,
               page_size=16, seed=0) -> Probe4972:
    """fa2 paged prefill, ``causal=False``, ``window_left`` at plan, one request with qo_len <
    kv_len (split-KV on): compare with a float64 reference whose left bound is
    ``q_pos - window_left`` (q_pos = kv_len - qo_len + row, variants.cuh:88-89) and no right bound."""
    if not torch.cuda.is_available():
        return Probe4972(False, None, "not run: needs CUDA")
    try:
        import flashinfer
    except Exception as e:
        return Probe4972(False, None, f"not run: flashinfer does not import ({type(e).__name__}: {e})")
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = ceil_div(kv_len, page_size)
    k = torch.randn(pages, page_size, num_kv_heads, head_dim, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(pages, page_size, num_kv_heads, head_dim, device="cuda", dtype=torch.float16, generator=g)
    q = torch.randn(qo_len, num_qo_heads, head_dim, device="cuda", dtype=torch.float16, generator=g)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"),
                                                       "NHD", backend="fa2")
    i32 = dict(dtype=torch.int32, device="cuda")
    last = kv_len - (pages - 1) * page_size
    w.plan(torch.tensor([0, qo_len], **i32), torch.tensor([0, pages], **i32), torch.arange(pages, **i32),
           torch.tensor([last], **i32), num_qo_heads, num_kv_heads, head_dim, page_size, causal=False,
           window_left=window_left, q_data_type=torch.float16, kv_data_type=torch.float16)
    split = bool(w._plan_info[14]) if len(w._plan_info) > 14 else None
    o = w.run(q, (k, v)).double()
    kk = k.reshape(-1, num_kv_heads, head_dim)[:kv_len].double().repeat_interleave(num_qo_heads // num_kv_heads, 1)
    vv = v.reshape(-1, num_kv_heads, head_dim)[:kv_len].double().repeat_interleave(num_qo_heads // num_kv_heads, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) / math.sqrt(head_dim)
    pos = torch.arange(qo_len, device="cuda")[:, None] + kv_len - qo_len
    keep = torch.arange(kv_len, device="cuda")[None, :] >= pos - window_left
    ref = torch.einsum("hqk,khd->qhd", torch.softmax(s.masked_fill(~keep, -math.inf), -1), vv)
    err = (o - ref).abs().amax(dim=(1, 2))
    bad = torch.nonzero(err > 2e-2).flatten().tolist()
    return Probe4972(True, bool(bad), f"split_kv={split}; {len(bad)} of {qo_len} rows differ from the reference",
                     bad[:8] + (["..."] if len(bad) > 8 else []), float(err.max()))
