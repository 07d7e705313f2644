"""Which mode a run uses, and why: ``live`` (real FlashInfer kernels on CUDA) or ``model`` (the CPU
kernel model plus recorded GPU evidence). ``swa-repro doctor`` (``swa_repro.notebook.doctor``) reports it.

``auto`` picks ``live`` iff ``torch.cuda.is_available()`` and ``import flashinfer`` both succeed;
the reason is always said, so a notebook or CI log never leaves the mode to be guessed.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
from dataclasses import asdict, dataclass, field

from swa_repro.core.errors import UsageError

MODES = ("auto", "model", "live")


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
    return {"imports": True, "version": getattr(fi, "__version__", None) or dist_version("flashinfer-python")}


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


def dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
