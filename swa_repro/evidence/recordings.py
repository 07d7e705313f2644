"""``swa-repro record`` (GPU): probe every recording case on the real kernel and commit the result.

Layout: ``recordings/<flashinfer-version>/<case>.json`` (case, provenance, statuses, plan info,
module, timings, the model's prediction at record time) + ``<case>.npz`` (per request int32
``lo/hi/count`` and bool flags; only KV-head 0's query-head group when every group agrees,
which the JSON records as ``heads_stored``/``groups_agree``). Written only by this command.
Read back, a recording's requests are :class:`~swa_repro.kernel.probe.ProbeRequest` with the
status and reason as recorded.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swa_repro.core.case import Case
from swa_repro.core.errors import UsageError, check_bounds
from swa_repro.core.intervals import Intervals
from swa_repro.core import outputs
from swa_repro.core.outputs import atomic_path, write_atomic
from swa_repro.core.versions import RECORDINGS_ROOT

FORMAT = "swa-repro-recording/1"
DEFAULT_ROOT = RECORDINGS_ROOT
# where `record` writes unless told: git-ignored. recordings/ is committed evidence, written only when
# named with --force (`--out recordings --force`, as scripts/gpu_evidence.sh does), never by default.
RECORD_OUT = RECORDINGS_ROOT.parent / "artifacts" / "recordings"
INT_FIELDS = ("lo", "hi", "count")
FLAG_FIELDS = ("contiguous", "consistent", "nan", "repeat_equal")  # (qo, heads)
ROW_FIELDS = ("err_vs_reference", "err_vs_model", "err_vs_probed", "random_equal")  # (qo,)


# ----------------------------------------------------------------------------- writing
def groups_agree(case: Case, req) -> bool:
    """Every KV head's group of query heads saw exactly what group 0 saw."""
    g, hk = case.group_size, case.num_kv_heads
    for f in INT_FIELDS + FLAG_FIELDS:
        a = getattr(req, f).reshape(req.lo.shape[0], hk, g)
        if not (a == a[:, :1]).all():
            return False
    return True


def to_record(result, provenance: dict, extra: dict | None = None) -> tuple[dict, dict]:
    """A ProbeResult -> (JSON dict, npz arrays)."""
    from swa_repro.kernel.model import simulate

    case = result.case
    agree = all(groups_agree(case, r) for r in result.requests)
    ncols = case.group_size if agree else case.num_qo_heads
    arrays = {}
    for i, r in enumerate(result.requests):
        for f in INT_FIELDS:
            arrays[f"r{i}_{f}"] = np.ascontiguousarray(getattr(r, f)[:, :ncols], dtype=np.int32)
        for f in FLAG_FIELDS:
            arrays[f"r{i}_{f}"] = np.ascontiguousarray(getattr(r, f)[:, :ncols], dtype=bool)
        for f in ROW_FIELDS:
            arrays[f"r{i}_{f}"] = np.asarray(getattr(r, f), dtype=bool if f == "random_equal" else np.float32)
    model = simulate(case)
    doc = {
        "format": FORMAT, "name": case.name, "case": case.to_dict(),
        "statuses": result.statuses, "reasons": result.reasons,
        "groups_agree": agree, "heads_stored": "group0" if agree else "all",
        "plan_info": result.plan_info, "timings": result.timings,
        "repeats": result.repeats, "launches": result.launches, "source": result.source,
        "model_at_record": {"statuses": model.statuses, "summary": model.summary()},
        "provenance": provenance, **(extra or {}),
    }
    return doc, arrays


def write_recording(result, out_dir: Path, provenance: dict, extra: dict | None = None) -> Path:
    doc, arrays = to_record(result, provenance, extra)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / (result.case.name or "case")
    with atomic_path(stem.with_suffix(".npz")) as tmp:  # all or nothing, never through a link (core.outputs)
        np.savez_compressed(tmp, **arrays)
    doc["arrays"] = stem.with_suffix(".npz").name
    write_atomic(stem.with_suffix(".json"), (json.dumps(doc, indent=1, default=_json_default) + "\n").encode())
    return stem.with_suffix(".json")


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return None if np.isnan(o) else float(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def provenance(argv=None) -> dict:
    """GPU, driver, CUDA, torch, flashinfer (and where it came from), sglang, python, UTC date and
    the command line; no hostname."""
    import torch

    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception:
            return ""

    try:
        import flashinfer

        fi = {"version": str(flashinfer.__version__), "from": str(Path(flashinfer.__file__).parent),
              "git": str(getattr(flashinfer, "__git_version__", getattr(flashinfer, "__git_commit__", "")))}
    except Exception as e:
        fi = {"version": None, "error": str(e)}
    try:
        from importlib.metadata import version

        sg = version("sglang")
    except Exception:
        sg = "not installed"
    dev = {}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        dev = {"gpu": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
               "sm_count": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1)}
    nvcc = run(["nvcc", "--version"]).splitlines()
    return {
        **dev,
        "driver": (run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines() or [None])[0],
        "cuda_runtime": torch.version.cuda, "nvcc": nvcc[-1] if nvcc else None,
        "torch": torch.__version__, "flashinfer": fi, "sglang": sg,
        "python": platform.python_version(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": shlex.join(["swa-repro", *(sys.argv[1:] if argv is None else argv)]),
    }


# ----------------------------------------------------------------------------- reading
@dataclass
class Recording:
    path: Path
    case: Case
    provenance: dict
    statuses: list
    doc: dict
    requests: list  # ProbeRequest per request: intervals/flags as stored, status/reason as recorded

    @property
    def name(self) -> str:
        return self.case.name

    @property
    def flashinfer_version(self) -> str:
        return self.case.flashinfer_version


def load_recording(path) -> Recording:
    path = Path(path)
    doc = json.loads(path.read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file (format={doc.get('format')!r})")
    case = Case.from_dict({**doc["case"], "name": doc["name"]})
    with np.load(path.with_name(doc["arrays"])) as z:
        arrays = {k: z[k] for k in z.files}
    reqs = [_request(case, i, arrays, doc["statuses"][i], doc["reasons"][i]) for i in range(case.batch_size)]
    return Recording(path, case, doc["provenance"], doc["statuses"], doc, reqs)


def _request(case: Case, i: int, arrays: dict, status: str, reason: str):
    """Request ``i``'s stored arrays as the ProbeRequest they were written from."""
    from swa_repro.kernel.probe import ProbeRequest

    a = {k[len(f"r{i}_"):]: v for k, v in arrays.items() if k.startswith(f"r{i}_")}
    iv = Intervals(case.prefix_lens[i], case.extend_lens[i], a.pop("lo"), a.pop("hi"))
    return ProbeRequest(iv, case.window_left, status=status, reason=reason, **a)


def load_recordings(root=None) -> list[Recording]:
    """Every ``<root>/<flashinfer-version>/<case>.json`` (default: the repo's ``recordings/``)."""
    root = Path(root) if root is not None else DEFAULT_ROOT
    return [load_recording(p) for p in sorted(root.glob("[0-9]*/*.json"))]  # version folders; replay/ and logs/ are not probes


# ----------------------------------------------------------------------------- command
def register(sub) -> None:
    p = sub.add_parser("record", help="(GPU) probe the recording cases on real FlashInfer -> recordings/")
    p.add_argument("--cases", default="all", help="comma-separated names from swa_repro/recording_cases.py, or all")
    p.add_argument("--out", default=str(RECORD_OUT), help="root; files go to <out>/<flashinfer-version>/ "
                   "(default artifacts/recordings; the committed recordings/ with --force)")
    p.add_argument("--force", action="store_true", help="let --out be a folder of committed files (recordings/)")
    p.add_argument("--repeats", type=int, default=2, help="full probe sweeps compared bitwise (1..10)")
    p.add_argument("--random-runs", type=int, default=2, help="random-data runs compared bitwise (0..10)")
    p.add_argument("--jit-workers", type=int, default=4, help="modules JIT-built in parallel before probing (1..64)")
    p.add_argument("--list", action="store_true", help="print the cases, model predictions and modules; no GPU")
    p.set_defaults(func=main)


def _bounds(a) -> list:
    """(flag, value, lowest, highest) of every number; as ``swa-repro fuzz``'s, the highest keeps a
    recording within hours."""
    return [("--repeats", a.repeats, 1, 10), ("--random-runs", a.random_runs, 0, 10),
            ("--jit-workers", a.jit_workers, 1, 64)]


def main(a) -> int:
    from swa_repro.evidence import cases as rc

    check_bounds(_bounds(a))
    cases = rc.select(a.cases)
    if a.list and a.force:
        raise UsageError("--force goes with --out (a committed folder); --list writes nothing")
    if a.list:
        print(rc.table(cases))
        return 0
    if not str(a.out).strip():  # "" is the current folder to out_dir: the recordings landed there
        raise UsageError("--out '': name a folder, or leave --out out for artifacts/recordings/")
    outputs.untracked_dir(a.out, "--out", force=a.force)  # before the GPU work: a refused path fails now
    from swa_repro.kernel.live import installed_flashinfer_version, module_key, prebuild_modules, require_cuda

    require_cuda()
    import torch

    version = installed_flashinfer_version()
    props = torch.cuda.get_device_properties(0)
    arch = tuple(torch.cuda.get_device_capability(0))
    cases = [c.with_(flashinfer_version=version, sm_count=props.multi_processor_count, arch=arch) for c in cases]
    prov = provenance()
    out_dir = Path(a.out) / version
    print(f"flashinfer {version} from {prov['flashinfer'].get('from')}; {prov.get('gpu')}; "
          f"{len(cases)} cases -> {out_dir}", flush=True)
    t = time.perf_counter()
    builds = prebuild_modules([module_key(c) for c in cases], workers=a.jit_workers)
    jit_total = round(time.perf_counter() - t, 1)
    print(f"JIT: {len(builds)} modules in {jit_total} s: {builds}", flush=True)
    from swa_repro.kernel.probe import probe_case

    failed = []
    for c in rc.risky_last(cases):
        t = time.perf_counter()
        try:
            res = probe_case(c, repeats=a.repeats, random_runs=a.random_runs)
            path = write_recording(res, out_dir, prov, {"jit_prebuild": {"seconds_total": jit_total, "modules": builds}})
        except Exception as e:  # keep going: the other cases are still evidence
            failed.append(c.name)
            print(f"FAILED {c.name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
            continue
        print(f"{c.name:24s} {','.join(res.statuses):28s} model {','.join(res_model(c)):28s} "
              f"{res.plan_info.get('module')} cta_q={res.plan_info.get('cta_tile_q')} split={res.plan_info.get('split_kv')} "
              f"{time.perf_counter() - t:.1f}s -> {path}", flush=True)
    if failed:
        print(f"{len(failed)} case(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def res_model(case: Case) -> list[str]:
    from swa_repro.kernel.model import simulate

    return simulate(case).statuses
