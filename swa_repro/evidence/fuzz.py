"""``swa-repro fuzz``: the kernel model against the real kernel on random batches.

``--mode live`` (CUDA + flashinfer): draw ``--cases`` random cases from ``--seed``
(:mod:`swa_repro.evidence.fuzz_cases`), JIT-build every module they need in parallel, probe each
case like ``swa-repro record`` (:func:`swa_repro.kernel.probe.probe_case`), store the run
(:mod:`swa_repro.evidence.fuzz_store`, default ``artifacts/fuzz/live/<version>/``: the committed
``recordings/fuzz/<version>/`` only when named with ``--force``) and hold the model
to it per request and query head (:mod:`swa_repro.evidence.fuzz_compare`). ``--mode model``
replays the committed fuzz recordings through the model. ``--mode selftest`` runs the live
pipeline on CPU with the model's own masks standing in for the kernel (checks the machinery,
proves nothing about the kernel; never written under recordings/ by default). ``auto``: live iff
CUDA and flashinfer are usable, else model. Exit 1 on any disagreement or case that failed to
probe, 2 on bad input (nothing written).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

from swa_repro.core.case import Case
from swa_repro.core.errors import UsageError, check_bounds
from swa_repro.core.intervals import nan_max
from swa_repro.core.outputs import not_regular, out_dir, untracked_dir, untracked_file, write_atomic
from swa_repro.core.versions import FLASHINFER_VERSIONS, unmodelled_message
from swa_repro.evidence import fuzz_cases as fc
from swa_repro.evidence.fuzz_report import build_report, format_report
from swa_repro.evidence.fuzz_store import encode_case, find_runs, load_run, observed_from_probe, write_run
from swa_repro.evidence.recordings import DEFAULT_ROOT, provenance

FUZZ_ROOT = DEFAULT_ROOT / "fuzz"
ARTIFACTS = DEFAULT_ROOT.parent / "artifacts" / "fuzz"
LIMITS = {"live": (2048, 6144, 6), "selftest": (48, 160, 3)}  # max_len, max_tokens, max_batch


# ----------------------------------------------------------------------------- pipeline (library)
def stem_for(a) -> str:
    s = f"fuzz-s{a.seed}-n{a.cases}-{'_'.join(a.backends)}-hd{'_'.join(map(str, a.head_dims))}"
    if (a.max_len, a.max_tokens, a.max_batch) != LIMITS["live"]:
        s += f"-L{a.max_len}-T{a.max_tokens}-B{a.max_batch}"
    if any(v != fc.PLAN_VARIANTS for v in getattr(a, "plans", {}).values()):
        s += "-plans-" + "_".join(f"{b}{''.join(x[0] for x in v)}" for b, v in a.plans.items())
    return s


def probe_cases(cases, probe_fn, *, budget_s: float = 0, log=print) -> tuple[list[dict], dict, list[int]]:
    """Probe each case with ``probe_fn(case) -> ProbeResult`` (cases the model calls undefined
    last, so a fault there cannot cost the others); stop starting cases after ``budget_s`` (0: no
    limit) or on Ctrl-C. Returns (JSON entries by index, npz arrays, indices not probed)."""
    from swa_repro.kernel.model import simulate

    order = sorted(range(len(cases)), key=lambda k: "undefined" in simulate(cases[k]).statuses)
    entries, arrays, t0 = {}, {}, time.perf_counter()
    for n, k in enumerate(order):
        if budget_s and time.perf_counter() - t0 > budget_s:
            log(f"budget of {budget_s:.0f} s spent: {len(order) - n} cases not probed")
            break
        case, t = cases[k], time.perf_counter()
        try:
            res = probe_fn(case)
            obs = [observed_from_probe(r) for r in res.requests]
            extra = {"plan_info": res.plan_info, "timings": res.timings, "seconds": round(time.perf_counter() - t, 3),
                     "source": res.source, "repeats": res.repeats, "launches": res.launches,
                     "max_err": {f: [_max_err(getattr(r, f"err_{f}")) for r in res.requests]
                                 for f in ("vs_reference", "vs_model", "vs_probed")},
                     "random_equal": [bool(r.random_equal.all()) for r in res.requests]}
            entries[k], arr = encode_case(k, case, obs, extra)
            arrays.update(arr)
        except KeyboardInterrupt:
            log(f"interrupted: {len(order) - n} cases not probed")
            break
        except Exception as e:  # keep going: the other cases are still evidence
            entries[k] = {"index": k, "case": case.to_dict(), "error": f"{type(e).__name__}: {e}"[:2000]}
            log(f"FAILED {case.name}: {entries[k]['error']}\n{traceback.format_exc(limit=3)}")
            continue
        log(f"{case.name:16s} {','.join(entries[k]['statuses']):30s} {time.perf_counter() - t:6.2f}s")
    entries = [entries[k] for k in sorted(entries)]
    return entries, arrays, [k for k in range(len(cases)) if k not in {e["index"] for e in entries}]


def _max_err(x):
    """Largest per-row error for the JSON: None when no random run, "nan" when any row is NaN."""
    v = nan_max(x, None)
    return v if v is None or v == v else "nan"


def run_and_store(cases, probe_fn, stem: Path, doc: dict, *, budget_s: float = 0, log=print):
    """Probe, write ``<stem>.json/.npz``, read it back and compare: the report always comes from
    the stored recording, exactly as a later replay sees it. Returns (report, json path)."""
    t = time.perf_counter()
    entries, arrays, skipped = probe_cases(cases, probe_fn, budget_s=budget_s, log=log)
    doc = {**doc, "cases_generated": len(cases), "not_probed": skipped, "probe_seconds": round(time.perf_counter() - t, 2)}
    path = write_run(stem, doc, entries, arrays)
    run = load_run(path)
    rep = build_report([run], doc["mode"], doc["provenance"], {"args": doc["args"], "not_probed": skipped,
                                                               "seconds": _seconds(doc, entries)})
    return rep, path


def _seconds(doc, entries) -> dict:
    per = [e["seconds"] for e in entries if "seconds" in e]
    return {"jit_prebuild": doc.get("jit_prebuild", {}).get("seconds_total"), "probe_total": doc["probe_seconds"],
            "per_case_mean": round(sum(per) / len(per), 3) if per else None, "per_case_max": max(per, default=None)}


def model_stand_in(case: Case, masks=None):
    """CPU 'kernel': attention with the kernel model's masks (or ``masks``); the rows of requests
    the model calls ``undefined`` get a repeat-dependent offset, like a split-KV race."""
    from swa_repro.kernel.model import simulate
    from swa_repro.kernel.probe import mask_attention_fn, model_masks

    fn = mask_attention_fn(case, model_masks(case) if masks is None else masks)
    racy = [i for i, s in enumerate(simulate(case).statuses) if s == "undefined"]

    def attn(batch, repeat=0):
        o = fn(batch, repeat)
        qi = batch.qo_indptr.tolist()
        for i in racy:
            o[qi[i]:qi[i + 1]] += 0.01 * (repeat + 1)
        return o
    return attn


def selftest_probe(case: Case, random_runs: int = 1):
    """The live pipeline's probe with :func:`model_stand_in` as the kernel (CPU)."""
    from swa_repro.kernel.probe import probe_from_attention_fn

    return probe_from_attention_fn(case, model_stand_in(case), repeats=2, random_runs=random_runs)


# ----------------------------------------------------------------------------- command
def register(sub) -> None:
    p = sub.add_parser("fuzz", help="the kernel model against the real kernel on random batches (GPU) or recordings")
    p.add_argument("--mode", choices=("auto", "live", "model", "selftest"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", type=int, default=100)
    p.add_argument("--flashinfer-version", default=None,
                   help="the model to hold the kernel to. live: the installed flashinfer (default); an "
                        "unmodelled installed flashinfer is held to the version given here. model: which recordings")
    p.add_argument("--backends", default="fa2,fa3", help=f"comma-separated subset of {','.join(fc.GEN_BACKENDS)}")
    p.add_argument("--head-dims", default="64,128,256", help="comma-separated subset of 64,128,256")
    p.add_argument("--plans", default="bug,fix",
                   help="plan variants to draw: bug (plan without window_left), fix (with it), or per backend, "
                        "e.g. fa3:bug; pinning one variant halves that backend's JIT builds (default bug,fix)")
    p.add_argument("--max-len", type=int, default=None, help="longest prefix/extend (live 2048, selftest 48)")
    p.add_argument("--max-tokens", type=int, default=None, help="keys per case in all (live 6144, selftest 160)")
    p.add_argument("--max-batch", type=int, default=None, help="requests per case (live 6, selftest 3)")
    p.add_argument("--repeats", type=int, default=2, help="full probe sweeps compared bitwise")
    p.add_argument("--random-runs", type=int, default=2, help="random-data runs per case (>= 1: the probe's "
                   "status needs one; 2 also compares them bitwise)")
    p.add_argument("--jit-workers", type=int, default=4, help="modules JIT-built in parallel first")
    p.add_argument("--jit-jobs", type=int, default=None,
                   help="nvcc processes of all parallel builds together (sets ninja's MAX_JOBS per build; "
                        "default: ninja's own, cores + 2 per build)")
    p.add_argument("--prebuild-only", action="store_true", help="live: JIT-build the modules the cases need, then stop")
    p.add_argument("--budget-s", type=float, default=0, help="stop starting cases after this many seconds (0: none)")
    p.add_argument("--out", default=None, help="live: folder (default artifacts/fuzz/live/<version>/; the "
                   "committed recordings/fuzz/<version>/ with --force)")
    p.add_argument("--force", action="store_true", help="let --out or --report be in the committed folders "
                   "(recordings/, docs/)")
    p.add_argument("--recordings", default=str(FUZZ_ROOT), help="model: root of <version>/ fuzz recordings")
    p.add_argument("--report", default=None, help="report JSON path (default: next to the recording; model: artifacts/fuzz/)")
    p.set_defaults(func=main)


def _csv(text: str, conv, flag: str) -> tuple:
    """A repeated value was drawn twice as often (and named twice in the recording's file name)."""
    try:
        vals = tuple(conv(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated values; got {text!r}") from None
    twice = sorted({str(x) for x in vals if vals.count(x) > 1})
    if twice:
        raise UsageError(f"{flag} names {', '.join(twice)} more than once: give each once")
    return vals


def _mode_flags(a, requested: str) -> None:
    """Flags the resolved mode never reads were dropped (``--mode model --out X`` made X and wrote
    the report elsewhere); an empty path fell back to the default one."""
    for flag, value in (("--out", a.out), ("--report", a.report), ("--recordings", a.recordings)):
        if value is not None and not str(value).strip():
            raise UsageError(f"{flag} '': name a path, or leave {flag} out for its default")
    live_only = [f for f, on in (("--out", a.out), ("--budget-s", a.budget_s), ("--jit-jobs", a.jit_jobs is not None),
                                 ("--prebuild-only", a.prebuild_only)) if on]
    if a.mode == "model" and live_only:
        why = "" if requested == "model" else " (auto picked it: no usable CUDA here)"
        raise UsageError(f"{', '.join(live_only)}: --mode model{why} replays the recordings under --recordings into "
                         "--report; these go with --mode live or selftest")
    if a.mode != "model" and a.recordings != str(FUZZ_ROOT):
        raise UsageError(f"--recordings goes with --mode model (it replays them); --mode {a.mode} draws new cases")


def _bounds(a) -> list:
    """(flag, value, lowest, highest) of every number; the highest keeps a run within hours."""
    return [("--seed", a.seed, 0, 2**32 - 1), ("--cases", a.cases, 1, 5000), ("--max-len", a.max_len, 1, 65536),
            ("--max-tokens", a.max_tokens, 2, 131072), ("--max-batch", a.max_batch, 1, 64),
            ("--repeats", a.repeats, 1, 10), ("--random-runs", a.random_runs, 1, 10),
            ("--jit-workers", a.jit_workers, 1, 64), ("--jit-jobs", a.jit_jobs, 1, 256),
            ("--budget-s", a.budget_s, 0, 86400)]


def _check(a, requested: str | None = None) -> None:
    a.backends = _csv(a.backends, str, "--backends")
    a.head_dims = _csv(a.head_dims, int, "--head-dims")
    lim = LIMITS["selftest" if a.mode == "selftest" else "live"]
    a.max_len, a.max_tokens, a.max_batch = (x if x is not None else d for x, d in zip((a.max_len, a.max_tokens, a.max_batch), lim))
    fc.check_args(a.cases, a.backends, a.head_dims, a.max_len, a.max_tokens, a.max_batch)
    a.plans = fc.parse_plans(a.plans, a.backends)
    check_bounds(_bounds(a))
    if a.flashinfer_version is not None and a.flashinfer_version not in FLASHINFER_VERSIONS:
        raise UsageError(unmodelled_message(a.flashinfer_version))
    _mode_flags(a, requested or a.mode)  # the values first (as given), then what the mode reads
    if a.force and not (a.out or a.report):
        raise UsageError("--force goes with --out or --report (a committed folder); without them nothing is "
                         "written there")
    if a.out:
        untracked_dir(a.out, "--out", force=a.force)  # created when missing; checked before any case runs
    if a.report:
        if Path(a.report).is_dir():
            raise UsageError(f"--report {a.report} is a folder: name a .json file")
        if Path(a.report).is_symlink():
            raise UsageError(f"--report {a.report} is a symbolic link to {os.path.realpath(a.report)}: name a "
                             "regular file (a link is never written through)")
        not_regular(a.report, "--report")
        out_dir(Path(a.report).parent, "--report's folder")
        untracked_file(a.report, "--report", force=a.force)


def main(a) -> int:
    requested = a.mode
    if a.mode == "auto":  # first: which flags mean something depends on it
        from swa_repro.core.mode import resolve_mode

        a.mode = resolve_mode("auto").mode
    _check(a, requested)
    if a.mode == "model":
        return _replay(a)
    return _live(a)


def _args_doc(a) -> dict:
    keys = ("seed", "cases", "backends", "head_dims", "max_len", "max_tokens", "max_batch", "repeats", "random_runs")
    return {**{k: getattr(a, k) for k in keys}, "plans": {b: list(v) for b, v in a.plans.items()}}


def _live(a) -> int:
    live = a.mode == "live"
    if a.prebuild_only and not live:
        raise UsageError("--prebuild-only needs --mode live (it JIT-builds on the GPU machine)")
    version, sm_count, arch = a.flashinfer_version or Case.__dataclass_fields__["flashinfer_version"].default, 132, (9, 0)
    if live:
        version, sm_count, arch = _device(a)
    cases = fc.for_device(fc.generate(a.seed, a.cases, backends=a.backends, head_dims=a.head_dims, max_len=a.max_len,
                                      max_tokens=a.max_tokens, max_batch=a.max_batch, plans=a.plans),
                          flashinfer_version=version, sm_count=sm_count, arch=arch)
    print(f"fuzz {a.mode}: flashinfer {version}, seed {a.seed}, {len(cases)} cases, modules {fc.module_labels(cases)}", flush=True)
    jit, failed = {}, {}
    if live:
        jit = _prebuild(cases, a.jit_workers, a.jit_jobs)
        mods = jit["modules"]
        print(f"JIT: {len(mods)} modules in {jit['seconds_total']} s wall, {jit['cpu_seconds']} s CPU: {mods}", flush=True)
        failed = {u: v for u, v in mods.items() if isinstance(v, str)}
        if a.prebuild_only:
            return 1 if failed else 0
    kernel_version = getattr(a, "installed_flashinfer", version)
    out = Path(a.out) if a.out else ARTIFACTS / ("live" if live else "selftest") / (kernel_version if live else version)
    stem = out / stem_for(a)
    doc = {"mode": a.mode, "flashinfer_version": version, "kernel_flashinfer_version": kernel_version,
           "args": _args_doc(a), "provenance": provenance(), "jit_prebuild": jit}
    probe_fn = selftest_probe if not live else _live_probe(a, failed)
    rep, path = run_and_store(cases, probe_fn, stem, doc, budget_s=a.budget_s)
    return _finish(rep, Path(a.report) if a.report else stem.with_name(stem.name + ".report.json"), path)


def _prebuild(cases, workers: int, jobs: int | None) -> dict:
    """JIT-build the cases' modules; the wall and CPU time (nvcc and ninja are waited-for
    children, so ``RUSAGE_CHILDREN`` counts them), the build settings and each library's size."""
    from swa_repro.kernel.live import jit_build_env, jit_library_bytes, module_key, prebuild_modules

    t, cpu0 = time.perf_counter(), _children_cpu_s()
    mods = prebuild_modules([module_key(c) for c in cases], workers=workers, jobs=jobs)
    return {"seconds_total": round(time.perf_counter() - t, 1), "cpu_seconds": round(_children_cpu_s() - cpu0, 1),
            "workers": workers, "jobs": jobs, "env": jit_build_env(), "modules": mods, "library_bytes": jit_library_bytes(mods)}


def _children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _device(a):
    from swa_repro.kernel.live import installed_flashinfer_version, require_cuda

    require_cuda()
    import torch

    installed = installed_flashinfer_version()
    a.installed_flashinfer = installed
    if installed not in FLASHINFER_VERSIONS:
        # an unmodelled kernel can still be held to the nearest model: that is how a user checks it
        if not a.flashinfer_version:
            raise UsageError(unmodelled_message(installed))
        version = a.flashinfer_version
    elif a.flashinfer_version and a.flashinfer_version != installed:
        raise UsageError(f"--flashinfer-version {a.flashinfer_version} but flashinfer {installed} is installed "
                         "(and modelled): install that version (scripts/gpu_fuzz.sh does) or drop the flag")
    else:
        version = installed
    arch = tuple(torch.cuda.get_device_capability(0))
    if arch[0] != 9 and "fa3" in a.backends:
        raise UsageError(f"fa3 needs an sm90 GPU and this one is sm{arch[0]}{arch[1]}: pass --backends fa2")
    return version, torch.cuda.get_device_properties(0).multi_processor_count, arch


def _live_probe(a, failed_builds: dict):
    """``probe_case`` with the fuzz's repeats; a case whose module failed to JIT-build fails at
    once instead of rebuilding (minutes) inside ``plan()``."""
    from swa_repro.kernel.live import module_key, module_uri
    from swa_repro.kernel.probe import probe_case

    def probe(case):
        key = module_key(case)
        try:
            uri = module_uri(key[0], key[1:])
        except Exception:
            uri = repr(key)
        if uri in failed_builds:
            raise RuntimeError(f"JIT build of {uri} failed: {failed_builds[uri][-300:]}")
        return probe_case(case, repeats=a.repeats, random_runs=a.random_runs)
    return probe


def _replay(a) -> int:
    if a.prebuild_only:
        raise UsageError("--prebuild-only needs --mode live (it JIT-builds on the GPU machine)")
    root = Path(a.recordings)
    versions = [a.flashinfer_version] if a.flashinfer_version else sorted(p.name for p in root.glob("[0-9]*") if p.is_dir())
    paths = [p for v in versions for p in find_runs(root / v)]
    if not paths:
        raise UsageError(f"no fuzz recordings under {root}/{a.flashinfer_version or '<version>'}/: record them on a GPU "
                         "with `swa-repro fuzz --mode live` (scripts/gpu_fuzz.sh)")
    runs = [load_run(p) for p in paths]
    print(f"fuzz model: replaying {len(runs)} recording(s) of flashinfer {', '.join(versions)} through the kernel model")
    rep = build_report(runs, "model", provenance())
    name = f"replay-{a.flashinfer_version or 'all'}.report.json"
    return _finish(rep, Path(a.report) if a.report else ARTIFACTS / name, None)


def _finish(rep: dict, report_path: Path, rec_path) -> int:
    report_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(report_path, (json.dumps(rep, indent=1, default=str) + "\n").encode())  # never through a link
    print(format_report(rep))
    print(f"report -> {report_path}" + (f"; recording -> {rec_path}" if rec_path else ""))
    return 1 if rep["disagreement_count"] or rep["cases_failed"] else 0
