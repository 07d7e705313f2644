"""``swa-repro bundle --sglang [VERSION]``: sglang for an air-gapped GPU machine that has torch but no
sglang and no network, beside the flashinfer bundle, so that sglang's own FlashInferAttnBackend runs
there (``sglang-check --mode live``, scripts/gpu_sglang.sh).

What travels is measured, not sglang's full requirement list (~70 distributions, sglang-kernel alone
587 MiB): :data:`CHAIN`, the distributions the live path imports that the device image lacks or has at
a version sglang cannot use, each with the distribution that requires it and its first importer. For a
VERSION the versions are derived from its wheel's Requires-Dist (and each parent's): the measured
version where it satisfies the requirement, else the newest wheel that does. ``sgl_kernel`` is a stub
(:mod:`swa_repro.evidence.stubs`), recorded in MANIFEST.json and in sglang-check's JSON.

Contents of ``--out DIR``: ``sglang-site-VERSION.tar.xz`` (the tree ``pip install --target`` writes for
the target CPython from those wheels, unmodified, ``bin/`` and ``share/`` dropped, plus the stub),
``install.sh [TARGET]`` (run after the flashinfer bundle's, same TARGET) and ``MANIFEST.json``.
"""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.core.outputs import fresh_dir, out_dir
from swa_repro.core.versions import check_sglang_release
from swa_repro.evidence.bundle import LIMIT_BYTES, _sha256, _strip_pycache
from swa_repro.evidence.stubs import MEASURED_WHEELS, SGL_KERNEL_DIR, STUBS

REPO = Path(__file__).resolve().parents[2]
SGLANG_DEFAULT = "0.5.15.post1"  # also the oldest supported: the release the chain was measured on
# sglang >= 0.5.11 ships manylinux_2_34 cp312 wheels; pip matches each N exactly
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (34, 31, 28, 27, 26, 24, 17, 5)) + (
    "manylinux2014_x86_64", "manylinux1_x86_64")
TARGET_ENV = {"sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux",
              "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}

CHAIN_MEASURED = {
    "sglang": "0.5.15.post1", "flashinfer": "0.6.12", "date": "2026-12-03",
    "how": "on CPU, in a venv holding only the device image's distributions (KINDS.md) plus the flashinfer "
           "bundle's: import every module sglang-check's live path imports (swa_repro.sglang harness/check and "
           "flashinfer), add the distribution of each ModuleNotFoundError, repeat until none is left (19 "
           "rounds); again with torch.cuda faked available (sgl_kernel then needed: stubbed) and with the "
           "image's transformers 5.17.0 / tokenizers 0.23.2 (both refused at import: pinned here). Proof: "
           "sglang-check --mode model --peer passed in that venv; optional imports (flashinfer-cubin, "
           "cutlass-dsl, xgrammar, torchao, flash-attn-4, ...) are absent there and not carried",
}
# distribution -> (the distribution whose Requires-Dist brings it, measured version, why: first importer
# on the live path, file:line in the sglang 0.5.15.post1 tree). Parents come before their children.
CHAIN = {
    "apache-tvm-ffi": ("sglang", "0.1.11", "sglang/jit_kernel/utils.py:255 (the store_cache JIT); replaces the "
                                           "flashinfer bundle's apache-tvm-ffi (flashinfer allows >=0.1.6,<0.2)"),
    "transformers": ("sglang", "5.12.1", "the image's 5.17.0 fails at sglang/srt/configs/qwen3_asr.py:167 "
                                         "AutoConfig.register('qwen3_asr'): already used by a Transformers config"),
    "tokenizers": ("transformers", "0.22.2", "transformers checks its tokenizers requirement at import "
                                             "(transformers/utils/versions.py:43); the image has 0.23.2"),
    "orjson": ("sglang", "3.13.0", "sglang/srt/utils/common.py:81 <- sglang/__init__.py:29"),
    "pybase64": ("sglang", "1.5.1", "sglang/srt/utils/common.py:83"),
    "ipython": ("sglang", "9.18.1", "sglang/utils.py:26 <- sglang/lang/interpreter.py:35"),
    "traitlets": ("ipython", "5.16.1", "IPython/core/interactiveshell.py:34"),
    "pydantic": ("sglang", "2.14.4", "sglang/utils.py:27"),
    "pydantic-core": ("pydantic", "2.50.5", "pydantic/version.py:7"),
    "typing-inspection": ("pydantic", "0.4.5", "pydantic/errors.py:8"),
    "annotated-types": ("pydantic", "0.8.0", "pydantic/fields.py:17"),
    "pyzmq": ("sglang", "27.3.0", "sglang/srt/utils/network.py:12 <- sglang/srt/distributed/parallel_state.py:66"),
    "openai": ("sglang", "2.6.1", "sglang/srt/entrypoints/openai/protocol.py:36 <- sglang/srt/server_args.py:49"),
    "sniffio": ("openai", "1.3.1", "openai/_utils/_utils.py:23"),
    "distro": ("openai", "1.9.0", "openai/_base_client.py:36"),
    "fastapi": ("sglang", "0.165.0", "sglang/srt/distributed/gated_launch.py:9 <- srt/distributed/bootstrap.py:13 "
                                    "(0.5.23; measured there, the same way, on 2026-12-04)"),
    "opentelemetry-api": ("fastapi", "1.45.2", "fastapi/telemetry/_api.py:9 (fastapi 0.165)"),
    "uvicorn": ("sglang", "0.55.0", "sglang/srt/distributed/gated_launch.py:8 (0.5.23)"),
    "starlette": ("sglang", "1.10.0", "sglang/srt/utils/common.py:90 (a dependency of sglang's fastapi)"),
    "dill": ("sglang", "0.4.1", "sglang/srt/sampling/custom_logit_processor.py:7 <- srt/configs/deepseek_ocr.py:19"),
    "partial-json-parser": ("sglang", "0.2.1.1.post7", "sglang/srt/function_call/base_format_detector.py:7"),
    "msgspec": ("sglang", "0.23.0", "sglang/srt/lora/lora_registry.py:21 <- sglang/srt/server_args.py:51"),
    "compressed-tensors": ("sglang", "0.20.1", "srt/layers/quantization/compressed_tensors/compressed_tensors.py:21 "
                                               "<- sglang/srt/configs/model_config.py:28"),
    "loguru": ("compressed-tensors", "0.7.3", "compressed_tensors/logger.py:13"),
    "gguf": ("sglang", "0.19.0", "srt/layers/quantization/gguf.py:10 <- srt/layers/quantization/__init__.py:31"),
    "datasets": ("sglang", "5.2.0", "sglang/benchmark/datasets/mmmu.py:8 <- benchmark/datasets/__init__.py:11 <- "
                                    "benchmark/serving.py:44 <- sglang/test/test_utils.py:38 (CustomTestCase: the "
                                    "registered regression test's import, 0.5.23; the H100 run of 2026-12-05 stopped "
                                    "there; measured with swa_repro.sglang.device_image)"),
    "multiprocess": ("datasets", "0.70.19", "datasets/arrow_dataset.py:56 (datasets 5.2.0)"),
}
# carried although sglang's Requires-Dist does not name it: (parent named instead, why)
INDIRECT = {"starlette": ("fastapi", "sglang imports starlette directly (srt/utils/common.py:90) but requires it "
                                     "only through fastapi (carried since 0.5.23's path imports it)"),
            "dill": ("datasets", "sglang imports dill directly (srt/sampling/custom_logit_processor.py:7) but requires "
                                 "it only through datasets")}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ----------------------------------------------------------------------------- wheels and their requirements
def _wheel_name_version(w: Path) -> tuple[str, str]:
    name, ver = w.name.split("-")[:2]
    return norm(name), ver


def _find(folders, dist: str, spec) -> Path | None:
    """The newest wheel of ``dist`` in ``folders`` whose version ``spec`` (a SpecifierSet) contains."""
    from packaging.version import Version

    hits = [w for f in folders if f for w in Path(f).glob("*.whl")
            if _wheel_name_version(w)[0] == norm(dist) and spec.contains(_wheel_name_version(w)[1], prereleases=True)]
    return max(hits, key=lambda w: Version(_wheel_name_version(w)[1]), default=None)


def pip_target_args(python_version: str) -> list[str]:
    out = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for p in PLATFORMS:
        out += ["--platform", p]
    return out


def fetch(dist: str, spec, folders, dl: Path, python_version: str) -> Path:
    """A wheel for ``dist`` satisfying ``spec``: from ``folders`` if one is there, else pip-downloaded."""
    whl = _find(folders, dist, spec)
    if whl is None:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                            *pip_target_args(python_version), "-d", str(dl), f"{dist}{spec}"],
                           capture_output=True, text=True)
        whl = _find([dl], dist, spec)
        if r.returncode != 0 or whl is None:
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-2:])
            raise UsageError(f"no cp{python_version.replace('.', '')} wheel of {dist}{spec} (network? or give "
                             f"--wheel-dir with pre-fetched wheels): {tail}")
    return whl


def requirements(whl: Path, python_version: str) -> dict:
    """Requires-Dist of a wheel for the target (linux x86_64 CPython), no extras: ``{norm name: Requirement}``."""
    import zipfile

    from packaging.requirements import Requirement

    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    env = {**TARGET_ENV, "python_version": python_version, "python_full_version": python_version + ".0", "extra": ""}
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines() if line.startswith("Requires-Dist:")]
    return {norm(r.name): r for r in reqs if r.marker is None or r.marker.evaluate(env)}


def check_version(version: str) -> None:
    """Before any folder or pip: a version that is no sglang release (``0.5.15.post2``, between two
    known ones) is one line naming the nearest (``core.versions.check_sglang_release``, the audit's
    rule), where pip used to be asked first and its resolver error printed."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        raise UsageError(f"--sglang {version}: not a version (e.g. {SGLANG_DEFAULT})") from None
    if v < Version(SGLANG_DEFAULT):
        raise UsageError(f"sglang {version} is not supported: the import chain was measured on {SGLANG_DEFAULT} "
                         f"and older releases ship other wheels and dependencies; use {SGLANG_DEFAULT} or newer")
    check_sglang_release(version)


def resolve(version: str, folders, dl: Path, python_version: str = "3.12") -> tuple[list[dict], dict]:
    """The wheels to carry for sglang ``version`` and what the stub replaces / which flashinfer it pins."""
    from packaging.specifiers import SpecifierSet

    check_version(version)
    sg = fetch("sglang", SpecifierSet(f"=={version}"), folders, dl, python_version)
    reqs = {"sglang": requirements(sg, python_version)}
    picks = [{"dist": "sglang", "version": version, "wheel": sg, "required_by": None, "requirement": f"sglang=={version}",
              "why": "the package under test (its wheel, unmodified)"}]
    for dist, (parent, measured, why) in CHAIN.items():
        via = INDIRECT.get(dist, (dist,))[0]
        r = reqs[parent].get(norm(via))
        if r is None:
            raise UsageError(f"sglang {version} is not supported: {parent} no longer requires {via}, so the import "
                             f"chain measured on {SGLANG_DEFAULT} does not apply; re-measure it (sglang_bundle.CHAIN_MEASURED says how)")
        spec = r.specifier if via == dist else SpecifierSet()
        pin = SpecifierSet(f"=={measured}") if spec.contains(measured, prereleases=True) else spec
        whl = fetch(dist, pin, folders, dl, python_version)
        reqs[norm(dist)] = requirements(whl, python_version)
        picks.append({"dist": dist, "version": _wheel_name_version(whl)[1], "wheel": whl, "required_by": parent,
                      "requirement": str(r) if via == dist else f"{dist} (through {parent}'s {r})",
                      "why": why if via == dist else f"{why}; {INDIRECT[dist][1]}"})
    kern = reqs["sglang"].get("sglang-kernel") or reqs["sglang"].get("sgl-kernel")
    if kern is None:
        raise UsageError(f"sglang {version} is not supported: it requires no sglang-kernel, so the sgl_kernel stub "
                         f"measured on {SGLANG_DEFAULT} does not apply")
    kname = f"{norm(kern.name)}{kern.specifier}"
    fi = reqs["sglang"].get("flashinfer-python")
    return picks, {"replaces": f"{kname} ({MEASURED_WHEELS.get(kname, 'size not measured')})",
                   "flashinfer": str(fi.specifier).lstrip("=") if fi else None}


# ----------------------------------------------------------------------------- the site tree, packed
def build_site(picks, site: Path, python_version: str, replaces: str, version: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--disable-pip-version-check", *pip_target_args(python_version), "--target", str(site),
                        *(str(p["wheel"]) for p in picks)], capture_output=True, text=True)
    if r.returncode != 0:
        raise UsageError("pip install --target of the sglang wheels failed: "
                         + " | ".join((r.stderr or r.stdout).strip().splitlines()[-2:]))
    for data in ("bin", "share"):  # console scripts and ipython's man page: never imported
        shutil.rmtree(site / data, ignore_errors=True)
    stub = site / "sgl_kernel"
    if stub.exists():
        raise UsageError(f"{stub} exists: a carried wheel brings sgl_kernel, so the stub would shadow it")
    stub.mkdir()
    shutil.copy2(SGL_KERNEL_DIR / "__init__.py", stub / "__init__.py")
    (stub / "_stub.json").write_text(json.dumps({"replaces": replaces, "version": "0+swa-repro-stub",
                                                 "sglang": version}) + "\n")


def pack(site: Path, tarball: Path, preset: int) -> None:
    with tarfile.open(tarball, "w:xz", preset=preset) as tar:  # tarfile.add recurses in sorted order
        for top in sorted(p.name for p in site.iterdir()):
            tar.add(site / top, arcname=top, filter=_deterministic)


def _deterministic(ti: tarfile.TarInfo):
    ti = _strip_pycache(ti)
    if ti is not None:
        ti.mtime = 0
    return ti


INSTALL_SH = r"""#!/usr/bin/env bash
# Offline install of the sglang @VERSION@ bundle (made by `swa-repro bundle --sglang`) into TARGET
# (default /tmp/site). Run it LAST, after the flashinfer bundle's install.sh (and the notebooks
# bundle's) into the same TARGET: it first removes every copy of what it brings, whatever the version
# (the flashinfer bundle's apache-tvm-ffi included), so one version of each is left. sgl_kernel is a
# stub (MANIFEST.json "stubs"). Writes nothing outside TARGET; needs no pip and no xz.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TARGET="${1:-/tmp/site}"
PY="${PYTHON:-python3}"
"$PY" -c 'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(None if v == "@PY@" else "this bundle is for CPython @PY@, not " + v)'
mkdir -p "$TARGET"
TARGET="$(cd "$TARGET" && pwd)"
for top in @TOP@; do rm -rf "${TARGET:?}/$top"; done
for d in @DISTS@; do rm -rf "$TARGET/$d"-*.dist-info; done
"$PY" - "$HERE/@TARBALL@" "$TARGET" @PINS@ <<'EOF'
import importlib.metadata as md, json, sys, tarfile
tarball, target, pins = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with tarfile.open(tarball) as t:
    t.extractall(target, filter="data")
have = {}
for d in md.distributions(path=[target]):
    have.setdefault(d.metadata["Name"].lower().replace("_", "-").replace(".", "-"), []).append(d.version)
bad = {n: have.get(n) for n, v in pins.items() if have.get(n) != [v]}
if bad:
    sys.exit(f"error: in {target} these are not exactly one copy at the bundled version: {bad}")
sys.path.insert(0, target)
import sgl_kernel
if not getattr(sgl_kernel, "__swa_repro_stub__", False) or not sgl_kernel.__file__.startswith(target):
    sys.exit(f"error: sgl_kernel comes from {sgl_kernel.__file__}, not the bundle's stub in {target}")
print(f"installed sglang {pins['sglang']} ({len(pins)} distributions) into {target}; "
      f"stub: {sgl_kernel.provenance()['replaces']}")
EOF
echo "export PYTHONPATH=$TARGET\${PYTHONPATH:+:\$PYTHONPATH}"
"""


def install_sh(site: Path, picks, version: str, tarball: str, python_version: str) -> str:
    tops = sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info"))
    dists = sorted({p.name.removesuffix(".dist-info").rsplit("-", 1)[0] for p in site.glob("*.dist-info")})
    pins = json.dumps({norm(p["dist"]): p["version"] for p in picks}, separators=(",", ":"))
    for word in tops + dists:
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", word):
            raise UsageError(f"unexpected top-level name {word!r} in the sglang site tree")
    return (INSTALL_SH.replace("@VERSION@", version).replace("@PY@", python_version).replace("@TARBALL@", tarball)
            .replace("@TOP@", " ".join(tops)).replace("@DISTS@", " ".join(dists)).replace("@PINS@", f"'{pins}'"))


# ----------------------------------------------------------------------------- budget
def _tree_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file())


def _repo_bytes(repo: Path, skip) -> int | None:
    """What a device call sends: tracked and untracked-not-ignored files (bundles under ``skip`` apart)."""
    r = subprocess.run(["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True)
    if r.returncode != 0:
        return None
    skip = [Path(s).resolve() for s in skip]
    files = [(repo / f.decode()).resolve() for f in r.stdout.split(b"\0") if f]
    return sum(f.stat().st_size for f in files if f.is_file() and not any(f.is_relative_to(s) for s in skip))


def budget(out: Path, this_bytes: int, repo: Path = REPO) -> dict:
    """One device call carries the repo, the other bundles beside ``out`` (siblings with an install.sh)
    and this one, in 64 MiB."""
    beside = sorted(d for d in out.resolve().parent.iterdir() if d.is_dir() and d != out.resolve()
                    and (d / "install.sh").is_file())
    b = {"limit_bytes": LIMIT_BYTES, "repo_bytes": _repo_bytes(repo, [out, *beside]),
         "beside_bytes": {d.name: _tree_bytes(d) for d in beside}, "this_bundle_bytes": this_bytes}
    if b["repo_bytes"] is not None:
        b["one_call_bytes"] = b["repo_bytes"] + sum(b["beside_bytes"].values()) + this_bytes
        b["headroom_bytes"] = LIMIT_BYTES - b["one_call_bytes"]
        b["fits_one_call"] = b["headroom_bytes"] >= 0
    return b


# ----------------------------------------------------------------------------- build + CLI
def build_sglang_bundle(version: str, out: Path, *, python_version: str = "3.12", wheel_dir: Path | None = None,
                        xz_preset: int = 9 | lzma.PRESET_EXTREME, repo: Path = REPO) -> dict:
    check_version(version)
    with fresh_dir(out, "--out") as out:  # a failure (no such release, no network, over 64 MiB) leaves nothing
        return _build(version, out, python_version, wheel_dir, xz_preset, repo)


def _build(version: str, out: Path, python_version: str, wheel_dir, xz_preset: int, repo: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        picks, stub = resolve(version, [wheel_dir], Path(tmp), python_version)
        site = Path(tmp) / "site"
        build_site(picks, site, python_version, stub["replaces"], version)
        tarball = f"sglang-site-{version}.tar.xz"
        pack(site, out / tarball, xz_preset)
        (out / "install.sh").write_text(install_sh(site, picks, version, tarball, python_version))
        os.chmod(out / "install.sh", 0o755)
        wheels = [{k: v for k, v in p.items() if k != "wheel"} | {"wheel": p["wheel"].name, "sha256": _sha256(p["wheel"]),
                                                                "bytes": p["wheel"].stat().st_size} for p in picks]
    fi = stub["flashinfer"]
    manifest = {
        "sglang": version, "python": python_version, "format": "tar.xz of `pip install --target` of the wheels",
        "import_chain": CHAIN_MEASURED | {"derived_for": version},
        "wheels": wheels, "wheel_bytes": sum(w["bytes"] for w in wheels),
        "stubs": [{"module": m, "replaces": stub["replaces"], **info} for m, info in STUBS.items()],
        "flashinfer": fi,
        "install_order": [f"bash .bundle/fi-{fi}/install.sh TARGET (swa-repro bundle --flashinfer {fi})",
                          "bash .bundle/notebooks/install.sh TARGET (optional: papermill for `swa-repro run`)",
                          "bash <this>/install.sh TARGET (last: replaces the flashinfer bundle's apache-tvm-ffi)"],
        "files": {n: {"bytes": (out / n).stat().st_size, "sha256": _sha256(out / n)} for n in (tarball, "install.sh")},
    }
    if version != CHAIN_MEASURED["sglang"]:
        manifest["import_chain"]["caveat"] = (f"measured on {CHAIN_MEASURED['sglang']}, versions derived for "
                                              f"{version} from Requires-Dist; the first GPU run is the test")
    # this bundle's bytes, MANIFEST.json included: an upper bound (its budget block is < 2 KiB)
    this = sum(f["bytes"] for f in manifest["files"].values()) + len(json.dumps(manifest, indent=1)) + 2048
    manifest["budget"] = budget(out, this, repo)
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if this > LIMIT_BYTES:
        raise UsageError(f"the sglang bundle is {_mib(this)}, over the 64 MiB one call can carry")
    return manifest


def _mib(n) -> str:
    return "?" if n is None else f"{n / 2**20:.2f} MiB"


def main(a) -> int:
    """``swa-repro bundle --sglang [VERSION] --out DIR`` (dispatched from bundle_cli.main)."""
    check_version(a.sglang)  # first: no folder made, no pip asked, for a version that is no release
    out_dir(a.out, "--out")
    if Path(a.out).exists() and any(Path(a.out).iterdir()):
        raise UsageError(f"--out {a.out} exists and is not empty: give a new or empty folder")
    if a.wheel_dir and not Path(a.wheel_dir).is_dir():
        raise UsageError(f"--wheel-dir {a.wheel_dir}: no such folder (give the folder of pre-fetched wheels)")
    m = build_sglang_bundle(a.sglang, Path(a.out), python_version=a.python,
                            wheel_dir=Path(a.wheel_dir) if a.wheel_dir else None)
    b = m["budget"]
    print(f"sglang {a.sglang}: {len(m['wheels'])} wheels ({_mib(m['wheel_bytes'])}) + stub sgl_kernel for "
          f"{m['stubs'][0]['replaces']} -> {a.out}: {_mib(b['this_bundle_bytes'])}")
    parts = " + ".join([f"repo {_mib(b['repo_bytes'])}", *(f"{k} {_mib(v)}" for k, v in b["beside_bytes"].items()),
                        f"this {_mib(b['this_bundle_bytes'])}"])
    if "one_call_bytes" not in b:
        print(f"one call: {parts} (repo size unknown: not a git checkout) of 64 MiB")
    elif b["fits_one_call"]:
        print(f"one call: {parts} = {_mib(b['one_call_bytes'])} of 64 MiB, headroom {_mib(b['headroom_bytes'])}")
    else:
        print(f"one call: {parts} = {_mib(b['one_call_bytes'])}: OVER 64 MiB by {_mib(-b['headroom_bytes'])}; "
              "carry the bundles over consecutive calls while the machine is warm (README)")
    if m["flashinfer"] and m["flashinfer"] not in b["beside_bytes"] and f"fi-{m['flashinfer']}" not in b["beside_bytes"]:
        print(f"beside it: swa-repro bundle --flashinfer {m['flashinfer']} --out .bundle/fi-{m['flashinfer']}")
    print(f"on the GPU machine: bash scripts/gpu_sglang.sh (or install.sh of the flashinfer bundle, then {a.out}/install.sh)")
    return 0
