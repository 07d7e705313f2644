"""``swa-repro bundle``: an offline FlashInfer for an air-gapped GPU machine that has only torch.

Contents of ``--out DIR`` (it must travel in 64 MiB):
- ``flashinfer-<version>.tar.xz``: the ``flashinfer`` package and its dist-info, with every
  ``flashinfer/data/csrc`` sub-folder removed that the batch-prefill JIT sources do not include
  (found by following ``#include`` from ``csrc/batch_prefill*`` through ``csrc/`` and
  ``include/``; jit/attention/modules.py only reads top-level csrc files for fa2/fa3 prefill:
  0.6.12 modules.py gen_customize_batch_prefill_module, 0.7.2.post1 modules.py:2078-2225).
  ``--kernels prefill,decode,xqa`` keeps the sources of more kernels the same way (:data:`KERNEL_GLOBS`;
  default ``prefill``); MANIFEST.json records which.
- ``wheels/``: apache-tvm-ffi (as the wheel's METADATA pins it, built for the target CPython)
  and the pure-Python modules ``import flashinfer`` needs that a torch install lacks
  (:data:`IMPORT_DEPS`: flashinfer/jit/cpp_ext.py imports packaging, flashinfer/artifacts.py
  imports requests; tqdm and pynvml come in at import as well).
- ``install.sh [TARGET]``: unpacks everything into TARGET (default /tmp/site), offline, and
  prints the ``export PYTHONPATH=...`` line. Nothing is installed into an existing environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.core.outputs import fresh_dir

LIMIT_BYTES = 64 * 2**20
# Measured: on a python that has only torch 2.11 + its own requirements (jinja2, filelock,
# cuda-bindings, ...), `import flashinfer` of 0.6.12 and 0.7.2.post1 needs exactly these extra.
IMPORT_DEPS = ("packaging", "requests", "urllib3", "idna", "certifi", "charset-normalizer", "tqdm", "nvidia-ml-py")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
PREFILL_GLOBS = ("batch_prefill*", "tvm_ffi_utils.h")
# The csrc files each kernel's JIT module compiles or renders (``--kernels``), read from flashinfer
# 0.7.2.post1's jit sources; their includes are followed as for prefill, and a sub-folder holding one
# of them (csrc/xqa) is kept. The first glob must match, else the layout is unknown (prune refuses).
KERNEL_GLOBS = {
    # jit/attention/modules.py:2078-2140 (gen_customize_batch_prefill_module: batch_prefill_*.jinja,
    # batch_prefill.cu / batch_prefill_paged.cu and their *_jit_binding.cu) and :2185-2226 (fa3, *_sm90*)
    "prefill": PREFILL_GLOBS,
    # jit/attention/modules.py:1963-1990 (gen_customize_batch_decode_module, reached from
    # gen_batch_decode_module :949): batch_decode_customize_config.jinja, batch_decode_kernel_inst.jinja,
    # batch_decode.cu, batch_decode_jit_binding.cu
    "decode": ("batch_decode*", "tvm_ffi_utils.h"),
    # jit/xqa.py:147-156 (gen_xqa_module :53): xqa/mha.cu, xqa/xqa_wrapper.cu, flashinfer_xqa_binding.cu,
    # and for sm90 xqa/mha_sm90.cu + xqa/tensorMap.cpp; all of csrc/xqa (headers included by those)
    "xqa": ("xqa/*", "flashinfer_xqa_binding.cu", "tvm_ffi_utils.h"),
}
# A release number as PEP 440 normalizes it (0.6.12, 0.7.2.post1, 0.8.0rc1): it names the wheel, the
# tarball and pip's requirement, so anything else (``0.6.12;x``, ``>=0.6``, a path) stops here.
VERSION_RE = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")


def check_version(version: str, flag: str = "--flashinfer") -> None:
    """Before any folder is made or pip is run: a version that is not one is one line."""
    if not VERSION_RE.fullmatch(version or ""):
        raise UsageError(f"{flag} {version!r} is not a release number (e.g. 0.6.12 or 0.7.2.post1; "
                         "see `pip index versions flashinfer-python`)")


# ----------------------------------------------------------------------------- csrc pruning
def needed_csrc_subdirs(data_dir: Path, globs=PREFILL_GLOBS) -> set[str]:
    """Sub-folders of ``data/csrc`` reached by ``#include`` from the prefill JIT sources.

    Includes resolve against the including file's folder, ``data/csrc`` and ``data/include`` (the
    JIT's -I paths, jit/cpp_ext.py); conditional compilation is ignored, so the set is a superset.
    """
    csrc, inc = data_dir / "csrc", data_dir / "include"
    todo = [p for g in globs for p in csrc.glob(g) if p.is_file()]
    seen: set[Path] = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for name in INCLUDE_RE.findall(text):
            for base in (f.parent, csrc, inc):
                cand = (base / name).resolve()
                if cand.is_file():
                    todo.append(cand)
                    break
    root = csrc.resolve()
    subdirs = set()
    for f in seen:
        try:
            rel = f.relative_to(root)
        except ValueError:
            continue
        if len(rel.parts) > 1:
            subdirs.add(rel.parts[0])
    return subdirs


def check_kernels(kernels) -> tuple[str, ...]:
    """``"prefill,decode"`` or a sequence -> the kernel names, each a key of :data:`KERNEL_GLOBS`."""
    names = tuple(k.strip() for k in (kernels.split(",") if isinstance(kernels, str) else kernels))
    bad = [k for k in names if k not in KERNEL_GLOBS]
    if bad or not names:
        raise UsageError(f"--kernels {','.join(names)!r}: give a comma-separated subset of {', '.join(KERNEL_GLOBS)}")
    return tuple(dict.fromkeys(names))


def prune_csrc(pkg_dir: Path, kernels=("prefill",)) -> tuple[list[str], list[str]]:
    """Remove ``flashinfer/data/csrc`` sub-folders that no source of ``kernels`` reaches, in place;
    returns (removed, kept)."""
    data = pkg_dir / "data"
    csrc = data / "csrc"
    kernels = check_kernels(kernels)
    if not csrc.is_dir():
        raise UsageError(f"{pkg_dir} has no data/csrc: not a flashinfer package with JIT sources")
    for k in kernels:
        if not [p for p in csrc.glob(KERNEL_GLOBS[k][0]) if p.is_file()]:
            raise UsageError(f"{csrc} has no {KERNEL_GLOBS[k][0]} sources ({k}): refusing to prune an unknown layout")
    keep = needed_csrc_subdirs(data, tuple(g for k in kernels for g in KERNEL_GLOBS[k]))
    removed = []
    for d in sorted(p for p in csrc.iterdir() if p.is_dir()):
        if d.name not in keep:
            shutil.rmtree(d)
            removed.append(d.name)
    return removed, sorted(keep)


# ----------------------------------------------------------------------------- downloads
def _pip_download(specs, dest: Path, *, python_version: str | None = None, binary_platform=False) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(dest)]
    if python_version:
        cmd += ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
        if binary_platform:
            for p in PLATFORMS:
                cmd += ["--platform", p]
    cmd += list(specs)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise UsageError(f"pip download {' '.join(specs)} failed (network? use --wheel-dir with pre-fetched wheels): "
                     + " | ".join(tail))


def _find_wheel(folder: Path, dist: str, version: str | None = None) -> Path | None:
    norm = dist.replace("-", "_").lower()
    for w in sorted(folder.glob("*.whl")):
        name, ver = w.name.split("-")[:2]
        if name.lower() == norm and (version is None or ver == version):
            return w
    return None


def wheel_requires(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


def tvm_ffi_spec(whl: Path) -> str:
    for r in wheel_requires(whl):
        if re.match(r"apache[-_]tvm[-_]ffi\b", r, re.I):
            return r.split(";")[0].replace(" ", "")
    raise UsageError(f"{whl.name} does not require apache-tvm-ffi: unknown flashinfer packaging")


# ----------------------------------------------------------------------------- repack
def repack(whl: Path, out: Path, xz_preset: int = 6, kernels=("prefill",)) -> dict:
    """Wheel -> pruned ``tar.xz`` of the flashinfer package and its dist-info."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        with zipfile.ZipFile(whl) as z:
            members = [n for n in z.namelist() if n.startswith("flashinfer/") or ".dist-info/" in n.split("/")[0] + "/"]
            z.extractall(t, members)
        removed, kept = prune_csrc(t / "flashinfer", kernels)
        with tarfile.open(out, "w:xz", preset=xz_preset) as tar:
            for top in sorted(p.name for p in t.iterdir()):
                tar.add(t / top, arcname=top, filter=_strip_pycache)
    return {"kernels": list(check_kernels(kernels)), "removed_csrc_subdirs": removed, "kept_csrc_subdirs": kept}


def _strip_pycache(ti: tarfile.TarInfo):
    if "__pycache__" in ti.name.split("/"):
        return None
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


INSTALL_SH = r"""#!/usr/bin/env bash
# Offline install of this bundle (made by `swa-repro bundle`): unpacks into TARGET only.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TARGET="${1:-/tmp/site}"
PY="${PYTHON:-python}"
mkdir -p "$TARGET"
if "$PY" -m pip --version >/dev/null 2>&1; then
  "$PY" -m pip install --quiet --no-index --no-deps --disable-pip-version-check --target "$TARGET" "$HERE"/wheels/*.whl
else
  for w in "$HERE"/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$TARGET"; done
fi
for t in "$HERE"/flashinfer-*.tar.xz; do [ -e "$t" ] && tar -xJf "$t" -C "$TARGET"; done
echo "export PYTHONPATH=$TARGET\${PYTHONPATH:+:\$PYTHONPATH}"
"""


def build_bundle(version: str, out: Path, *, python_version: str = "3.12", wheel_dir: Path | None = None,
                 xz_preset: int = 6, kernels=("prefill",)) -> dict:
    """The bundle in ``out`` (new or empty), keeping the JIT sources of ``kernels`` (:data:`KERNEL_GLOBS`);
    a failure (no such version, no network, over 64 MiB) leaves nothing there (``core.outputs.fresh_dir``)."""
    check_version(version)
    kernels = check_kernels(kernels)
    with fresh_dir(out, "--out") as out, tempfile.TemporaryDirectory() as tmp:
        (out / "wheels").mkdir()
        dl = Path(tmp)
        whl = _find_wheel(Path(wheel_dir), "flashinfer-python", version) if wheel_dir else None
        if whl is None:
            _pip_download([f"flashinfer-python=={version}"], dl)
            whl = _find_wheel(dl, "flashinfer-python", version)
        if whl is None:
            raise UsageError(f"no flashinfer_python-{version} wheel found")
        info = repack(whl, out / f"flashinfer-{version}.tar.xz", xz_preset, kernels)
        _pip_download([tvm_ffi_spec(whl)], out / "wheels", python_version=python_version, binary_platform=True)
        _pip_download(list(IMPORT_DEPS), out / "wheels", python_version=python_version, binary_platform=True)
        (out / "install.sh").write_text(INSTALL_SH)
        os.chmod(out / "install.sh", 0o755)
        files = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
        manifest = {"flashinfer": version, "python": python_version, "source_wheel": whl.name, **info,
                    "files": files, "sha256": {k: _sha256(out / k) for k in files},
                    "total_bytes": sum(files.values())}
        (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
        manifest["total_bytes"] += (out / "MANIFEST.json").stat().st_size
        if manifest["total_bytes"] > LIMIT_BYTES:
            raise UsageError(f"bundle is {manifest['total_bytes'] / 2**20:.1f} MiB, over the 64 MiB that can travel")
    return manifest


# What executing the notebooks needs beyond a bare torch image (papermill, jupytext, nbconvert and a
# kernel), at the pins of pyproject.toml's `notebooks` extra; matplotlib is on the GPU image.
NOTEBOOK_DISTS = ("papermill", "jupytext", "nbconvert", "ipykernel")


def notebook_pins(pyproject: Path | None = None) -> list[str]:
    """``name==version`` for :data:`NOTEBOOK_DISTS`, read from pyproject.toml's notebooks extra."""
    import tomllib

    pyproject = pyproject or Path(__file__).resolve().parents[2] / "pyproject.toml"
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["notebooks"]
    pins = [p for p in extra if p.split("==")[0].lower() in NOTEBOOK_DISTS]
    if len(pins) != len(NOTEBOOK_DISTS):
        raise UsageError(f"pyproject.toml's notebooks extra must pin {', '.join(NOTEBOOK_DISTS)}; found {pins}")
    return pins


def build_notebook_bundle(out: Path, *, python_version: str = "3.12") -> dict:
    """Wheels (dependencies resolved for the target CPython) to execute the notebooks with papermill
    on an air-gapped GPU machine that has torch but no Jupyter stack."""
    with fresh_dir(out, "--out") as out:
        (out / "wheels").mkdir()
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-d", str(out / "wheels"),
               "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
        for p in (*PLATFORMS, "manylinux_2_26_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64"):
            cmd += ["--platform", p]
        r = subprocess.run(cmd + notebook_pins(), capture_output=True, text=True)
        if r.returncode != 0:
            raise UsageError("pip download of the notebook stack failed: "
                             + " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:]))
        (out / "install.sh").write_text(INSTALL_SH)
        os.chmod(out / "install.sh", 0o755)
        files = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
        manifest = {"notebooks": notebook_pins(), "python": python_version, "files": files,
                    "total_bytes": sum(files.values())}
        (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
