"""Which mode a run uses, and why: ``live`` (real FlashInfer kernels on CUDA) or ``model`` (the CPU
kernel model plus recorded GPU evidence). Also ``swa-repro doctor``: what is installed, what runs.

``auto`` picks ``live`` iff ``torch.cuda.is_available()`` and ``import flashinfer`` both succeed;
the reason is always said, so a notebook or CI log never leaves the mode to be guessed.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from swa_repro.core.errors import UsageError

MODES = ("auto", "model", "live")
# Distributions doctor reports (PyPI names).
PACKAGES = ("torch", "flashinfer-python", "sglang", "numpy", "papermill", "jupytext", "nbconvert",
            "ipykernel", "matplotlib", "pytest")


@dataclass(frozen=True)
class ModeInfo:
    mode: str  # "live" | "model"
    reason: str  # one human sentence: why this mode
    details: dict = field(default_factory=dict)  # requested, cuda, flashinfer probes

    def to_dict(self) -> dict:
        return asdict(self)


def cuda_status() -> dict:
    """torch's own view: is a CUDA device usable, and what CUDA torch was built with."""
    try:
        import torch
    except Exception as e:  # torch is a core dependency; say so instead of crashing
        return {"available": False, "why": f"torch does not import ({type(e).__name__}: {e})",
                "torch": None, "torch_cuda_build": None}
    ok = bool(torch.cuda.is_available())
    st = {"available": ok, "torch": torch.__version__, "torch_cuda_build": torch.version.cuda}
    if not ok:
        build = "a CPU-only torch build" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
        st["why"] = f"no CUDA device: torch.cuda.is_available() is False ({build})"
    return st


def flashinfer_status() -> dict:
    """Does ``import flashinfer`` succeed, and which version (the wrapper itself needs CUDA)."""
    try:
        fi = importlib.import_module("flashinfer")
    except Exception as e:
        return {"imports": False, "why": f"flashinfer does not import ({type(e).__name__}: {e})", "version": None}
    return {"imports": True, "version": getattr(fi, "__version__", None) or _dist_version("flashinfer-python")}


def resolve_mode(requested: str = "auto") -> ModeInfo:
    """``auto`` -> ``live`` iff CUDA and flashinfer are usable, else ``model``; ``live`` without them
    is a UsageError saying what to do; ``model`` is always available."""
    if requested not in MODES:
        raise UsageError(f"unknown mode {requested!r}: use one of {', '.join(MODES)}")
    if requested == "model":
        return ModeInfo("model", "requested --mode model: CPU kernel model plus recorded GPU evidence",
                        {"requested": requested})
    cuda = cuda_status()
    # flashinfer is probed only when it matters: without CUDA the answer is `model` either way.
    fi = flashinfer_status() if cuda["available"] else {"imports": None, "why": "not probed (no CUDA)"}
    details = {"requested": requested, "cuda": cuda, "flashinfer": fi}
    if cuda["available"] and fi["imports"]:
        import torch

        name = torch.cuda.get_device_name(0)
        return ModeInfo("live", f"CUDA device {name} and flashinfer {fi['version']} are usable: real kernels",
                        {**details, "gpu": name})
    why = cuda.get("why") or fi.get("why")
    if requested == "live":
        fix = ("install the pinned baseline (`make test` or `pip install -e '.[baseline]'`)"
               if cuda["available"] else "run on a machine with an NVIDIA GPU and a CUDA build of torch")
        raise UsageError(f"--mode live needs real kernels but {why}: {fix}, or use --mode model "
                           "(CPU kernel model plus recorded GPU evidence) or --mode auto")
    return ModeInfo("model", f"{why}: using the CPU kernel model plus recorded GPU evidence", details)


def require_live() -> ModeInfo:
    """For code that needs real kernels: returns the live ModeInfo or raises a UsageError."""
    return resolve_mode("live")


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _gpu_info() -> dict | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        p = torch.cuda.get_device_properties(0)
        info = {"name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
                "count": torch.cuda.device_count(), "driver": None}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def doctor_report() -> dict:
    cuda = cuda_status()
    try:
        auto = resolve_mode("auto").to_dict()
    except Exception as e:  # never let the doctor itself crash
        auto = {"mode": None, "reason": f"{type(e).__name__}: {e}", "details": {}}
    return {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "packages": {name: _dist_version(name) for name in PACKAGES},
        "torch": cuda.get("torch"),  # torch.__version__, with its local tag (+cpu, +cu130)
        "torch_cuda_build": cuda.get("torch_cuda_build"),
        "cuda_usable": cuda["available"],
        "gpu": _gpu_info(),
        "flashinfer": flashinfer_status(),
        "auto_mode": {"mode": auto["mode"], "reason": auto["reason"]},
    }


def _print_report(r: dict) -> None:
    pk = r["packages"]
    print(f"python      {r['python']}  ({r['python_executable']})")
    print(f"torch       {r['torch'] or 'not installed'}  (CUDA build: {r['torch_cuda_build'] or 'none, CPU-only'})")
    fi = r["flashinfer"]
    print(f"flashinfer  {pk['flashinfer-python'] or 'not installed'}  "
          f"({'imports' if fi['imports'] else fi.get('why', 'does not import')})")
    for name in ("sglang", "numpy", "papermill", "jupytext", "nbconvert", "ipykernel", "matplotlib", "pytest"):
        print(f"{name:<11} {pk[name] or 'not installed'}")
    print(f"CUDA usable {'yes' if r['cuda_usable'] else 'no'}")
    g = r["gpu"]
    if g:
        print(f"GPU         {g.get('name')}  sm{g.get('capability', '?').replace('.', '')}  "
              f"{g.get('memory_gib')} GiB  x{g.get('count')}  driver {g.get('driver') or 'unknown'}"
              if "error" not in g else f"GPU         error: {g['error']}")
    print(f"auto picks  {r['auto_mode']['mode']}: {r['auto_mode']['reason']}")


def register(sub) -> None:
    p = sub.add_parser("doctor", help="what is installed, whether CUDA is usable, and which mode auto picks")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=doctor_main)


def doctor_main(a) -> int:
    r = doctor_report()
    if a.json:
        json.dump(r, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_report(r)
    return 0
