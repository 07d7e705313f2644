"""bundle.py: csrc pruning on a fake tree (offline); a real 0.6.12 bundle (network, cached wheel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from swa_repro.evidence.bundle import (IMPORT_DEPS, KERNEL_GLOBS, build_bundle, check_kernels, needed_csrc_subdirs,
                                      prune_csrc, tvm_ffi_spec)
from swa_repro.core.errors import UsageError

REPO = Path(__file__).resolve().parents[1]


def _fake_pkg(root: Path) -> Path:
    pkg = root / "flashinfer"
    files = {
        "data/csrc/batch_prefill.cu": '#include "tvm_ffi_utils.h"\n#include "keep_a/a.cuh"\n#include <flashinfer/f.cuh>\n',
        "data/csrc/batch_prefill_sm90.cu": "  #  include <type_traits>\n",
        "data/csrc/tvm_ffi_utils.h": "#pragma once\n",
        "data/csrc/other_top.cu": '#include "drop_c/c.h"\n',  # not a prefill source: does not keep drop_c
        "data/csrc/keep_a/a.cuh": '#include "a2.cuh"\n',
        "data/csrc/keep_a/a2.cuh": "",
        "data/csrc/keep_b/b.h": "",
        "data/csrc/drop_c/c.h": "",
        "data/csrc/drop_d/nested/d.h": "",
        "data/include/flashinfer/f.cuh": '#include "../../csrc/keep_b/b.h"\n',
    }
    return _write(pkg, files)


def _write(pkg: Path, files: dict) -> Path:
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_needed_subdirs_follow_includes_transitively(tmp_path):
    pkg = _fake_pkg(tmp_path)
    assert needed_csrc_subdirs(pkg / "data") == {"keep_a", "keep_b"}


def test_prune_removes_only_unreached_subdirs(tmp_path):
    pkg = _fake_pkg(tmp_path)
    removed, kept = prune_csrc(pkg)
    assert removed == ["drop_c", "drop_d"] and kept == ["keep_a", "keep_b"]
    csrc = pkg / "data" / "csrc"
    assert sorted(p.name for p in csrc.iterdir() if p.is_dir()) == ["keep_a", "keep_b"]
    assert (csrc / "other_top.cu").is_file() and (csrc / "keep_a" / "a2.cuh").is_file()


def test_prune_refuses_unknown_layout(tmp_path):
    (tmp_path / "flashinfer" / "data" / "csrc" / "x").mkdir(parents=True)
    with pytest.raises(UsageError, match="batch_prefill"):
        prune_csrc(tmp_path / "flashinfer")
    assert (tmp_path / "flashinfer" / "data" / "csrc" / "x").is_dir()  # nothing removed
    with pytest.raises(UsageError, match="data/csrc"):
        prune_csrc(tmp_path / "nothing")


def _fake_pkg_with_decode_and_xqa(root: Path) -> Path:
    """_fake_pkg plus 0.7.2.post1's decode and XQA layout: batch_decode.cu at the top (its include in
    dec_e/), flashinfer_xqa_binding.cu at the top and the XQA kernel in csrc/xqa/, which includes only
    its own headers and tvm_ffi_utils.h (jit/xqa.py:147-156 compiles xqa/mha.cu, xqa/xqa_wrapper.cu ...)."""
    pkg = _fake_pkg(root)
    files = {
        "data/csrc/batch_decode.cu": '#include "dec_e/e.cuh"\n',
        "data/csrc/batch_decode_kernel_inst.jinja": "#include <flashinfer/f.cuh>\n",
        "data/csrc/dec_e/e.cuh": "",
        "data/csrc/flashinfer_xqa_binding.cu": '#include "tvm_ffi_utils.h"\n',
        "data/csrc/xqa/mha.cu": '#include "mha.h"\n#include "../tvm_ffi_utils.h"\n',
        "data/csrc/xqa/mha.h": "",
        "data/csrc/xqa/tensorMap.cpp": '#include "tensorMap.h"\n',
        "data/csrc/xqa/tensorMap.h": "",
    }
    return _write(pkg, files)


@pytest.mark.parametrize("kernels, kept", [
    (("prefill",), ["keep_a", "keep_b"]),  # the default: as before, xqa and dec_e go
    (("prefill", "xqa"), ["keep_a", "keep_b", "xqa"]),
    (("prefill", "decode", "xqa"), ["dec_e", "keep_a", "keep_b", "xqa"]),
    (("xqa",), ["xqa"]),
])
def test_prune_keeps_the_sources_of_the_kernels_asked_for(tmp_path, kernels, kept):
    pkg = _fake_pkg_with_decode_and_xqa(tmp_path)
    removed, got = prune_csrc(pkg, kernels)
    all_dirs = ["dec_e", "drop_c", "drop_d", "keep_a", "keep_b", "xqa"]
    assert got == kept and removed == [d for d in all_dirs if d not in kept]
    csrc = pkg / "data" / "csrc"
    assert sorted(p.name for p in csrc.iterdir() if p.is_dir()) == kept
    if "xqa" in kernels:  # the JIT's XQA sources are all there
        assert all((csrc / f).is_file() for f in ("xqa/mha.cu", "xqa/mha.h", "xqa/tensorMap.cpp",
                                                  "xqa/tensorMap.h", "flashinfer_xqa_binding.cu"))


def test_prune_default_drops_xqa(tmp_path):
    """Without --kernels the bundle is what it was: nothing includes csrc/xqa from batch_prefill*."""
    pkg = _fake_pkg_with_decode_and_xqa(tmp_path)
    assert "xqa" in prune_csrc(pkg)[0] and not (pkg / "data" / "csrc" / "xqa").exists()


def test_kernels_checked(tmp_path):
    assert check_kernels("prefill,decode,xqa") == ("prefill", "decode", "xqa") == check_kernels(["prefill", "decode", "xqa"])
    assert set(KERNEL_GLOBS) == {"prefill", "decode", "xqa"} and KERNEL_GLOBS["prefill"] == ("batch_prefill*", "tvm_ffi_utils.h")
    for bad in ("mla", "prefill,", "", "xqa,nope"):
        with pytest.raises(UsageError, match="--kernels"):
            check_kernels(bad)
    pkg = _fake_pkg(tmp_path)  # no csrc/xqa at all: an unknown layout, nothing removed
    with pytest.raises(UsageError, match=r"xqa/\*"):
        prune_csrc(pkg, ("prefill", "xqa"))
    assert (pkg / "data" / "csrc" / "drop_c").is_dir()


def test_cli_refuses_bad_kernels(tmp_path):
    for argv, msg in ((["--flashinfer", "0.7.2.post1", "--kernels", "prefill,mla"], "--kernels"),
                      (["--notebooks", "--kernels", "xqa"], "--kernels goes with --flashinfer")):
        r = subprocess.run([sys.executable, "-m", "swa_repro.cli", "bundle", *argv, "--out", str(tmp_path / "b")],
                           check=False, capture_output=True, text=True, cwd=REPO)
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "b").exists()


def test_tvm_ffi_spec_read_from_metadata(tmp_path):
    whl = tmp_path / "flashinfer_python-9.9-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("flashinfer_python-9.9.dist-info/METADATA",
                   "Name: flashinfer-python\nRequires-Dist: apache-tvm-ffi!=0.1.8,<0.2,>=0.1.6\n"
                   "Requires-Dist: click\nRequires-Dist: apache-tvm-ffi<0.3; extra == \"ptx\"\n")
    assert tvm_ffi_spec(whl) == "apache-tvm-ffi!=0.1.8,<0.2,>=0.1.6"


def test_out_dir_must_be_new(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(UsageError, match="not empty"):
        build_bundle("0.6.12", tmp_path)
    assert (tmp_path / "x").read_text() == "keep me"


@pytest.mark.network
@pytest.mark.slow
def test_real_bundle_0612(tmp_path):
    """Download (cached in the user's cache, ``core.cache.cache_root()/wheels``) flashinfer-python
    0.6.12, bundle it for this python, install it offline with install.sh, import it and generate
    the fa2/fa3 prefill JIT sources."""
    from swa_repro.core.cache import cache_root

    cache = cache_root() / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    if not list(cache.glob("flashinfer_python-0.6.12-*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "flashinfer-python==0.6.12",
                        "-d", str(cache)], check=True, capture_output=True)
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    out = tmp_path / "bundle"
    m = build_bundle("0.6.12", out, python_version=pyver, wheel_dir=cache, xz_preset=0)
    assert m["total_bytes"] < 64 * 2**20
    names = set(tarfile.open(out / "flashinfer-0.6.12.tar.xz").getnames())
    for must in ("flashinfer/__init__.py", "flashinfer/prefill.py", "flashinfer/data/csrc/batch_prefill.cu",
                 "flashinfer/data/csrc/batch_prefill_sm90.cu", "flashinfer/data/include/flashinfer/attention/prefill.cuh",
                 "flashinfer/data/cutlass/include/cute/tensor.hpp", "flashinfer_python-0.6.12.dist-info/METADATA"):
        assert must in names, must
    assert not any(n.startswith("flashinfer/data/csrc/fused_moe/") for n in names)
    assert "fused_moe" in m["removed_csrc_subdirs"]
    wheels = sorted(p.name for p in (out / "wheels").iterdir())
    assert any(w.startswith("apache_tvm_ffi-") and f"cp{pyver.replace('.', '')}" in w for w in wheels)
    for dep in IMPORT_DEPS:
        assert any(w.lower().startswith(dep.replace("-", "_").lower() + "-") for w in wheels), dep
    assert json.loads((out / "MANIFEST.json").read_text())["flashinfer"] == "0.6.12"

    site = tmp_path / "site"
    r = subprocess.run(["bash", str(out / "install.sh"), str(site)], capture_output=True, text=True,
                       env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith(f"export PYTHONPATH={site}")
    code = ("import torch, flashinfer\n"
            "from flashinfer.jit.attention.modules import gen_batch_prefill_module\n"
            "print(flashinfer.__file__)\n"
            "for be in ('fa2', 'fa3'):\n"
            "    s = gen_batch_prefill_module(be, torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32,"
            " 128, 128, 0, False, False, False)\n"
            "    assert all(p.is_file() for p in s.sources), s.name\n")
    env = {**os.environ, "PYTHONPATH": str(site), "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"),
           "FLASHINFER_CUDA_ARCH_LIST": "9.0a"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().startswith(str(site))
