"""``swa-repro bundle``: the command over the four bundles (flashinfer and notebooks: ``bundle``;
sglang: ``sglang_bundle``, which builds on ``bundle``; vllm: ``vllm_bundle``, which builds on both).
Kept apart so no bundle module imports the others back."""

from __future__ import annotations

import re
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.core.outputs import out_dir
from swa_repro.evidence import (
    bundle,  # its builders read at call time (a name bound at import kept a stand-in)
)
from swa_repro.evidence.bundle import KERNEL_GLOBS, check_kernels, check_version

PYTHON_MINORS = (9, 14)  # CPython 3.9..3.14: the releases out when this was written


def register(sub) -> None:
    p = sub.add_parser("bundle", help="offline flashinfer bundle (+ install.sh) for an air-gapped GPU machine")
    p.add_argument("--flashinfer", default=None, help="flashinfer-python version, e.g. 0.6.12 or 0.7.2.post1")
    p.add_argument("--sglang", nargs="?", const="0.5.15.post1", default=None, metavar="VERSION",
                   help="instead: sglang (default 0.5.15.post1) and what its attention path imports, beside the "
                        "flashinfer bundle (swa_repro/evidence/sglang_bundle.py)")
    p.add_argument("--vllm", default=None, metavar="VERSION",
                   help="instead: vLLM VERSION's Python files (no compiled extension) and what its FlashInfer "
                        "backend's import path needs, beside the flashinfer bundle (swa_repro/evidence/vllm_bundle.py)")
    p.add_argument("--kernels", default="prefill",
                   help=f"--flashinfer: keep the JIT sources of these kernels, comma-separated from "
                        f"{','.join(KERNEL_GLOBS)} (default prefill)")
    p.add_argument("--notebooks", action="store_true",
                   help="instead: the papermill/jupytext/nbconvert/ipykernel wheels to run the notebooks there")
    p.add_argument("--out", required=True, help="new or empty folder, e.g. .bundle/0.6.12")
    p.add_argument("--python", default="3.12",
                   help=f"target CPython for binary wheels, 3.{PYTHON_MINORS[0]}..3.{PYTHON_MINORS[1]} (default 3.12)")
    p.add_argument("--wheel-dir", default=None, help="use a flashinfer wheel from here instead of downloading it "
                                                    "(--sglang: any of its wheels found here)")
    p.set_defaults(func=main)


def check_python(text: str) -> None:
    """``--python`` is MAJOR.MINOR of a CPython with wheels: pip's ``--python-version`` and the cp tag
    are built from it, and any other text failed only at the first download."""
    m = re.fullmatch(r"3\.(\d{1,3})", text)
    lo, hi = PYTHON_MINORS
    if not m or not lo <= int(m.group(1)) <= hi:
        raise UsageError(f"--python must be 3.{lo}..3.{hi} (MAJOR.MINOR, e.g. 3.12); got {text!r}")


ONE = "give --flashinfer VERSION or --notebooks, or --sglang [VERSION] or --vllm VERSION (one bundle per folder)"


def main(a) -> int:
    check_python(a.python)
    kinds = [a.flashinfer, a.notebooks or None, getattr(a, "sglang", None), getattr(a, "vllm", None)]
    if sum(k is not None for k in kinds) != 1:
        raise UsageError(ONE)
    kernels = check_kernels(getattr(a, "kernels", "prefill"))
    if kernels != ("prefill",) and a.flashinfer is None:
        raise UsageError("--kernels goes with --flashinfer VERSION only")
    if getattr(a, "sglang", None) is not None:
        from swa_repro.evidence.sglang_bundle import (
            main as sglang_main,  # lazy: only --sglang needs it
        )

        return sglang_main(a)
    if getattr(a, "vllm", None) is not None:
        from swa_repro.evidence.vllm_bundle import (
            main as vllm_main,  # lazy: only --vllm needs it
        )

        return vllm_main(a)
    if a.flashinfer is not None:
        check_version(a.flashinfer)  # before any folder or pip: `0.6.12;x` is no version
    out_dir(a.out, "--out")  # before any download: a path that cannot be a folder fails now
    if Path(a.out).is_dir() and any(Path(a.out).iterdir()):
        raise UsageError(f"--out {a.out} exists and is not empty: give a new or empty folder")
    if a.wheel_dir and not Path(a.wheel_dir).is_dir():
        raise UsageError(f"--wheel-dir {a.wheel_dir}: no such folder (give the folder holding the flashinfer wheel)")
    if a.notebooks:
        m = bundle.build_notebook_bundle(Path(a.out), python_version=a.python)
        print(f"{len(m['files']) - 2} wheels, {m['total_bytes'] / 2**20:.2f} MiB; on the GPU machine: "
              f"bash {a.out}/install.sh /tmp/site")
        return 0
    m = bundle.build_bundle(a.flashinfer, Path(a.out), python_version=a.python,
                     wheel_dir=Path(a.wheel_dir) if a.wheel_dir else None, kernels=kernels)
    for k, v in m["files"].items():
        print(f"{v / 2**20:8.2f} MiB  {k}")
    print(f"{m['total_bytes'] / 2**20:8.2f} MiB  total (limit 64 MiB); csrc sub-folders removed: "
          f"{len(m['removed_csrc_subdirs'])}, kept: {m['kept_csrc_subdirs']} (kernels: {','.join(m['kernels'])})")
    print(f"on the GPU machine: bash {a.out}/install.sh /tmp/site")
    return 0
