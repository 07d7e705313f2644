"""Issue #27's live step: vLLM's own FlashInfer backend run on kernels, its outputs read key by key
and held against the float64 reference (``python -m swa_repro.vllm.audit.live --overlay DIR --out F
--families gemma2,cohere2 --device cuda``; the GPU step is ``scripts/gpu_vllm.sh``).

The release's ``FlashInferImpl`` and ``FlashInferMetadataBuilder`` are built per layer kind as the
audit builds them (``paths.prepare``), on this GPU with its real FlashInfer
(``live_kernels.install_real``: every call recorded, the real kernel run) or on the CPU with the
model of what each kernel is told (``live_kernels.install_model``). Per path (a batch of
``paths.PATHS`` / ``paths.VARIANTS``, each request's prompt past the window):

* the batch's keys and values go into the release's cache through its own ``do_kv_cache_update``
  (the cache layout is the release's), the block table from a shuffled page order (``core.batch``);
* **keys**: the key probe (``kernel.probe``: q = 0 so every logit ties, V one-hot per block of
  ``head_dim`` keys) reads which keys each query row attends; held to the window the layer asks for
  (``asked``) and to transformers' mask of the family (``hf``);
* **cap**: one run on random data whose logits reach the soft cap (q and k scaled so that the
  scaled dot products have a standard deviation of twice the cap; 1 where the layer has none). Per
  row the largest error against the float64 reference at what the layer asks (``err_asked``: a row
  is *wrong* past ``ATOL``; the tolerances are the live judge's, ``engine.tolerance``), at
  transformers' window and cap (``err_hf``), and at what the kernel that ran the row is told
  (``err_told``, from its recorded call, ``paths.told``): within ``ATOL + RTOL * |reference|``
  everywhere, the kernel does what the audit says it is told (``told_agrees``).

With an NVFP4 cache (``--paths nvfp4_kv_mixed``: the mixed batch, the layer's impl, spec and
cache made for it as the audit makes them) the keys and values are drawn on NVFP4's own grid (e2m1
magnitudes, each 16 values' largest a power of two times 6: block scales of powers of two, so the
release's cache write stores them exactly and the float64 reference holds), all of the amplitude on
q; the key probe's one-hot values are not on that grid, so its keys are not read there.

A kernel's rows: vLLM puts decodes first, and the metadata's first ``num_decodes`` requests go to
the decode kernel, the rest to the prefill one (``FlashInferMetadata``).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

from swa_repro.engine.child import child_main, child_parser

LIVE_PATHS = ("decode", "mixed", "spec_decode", "cuda_graph_decode", "prefill")
OPTIONS = ("nvfp4_kv_mixed",)  # run where asked (``--paths``): a serving option's batch
V_TOP = 1.5  # V's largest value per 16 (a power of two times 6): bf16 outputs within ATOL of it
STOPPED: list[str] = []  # why no further path runs (an interrupt), once one stopped them
DECODE_KERNELS = ("BatchDecodeWithPagedKVCacheWrapper", "xqa_batch_decode_with_kv_cache",
                  "trtllm_batch_decode_with_kv_cache")


def amplitude(scale: float, head_dim: int, cap: float | None) -> float:
    """q's and k's standard deviation for which ``scale * q.k`` has one of ``2 * cap``."""
    return math.sqrt(2.0 * cap / (scale * math.sqrt(head_dim))) if cap else 1.0


def steps_of(path: str) -> tuple:
    """``(variant or None, [(stage, requests)])``: a variant's stages in order (a graph capture, then
    its replay, on one builder)."""
    from swa_repro.vllm.audit.paths import PATHS, VARIANTS

    return (None, [(None, PATHS[path])]) if path in PATHS else (path, list(VARIANTS[path][1]))


# ----------------------------------------------------------------------------- one path, run on a batch
class Runner:
    """One layer kind on one path: ``runner(batch, repeat) -> o (tokens, Hq, D)`` through the
    release's builder, its cache write and ``forward``; ``last``: the last run's kernel calls and
    the metadata's decode count."""

    def __init__(self, fb, drive, cfg, layer, device: str, pages: int):
        import torch

        from swa_repro.vllm.audit import kvcache

        self.fb, self.drive, self.layer, self.dev = fb, drive, layer, torch.device(device)
        self.cache_dtype = kv = cfg.cache_config.cache_dtype if cfg else "auto"
        spec = drive.spec_for(kv)
        self.builder = fb.FlashInferMetadataBuilder(spec, [drive.name], cfg, self.dev) if cfg else drive.builder
        fam = drive.fam
        self.cache = kvcache.kv_cache(fb, drive.layout, pages, fam["num_kv_heads"], fam["head_dim"],
                                      torch.bfloat16 if kv == "auto" else torch.uint8, self.dev, spec, kv)
        self.last: dict = {}

    def __call__(self, batch, repeat: int = 0):
        import torch

        from swa_repro.vllm.audit.paths import (
            KERNEL_CALLS,
            NOT_KERNELS,
            common_metadata,
            slots_of,
        )

        qo, ip = batch.qo_indptr.tolist(), batch.kv_indptr.tolist()
        n = len(qo) - 1
        seq = [(ip[i + 1] - ip[i] - 1) * batch.page_size + int(batch.last_page_len[i]) for i in range(n)]
        table = torch.zeros(n, max(ip[i + 1] - ip[i] for i in range(n)), dtype=torch.int32)
        for i in range(n):
            table[i, :ip[i + 1] - ip[i]] = batch.kv_indices[ip[i]:ip[i + 1]].cpu()
        cm, _ = common_metadata([(qo[i + 1] - qo[i], seq[i]) for i in range(n)], table)
        ks, vs = zip(*(batch.request_kv(i) for i in range(n)))
        every = torch.cat([slots_of(table, i, torch.arange(s)) for i, s in enumerate(seq)])  # every key's slot
        impl = self.layer.impl
        impl.do_kv_cache_update(self.layer, torch.cat(ks).to(self.dev), torch.cat(vs).to(self.dev), self.cache,
                                every.to(self.dev))  # the release's own write: its layout, not ours
        if self.dev.type != "cpu":  # what the model runner keeps on the GPU; the ``_cpu`` copies stay
            cm = dataclasses.replace(cm, **{f.name: getattr(cm, f.name).to(self.dev) for f in dataclasses.fields(cm)
                                            if f.init and torch.is_tensor(getattr(cm, f.name))
                                            and not f.name.endswith("_cpu")})
        rec = self.drive.rec
        k0 = len(rec.calls)
        md = self.builder.build(0, cm)
        q = batch.q.to(self.dev)
        k, v = (torch.cat([x[len(x) - (qo[i + 1] - qo[i]):] for i, x in enumerate(xs)]).to(self.dev) for xs in (ks, vs))
        out = torch.zeros_like(q)
        impl.forward(self.layer, q, k, v, self.cache, md, out)  # this step's keys and values: in the cache already
        self.last = {"calls": [c for c in rec.calls[k0:] if c["method"] in KERNEL_CALLS
                               and c["target"] not in NOT_KERNELS],
                     "num_decodes": int(getattr(md, "num_decodes", 0) or 0)}
        return out


# ----------------------------------------------------------------------------- judging
def told_per_request(last: dict, n: int, asked: dict) -> list[dict]:
    """Each request's kernel and what it was told (``paths.told``), by vLLM's decode-first split."""
    from swa_repro.vllm.audit.paths import told

    calls = last["calls"]
    dec = [c for c in calls if c["target"] in DECODE_KERNELS]
    pre = [c for c in calls if c["target"] not in DECODE_KERNELS]
    out = []
    for i in range(n):
        c = (dec or pre)[-1] if i < last["num_decodes"] else (pre or dec)[-1]
        t = told(c)
        cap = 0.0 if t["logits_soft_cap"] == "not passed" else float(t["logits_soft_cap"] or 0.0)
        window = asked["window_left"] if t["window_left"] == "not passed" else int(t["window_left"])
        out.append({"kernel": c["target"], "window_left": window, "logits_soft_cap": cap,
                    "sm_scale": t["sm_scale"] if isinstance(t["sm_scale"], float) else asked["sm_scale"]})
    return out


def on_nvfp4_grid(x, top: float = 6.0):
    """``x`` (..., D) on NVFP4's grid: each 16 values scaled so their largest magnitude is ``top`` (a
    power of two times 6), the rest rounded to the nearest e2m1 magnitude times ``top / 6``."""
    import torch

    from swa_repro.vllm.audit.live_kernels import E2M1

    b = x.double().reshape(*x.shape[:-1], -1, 16)
    y = b / b.abs().amax(-1, keepdim=True).clamp_min(1e-30) * 6.0
    grid = torch.tensor(E2M1, dtype=torch.float64)
    m = grid[(y.abs()[..., None] - grid).abs().argmin(-1)] * y.sign()
    return (m * (top / 6.0)).reshape(x.shape).to(x.dtype)


def cap_check(case, runner, asked: dict, hf: dict, seed: int) -> dict:
    """The random-data run (module docstring, **cap**) -> per-request rows, wrong rows and errors."""
    import torch

    from swa_repro.core.batch import LAYOUT_SEED, build_paged_batch, random_inputs
    from swa_repro.core.reference import intended_mask, masked_attention

    # the live judge's tolerances: bf16 against float64
    from swa_repro.engine.tolerance import ATOL, RTOL

    a = amplitude(asked["sm_scale"], case.head_dim, asked["logits_soft_cap"])
    qs, ks, vs = random_inputs(case, seed=seed)
    if runner.cache_dtype == "nvfp4":  # K and V exact in the cache; q carries the amplitude (std of q.k kept)
        ks, vs = [on_nvfp4_grid(x) for x in ks], [on_nvfp4_grid(x, V_TOP) for x in vs]
        qs = [(x.float() * a * a / k.float().std()).to(x.dtype) for x, k in zip(qs, ks)]
    else:
        qs, ks = [(x.float() * a).to(x.dtype) for x in qs], [(x.float() * a).to(x.dtype) for x in ks]
    batch = build_paged_batch(qs, ks, vs, case.page_size, seed=LAYOUT_SEED, device=runner.dev)
    o = runner(batch)  # the references run where it ran: float64 on the GPU there
    tolds = told_per_request(runner.last, case.batch_size, asked)
    qi = batch.qo_indptr.tolist()
    reqs = []
    for i, t in enumerate(tolds):
        p, e = case.prefix_lens[i], case.extend_lens[i]
        out = o[qi[i]:qi[i + 1]].double()
        errs = {}
        for name, (w, cap, sm) in {"asked": (asked["window_left"], asked["logits_soft_cap"], asked["sm_scale"]),
                                   "hf": (hf["window_left"], hf["logits_soft_cap"], asked["sm_scale"]),
                                   "told": (t["window_left"], t["logits_soft_cap"], t["sm_scale"])}.items():
            ref = masked_attention(qs[i], ks[i], vs[i], intended_mask(p, e, w), sm, cap or 0.0, device=o.device)
            d = (out - ref).abs()
            errs[name] = d.amax((1, 2)).cpu()
            if name == "told":
                errs["excess"] = (d - RTOL * ref.abs()).amax((1, 2)).cpu()
        reqs.append({**t, "rows": e, "wrong_rows": int((errs["asked"] > ATOL).sum()),
                     "wrong_rows_hf": int((errs["hf"] > ATOL).sum()),
                     "max_err_asked": float(errs["asked"].max()), "max_err_hf": float(errs["hf"].max()),
                     "max_err_told": float(errs["told"].max()),
                     "told_agrees": bool((errs["excess"] <= ATOL).all())})
    return {"amplitude": round(a, 4), "requests": reqs, "wrong_rows": sum(r["wrong_rows"] for r in reqs),
            "told_agrees": all(r["told_agrees"] for r in reqs), "nan": bool(torch.isnan(o).any().cpu())}


def keys_check(case, runner, hf_window: int, repeats: int) -> dict:
    """The key probe -> per request the rows whose keys are not the asked window's or HF's."""
    import numpy as np

    from swa_repro.core.intervals import Intervals
    from swa_repro.kernel.probe import probe_from_attention_fn

    res = probe_from_attention_fn(case, runner, repeats=repeats, random_runs=1, device=str(runner.dev),
                                  source="vllm")
    def off(got, p: int, e: int, window: int) -> int:  # rows whose first or last key is not the window's
        want = Intervals.intended(p, e, window, got.heads)
        return int((~((got.lo == want.lo) & (got.hi == want.hi))).any(1).sum())

    reqs = []
    for r, p, e in zip(res.requests, case.prefix_lens, case.extend_lens):
        got = r.intervals
        reqs.append({"rows": e, "status": r.status, "reason": r.reason, "rows_off_asked": off(got, p, e, case.window_left),
                     "rows_off_hf": off(got, p, e, hf_window), "first_key": int(np.asarray(got.lo)[-1].min()),
                     "last_key": int(np.asarray(got.hi)[-1].max()), "keys_last_row": int(r.count[-1].max())})
    return {"launches": res.launches, "requests": reqs, "rows_off_asked": sum(r["rows_off_asked"] for r in reqs),
            "rows_off_hf": sum(r["rows_off_hf"] for r in reqs)}


def run_path(fb, drive, cfg, layer, asked: dict, hf: dict, path: str, stages: list, device: str, arch, seed: int,
             repeats: int) -> dict:
    """One layer kind on one path: each stage's cap check on one builder (a CUDA-graph capture, then
    its replay: the replay re-plans through ``fast_decode_plan``), the last stage's kernels and keys."""
    from swa_repro.core.case import Case
    from swa_repro.vllm.audit.kvcache import PAGE

    fam, w = drive.fam, asked["window_left"]
    kv = cfg.cache_config.cache_dtype if cfg is not None else "auto"
    if kv != "auto":  # the layer's impl made for that cache, as the audit makes it (``paths.Drive.path``)
        layer = drive.layer_for(kv)
    pages = max(sum(math.ceil(s / PAGE) for _, s in reqs) for _, reqs in stages) + 1  # + the probe layout's spare
    runner = Runner(fb, drive, cfg, layer, device, pages)
    t0 = time.monotonic()
    row = {"path": path, "requests": stages[-1][1], "asked": asked, "hf": hf}
    for stage, reqs in stages:
        case = Case(prefix_lens=[s - q for q, s in reqs], extend_lens=[q for q, _ in reqs],
                    num_qo_heads=fam["num_qo_heads"], num_kv_heads=fam["num_kv_heads"], head_dim=fam["head_dim"],
                    page_size=PAGE, window_left=w, plan_window_left=w, arch=tuple(arch), name=f"vllm {path}")
        row["cap"] = cap_check(case, runner, asked, hf, seed)
        if stage is not None:
            row.setdefault("stages", {})[stage] = row["cap"]
    kernels = sorted({(r["kernel"], r["window_left"], r["logits_soft_cap"]) for r in row["cap"]["requests"]})
    row["kernels"] = [{"kernel": k, "told_window_left": tw, "told_logits_soft_cap": tc} for k, tw, tc in kernels]
    row["keys"] = keys_check(case, runner, hf["window_left"], repeats) if runner.cache_dtype == "auto" else {
        "not_run": f"the key probe's one-hot values are not on the {runner.cache_dtype} cache's grid"}
    return {**row, "seconds": round(time.monotonic() - t0, 2)}


# ----------------------------------------------------------------------------- one family
def family(fb, fam: dict, rec, device: str, arch, paths: list[str], seed: int, repeats: int,
           deadline: float | None) -> dict:
    from swa_repro.vllm.audit import paths as vp

    cfgs, layout_name, kinds = vp.prepare(fb, fam, rec, device)
    rows = []
    for kind, built in kinds:
        if isinstance(built, dict):
            rows.append({"layer": kind, **built})
            continue
        drive, layer, asked = built
        hf = {"window_left": fam["layers"][kind]["hf_window_left"], "logits_soft_cap": float(fam.get("hf_cap") or 0.0)}
        asked = {**asked, "logits_soft_cap": float(asked["logits_soft_cap"] or 0.0)}
        for path in paths:
            variant, stages = steps_of(path)
            if deadline is not None and time.monotonic() > deadline:
                rows.append({"layer": kind, "path": path, "not_run": "the live budget ran out"})
                continue
            if STOPPED:
                rows.append({"layer": kind, "path": path, "not_run": STOPPED[0]})
                continue
            try:
                rows.append({"layer": kind, **run_path(fb, drive, cfgs.get(variant), layer, asked, hf, path, stages,
                                                        device, arch, seed, repeats)})
            except KeyboardInterrupt:  # the step's timeout (SIGINT): keep what was judged, say the rest
                STOPPED.append("interrupted by the step's timeout")
                rows.append({"layer": kind, "path": path, "not_run": STOPPED[0]})
            except Exception as e:  # noqa: BLE001 - the release (or the kernel) refused this path: the row's answer
                rows.append({"layer": kind, "path": path, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
    return {"family": fam, "kv_cache_layout": layout_name, "rows": rows}


def run(overlay, a) -> dict:
    import torch

    from swa_repro.engine.tolerance import ATOL, RTOL
    from swa_repro.vllm import families
    from swa_repro.vllm.audit import drive, live_kernels
    from swa_repro.vllm.audit import env as standins

    cuda = a.device == "cuda"
    arch = torch.cuda.get_device_capability() if cuda else tuple(int(x) for x in a.arch.split("."))
    drive.ARCH[:] = list(arch)
    rec = standins.Recorder()
    live_kernels.register_cache_op()
    fb = drive.setup(rec, live_kernels.install_real if cuda else live_kernels.install_model, a.device)
    deadline = time.monotonic() + a.budget_s if a.budget_s else None
    out = {}
    for name in a.families.split(","):
        out[name] = family(fb, families.resolve(name, overlay), rec, a.device, arch, a.paths.split(","), a.seed,
                           a.repeats, deadline)
    import vllm

    fi = sys.modules.get("flashinfer")
    return {"families": out, "vllm": getattr(vllm, "__version__", None), "backend_file": fb.__file__,
            "device": torch.cuda.get_device_name() if cuda else "cpu", "arch": list(arch),
            "kernels": "real FlashInfer" if cuda else "CPU model of what each kernel is told (live_kernels)",
            "flashinfer": getattr(fi, "__version__", None), "torch": torch.__version__,
            "tolerances": {"atol": ATOL, "rtol": RTOL}, "seed": a.seed, "probe_repeats": a.repeats}


def main(argv=None) -> int:
    p = child_parser("swa_repro.vllm.audit.live")
    p.add_argument("--families", default="gemma2,cohere2", help="comma-separated (vllm.families.FAMILIES)")
    p.add_argument("--paths", default=",".join(LIVE_PATHS),
                   help=f"comma-separated, of {', '.join(LIVE_PATHS + OPTIONS)}")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--arch", default="9.0", help="on --device cpu: the GPU class modelled (e.g. 9.0, 8.0)")
    p.add_argument("--budget-s", type=float, default=0.0, help="no path starts after this many seconds (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2, help="key-probe sweeps compared bitwise")
    p.add_argument("--deps", type=Path, help="pure-Python imports the venv lacks (default: the overlay's .deps)")
    a, _ = p.parse_known_args(argv)
    from swa_repro.vllm.audit.drive import use_deps

    deps = a.deps or a.overlay / ".deps"
    use_deps(deps if deps.is_dir() else None)
    return child_main(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
