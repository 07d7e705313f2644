"""Shared fixtures: CUDA/flashinfer detection, the `gpu` marker's clean skip, the venv's CLI."""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# One OpenMP thread per process, before anything imports torch; every child (a release's overlay
# run, a notebook kernel, the CLI) inherits it. The suite's tensors are small, so torch's intra-op
# threads only spin: on 2 cores, with `make test`'s two xdist workers each running torch, one
# upstream_cpu child took 15.6-28 s with 2 threads and 14 s with one (issue #24). An
# OMP_NUM_THREADS already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@functools.cache
def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


@functools.cache
def flashinfer_importable() -> bool:
    try:
        importlib.import_module("flashinfer")
        return True
    except Exception:
        return False


requires_cuda = pytest.mark.skipif(not cuda_available(),
                                   reason="needs a CUDA device (torch.cuda.is_available() is False)")


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests skip cleanly unless CUDA is usable and flashinfer imports."""
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if not gpu_items:
        return
    if not cuda_available():
        why = "gpu test: no CUDA device (torch.cuda.is_available() is False)"
    elif not flashinfer_importable():
        why = "gpu test: flashinfer does not import"
    else:
        return
    for it in gpu_items:
        it.add_marker(pytest.mark.skip(reason=why))


def run_cli(*args: str, cwd=None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m swa_repro.cli ARGS` in a subprocess of this interpreter (the venv's python)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "swa_repro.cli", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, timeout=timeout, env=env)


@pytest.fixture
def cli():
    return run_cli
