"""``swa-repro bundle --vllm VERSION``: vLLM's Python files for an air-gapped GPU machine that has torch
but no vLLM and no network, beside the flashinfer bundle (``--flashinfer PIN --kernels prefill,decode,xqa``,
PIN the release's flashinfer pin), so that ``python -m swa_repro.vllm.audit.live`` runs the release's FlashInfer
backend on the real FlashInfer there.

What travels is measured (:data:`CHAIN_MEASURED`, ``vllm.bundle_measure.measure``): vLLM's package from its wheel without
its compiled code (:func:`exclusion`: ``.so``, the ``vllm-rs`` binary, ``third_party``, C/CUDA sources,
data files the import path does not read; the audit's platform replaces ``vllm._C``, as in
``swa_repro.vllm.audit.drive.setup``), its dist-info untouched, and :data:`CHAIN`, the distributions the live
child's imports need that neither the device image nor the flashinfer bundle has. Contents of ``--out``:
``vllm-site-VERSION.tar.xz``, ``install.sh [TARGET]`` (after the flashinfer bundle's, same TARGET) and
``MANIFEST.json``. No module of a higher layer is imported (tests/test_layers.py): the release's wheel
comes from the cache ``swa_repro.vllm.provision`` fills, and the device image's distributions reach
``vllm.bundle_measure.measure`` as an argument (``swa_repro.sglang.device_image.IMAGE``).
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.core.outputs import fresh_dir, out_dir
from swa_repro.evidence import sglang_bundle as sg
from swa_repro.evidence.bundle import LIMIT_BYTES, _sha256

REPO = sg.REPO
# The releases the chain was measured on (vLLM 0.34.0 pins flashinfer 0.7.3, which is not on PyPI)
MEASURED = {"0.33.0": "0.7.2.post1"}  # vLLM release -> its flashinfer-python pin (Requires-Dist)
C_SUFFIXES = (".h", ".hpp", ".cuh", ".cu", ".cpp", ".inl", ".c", ".cc")
# Data files under vllm/ the live child's imports open (measured: an audit hook on "open" in the probe)
DATA_READ: tuple[str, ...] = ()
# Versions the device image is known to hold (/work/.library/device/KINDS.md, the 'pip list' row of
# 2026-11): the measurement installs these where this venv's differ and the release requires them
IMAGE_KNOWN = {"transformers": "5.17.0", "tokenizers": "0.23.2", "huggingface-hub": "1.33.0", "safetensors": "0.8.0",
               "numpy": "2.5.2", "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "torch": "2.11.0",
               "torchvision": "0.26.0", "torchaudio": "2.11.0", "triton": "3.6.0"}

CHAIN_MEASURED = {
    "vllm": "0.33.0", "flashinfer": "0.7.2.post1", "date": "2026-12-06", "python": "3.11 (this venv)",
    "how": "vllm_measure.measure('0.33.0', .bundle/fi-0.7.2.post1, swa_repro.sglang.device_image.IMAGE) on CPU "
           "(again: pytest -m matrix tests/test_vllm_bundle.py): a child whose path is the stdlib, vLLM's carried "
           "files (exclusion()), the flashinfer bundle's real flashinfer 0.7.2.post1, this repo and a view of this "
           "venv's site-packages holding only the image's and the flashinfer bundle's distributions (transformers "
           "5.17.0, tokenizers 0.23.2, sentencepiece 0.2.2 installed as the image has them; numpy: the venv's 2.3.5, "
           "no 2.5.2 for 3.11; py-cpuinfo, in the image, installed as this venv lacks it) runs vllm_measure.PROBE "
           "(the live child's imports: drive.setup with live_kernels.install_real, the vLLM modules it and "
           "vllm.paths use, families.resolve gemma2/cohere2); the distribution of each ModuleNotFoundError was "
           "added at this venv's version where vLLM's Requires-Dist allows it, else at the lowest it allows, until "
           "none was left (20 rounds, 295 vllm modules imported); then again with torch.cuda faked available (an "
           "H100): nothing more. No data file under vllm/ is opened on that path (an audit hook on 'open')",
    "data_read": [],
    # the image's distributions that path imported (what the GPU machine must keep having)
    "image_used": [
        "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio", "attrs", "certifi",
        "charset-normalizer", "click", "cloudpickle", "cuda-bindings", "cuda-core", "cuda-pathfinder",
        "filelock", "frozenlist", "h11", "httpcore", "httpx", "huggingface-hub", "idna", "jinja2", "markupsafe",
        "ml-dtypes", "mpmath", "multidict", "networkx", "numpy", "nvidia-ml-py", "packaging", "pillow",
        "prometheus-client", "propcache", "psutil", "py-cpuinfo", "pygments", "pyyaml", "regex", "requests",
        "rich", "safetensors", "scipy", "sentencepiece", "setuptools", "sympy", "tiktoken", "tokenizers",
        "torch", "torchaudio", "torchvision", "tqdm", "transformers", "triton", "typing-extensions", "urllib3",
        "uvloop", "xxhash", "yarl",
    ],
}
# distribution -> (the distribution whose Requires-Dist brings it, measured version, why: first importer <- its
# importers, in the vLLM 0.33.0 tree). Parents come before their children.
CHAIN = {
    "pyzmq": ("vllm", "27.3.0", ("vllm/utils/network_utils.py:19 <- vllm/distributed/utils.py:33 <- "
                                 "vllm/distributed/parallel_state.py:51")),
    "pydantic": ("vllm", "2.14.4", ("vllm/config/attention.py:7 <- vllm/config/__init__.py:4 <- "
                                    "vllm/v1/attention/backends/flashinfer.py:31")),
    "pydantic-core": ("pydantic", "2.50.5", "pydantic/version.py:7 <- pydantic/warnings.py:5"),
    "typing-inspection": ("pydantic", "0.4.5", "pydantic/errors.py:8 <- pydantic/_migration.py:263"),
    "annotated-types": ("pydantic", "0.8.0", "pydantic/fields.py:17 <- pydantic/__init__.py:451"),
    "cbor2": ("vllm", "6.3.0", "vllm/utils/hashing.py:12 <- vllm/config/device.py:11 <- vllm/config/__init__.py:13"),
    "oss-harmony": ("vllm", "0.0.11", ("vllm/entrypoints/mcp/tool_server.py:7 (openai_harmony) <- "
                                       "vllm/reasoning/abs_reasoning_parsers.py:10 <- vllm/config/reasoning.py:8")),
    "openai": ("vllm", "2.25.0", "vllm/entrypoints/mcp/tool.py:8 <- vllm/entrypoints/mcp/tool_server.py:9"),
    "sniffio": ("openai", "1.3.1", "openai/_utils/_utils.py:23"),
    "distro": ("openai", "1.9.0", "openai/_base_client.py:37"),
    "pybase64": ("vllm", "1.5.1", "vllm/multimodal/media/audio.py:10 <- vllm/multimodal/hasher.py:17"),
    "cachetools": ("vllm", "8.0.3", "vllm/utils/cache.py:8 <- vllm/multimodal/cache/base.py:14"),
    "msgspec": ("vllm", "0.23.0", "vllm/pooling_params.py:7 <- vllm/v1/request.py:14 <- vllm/v1/core/kv_cache_utils.py:36"),
    "xgrammar": ("vllm", "0.2.8", "vllm/parser/abstract_parser.py:12 <- vllm/v1/structured_output/__init__.py:13"),
    "fastapi": ("vllm", "0.133.0", "vllm/entrypoints/serve/__init__.py:4 <- vllm/entrypoints/generate/base/protocol.py:18"),
    "starlette": ("vllm", "1.10.0", "fastapi/__init__.py:5 (vLLM requires starlette>=1.0.1 itself)"),
    "partial-json-parser": ("vllm", "0.2.1.1.post7", ("vllm/tool_parsers/utils.py:14 <- "
                                                      "vllm/tool_parsers/abstract_tool_parser.py:34")),
    "llguidance": ("vllm", "1.7.0", ("vllm/v1/structured_output/backend_guidance.py:219 (a dataclass field annotated "
                                     "llguidance.LLMatcher loads vllm/utils/import_utils.py:376's LazyLoader)")),
}


def check_version(version: str) -> str:
    """One line for a release the chain was not measured on; returns its flashinfer pin."""
    if version not in MEASURED:
        raise UsageError(f"--vllm {version}: the bundle's import chain was measured on vLLM "
                         f"{', '.join(MEASURED)} only (vllm_bundle.MEASURED; 0.34.0 pins flashinfer 0.7.3, not on "
                         "PyPI); re-measure with vllm.bundle_measure.measure for another release")
    return MEASURED[version]


# ----------------------------------------------------------------------------- vLLM's own files
def exclusion(name: str) -> str | None:
    """Why a member of the vLLM wheel is not carried, or None (carried, unmodified)."""
    top = name.split("/")[0]
    if top.endswith(".dist-info"):
        return None  # METADATA, RECORD (it lists what is left out too), WHEEL, licenses: untouched
    if top != "vllm":
        return "outside the vllm package"
    if name.endswith(".so"):
        return ("compiled extensions (.so, 633 MB in 0.33.0): vllm._C and the flash-attn/MoE/MLA kernels; the "
                "live child never loads them (its platform replaces vllm._C, swa_repro/vllm/audit/drive.py setup)")
    if name == "vllm/vllm-rs":
        return "vllm/vllm-rs: the Rust serving frontend (a 61 MB binary), never imported"
    if name.startswith("vllm/third_party/"):
        return ("vllm/third_party: vendored kernels (deep_gemm, fmha_sm100, flash_linear_attention, ...) and pynvml.py, "
                "not imported on the live path (pynvml: by vllm/platforms/cuda.py, which needs vllm._C anyway, and by "
                "platform detection, which the live child's own platform replaces)")
    if name.endswith(C_SUFFIXES):
        return "C/CUDA sources and headers (.h .hpp .cuh .cu .cpp .inl): vLLM's own kernels, not FlashInfer's JIT"
    if name.endswith((".py", ".pyi", "/py.typed")) or name in DATA_READ:
        return None
    return ("data files the import path does not open (tuned MoE/quant json configs, chat templates, the "
            "swagger UI, docs): measured, CHAIN_MEASURED['data_read']")


def vllm_wheel(version: str, wheel_dir: Path | None, python_version: str = "3.12") -> Path:
    """The release's wheel: from ``wheel_dir``, else the shared cache ``swa_repro.vllm.provision`` fills
    (``cache_root()/wheels/vllm``), else downloaded into that cache."""
    from packaging.specifiers import SpecifierSet

    from swa_repro.core.cache import cache_root

    cache = cache_root() / "wheels" / "vllm"
    cache.mkdir(parents=True, exist_ok=True)
    return sg.fetch("vllm", SpecifierSet(f"=={version}"), [wheel_dir, cache], cache, python_version)


def unpack_vllm(whl: Path, dest: Path) -> dict:
    """The carried members of ``whl`` into ``dest``; returns ``{why: {files, bytes, examples}}`` of the rest."""
    out: dict = {}
    with zipfile.ZipFile(whl) as z:
        keep = []
        for i in z.infolist():
            why = exclusion(i.filename)
            if why is None:
                keep.append(i.filename)
                continue
            e = out.setdefault(why, {"files": 0, "bytes": 0, "examples": []})
            e["files"] += 1
            e["bytes"] += i.file_size
            if len(e["examples"]) < 3:
                e["examples"].append(i.filename)
        z.extractall(dest, keep)
    return out


# ----------------------------------------------------------------------------- the site tree
def resolve(version: str, folders, dl: Path, python_version: str = "3.12") -> list[dict]:
    """vLLM's wheel and :data:`CHAIN`'s, each at its measured version where its parent allows it."""
    from packaging.specifiers import SpecifierSet

    whl = vllm_wheel(version, folders[0] if folders else None, python_version)
    reqs = {"vllm": sg.requirements(whl, python_version)}
    picks = [{"dist": "vllm", "version": version, "wheel": whl, "required_by": None, "requirement": f"vllm=={version}",
              "why": "the package under test (its Python files: MANIFEST.json 'excluded' says what is left out)"}]
    for dist, (parent, measured, why) in CHAIN.items():
        r = reqs.get(sg.norm(parent), {}).get(sg.norm(dist)) if parent else None
        spec = r.specifier if r is not None else SpecifierSet()
        pin = SpecifierSet(f"=={measured}") if spec.contains(measured, prereleases=True) else spec
        w = sg.fetch(dist, pin, folders, dl, python_version)
        reqs[sg.norm(dist)] = sg.requirements(w, python_version)
        picks.append({"dist": dist, "version": sg._wheel_name_version(w)[1], "wheel": w, "required_by": parent,
                      "requirement": str(r) if r is not None else f"{dist} (no Requires-Dist names it)", "why": why})
    return picks


def build_site(picks, site: Path, python_version: str) -> dict:
    """``pip install --target`` of the chain's wheels (``bin/``, ``share/`` dropped), then vLLM's carried
    files straight from its wheel (pip would install its ``.so``); returns the exclusions."""
    chain = [str(p["wheel"]) for p in picks[1:]]
    site.mkdir(parents=True)
    if chain:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--disable-pip-version-check", *sg.pip_target_args(python_version), "--target", str(site),
                            *chain], check=False, capture_output=True, text=True)
        if r.returncode != 0:
            raise UsageError("pip install --target of the vLLM chain failed: "
                             + " | ".join((r.stderr or r.stdout).strip().splitlines()[-2:]))
    for data in ("bin", "share"):
        shutil.rmtree(site / data, ignore_errors=True)
    if (site / "vllm").exists():
        raise UsageError("a chain wheel brings a vllm package: it would mix with the release's files")
    return unpack_vllm(picks[0]["wheel"], site)


INSTALL_HEAD = """#!/usr/bin/env bash
# Offline install of the vLLM @VERSION@ bundle (made by `swa-repro bundle --vllm`) into TARGET (default
# /tmp/site). Run it after the flashinfer bundle's install.sh into the same TARGET: it first removes every
# copy of what it brings, whatever the version, so one version of each is left. vLLM comes without its
# compiled extensions (MANIFEST.json "excluded"). Writes nothing outside TARGET; needs no pip and no xz.
"""
INSTALL_TAIL = """sys.path.insert(0, target)
import importlib.util
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.origin.startswith(target + "/"):
    sys.exit(f"error: vllm comes from {spec and spec.origin}, not the bundle's copy in {target}")
print(f"installed vllm {pins['vllm']} ({len(pins)} distributions, no compiled extension) into {target}")
EOF
echo "export PYTHONPATH=$TARGET\\${PYTHONPATH:+:\\$PYTHONPATH}"
"""


def install_sh(site: Path, picks, version: str, tarball: str, python_version: str) -> str:
    """sglang's install.sh (python check, removal of older copies, extraction with tarfile, exactly one
    copy at each pin), with vLLM's header and closing check instead of sglang's stub check."""
    text = sg.install_sh(site, picks, version, tarball, python_version)
    body = text[text.index("set -euo pipefail"):text.index("sys.path.insert(0, target)")]
    return INSTALL_HEAD.replace("@VERSION@", version) + body + INSTALL_TAIL


# ----------------------------------------------------------------------------- build + CLI
def build_vllm_bundle(version: str, out: Path, *, python_version: str = "3.12", wheel_dir: Path | None = None,
                      xz_preset: int = 9 | lzma.PRESET_EXTREME, repo: Path = REPO) -> dict:
    fi = check_version(version)
    with fresh_dir(out, "--out") as dest:  # a failure (no network, over 64 MiB) leaves nothing there
        return _build(version, fi, dest, python_version, wheel_dir, xz_preset, repo)


def _build(version: str, fi: str, out: Path, python_version: str, wheel_dir, xz_preset: int, repo: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        picks = resolve(version, [wheel_dir], Path(tmp), python_version)
        site = Path(tmp) / "site"
        excluded = build_site(picks, site, python_version)
        tarball = f"vllm-site-{version}.tar.xz"
        sg.pack(site, out / tarball, xz_preset)
        (out / "install.sh").write_text(install_sh(site, picks, version, tarball, python_version))
        os.chmod(out / "install.sh", 0o755)
        carried = sum(p.stat().st_size for p in (site / "vllm").rglob("*") if p.is_file())
        wheels = [{k: v for k, v in p.items() if k != "wheel"} | {"wheel": p["wheel"].name, "sha256": _sha256(p["wheel"]),
                                                                "bytes": p["wheel"].stat().st_size} for p in picks]
        conflicts = image_conflicts(picks[0]["wheel"], python_version)
    manifest = {
        "vllm": version, "python": python_version, "flashinfer": fi,
        "format": "tar.xz of `pip install --target` of the chain's wheels + vLLM's carried files from its wheel",
        "import_chain": CHAIN_MEASURED, "wheels": wheels,
        "vllm_files": {"carried_bytes": carried, "data_read": list(DATA_READ), "excluded": excluded},
        "image_vs_requires": conflicts,
        "install_order": [(f"bash .bundle/fi-{fi}/install.sh TARGET (swa-repro bundle --flashinfer {fi} "
                           "--kernels prefill,decode,xqa)"), "bash <this>/install.sh TARGET (last)"],
        "files": {n: {"bytes": (out / n).stat().st_size, "sha256": _sha256(out / n)} for n in (tarball, "install.sh")},
    }
    this = sum(f["bytes"] for f in manifest["files"].values()) + len(json.dumps(manifest, indent=1)) + 2048
    manifest["budget"] = budget(out, this, fi, repo)
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if this > LIMIT_BYTES:
        raise UsageError(f"the vLLM bundle is {sg._mib(this)}, over the 64 MiB one call can carry")
    return manifest


def image_conflicts(whl: Path, python_version: str) -> list[dict]:
    """The release's Requires-Dist that the image's known versions (:data:`IMAGE_KNOWN`) do not meet:
    not carried, since the measured import path does not refuse them."""
    reqs = sg.requirements(whl, python_version)
    return [{"dist": d, "image": v, "requires": str(reqs[d].specifier),
             "carried": sg.norm(d) in {sg.norm(c) for c in CHAIN}}
            for d, v in IMAGE_KNOWN.items() if d in reqs and not reqs[d].specifier.contains(v, prereleases=True)]


def budget(out: Path, this: int, fi: str, repo: Path = REPO) -> dict:
    """``sglang_bundle.budget`` (the repo and every bundle beside), plus the call that carries only the
    flashinfer bundle ``fi-<pin>`` beside this one."""
    b = sg.budget(out, this, repo)
    name = f"fi-{fi}"
    if b.get("repo_bytes") is not None and name in b["beside_bytes"]:
        n = b["repo_bytes"] + b["beside_bytes"][name] + this
        b["with_flashinfer_only"] = {"carries": [name, out.name], "bytes": n, "headroom_bytes": LIMIT_BYTES - n,
                                     "fits_one_call": n <= LIMIT_BYTES}
    return b


def main(a) -> int:
    """``swa-repro bundle --vllm VERSION --out DIR`` (dispatched from bundle_cli.main)."""
    fi = check_version(a.vllm)
    out_dir(a.out, "--out")
    if Path(a.out).exists() and any(Path(a.out).iterdir()):
        raise UsageError(f"--out {a.out} exists and is not empty: give a new or empty folder")
    if a.wheel_dir and not Path(a.wheel_dir).is_dir():
        raise UsageError(f"--wheel-dir {a.wheel_dir}: no such folder (give the folder of pre-fetched wheels)")
    m = build_vllm_bundle(a.vllm, Path(a.out), python_version=a.python,
                          wheel_dir=Path(a.wheel_dir) if a.wheel_dir else None)
    b = m["budget"]
    print(f"vllm {a.vllm}: {sg._mib(m['vllm_files']['carried_bytes'])} of its files + {len(m['wheels']) - 1} "
          f"wheels -> {a.out}: {sg._mib(b['this_bundle_bytes'])}")
    w = b.get("with_flashinfer_only")
    if w:
        print(f"one call with {' + '.join(w['carries'])} and the repo: {sg._mib(w['bytes'])} of 64 MiB, "
              f"{'headroom ' + sg._mib(w['headroom_bytes']) if w['fits_one_call'] else 'OVER'}")
    else:
        print(f"beside it: swa-repro bundle --flashinfer {fi} --kernels prefill,decode,xqa --out .bundle/fi-{fi}")
    print(f"on the GPU machine: bash .bundle/fi-{fi}/install.sh /tmp/site && bash {a.out}/install.sh /tmp/site")
    return 0
