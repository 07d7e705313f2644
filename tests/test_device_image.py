"""``swa_repro.sglang.device_image``: the files the GPU machine runs with only the bundles' sites on
its path import here as they would there. The H100 call of 2026-12-05 stopped both regression runs at
``import datasets`` (sglang.test.test_utils -> sglang.benchmark.serving): this is the CPU check that
would have caught it, and the bundle now carries datasets and multiprocess."""

from __future__ import annotations

import hashlib
import importlib.metadata as md

import pytest
from conftest import REPO

from swa_repro.evidence import sglang_bundle
from swa_repro.sglang import device_image as di
from swa_repro.sglang.fix.upstream_diff import TEST, VERSION

GPU_FILES = (REPO / "docs" / "upstream" / TEST, REPO / "tests" / "sglang_kit_flashinfer_cases.py",
             REPO / "tests" / "sglang_kit_swa_cases.py")  # scripts/gpu_kit.sh's


def _without_datasets(monkeypatch):
    monkeypatch.setattr(sglang_bundle, "CHAIN", {k: v for k, v in sglang_bundle.CHAIN.items() if k != "datasets"})


def test_the_view_links_what_the_device_has_and_nothing_else(tmp_path, monkeypatch):
    sp = tmp_path / "site-packages"
    for d in ("torch", "xgrammar", "datasets", "no_owner", "torch-2.11.0.dist-info", "xgrammar-0.2.1.dist-info",
              "datasets-5.2.0.dist-info", "__pycache__"):
        (sp / d).mkdir(parents=True)
    (sp / "six.py").write_text("")
    (sp / "distutils-precedence.pth").write_text("")
    monkeypatch.setattr(di, "owners", lambda: {"torch": {"torch"}, "xgrammar": {"xgrammar"}, "datasets": {"datasets"},
                                               "six": {"six"}})
    view = di.device_view(tmp_path / "view", sp)
    assert sorted(p.name for p in view.iterdir()) == [
        "datasets", "datasets-5.2.0.dist-info", "no_owner", "six.py", "torch", "torch-2.11.0.dist-info"]
    _without_datasets(monkeypatch)  # a bundle without it: the view lacks it too
    assert "datasets" not in {p.name for p in di.device_view(tmp_path / "view2", sp).iterdir()}


def test_the_image_list_and_the_bundles(monkeypatch):
    assert {"torch", "pyarrow", "huggingface-hub", "aiohttp"} <= di.IMAGE and "datasets" not in di.IMAGE
    assert {"sglang", "flashinfer-python", "datasets", "multiprocess", "sglang-kernel"} <= di.carried()
    assert list(sglang_bundle.CHAIN).index("datasets") < list(sglang_bundle.CHAIN).index("multiprocess")


def _checked(overlay, files):
    from swa_repro.core.cache import cached, code_hash, interpreter
    from swa_repro.sglang.provision import content_digest

    venv = sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions())
    parts = {"overlay": content_digest(overlay), "files": {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
                                                           for f in files},
             "code": code_hash(), "interpreter": interpreter(), "venv": hashlib.sha256("\n".join(venv).encode()).hexdigest()}
    return cached("device-imports", parts, lambda: di.check(overlay, files))[0]


@pytest.fixture(scope="module")
def overlay():
    from conftest import release_overlay

    return release_overlay(VERSION)


@pytest.mark.matrix  # a plain child importing sglang's test utilities (~20 s from nothing): with the bundle tests
def test_the_gpu_test_files_import_as_on_the_device(overlay):
    doc = _checked(overlay, GPU_FILES)
    assert doc["files"] == {f.name: "imports" for f in GPU_FILES}, doc


@pytest.mark.matrix
def test_without_datasets_in_the_bundle_the_registered_test_fails_as_on_the_h100(overlay, monkeypatch):
    _without_datasets(monkeypatch)
    doc = di.check(overlay, GPU_FILES)
    assert doc["files"][GPU_FILES[0].name] == "ModuleNotFoundError: No module named 'datasets'", doc
    assert all(doc["files"][f.name] == "imports" for f in GPU_FILES[1:])
