"""Shared fixtures: CUDA/flashinfer detection, the `gpu` marker's clean skip, the venv's CLI."""

from __future__ import annotations

import functools
import importlib
import importlib.util
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


# The files that take longest from nothing (an empty swa-repro cache: each computes its release's
# audits / kit runs / notebooks), heaviest first. `make test` (--dist loadfile --no-loadscope-reorder)
# hands whole files to its three workers in collection order (a worker gets the next file when two of its
# tests are left), so these start first and no long file is left to start last; xdist's own order (most
# tests first) had started test_upstream_kit.py (11 tests, 95 s) after 60 lighter files. Seconds (#hT2,
# at 30a1b9b less what it shared): each file alone from an empty cache, one after the other in this order
# on one shared cache (load 3-5 on the 2 cores; each file's first child also starts the process's fork
# server, ~30 s); "~" where only the suite's --durations=70 from nothing (load ~6, halved) had it. A file
# that reads what another computes (the same cache key: the second waits on the lock and reads) comes
# after it: test_family_fixes and test_audit_family read test_remedy's sweep, test_kit_swa_cases_cpu
# test_upstream_kit's kit runs, test_graph_verify test_audit_spec's whole audits, test_fallback_cells and
# test_arch_configs the plan of 0.5.23's columns test_hybrid_pool's Beam test makes (66 s of its 188).
HEAVY_FIRST = (
    "test_hybrid_pool.py",  # 188 s: pool probes of 0.5.23, 0.5.10 (0.5.12: matrix), 0.5.23's plan, Beam's family child
    "test_remedy.py",  # 160 s: 0.5.23's families x GPU classes, shipped and fixed (the sweep); notebook 07
    "test_sglang_check.py",  # 97 s: notebooks 03 and 04 (0.5.23's whole audits)
    "test_upstream_kit.py",  # 90 s: five upstream_cpu runs on 0.5.23 (test_kit_swa_cases_cpu's files too)
    "test_family_answer.py",  # 85 s: doctor --model (0.5.15.post1's gemma2, shipped and fixed)
    "test_cap_safety.py",  # 73 s: the cap check of 0.5.23, shipped and fixed
    "test_checkpoint_config.py",  # 61 s: two checkpoint audits of 0.5.23 (a family and a ServerArgs child each)
    "test_audit_spec.py",  # 54 s: 0.5.23's whole audits, shipped and with the fixes (notebook 04's)
    "test_sglang_kit.py",  # ~50 s: the kit on 0.5.23 fixed (0.5.14: make test-matrix)
    "test_alternatives.py",  # 49 s: 0.5.23 with the alternatives
    "test_server_run.py",  # 45 s: ServerArgs children of 0.5.10 and 0.5.23
    "test_graph_verify.py",  # 35 s: 0.5.23's prior-fix audit; shipped and fixed: test_audit_spec's
    "test_bundle.py",  # ~32 s
    "test_story.py",  # ~31 s: notebooks 01, 02 (once: alone from nothing 118 s -> 53 s), 00 up to its failing check
    "test_fallback_cells.py",  # 30 s: a Cwm checkpoint audit through the fallback; the plan's columns
    "test_artifact_sets.py",  # ~30 s: notebook 00 twice (headless, the lab's way)
    "test_lab.py",  # ~28 s
    "test_arch_configs.py",  # 25 s: 0.5.23's architecture columns (the plan)
    "test_kit_swa_cases_cpu.py",  # test_upstream_kit's kit runs (91 s when it ran its own)
    "test_family_fixes.py",  # 29 s: 0.5.23's fixed cells (test_remedy's)
    "test_audit_family.py",  # 25 s: 0.5.23's cells (test_remedy's); gemma3's child
    "test_layers.py",  # ~17 s
    "test_fuzz.py",  # ~16 s
    "test_cli_errors.py",
    "test_swa_archs.py",
    "test_sglang_bundle.py",  # the cp312 bundle (its wheels fetched once)
    "test_gpu_fuzz_script.py",  # mostly its stand-in's sleeps
    "test_sglang_fix.py",
    "test_gpu_fix_script.py",
    "test_notebook_runner.py",
)


def pytest_collection_modifyitems(config, items):
    """The :data:`HEAVY_FIRST` files first (the rest keep their order); `@pytest.mark.gpu` tests skip
    cleanly unless CUDA is usable and flashinfer imports."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(rank)))  # stable
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


def release_srt(version: str):
    """The release's own ``sglang/srt``, for a test that reads its files by a second route: its overlay
    as :func:`release_overlay` gives it (installed now unless cached). It used to skip where the overlay
    was not there yet: in a cold suite (CI's) 10 of these tests skipped, ahead of the audits that install it."""
    return release_overlay(version) / "sglang" / "srt"


def skip_module_unless(*names: str, reason: str = "") -> None:
    """Skip the calling test module, at collection, when a package is not installed, without
    importing it: ``pytest.importorskip`` at module level imports in every xdist worker's collection
    (sglang ~6 s, JupyterLab ~3 s each; issue #24), though only the worker that runs the file needs it."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        pytest.skip(reason or f"not installed: {', '.join(missing)}", allow_module_level=True)


def release_overlay(version: str):
    """Release ``version``'s overlay, installed now if the cache lacks it (``provision``: from uv's
    download cache or the package index). Only where it cannot be had at all (no network, no cached
    wheel) does the test skip, saying so: a cold cache is no reason to skip (from nothing, the tests
    that skipped on it were the ones CI ran last)."""
    from swa_repro.sglang.provision import provision

    try:
        return provision(version, any_release=True)[0]
    except Exception as e:  # noqa: BLE001 - no cached overlay and no package index
        pytest.skip(f"cannot provision sglang=={version}: {e}")


def release_families(version: str, fixes=None) -> dict:
    """``{gpu: document}`` of every family x GPU class of ``version`` (shipped, or with ``fixes``): the
    sweep's audit (``test_remedy.py``). The tests that read a few of its cells ask for all of them, so
    the suite runs one family child per release and fix set, not one per test's subset (each cell is its
    own cache entry: a subset asked first cost a child, and the sweep's then a second for the rest)."""
    from swa_repro.engine.families import GPU_CLASSES
    from swa_repro.sglang.audit.family_run import audit_release

    release_overlay(version)
    return audit_release(version, "all", list(GPU_CLASSES), fixes=fixes, note=lambda s: None)


def release_audits(version: str) -> dict:
    """``{"shipped": doc, "fixed": doc}``: the release's whole audits (``audit.release``, every path) as
    notebook 04 asks them (``fix_view.audit_pair`` of ``load_release(version, "all")``: the finding classes'
    fixes, ``fix.ORDER``). test_audit_spec and test_graph_verify read these, one cache key each, so the
    suite makes them once; ``fixes=fix.ALL`` (the family fixes too) was a third whole audit of its own."""
    from swa_repro.notebook import fix_view

    release_overlay(version)
    shipped, fixed = fix_view.audit_pair(fix_view.load_release(version, "all"), note=lambda s: None)
    return {"shipped": shipped, "fixed": fixed}


def run_cli(*args: str, cwd=None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m swa_repro.cli ARGS` in a subprocess of this interpreter (the venv's python)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "swa_repro.cli", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, timeout=timeout, env=env)


@pytest.fixture
def cli():
    return run_cli


def never(*a, **k):
    raise AssertionError("no release may be installed or audited for bad input")


@pytest.fixture
def no_work(monkeypatch, tmp_path):
    """The installer and the child fail the test; the overlay is a fake one serving Gemma-2 only
    (the family audit's and ``doctor --model``'s bad-input tests)."""
    from swa_repro.sglang import overlay_run, provision
    from swa_repro.sglang.audit import family_run

    models = tmp_path / "ov" / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    (models / "gemma2.py").write_text("class Gemma2ForCausalLM: pass\nEntryClass = Gemma2ForCausalLM\n")
    monkeypatch.setattr(provision, "provision", never)
    monkeypatch.setattr(overlay_run, "run_child", never)
    monkeypatch.setattr(family_run, "run_child", never)
    monkeypatch.setattr(family_run, "overlay_for", lambda v, fixes=None, **k: (tmp_path / "ov", {}, None))
    return tmp_path
