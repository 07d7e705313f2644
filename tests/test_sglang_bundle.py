"""`swa-repro bundle --sglang`: the sgl_kernel stub, the derived wheel set and MANIFEST.json (fake wheels,
offline), --out refusals, sglang-check failing a run whose stub was called, scripts/gpu_sglang.sh with a
fake python; one network test, in `make test-matrix`, builds the real bundle and installs it under CPython 3.12."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import pytest

from swa_repro.cli import main as cli_main
from swa_repro.core.errors import UsageError
from swa_repro.evidence import sglang_bundle as sb
from swa_repro.evidence.stubs import SGL_KERNEL_DIR
from swa_repro.sglang import check

REPO = Path(__file__).resolve().parents[1]
PY = "%d.%d" % sys.version_info[:2]


# ----------------------------------------------------------------------------- the stub
@pytest.fixture
def stub(tmp_path):
    """The stub as the bundle installs it: package ``sgl_kernel`` with ``_stub.json`` beside it."""
    pkg = tmp_path / "sgl_kernel"
    pkg.mkdir()
    shutil.copy2(SGL_KERNEL_DIR / "__init__.py", pkg / "__init__.py")
    (pkg / "_stub.json").write_text(json.dumps({"replaces": "sglang-kernel==0.4.4 (586.6 MiB)"}))
    saved_path, saved_mods = list(sys.meta_path), {k: v for k, v in sys.modules.items() if k.startswith("sgl_kernel")}
    for k in saved_mods:  # an earlier test's sgl_kernel (or its submodules) would shadow the stub's
        del sys.modules[k]
    spec = importlib.util.spec_from_file_location("sgl_kernel", pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sgl_kernel"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.meta_path[:] = saved_path
    for k in [k for k in sys.modules if k.startswith("sgl_kernel")]:
        del sys.modules[k]
    sys.modules.update(saved_mods)


def test_stub_records_lookups_and_raises_on_call(stub):
    from sgl_kernel import fast_topk  # noqa: the import sites of spec_utils.py:66 and utils.py:27
    from sgl_kernel.scalar_type import ScalarType  # noqa
    import sgl_kernel.kvcacheio

    sgl_kernel.kvcacheio.transfer_kv_all_layer_mla
    assert not hasattr(stub, "__wrapped__")  # the import machinery's dunder probes are not sglang's names
    p = stub.provenance()
    assert p["stubbed"] == "sgl_kernel" and p["replaces"] == "sglang-kernel==0.4.4 (586.6 MiB)"
    assert {"fast_topk", "scalar_type", "scalar_type.ScalarType", "kvcacheio",
            "kvcacheio.transfer_kv_all_layer_mla"} <= set(p["looked_up"])
    assert p["called"] == []
    with pytest.raises(RuntimeError, match=r"^sgl_kernel stub: fast_topk called; the attention path must not call it$"):
        fast_topk(None, 4)
    with pytest.raises(RuntimeError, match="scalar_type.ScalarType.uint4 called"):
        ScalarType.uint4()
    assert stub.provenance()["called"] == ["fast_topk", "scalar_type.ScalarType.uint4"]


@pytest.mark.parametrize("major,want", [(9, True), (10, True), (8, False)])
def test_stub_answers_is_arch_support_pdl_as_sgl_kernel_does(stub, monkeypatch, major, want):
    """Triton's backend asks ``sgl_kernel.utils.is_arch_support_pdl()`` at construction (0.5.23
    triton_backend.py:70-71, :340); sglang-kernel answers compute capability major >= 9 of the current
    device (sgl-kernel/python/sgl_kernel/utils.py). The stub answers the same, recorded as answered, not
    as a call that fails the run; it asks torch once (cached, as the real one)."""
    import torch

    asked = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: asked.append(d) or (major, 0))
    stub.ANSWERED["utils.is_arch_support_pdl"].cache_clear()
    from sgl_kernel.utils import is_arch_support_pdl  # triton_backend.py:71's import

    assert is_arch_support_pdl() is want and is_arch_support_pdl() is want and asked == [0]
    p = stub.provenance()
    assert p["called"] == [] and p["answered"] == ["utils.is_arch_support_pdl"]
    assert "utils.is_arch_support_pdl" in p["looked_up"]


def test_backends_ask_sgl_kernel_only_what_the_stub_answers():
    """Every ``sgl_kernel`` name the kit's SWA backends (FlashInfer, Triton), the modules they construct
    with and the kit import in 0.5.23 is answered by the stub; FA3's are compiled ops (flash_attn,
    merge_state_v2), which the stub cannot carry: its kit cases are skipped on the GPU, said so (scripts/gpu_kit.sh)."""
    import ast

    from conftest import release_overlay

    from swa_repro.sglang.fix.upstream_diff import VERSION

    site = release_overlay(VERSION) / "sglang"
    asked = {}
    for rel in ("srt/layers/attention/triton_backend.py", "srt/layers/attention/flashinfer_backend.py",
                "srt/layers/attention/flashattention_backend.py", "kernels/ops/attention/flash_attention_v3.py",
                "kernels/ops/attention/extend_attention.py", "kernels/ops/attention/decode_attention.py",
                "srt/layers/radix_attention.py", "srt/model_executor/forward_batch_info.py",
                *(str(p.relative_to(site)) for p in sorted((site / "test/kits/attention_unittest").rglob("*.py")))):
        for n in ast.walk(ast.parse((site / rel).read_text())):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sgl_kernel"):
                sub = n.module[len("sgl_kernel."):] + "." if "." in n.module else ""
                asked.setdefault(rel, set()).update(sub + a.name for a in n.names)
    stub_src = (SGL_KERNEL_DIR / "__init__.py").read_text()
    assert asked.pop("srt/layers/attention/triton_backend.py") == {"utils.is_arch_support_pdl"}
    fa3 = {"kernels/ops/attention/flash_attention_v3.py", "srt/layers/attention/flashattention_backend.py"}
    assert set(asked) == fa3  # FA3 only: compiled ops (flash_attn_*, merge_state_v2)
    assert all(n.startswith("flash_attn.") or n == "merge_state_v2" for r in fa3 for n in asked[r])
    assert '"utils.is_arch_support_pdl":' in stub_src


# ----------------------------------------------------------------------------- sglang-check and the stub
def _check_args(**kw):
    return types.SimpleNamespace(**{"cases": None, "trace_dir": None, "mode": "model", "peer": False, "json": True, "kit_only": False, "sglang": None, "fix": None, "force": False} | kw)


@pytest.fixture
def no_matrix(monkeypatch):
    """sglang-check's main without sglang: no rows, a fixed mode and sglang description."""
    monkeypatch.setattr(check, "run_matrix", lambda *a, **k: [])
    monkeypatch.setattr(check, "resolve_mode", lambda m: types.SimpleNamespace(mode="model", reason="test"))
    monkeypatch.setattr(check, "sglang_info", lambda: {"sglang": "0", "state": "unpatched", "backend_file": "f"})


def _fake_stub(called):
    m = types.ModuleType("sgl_kernel")
    m.__swa_repro_stub__ = True
    m.provenance = lambda: {"stubbed": "sgl_kernel", "replaces": "sglang-kernel==0.4.4", "looked_up": ["fast_topk"],
                            "called": list(called)}
    return m


def test_check_fails_a_run_whose_stub_was_called(monkeypatch, no_matrix, capsys):
    monkeypatch.setitem(sys.modules, "sgl_kernel", _fake_stub(["fast_topk"]))
    assert check.main(_check_args()) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["stubs"][0]["called"] == ["fast_topk"] and doc["expectation_met"] is False
    assert "error: the run called fast_topk of the sgl_kernel stub" in err
    assert "EXPECTATION FAILED: the run called fast_topk" in check.format_table(doc)


def test_check_records_an_uncalled_stub_and_passes(monkeypatch, no_matrix, capsys):
    monkeypatch.setitem(sys.modules, "sgl_kernel", _fake_stub([]))
    assert check.main(_check_args()) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stubs"] == [_fake_stub([]).provenance()] and "stub_violation" not in doc


def test_check_ignores_placeholders_that_answer_every_name(monkeypatch, no_matrix, capsys):
    """releases.py's CPU placeholder answers ``provenance`` too (a callable that raises): not a stub."""
    from swa_repro.sglang.releases import _SglKernelPlaceholder

    finder = _SglKernelPlaceholder()
    m = finder.create_module(importlib.util.spec_from_loader("sgl_kernel", finder))
    assert callable(m.provenance)
    monkeypatch.setitem(sys.modules, "sgl_kernel", m)
    assert check.main(_check_args()) == 0
    assert "stubs" not in json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- fake wheels: derivation + manifest
def _wheel(folder: Path, dist: str, version: str, requires=(), module=None) -> Path:
    stem = f"{dist.replace('-', '_')}-{version}"
    module = module or dist.replace("-", "_")
    files = {f"{module}/__init__.py": f"__version__ = {version!r}\n",
             f"{stem}.dist-info/METADATA": "Metadata-Version: 2.1\nName: " + dist + "\nVersion: " + version + "\n"
             + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{stem}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{stem}.dist-info/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{stem}.dist-info/RECORD,,\n"
    whl = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return whl


def _fake_wheels(folder: Path, sglang="0.5.15.post1", overrides=None) -> Path:
    """sglang and every CHAIN distribution at its measured version, each parent requiring its children."""
    overrides = overrides or {}
    folder.mkdir(exist_ok=True)
    versions = {d: overrides.get(d, v) for d, (_, v, _) in sb.CHAIN.items()}
    children = {}
    for d, (parent, _, _) in sb.CHAIN.items():
        via = sb.INDIRECT.get(d, (d,))[0]
        children.setdefault(parent, []).append(f"{via}=={versions[d]}" if via == d else via)
    _wheel(folder, "sglang", sglang, children["sglang"] + [
        "sglang-kernel==0.4.4", "flashinfer_python[cu13]==0.6.12", 'av; platform_machine == "aarch64"',
        'cudnn==9; extra == "diffusion"'])
    for d, v in versions.items():
        _wheel(folder, d, v, children.get(d, []), module="tvm_ffi" if d == "apache-tvm-ffi" else None)
    return folder


def test_versions_are_derived_from_requires_dist(tmp_path):
    """A newer release pinning another transformers gets that one; the measured pins stay where allowed."""
    wd = _fake_wheels(tmp_path / "w", sglang="0.5.99", overrides={"transformers": "5.13.0"})
    picks, stub = sb.resolve("0.5.99", [wd], tmp_path / "dl", PY)
    got = {p["dist"]: p["version"] for p in picks}
    assert got["transformers"] == "5.13.0" and got["tokenizers"] == "0.22.2" and got["sglang"] == "0.5.99"
    assert set(got) == {"sglang", *sb.CHAIN} and stub == {
        "replaces": "sglang-kernel==0.4.4 (sglang_kernel-0.4.4-cp310-abi3-manylinux2014_x86_64.whl, 586.6 MiB)",
        "flashinfer": "0.6.12"}


def test_unsupported_versions_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="sglang 0.5.14 is not supported: the import chain was measured on 0.5.15.post1"):
        sb.resolve("0.5.14", [], tmp_path, PY)
    wd = tmp_path / "w"
    wd.mkdir()
    _wheel(wd, "sglang", "0.6.0", ["transformers==9"])  # requires none of the rest: the chain does not apply
    with pytest.raises(UsageError, match="sglang 0.6.0 is not supported: sglang no longer requires apache-tvm-ffi"):
        sb.resolve("0.6.0", [wd], tmp_path / "dl", PY)


@pytest.fixture(scope="module")
def fake_bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sglang_bundle")
    wd = _fake_wheels(tmp / "w")
    m = sb.build_sglang_bundle("0.5.15.post1", tmp / "bundles" / "sglang", python_version=PY, wheel_dir=wd,
                               xz_preset=0, repo=tmp)
    return tmp, wd, m


def test_manifest_lists_every_wheel_with_sha256_and_the_stub(fake_bundle):
    tmp, wd, m = fake_bundle
    out = tmp / "bundles" / "sglang"
    assert json.loads((out / "MANIFEST.json").read_text()) == m
    assert [w["dist"] for w in m["wheels"]] == ["sglang", *sb.CHAIN]
    for w in m["wheels"]:
        assert w["sha256"] == hashlib.sha256((wd / w["wheel"]).read_bytes()).hexdigest() and w["why"]
    (s,) = m["stubs"]
    assert s["module"] == "sgl_kernel" and s["replaces"].startswith("sglang-kernel==0.4.4 ")
    assert "calls none of them" in s["reason"]
    assert m["import_chain"]["date"] and m["import_chain"]["how"] and "caveat" not in m["import_chain"]
    with tarfile.open(out / "sglang-site-0.5.15.post1.tar.xz") as t:
        names = t.getnames()
    assert "sgl_kernel/__init__.py" in names and "sgl_kernel/_stub.json" in names
    assert m["budget"]["repo_bytes"] is None and "one_call_bytes" not in m["budget"]  # tmp is no git checkout


def test_install_sh_leaves_one_copy_of_each_and_the_stub(fake_bundle):
    """Over a site where the flashinfer bundle put apache-tvm-ffi 0.1.15.post2: only the bundle's is left."""
    tmp, _, _ = fake_bundle
    site = tmp / "site"
    (site / "tvm_ffi").mkdir(parents=True)
    (site / "tvm_ffi" / "old.py").write_text("")
    (site / "apache_tvm_ffi-0.1.15.post2.dist-info").mkdir()
    (site / "apache_tvm_ffi-0.1.15.post2.dist-info" / "METADATA").write_text("Name: apache-tvm-ffi\nVersion: 0.1.15.post2\n")
    (site / "keep_me").mkdir()
    r = subprocess.run(["bash", str(tmp / "bundles" / "sglang" / "install.sh"), str(site)], capture_output=True,
                       text=True, env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
    from swa_repro.evidence.sglang_bundle import CHAIN

    n = len(CHAIN) + 1  # the chain and sglang itself
    assert f"installed sglang 0.5.15.post1 ({n} distributions)" in r.stdout and "export PYTHONPATH=" in r.stdout
    assert sorted(p.name for p in site.glob("apache_tvm_ffi-*")) == ["apache_tvm_ffi-0.1.11.dist-info"]
    assert not (site / "tvm_ffi" / "old.py").exists() and (site / "keep_me").is_dir()
    assert (site / "sgl_kernel" / "_stub.json").is_file()


def test_out_must_be_new_or_empty(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    (tmp_path / "file").write_text("")
    for out, msg in ((tmp_path / "full", "exists and is not empty"), (tmp_path / "file", "is a file")):
        assert cli_main(["bundle", "--sglang", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1
    assert os.listdir(tmp_path / "full") == ["x"] and (tmp_path / "full" / "x").read_text() == "keep me"
    assert cli_main(["bundle", "--sglang", "0.5.4", "--out", str(tmp_path / "new")]) == 2
    assert "not supported" in capsys.readouterr().err and not (tmp_path / "new").exists()


# ----------------------------------------------------------------------------- scripts/gpu_sglang.sh
def test_gpu_script_installs_in_order_and_runs_audit_check_and_notebooks(tmp_path):
    """With a fake python that logs its argv and fake bundles that log their install."""
    log = tmp_path / "calls.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\n[ "$1" = - ] && cat >/dev/null\necho "python $*" >> {log}\n')
    fake.chmod(0o755)
    bundles = tmp_path / "bundles"
    for name in ("fi-0.6.12", "notebooks", "sglang-0.5.15.post1"):
        (bundles / name).mkdir(parents=True)
        (bundles / name / "install.sh").write_text(f'echo "install {name} $1 PYTHON=$PYTHON" >> {log}\n')
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHON": str(fake), "BUNDLE_DIR": str(bundles), "SITE": str(tmp_path / "site"),
           "ART": str(tmp_path / "art"), "NB_OUT": str(tmp_path / "live"), "OUT": str(out)}
    r = subprocess.run(["bash", str(REPO / "scripts" / "gpu_sglang.sh")], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = log.read_text().splitlines()
    site = tmp_path / "site"
    assert calls[:3] == [f"install {n} {site} PYTHON={fake}" for n in ("fi-0.6.12", "notebooks", "sglang-0.5.15.post1")]
    assert calls[3] == "python -"  # the check that flashinfer, sglang and the stub come from the site
    # the live audit runs in the background beside sglang-check (their JIT builds overlap): either order
    assert sorted(calls[4:6]) == sorted([
        "python -m swa_repro.cli audit --mode live --json --live-budget 300",
        f"python -m swa_repro.cli sglang-check --mode live --peer --json --trace-dir {tmp_path / 'art'}/traces"])
    assert calls[6] == f"python -m swa_repro.cli run --mode live --output {tmp_path / 'live'} 03 04 05"
    got = sorted(p.name for p in out.iterdir())
    assert len(got) <= 8 and "sglang-check.json" in got and "site-listing.txt" in got
    dry = subprocess.run(["bash", str(REPO / "scripts" / "gpu_sglang.sh"), "install"], capture_output=True, text=True,
                         env=env | {"DRY_RUN": "1", "OUT": ""}, timeout=60)
    assert dry.returncode == 0 and len(log.read_text().splitlines()) == len(calls)  # nothing ran
    assert dry.stdout.index("fi-0.6.12/install.sh") < dry.stdout.index("sglang-0.5.15.post1/install.sh")
    shutil.rmtree(bundles / "sglang-0.5.15.post1")
    miss = subprocess.run(["bash", str(REPO / "scripts" / "gpu_sglang.sh")], capture_output=True, text=True, env=env,
                          timeout=60)
    assert miss.returncode == 2 and "swa-repro bundle --sglang 0.5.15.post1 --out .bundle/sglang-0.5.15.post1" in miss.stdout


# ----------------------------------------------------------------------------- the real bundle
def _python312():
    """A CPython 3.12 that runs (a pyenv shim may not), or None."""
    for c in [*sorted(Path("/root/.pyenv/versions").glob("3.12*/bin/python3.12")), shutil.which("python3.12")]:
        if c and subprocess.run([str(c), "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                                capture_output=True).returncode == 0:
            return c
    return None


PY312 = _python312()


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.matrix  # the real wheels of a release's import chain (~30 s from nothing): make test-matrix;
# make test builds, lists and installs bundles from stand-in wheels (the tests above)
@pytest.mark.skipif(PY312 is None, reason="needs a CPython 3.12 to install the cp312 bundle")
def test_real_bundle_installs_and_imports_under_cpython_312(tmp_path):
    from swa_repro.core.cache import cache_root

    wheels = cache_root() / "wheels" / "cp312"  # downloaded once (resolve fetches what is missing), then offline
    wheels.mkdir(parents=True, exist_ok=True)
    sb.resolve("0.5.15.post1", [wheels], wheels, "3.12")
    m = sb.build_sglang_bundle("0.5.15.post1", tmp_path / "b" / "sglang", xz_preset=1, repo=tmp_path, wheel_dir=wheels)
    assert {w["dist"]: w["version"] for w in m["wheels"]} == {"sglang": "0.5.15.post1"} | {
        d: v for d, (_, v, _) in sb.CHAIN.items()}
    site = tmp_path / "site"
    r = subprocess.run(["bash", str(tmp_path / "b" / "sglang" / "install.sh"), str(site)], capture_output=True,
                       text=True, env={**os.environ, "PYTHON": str(PY312)})
    assert r.returncode == 0, r.stderr
    import typing_extensions  # on the device image; pydantic_core imports it

    image = tmp_path / "image"
    image.mkdir()
    shutil.copy2(typing_extensions.__file__, image)
    code = ("import sys; sys.path[:0] = sys.argv[1:]; import pydantic_core, pydantic, orjson, msgspec, zmq, tokenizers, "
            "pybase64, tvm_ffi, sgl_kernel; assert tvm_ffi.__version__ == '0.1.11'; "
            "print(sgl_kernel.provenance()['replaces'])")
    r = subprocess.run([str(PY312), "-c", code, str(site), str(image)], capture_output=True, text=True)
    assert r.returncode == 0 and "sglang-kernel==0.4.4" in r.stdout, r.stderr
