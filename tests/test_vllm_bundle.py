"""vllm_bundle.py: what of vLLM's wheel travels, install.sh (run offline on a fake tree), the CLI's
refusals, the measured chain's shape; the measurement itself only with ``-m matrix`` (network, minutes)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from swa_repro.core.errors import UsageError
from swa_repro.evidence import sglang_bundle as sg
from swa_repro.evidence import vllm_bundle as vb

REPO = Path(__file__).resolve().parents[1]
PY = "{}.{}".format(*sys.version_info[:2])
# the cache's documented rule, written out (core.cache.cache_root): $SWA_REPRO_CACHE, else
# $XDG_CACHE_HOME/swa-repro, else ~/.cache/swa-repro
OVERLAY = Path(os.environ.get("SWA_REPRO_CACHE")
               or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swa-repro") / "vllm" / "0.33.0"

# member of the wheel -> carried? (written out by hand, not derived from vllm_bundle's suffix lists)
MEMBERS = {
    "vllm/__init__.py": True, "vllm/v1/attention/backends/flashinfer.py": True, "vllm/py.typed": True,
    "vllm-0.33.0.dist-info/RECORD": True, "vllm-0.33.0.dist-info/METADATA": True,
    "vllm-0.33.0.dist-info/licenses/LICENSE": True,
    "vllm/_C_stable_libtorch.abi3.so": False, "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": False,
    "vllm/vllm-rs": False, "vllm/third_party/deep_gemm/__init__.py": False,
    "vllm/third_party/fmha_sm100/csrc/fmha_sm100_inst.jinja": False,
    "vllm/models/deepseek_v41/nvidia/kernel.cuh": False, "vllm/kernels/x/ops.cu": False, "vllm/a/b.hpp": False,
    "vllm/a/b.h": False, "vllm/a/b.cpp": False, "vllm/a/b.inl": False,
    "vllm/model_executor/layers/fused_moe/configs/E=8,N=14336,device_name=NVIDIA_H100.json": False,
    "vllm/entrypoints/serve/instrumentator/static/swagger-ui-bundle.js": False,
    "vllm/transformers_utils/chat_templates/template_chatml.jinja": False,
    "other_top/x.py": False,
}


def test_exclusion_carries_only_python_and_metadata():
    got = {m: vb.exclusion(m) is None for m in MEMBERS}
    assert got == MEMBERS
    assert "vllm-rs" in vb.exclusion("vllm/vllm-rs") and ".so" in vb.exclusion("vllm/_C.abi3.so")
    assert all(vb.exclusion(f) is None for f in vb.DATA_READ)  # what the import path opens travels


def _fake_wheel(tmp_path: Path) -> Path:
    whl = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for i, m in enumerate(MEMBERS):
            z.writestr(m, f"# {i} {m}\n" * (i + 1))
    return whl


def test_unpack_carries_unmodified_and_counts_the_rest(tmp_path):
    whl = _fake_wheel(tmp_path)
    excluded = vb.unpack_vllm(whl, tmp_path / "t")
    got = sorted(str(p.relative_to(tmp_path / "t")) for p in (tmp_path / "t").rglob("*") if p.is_file())
    assert got == sorted(m for m, keep in MEMBERS.items() if keep)
    with zipfile.ZipFile(whl) as z:
        assert all((tmp_path / "t" / m).read_bytes() == z.read(m) for m in got)
        sizes = {i.filename: i.file_size for i in z.infolist()}
    assert sum(e["files"] for e in excluded.values()) == sum(not k for k in MEMBERS.values())
    assert sum(e["bytes"] for e in excluded.values()) == sum(sizes[m] for m, k in MEMBERS.items() if not k)


def _site(root: Path, dists: dict) -> Path:
    for name, (top, version) in dists.items():
        (root / top).mkdir(parents=True)
        (root / top / "__init__.py").write_text(f"__version__ = {version!r}\n")
        info = root / f"{top}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def _bundle(tmp_path: Path, python_version: str = PY) -> Path:
    site = _site(tmp_path / "site", {"vllm": ("vllm", "0.33.0"), "cachetools": ("cachetools", "8.0.2")})
    out = tmp_path / "bundle"
    out.mkdir()
    picks = [{"dist": "vllm", "version": "0.33.0"}, {"dist": "cachetools", "version": "8.0.2"}]
    sg.pack(site, out / "vllm-site-0.33.0.tar.xz", 0)
    (out / "install.sh").write_text(vb.install_sh(site, picks, "0.33.0", "vllm-site-0.33.0.tar.xz", python_version))
    return out


def test_install_sh_replaces_older_copies_and_checks_pins(tmp_path):
    out = _bundle(tmp_path)
    text = (out / "install.sh").read_text()
    assert "sgl_kernel" not in text and "sglang" not in text and "vLLM 0.33.0 bundle" in text
    target = _site(tmp_path / "target", {"cachetools": ("cachetools", "1.0"), "flashinfer-python":
                                         ("flashinfer", "0.7.2.post1")})  # an older copy; the fi bundle's
    (target / "cachetools" / "old.py").write_text("")
    r = subprocess.run(["bash", str(out / "install.sh"), str(target)], check=False, capture_output=True, text=True,
                       env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
    assert f"installed vllm 0.33.0 (2 distributions, no compiled extension) into {target}" in r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith(f"export PYTHONPATH={target}")
    assert not (target / "cachetools" / "old.py").exists() and not (target / "cachetools-1.0.dist-info").exists()
    assert (target / "cachetools-8.0.2.dist-info").is_dir() and (target / "vllm" / "__init__.py").is_file()
    assert (target / "flashinfer" / "__init__.py").is_file()  # not ours: kept


def test_install_sh_refuses_another_python(tmp_path):
    out = _bundle(tmp_path, "3.99")
    r = subprocess.run(["bash", str(out / "install.sh"), str(tmp_path / "target")], check=False, capture_output=True,
                       text=True, env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode != 0 and "this bundle is for CPython 3.99" in r.stderr
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize("argv, msg", [
    (["--vllm", "0.19.0"], "measured on vLLM 0.33.0"),
    (["--vllm", "0.34.0"], "measured on vLLM 0.33.0"),
    (["--vllm", "abc"], "measured on vLLM 0.33.0"),
    (["--vllm", "0.33.0", "--sglang"], "one bundle per folder"),
    (["--vllm", "0.33.0", "--flashinfer", "0.7.2.post1"], "one bundle per folder"),
    (["--vllm", "0.33.0", "--kernels", "xqa"], "--kernels goes with --flashinfer"),
    (["--vllm", "0.33.0", "--wheel-dir", "{MISSING}"], "--wheel-dir"),
    (["--vllm", "0.33.0", "--python", "2.7"], "--python must be"),
    (["--vllm", "0.33.0", "--out", "{FULL}"], "not empty"),
])
def test_cli_refusals_are_one_line_and_write_nothing(tmp_path, argv, msg):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("keep me")
    argv = [a.replace("{MISSING}", str(tmp_path / "nope")).replace("{FULL}", str(tmp_path / "full")) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "b")]
    r = subprocess.run([sys.executable, "-m", "swa_repro.cli", "bundle", *argv], check=False, capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "b").exists() and os.listdir(tmp_path / "full") == ["keep"]


def test_check_version_returns_the_flashinfer_pin():
    assert vb.check_version("0.33.0") == "0.7.2.post1"
    with pytest.raises(UsageError, match="0.7.3"):
        vb.check_version("0.34.0")


def test_chain_shape():
    """Parents come before their children; each entry has a version and an importer file:line."""
    from packaging.version import Version

    assert vb.CHAIN and vb.CHAIN_MEASURED["vllm"] in vb.MEASURED
    seen = {"vllm"}
    for dist, (parent, version, why) in vb.CHAIN.items():
        assert parent in seen, (dist, parent)
        Version(version)
        assert ".py:" in why, dist
        seen.add(dist)
    from swa_repro.sglang.device_image import IMAGE

    image = {sg.norm(d) for d in IMAGE}
    assert set(vb.CHAIN_MEASURED["image_used"]) <= image and not image & {sg.norm(d) for d in vb.CHAIN}


@pytest.mark.matrix
@pytest.mark.network
def test_chain_meets_the_release_requirements_and_the_overlay_is_carried():
    """With the release's overlay (swa_repro.vllm.provision, fetched once into the shared cache): every
    distribution the chain says vLLM requires is in its Requires-Dist at a version that meets it, and
    every .py outside third_party travels."""
    from packaging.requirements import Requirement

    from swa_repro.vllm.provision import provision

    assert provision("0.33.0")[0] == OVERLAY

    meta = (OVERLAY / "vllm-0.33.0.dist-info" / "METADATA").read_text()
    reqs = {sg.norm(r.name): r for r in (Requirement(line.split(":", 1)[1]) for line in meta.splitlines()
                                         if line.startswith("Requires-Dist:"))}
    for dist, (parent, version, _) in vb.CHAIN.items():
        if parent == "vllm":
            assert reqs[sg.norm(dist)].specifier.contains(version, prereleases=True), dist
    assert reqs["flashinfer-python"].specifier.contains(vb.MEASURED["0.33.0"])
    files = [str(p.relative_to(OVERLAY)) for p in (OVERLAY / "vllm").rglob("*.py")]
    assert len(files) > 2000
    assert all(vb.exclusion(f) is None for f in files if not f.startswith("vllm/third_party/"))


def test_image_conflicts_lists_only_unmet_requirements(tmp_path):
    whl = tmp_path / "vllm-9.9-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("vllm-9.9.dist-info/METADATA", "Name: vllm\nRequires-Dist: torch==2.14.0\n"
                   "Requires-Dist: transformers<5.21.0,>=5.16.1\nRequires-Dist: tokenizers>=0.99\n"
                   "Requires-Dist: numpy<1; extra == \"x\"\n")
    got = {c["dist"]: c["requires"] for c in vb.image_conflicts(whl, "3.12")}
    assert got == {"torch": "==2.14.0", "tokenizers": ">=0.99"}


def test_budget_counts_the_flashinfer_bundle_only(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x" * 1000)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    bundles = repo / ".bundle"
    for name, size in (("fi-0.7.2.post1", 5000), ("sglang-0.5.23", 7000)):
        (bundles / name).mkdir(parents=True)
        (bundles / name / "install.sh").write_text("y" * size)
    (bundles / "vllm-0.33.0").mkdir()
    b = vb.budget(bundles / "vllm-0.33.0", 300, "0.7.2.post1", repo)
    assert b["beside_bytes"] == {"fi-0.7.2.post1": 5000, "sglang-0.5.23": 7000}
    assert b["with_flashinfer_only"]["bytes"] == b["repo_bytes"] + 5000 + 300
    assert b["with_flashinfer_only"]["fits_one_call"]


FI_BUNDLE = REPO / ".bundle" / "fi-0.7.2.post1"


@pytest.mark.matrix
@pytest.mark.network
@pytest.mark.slow
def test_chain_is_what_the_measurement_finds(tmp_path):
    """Re-measure (minutes: one child per missing distribution, twice) and compare with CHAIN; the
    flashinfer bundle is .bundle's where one was built, else built here (a clean clone has none)."""
    from swa_repro.evidence.bundle import build_bundle
    from swa_repro.sglang.device_image import IMAGE
    from swa_repro.vllm.bundle_measure import measure

    fi = FI_BUNDLE
    if not list(fi.glob("flashinfer-*.tar.xz")):
        fi = tmp_path / "fi"
        build_bundle(vb.MEASURED["0.33.0"], fi, kernels=("prefill", "decode", "xqa"))
    m = measure("0.33.0", fi, IMAGE, log=lambda s: None)
    assert {d: v[:2] for d, v in m["chain"].items()} == {d: tuple(v[:2]) for d, v in vb.CHAIN.items()}
    assert m["measured"]["runs"]["cpu"]["ok"]
