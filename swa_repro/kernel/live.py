"""Real FlashInfer on CUDA, called the way sglang <= 0.5.15.post1 calls it.

sglang's paged-only prefill builds ``BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD",
backend="fa2")``, plans *without* ``window_left`` and later calls the deprecated
``forward(q, (k, v), causal=True, window_left=W)``. ``plan()`` picks the compiled module from
``window_left >= 0`` (flashinfer 0.6.12 prefill.py:2035 / 0.7.2.post1 prefill.py:3689, via
``get_batch_prefill_module``, whose uri carries ``use_swa_{True,False}``:
jit/attention/modules.py:373 / :407); ``forward()`` overwrites ``self._window_left``
(prefill.py:2136 / :3969) so ``run()``'s ``assert window_left == self._window_left``
(prefill.py:2317 / :4313) passes; ``run(window_left=W)`` after such a plan raises AssertionError.

Imports only ``core`` and the kernel model; ``probe`` builds on :class:`KernelRunner` (one way).
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swa_repro.core.batch import LAYOUT_SEED, build_paged_batch, random_inputs
from swa_repro.core.case import Case
from swa_repro.core.errors import UsageError
from swa_repro.core.intervals import Intervals, nan_max
from swa_repro.core.reference import interval_attention, row_max_abs
from swa_repro.kernel.model import model_intervals

WORKSPACE_BYTES = 128 * 1024 * 1024  # sglang's and flashinfer's recommended float workspace
APIS = ("forward", "run")
# PrefillPlanInfo::ToVector (scheduler.cuh:650 in 0.6.12, :720 in 0.7.2.post1)
FA2_PLAN_FIELDS = ("padded_batch_size", "total_num_rows", "total_num_rows_offset", "cta_tile_q",
                   "request_indices_offset", "qo_tile_indices_offset", "kv_tile_indices_offset",
                   "merge_indptr_offset", "o_indptr_offset", "kv_chunk_size_ptr_offset", "v_offset",
                   "s_offset", "block_valid_mask_offset", "enable_cuda_graph", "split_kv")
# PrefillPlanSM90Info::ToVector (scheduler.cuh:844 / :1018)
FA3_PLAN_FIELDS = ("qo_tile_indices_offset", "qo_indptr_offset", "kv_indptr_offset", "qo_len_offset",
                   "kv_len_offset", "head_indices_offset", "work_indptr_offset", "batch_indices_offset",
                   "same_schedule_for_all_heads")


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise UsageError("this needs a CUDA GPU and none is visible to torch; without one use the kernel "
                     "model (`swa-repro mask --mode model`) or the committed recordings (recordings/)")


def import_flashinfer():
    """``flashinfer`` or a UsageError that says how to get it."""
    try:
        import flashinfer
        from flashinfer import prefill  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising anything at import
        raise UsageError(f"flashinfer is not importable ({type(e).__name__}: {e}); install the baseline "
                     "(`pip install -e .[baseline]`) or, on an air-gapped GPU machine, carry a "
                     "`swa-repro bundle` and run scripts/gpu_evidence.sh") from e
    return flashinfer


def installed_flashinfer_version() -> str:
    """The installed version exactly as ``Case.flashinfer_version`` spells it (e.g. 0.7.2.post1)."""
    fi = import_flashinfer()
    return str(fi.__version__).split("+")[0]


def module_key(case: Case, dtype=torch.bfloat16, idtype=torch.int32) -> tuple:
    """``(backend, *args)`` exactly as ``plan()`` passes them to ``get_batch_prefill_module``
    (prefill.py:2025-2042 / :3675-3695); ``auto`` is resolved like ``determine_attention_backend``."""
    return (case.resolved_backend, dtype, dtype, dtype, idtype, case.head_dim, case.head_dim, 0,
            case.plan_window_left >= 0, False, False)


def module_uri(backend: str, args) -> str:
    from flashinfer import prefill as fp

    return fp.get_batch_prefill_uri(backend, *args)


def prebuild_modules(keys, workers: int = 4, jobs: int | None = None) -> dict:
    """JIT-build (and load) the distinct batch-prefill modules in parallel threads: each build is
    its own ninja/nvcc job behind a per-module FileLock (jit/core.py), so builds overlap. ``jobs``
    caps the nvcc processes of all builds together by setting ninja's ``MAX_JOBS`` per build
    (read at each build, cpp_ext.py:345 in 0.6.12; unset, each ninja runs cores + 2 at once: a
    module is 10 sources, so many fa3 builds at once can exhaust memory). Returns
    ``{uri: seconds}`` or ``{uri: "error: ..."}``; a failed prebuild is not fatal (plan() builds
    the module again, sequentially, and a real failure is then reported for that case)."""
    from concurrent.futures import ThreadPoolExecutor

    from flashinfer import prefill as fp

    keys = list(dict.fromkeys(keys))
    workers = max(1, min(workers, len(keys) or 1))
    if jobs:
        os.environ["MAX_JOBS"] = str(max(1, -(-jobs // workers)))

    def build(key):
        t = time.perf_counter()
        try:
            uri = module_uri(key[0], key[1:])
        except Exception:
            uri = repr(key)
        try:
            fp.get_batch_prefill_module(*key)
        except Exception as e:  # noqa: BLE001 - reported, retried by plan()
            return uri, f"error: {type(e).__name__}: {str(e)[-500:]}"
        return uri, round(time.perf_counter() - t, 2)

    with ThreadPoolExecutor(max_workers=workers) as ex:
        return dict(ex.map(build, keys))


def jit_build_env() -> dict:
    """What decides JIT cost besides the modules: cores, ninja's ``MAX_JOBS`` (unset: ninja's own
    default, cores + 2) and ``FLASHINFER_CUDA_ARCH_LIST`` (unset: the visible GPUs' own archs,
    compilation_context.py:59-75 in 0.6.7.post2, :90-106 in 0.6.18)."""
    return {"cpu_count": os.cpu_count(), "MAX_JOBS": os.environ.get("MAX_JOBS"),
            "FLASHINFER_CUDA_ARCH_LIST": os.environ.get("FLASHINFER_CUDA_ARCH_LIST")}


def jit_library_bytes(uris) -> dict:
    """``{uri: bytes}`` of each built module's shared libraries, at ``JitSpec.jit_library_path``
    (jit/core.py:237-238 in 0.6.7.post2, :344-345 in 0.6.18): what carrying them between calls
    costs. From 0.7.2 an fa2 module is built under its uri plus a stride-mode suffix
    (jit/attention/modules.py:174-185 in 0.7.2.post1), so every suffixed name counts as well."""
    from flashinfer.jit import env as jit_env

    try:
        from flashinfer.jit.attention import modules
    except ImportError:
        modules = None
    suffixes = dict.fromkeys(("", *getattr(modules, "_BATCH_PREFILL_MODULE_URI_SUFFIX", {}).values()))
    root, out = Path(jit_env.FLASHINFER_JIT_DIR), {}
    for u in uris:
        sizes = [p.stat().st_size for s in suffixes if (p := root / f"{u}{s}" / f"{u}{s}.so").is_file()]
        if sizes:
            out[u] = sum(sizes)
    return out


@contextlib.contextmanager
def _spy_module_choice():
    """Record every ``get_batch_prefill_module(backend, *args)`` call ``plan()`` makes, so the
    module actually selected is identified by identity with ``wrapper._cached_module``."""
    from flashinfer import prefill as fp

    calls, orig = [], fp.get_batch_prefill_module

    def spy(backend, *args):
        t = time.perf_counter()
        mod = orig(backend, *args)
        calls.append((backend, args, mod, time.perf_counter() - t))
        return mod

    fp.get_batch_prefill_module = spy
    try:
        yield calls
    finally:
        fp.get_batch_prefill_module = orig


def plan_info_dict(plan_info, backend: str) -> dict:
    """Name the fields of ``wrapper._plan_info`` (15 for fa2, 9 for fa3's SM90 plan)."""
    if plan_info is None:
        return {"raw": None}
    try:
        vec = [int(x) for x in plan_info]
    except TypeError:
        return {"raw": repr(plan_info)}
    out = {"raw": vec}
    if len(vec) == len(FA2_PLAN_FIELDS) and backend == "fa2":
        out.update(dict(zip(FA2_PLAN_FIELDS, vec)))
        out["split_kv"] = bool(out["split_kv"])
    elif len(vec) == len(FA3_PLAN_FIELDS):
        out.update(dict(zip(FA3_PLAN_FIELDS, vec)))
        out.update(cta_tile_q=None, split_kv=False)  # fa3 prefill never splits KV
    return out


class KernelRunner:
    """One ``BatchPrefillWithPagedKVCacheWrapper`` planned once for ``case`` on ``layout``'s pages."""

    needs_cuda = True  # tests drive a fake flashinfer on CPU by turning this off

    def __init__(self, case: Case, layout, *, dtype=torch.bfloat16, workspace_bytes: int = WORKSPACE_BYTES):
        if self.needs_cuda:
            require_cuda()
        fi = import_flashinfer()
        self.case, self.dtype = case, dtype
        self.flashinfer_version = str(fi.__version__)
        self.device = dev = layout.q.device
        if dev.type != "cuda" and self.needs_cuda:
            raise ValueError("KernelRunner needs the paged batch on a CUDA device")
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=dev)
        self.wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=case.backend)
        extra = {"fixed_split_size": case.fixed_split_size} if case.fixed_split_size > 0 else {}
        with _spy_module_choice() as calls:
            t = time.perf_counter()
            self.wrapper.plan(layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.last_page_len,
                              case.num_qo_heads, case.num_kv_heads, case.head_dim, case.page_size,
                              causal=True, window_left=case.plan_window_left, q_data_type=dtype,
                              kv_data_type=dtype, disable_split_kv=case.disable_split_kv, **extra)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            self.plan_seconds = time.perf_counter() - t
        self.build_seconds = sum(c[3] for c in calls)
        self.backend = str(getattr(self.wrapper, "_backend", case.resolved_backend))
        self.module = self._module_info(calls)
        self.plan_info = plan_info_dict(getattr(self.wrapper, "_plan_info", None), self.backend)

    def _module_info(self, calls) -> dict:
        cached = getattr(self.wrapper, "_cached_module", None)
        hit = [c for c in calls if c[2] is cached and cached is not None]
        if not hit:
            return {"uri": None, "use_sliding_window": None,
                    "note": f"plan() made {len(calls)} get_batch_prefill_module calls, none is _cached_module"}
        backend, args, _, secs = hit[-1]
        try:
            uri = module_uri(backend, args)
        except Exception as e:  # signature drift between versions: keep the raw args
            uri = f"<{type(e).__name__}: {e}>"
        return {"uri": uri, "backend": backend, "use_sliding_window": bool(args[7]),
                "args": [str(a) for a in args], "get_module_seconds": round(secs, 3)}

    def describe(self) -> dict:
        return {"backend": self.backend, "module": self.module.get("uri"),
                "use_sliding_window": self.module.get("use_sliding_window"),
                "cta_tile_q": self.plan_info.get("cta_tile_q"), "split_kv": self.plan_info.get("split_kv"),
                "plan_info": self.plan_info.get("raw")}

    def run(self, q, k_cache, v_cache, *, api: str = "forward", repeat: int = 0) -> torch.Tensor:
        """One launch. Before ``repeat >= 1`` the float workspace (split-KV partial outputs only:
        scheduler.cuh PrefillPlan allocates just tmp_v/tmp_s there) gets a byte pattern."""
        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {api!r}")
        if repeat > 0:
            self.workspace.fill_((0x40 + repeat) & 0xFF)
        if api == "forward":
            return self.wrapper.forward(q, (k_cache, v_cache), causal=True, window_left=self.case.window_left)
        return self.wrapper.run(q, (k_cache, v_cache), window_left=self.case.window_left)

    def attn_fn(self, api: str = "forward"):
        return lambda batch, repeat=0: self.run(batch.q, batch.k_cache, batch.v_cache, api=api, repeat=repeat)


@dataclass
class LiveResult:
    case: Case
    api: str
    flashinfer_version: str
    module: dict
    plan_info: dict
    error: str | None  # e.g. run()'s AssertionError, with the flashinfer line that raised it
    err_vs_reference: list = field(default_factory=list)  # per request (qo,) float32
    err_vs_model: list = field(default_factory=list)
    nan_rows: list = field(default_factory=list)  # per request (qo,) bool
    timings: dict = field(default_factory=dict)

    def summary(self) -> dict:
        mx = lambda a: nan_max(a, skip_nan=True)  # noqa: E731
        return {"api": self.api, "flashinfer": self.flashinfer_version, "module": self.module.get("uri"),
                "use_sliding_window": self.module.get("use_sliding_window"),
                "cta_tile_q": self.plan_info.get("cta_tile_q"), "split_kv": self.plan_info.get("split_kv"),
                "error": self.error, "max_err_vs_reference": [mx(e) for e in self.err_vs_reference],
                "max_err_vs_model": [mx(e) for e in self.err_vs_model],
                "nan_rows": [int(n.sum()) for n in self.nan_rows], "timings": self.timings}


def _describe_exception(e: BaseException) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" at {frame.filename.split('site-packages/')[-1]}:{frame.lineno}: {frame.line}" if frame else ""
    return f"{type(e).__name__}: {e}{where}".replace(": :", ":")


def run_live(case: Case, *, seed: int = 0, api: str = "forward", dtype=torch.bfloat16) -> LiveResult:
    """Plan with ``case.plan_window_left``, then ``forward(..., window_left=W)`` (sglang's way)
    or ``run(..., window_left=W)``; errors per row vs the float64 reference and vs the model."""
    if api not in APIS:
        raise UsageError(f"--api must be one of {', '.join(APIS)}; got {api!r}")
    require_cuda()
    qs, ks, vs = random_inputs(case, seed=seed, dtype=dtype)
    batch = build_paged_batch(qs, ks, vs, case.page_size, seed=LAYOUT_SEED, device="cuda")
    runner = KernelRunner(case, batch, dtype=dtype)
    res = LiveResult(case, api, runner.flashinfer_version, runner.module, runner.plan_info, None,
                     timings={"jit_build": round(runner.build_seconds, 3), "plan": round(runner.plan_seconds, 4)})
    try:
        t = time.perf_counter()
        o = runner.run(batch.q, batch.k_cache, batch.v_cache, api=api)
        torch.cuda.synchronize()
        res.timings["run"] = round(time.perf_counter() - t, 4)
    except AssertionError as e:
        res.error = _describe_exception(e)
        return res
    qi = batch.qo_indptr.tolist()
    for i, mod_iv in enumerate(model_intervals(case)):
        ref_iv = Intervals.intended(mod_iv.prefix_len, mod_iv.extend_len, case.window_left, case.num_qo_heads)
        oi = o[qi[i]:qi[i + 1]]
        q, k, v = qs[i].cuda(), ks[i].cuda(), vs[i].cuda()
        res.err_vs_reference.append(row_max_abs(oi, interval_attention(q, k, v, ref_iv.lo, ref_iv.hi)))
        res.err_vs_model.append(row_max_abs(oi, interval_attention(q, k, v, mod_iv.lo, mod_iv.hi)))
        res.nan_rows.append(torch.isnan(oi).any(-1).any(-1).cpu().numpy())
    return res
