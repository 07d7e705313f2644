"""Mode resolution at its real boundaries (torch.cuda.is_available, `import flashinfer`) and doctor."""

from __future__ import annotations

import importlib.metadata as md
import json
import sys
import types

import pytest
import torch

from swa_repro.cli import main
from swa_repro.core.errors import UsageError
from swa_repro.core.mode import require_live, resolve_mode


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "FAKE H200")


def test_auto_without_cuda_is_model_and_says_why(no_cuda):
    info = resolve_mode("auto")
    assert info.mode == "model"
    assert "torch.cuda.is_available() is False" in info.reason
    assert info.details["requested"] == "auto" and info.details["cuda"]["available"] is False


def test_live_without_cuda_says_what_to_do(no_cuda):
    with pytest.raises(UsageError, match=r"--mode live needs real kernels.*is_available\(\) is False.*--mode model"):
        resolve_mode("live")
    with pytest.raises(UsageError):
        require_live()


def test_model_is_always_available(fake_cuda):
    info = resolve_mode("model")
    assert info.mode == "model" and "requested" in info.reason


def test_auto_with_cuda_but_no_flashinfer_is_model(fake_cuda, monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # `import flashinfer` raises ImportError
    info = resolve_mode("auto")
    assert info.mode == "model"
    assert "flashinfer does not import" in info.reason
    with pytest.raises(UsageError, match="install the pinned baseline"):
        resolve_mode("live")


def test_auto_with_cuda_and_flashinfer_is_live(fake_cuda, monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(__version__="9.9.9"))
    info = resolve_mode("auto")
    assert info.mode == "live"
    assert "FAKE H200" in info.reason and "9.9.9" in info.reason
    assert require_live().mode == "live"


def test_unknown_mode():
    with pytest.raises(UsageError, match="use one of auto, model, live"):
        resolve_mode("gpu")


def test_doctor_json_reports_this_interpreter(capsys):
    assert main(["doctor", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["python"] == sys.version.split()[0] and rep["python_executable"] == sys.executable
    assert rep["torch"] == torch.__version__ and rep["packages"]["torch"] == md.version("torch")
    assert rep["torch_cuda_build"] == torch.version.cuda
    assert rep["cuda_usable"] == torch.cuda.is_available()
    assert rep["auto_mode"]["mode"] == ("live" if rep["cuda_usable"] and rep["flashinfer"]["imports"] else "model")
    if not rep["cuda_usable"]:
        assert rep["gpu"] is None and "is_available() is False" in rep["auto_mode"]["reason"]


def test_doctor_text(capsys, no_cuda):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"python      {sys.version.split()[0]}" in out
    assert f"torch       {torch.__version__}" in out
    assert "CUDA usable no" in out
    assert "auto picks  model: no CUDA device: torch.cuda.is_available() is False" in out


def test_gpu_marker_skips_cleanly_without_cuda(tmp_path):
    """The shared conftest turns `@pytest.mark.gpu` into a skip (with the reason) when CUDA is missing."""
    import shutil
    import subprocess

    from conftest import REPO, cuda_available, flashinfer_importable

    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text(
        "import pytest, torch\n\n@pytest.mark.gpu\ndef test_needs_gpu():\n    assert torch.cuda.is_available()\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    if cuda_available() and flashinfer_importable():
        assert "1 passed" in r.stdout, r.stdout
    else:
        assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout
        assert "gpu test: no CUDA device" in r.stdout or "flashinfer does not import" in r.stdout


@pytest.mark.parametrize("installed, modelled", [("0.6.12", "0.6.12"), ("0.7.2+cu130", "0.7.2"), ("0.6.13", "0.6.12"),
                                                 (None, "0.7.2.post1")])
def test_doctor_says_what_backs_the_model_of_the_installed_flashinfer(installed, modelled):
    from swa_repro.core.versions import evidence_note
    from swa_repro.notebook.doctor import _kernel_model

    km = _kernel_model(installed)
    assert km["modelled"] == modelled and km["evidence"] == evidence_note(modelled)
