"""``swa-repro doctor``: what is installed, whether CUDA is usable, and which mode ``auto`` picks.

Exit status: 0; with ``--model``, the family's answer's (``core.exit_status``: 1 affected or not
answered, ``--fail-on``), 2 bad input.

It sits in the notebook layer (above ``sglang``) so that it can report what every layer below
finds; the mode rule itself is ``swa_repro.core.mode``'s.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys

from swa_repro.core.mode import cuda_status, dist_version, flashinfer_status, resolve_mode

# Distributions doctor reports (PyPI names).
PACKAGES = ("torch", "flashinfer-python", "sglang", "numpy", "papermill", "jupytext", "nbconvert",
            "ipykernel", "matplotlib", "pytest")


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
        "packages": {name: dist_version(name) for name in PACKAGES},
        "torch": cuda.get("torch"),  # torch.__version__, with its local tag (+cpu, +cu130)
        "torch_cuda_build": cuda.get("torch_cuda_build"),
        "cuda_usable": cuda["available"],
        "gpu": _gpu_info(),
        "flashinfer": flashinfer_status(),
        "auto_mode": {"mode": auto["mode"], "reason": auto["reason"]},
        "kernel_model": _kernel_model(dist_version("flashinfer-python")),
        "sglang_findings": _sglang_findings(),
    }


def _kernel_model(installed: str | None) -> dict:
    """Which modelled flashinfer stands for the installed one, and what backs that model: the
    committed real-kernel runs of it, or its sources alone (``core.versions.evidence_note``)."""
    from swa_repro.core.versions import FLASHINFER_VERSIONS, evidence_note, nearest_modelled

    version = installed.split("+")[0] if installed else None
    modelled = version if version in FLASHINFER_VERSIONS else nearest_modelled(version or FLASHINFER_VERSIONS[-1])
    return {"installed": installed, "modelled": modelled, "exact": modelled == version,
            "evidence": evidence_note(modelled)}


def _sglang_findings() -> dict:
    """The installed backend's state (live, patch.classify) and its row of the release table."""
    try:
        from swa_repro.sglang.audit.table import installed_summary

        return installed_summary()
    except Exception as e:  # never let the doctor itself crash
        return {"error": f"{type(e).__name__}: {e}"}


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
    km = r["kernel_model"]
    print(f"model of    flashinfer {km['modelled']}" + ("" if km["exact"] else f" (nearest to {km['installed'] or 'none installed'})")
          + f": {km['evidence']}")
    from swa_repro.sglang.audit.table import summary_lines

    for line in summary_lines(r["sglang_findings"]):
        print(line)


def register(sub) -> None:
    p = sub.add_parser("doctor", help="what is installed, whether CUDA is usable, and which mode auto picks")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--model", metavar="FAMILY", help="also: is this family affected on the installed sglang, on this "
                   "GPU's class? (the family audit run now, on CPU, cached by content; and the --fix that makes it exact)")
    p.add_argument("--gpu", metavar="sm80|sm90|sm100", help="with --model: the GPU class (default: this GPU's, "
                   "from its compute capability; without CUDA sm90, said so)")
    from swa_repro.core.exit_status import add_argument

    add_argument(p)  # with --model: the family's answer is the exit status
    p.set_defaults(func=doctor_main)


def doctor_main(a) -> int:
    family = None
    if a.model is not None or a.gpu is not None:
        from swa_repro.core.errors import UsageError
        from swa_repro.notebook import family_answer

        if a.model is None:
            raise UsageError("--gpu goes with --model FAMILY: the GPU class of the family's verdict")
        if a.gpu is not None and not a.gpu.strip():  # family_answer reads "" as "this GPU's" (notebook 07's gpu=)
            raise UsageError(f"--gpu {a.gpu!r}: give sm80, sm90 or sm100, or leave --gpu out for this GPU's class")
        family_answer.check(a.model, a.gpu, None)  # one line each, before any work
    r = doctor_report()
    if a.model is not None:
        family = family_answer.verdict(a.model, a.gpu)
        r["family"] = {k: v for k, v in family.items() if k != "audit"} | {
            "verdicts": family_answer.verdict_rows(family["audit"]),
            "fix": {k: v for k, v in family["fix"].items() if k != "fixed"}}
    if a.json:
        json.dump(r, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        _print_report(r)
        for line in family_answer.lines(family) if family else []:
            print(line)
    if family is None:
        return 0
    from swa_repro.core.exit_status import exit_status

    return exit_status([family["answer"]["state"]], a.fail_on)
