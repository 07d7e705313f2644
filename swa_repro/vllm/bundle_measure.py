"""How :data:`~swa_repro.evidence.vllm_bundle.CHAIN` was measured, runnable again for another release:
:func:`measure` runs :data:`PROBE` (the live child's imports, with the real flashinfer) in a child that
sees only the device image, the flashinfer bundle and what was added so far, and adds the distribution of
each ModuleNotFoundError until none is left. Nothing here is imported by the bundle command. vLLM's, not
the evidence layer's: its probe runs the project's vLLM modules (``vllm.audit.drive``, ``vllm.audit.live``,
...)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.evidence import sglang_bundle as sg
from swa_repro.evidence.bundle import IMPORT_DEPS
from swa_repro.evidence.site_view import site_view
from swa_repro.evidence.vllm_bundle import IMAGE_KNOWN, REPO, unpack_vllm, vllm_wheel

# What the live child (swa_repro/vllm/audit/live.py run) imports, with the real flashinfer: drive.setup with
# live_kernels.install_real (the audit's CUDA platform, then the release's FlashInfer backend), the
# vLLM modules drive.setup and vllm.audit.paths use, and families.resolve for gemma2 and cohere2. A string,
# run in a child (where only the device image's distributions are importable).
PROBE = r"""
import json, sys, traceback
from pathlib import Path
tree = sys.argv[1]
opened = set()
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(tree + "/vllm/") \
            and not args[0].endswith((".py", ".pyc")):
        opened.add(args[0][len(tree) + 1:])
sys.addaudithook(hook)
out = {"ok": True}
try:
    import torch
    if sys.argv[2] == "cuda":  # as on the GPU machine, for what asks at import: one H100
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 1
        torch.cuda.get_device_capability = lambda device=None: (9, 0)
        torch.cuda.get_device_name = lambda device=None: "NVIDIA H100 80GB HBM3"
    from swa_repro.vllm import families
    from swa_repro.vllm.audit import drive, live, live_kernels, paths
    from swa_repro.vllm.audit import env as standins
    drive.setup(standins.Recorder(), live_kernels.install_real, "cuda")
    import vllm.config.vllm, vllm.model_executor.layers.attention_layer_base, vllm.v1.kv_cache_interface
    import vllm.utils.torch_utils, vllm.v1.attention.backend, vllm.v1.attention.backends.utils
    from vllm.config import CUDAGraphMode
    for name in ("gemma2", "cohere2"):
        families.resolve(name, Path(tree))
except BaseException as e:
    frames = [f"{f.filename}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)]
    out = {"missing": e.name} if isinstance(e, ModuleNotFoundError) else {"error": (f"{type(e).__name__}: {e}".splitlines() or [""])[0]}
    out["importers"] = frames
out["data_read"] = sorted(opened)
out["vllm_modules"] = sum(k.split(".")[0] == "vllm" for k in sys.modules)
out["flashinfer"] = getattr(sys.modules.get("flashinfer"), "__version__", None)
out["tops"] = sorted({k.split(".")[0] for k in sys.modules})
print(json.dumps(out))
"""
# module -> distribution, before this venv's owner (openai_harmony: vLLM requires oss-harmony, whose
# oss_harmony-0.0.11 wheel holds it; this venv's is openai-harmony's)
ALIASES = {"cpuinfo": "py-cpuinfo", "zmq": "pyzmq", "yaml": "pyyaml", "PIL": "pillow", "openai_harmony": "oss-harmony"}


def _install(whl: Path, target: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                        "--target", str(target), str(whl)], check=False, capture_output=True, text=True)
    if r.returncode != 0:
        raise UsageError(f"pip install {whl.name} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")


def measure(version: str, fi_bundle: Path, image, *, wheel_dir: Path | None = None, variants=("cpu", "cuda"),
            rounds: int = 60, log=print) -> dict:
    """Run :data:`PROBE` in a child whose path is the stdlib, the installs so far, vLLM's carried files,
    the flashinfer bundle's flashinfer, this repo and :func:`site_view.site_view` of ``image`` plus the flashinfer
    bundle's dependencies; add the distribution of each ModuleNotFoundError (:func:`_pick` says at which
    version) and repeat until none is left; then again with torch.cuda faked available (``"cuda"``: an
    import that asks for a GPU takes the GPU machine's branch). ``image``:
    ``swa_repro.sglang.device_image.IMAGE``. Returns what ``vllm_bundle.CHAIN`` and ``CHAIN_MEASURED`` hold."""
    import datetime

    with tempfile.TemporaryDirectory(prefix="swa-vllm-measure-") as tmp:
        t = Path(tmp)
        whl = vllm_wheel(version, wheel_dir)
        unpack_vllm(whl, t / "tree")
        with tarfile.open(next(Path(fi_bundle).glob("flashinfer-*.tar.xz"))) as tar:
            tar.extractall(t / "fi", filter="data")
        st = {"t": t, "reqs": {"vllm": sg.requirements(whl, "3.12")}, "chain": {}, "image_too": {}, "log": log,
              "image": {sg.norm(d) for d in image},
              "present": {sg.norm(d) for d in (*image, "apache-tvm-ffi", *IMPORT_DEPS, "swa-repro")}}
        overrides = _image_versions(st)
        view = site_view(t / "view", st["present"])
        st["env"] = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {
            "PYTHONDONTWRITEBYTECODE": "1", "FLASHINFER_WORKSPACE_BASE": str(t / "ws"),
            "PYTHONPATH": ":".join(map(str, (t / "extras", t / "tree", t / "fi", REPO, view)))}
        st["roots"] = [*sorted((str(t / x) for x in ("extras", "tree", "fi", "view")), key=len, reverse=True), str(REPO)]
        runs = {v: _rounds(st, v, rounds) for v in variants}
    return {"chain": st["chain"], "measured": {
        "vllm": version, "flashinfer": runs[variants[0]].pop("flashinfer"), "date": datetime.date.today().isoformat(),
        "python": "{}.{}".format(*sys.version_info[:2]), "runs": runs, "image_versions_used": overrides,
        "image_absent_here_installed": st["image_too"]}}


def _version(dist: str) -> str | None:
    from importlib import metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _image_versions(st) -> dict:
    """The image's known version (``vllm_bundle.IMAGE_KNOWN``) where this venv's differs and the release
    requires the distribution: installed for the measurement, hidden from the view."""
    from packaging.specifiers import SpecifierSet

    out, pyv = {}, "{}.{}".format(*sys.version_info[:2])
    for d, v in IMAGE_KNOWN.items():
        mine = _version(d)
        if d in st["reqs"]["vllm"] and mine not in (None, v):
            try:
                _install(sg.fetch(d, SpecifierSet(f"=={v}"), [], st["t"] / "dl", pyv), st["t"] / "extras")
                st["present"].discard(sg.norm(d))
                out[d] = f"{v} (this venv: {mine})"
            except UsageError:
                out[d] = f"this venv's {mine}: no {v} wheel for CPython {pyv}"
    return out


def _rounds(st, variant: str, rounds: int) -> dict:
    """Probe, add the missing distribution, until the probe passes or stops on another error."""
    from importlib import metadata as md

    from packaging.specifiers import SpecifierSet

    for n in range(1, rounds + 1):
        r = subprocess.run([sys.executable, "-S", "-c", PROBE, str(st["t"] / "tree"), variant], check=False,
                           capture_output=True, text=True, env=st["env"], cwd=st["t"])
        try:
            doc = json.loads(r.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise UsageError(f"the probe died: {r.stderr.strip()[-600:]}") from None
        frames = [f for f in reversed(doc.pop("importers", [])) if any(f.startswith(x + "/") for x in st["roots"])]
        why = " <- ".join(next(f[len(x) + 1:] for x in st["roots"] if f.startswith(x + "/")) for f in frames[:5])
        if doc.get("ok") or "error" in doc:  # which of the image's distributions the path imported
            used = {sg.norm(d) for top in doc.pop("tops") for d in md.packages_distributions().get(top, ())}
            used = sorted((used & st["image"]) | set(st["image_too"]))
            return {**doc, "rounds": n, "image_used": used} | ({"at": why} if "error" in doc else {})
        top = doc["missing"].split(".")[0]
        dist = sg.norm(ALIASES.get(top) or next(iter(md.packages_distributions().get(top, ())), top))
        if top in ("vllm", "flashinfer", "swa_repro") or dist in st["chain"] or dist in st["image_too"]:
            raise UsageError(f"{variant} round {n}: {doc['missing']} is missing although {dist} is on the path: {why}")
        reqs = st["reqs"]
        parent = next((p for p in reqs if dist in reqs[p]), None)
        w = sg.fetch(dist, _pick(dist, reqs[parent][dist].specifier if parent else SpecifierSet()), [],
                     st["t"] / "dl", "{}.{}".format(*sys.version_info[:2]))
        _install(w, st["t"] / "extras")
        got = sg._wheel_name_version(w)[1]
        if dist in st["present"]:  # the image has it, this venv does not: for the measurement only
            st["image_too"][dist] = got
            st["log"](f"{variant} round {n}: {doc['missing']} -> {dist} {got}: the image's, absent from this venv")
            continue
        reqs[dist] = sg.requirements(w, "3.12")
        st["chain"][dist] = (parent, got, f"{why} ({variant})" if variant != "cpu" else why)
        st["log"](f"{variant} round {n}: {doc['missing']} -> {dist} {got} (required by {parent}): {why}")
    raise UsageError(f"{variant}: still missing modules after {rounds} rounds")


def _pick(dist: str, spec):
    """This venv's version of ``dist`` where ``spec`` allows it, else the lowest version ``spec`` names
    (a release's ``>=X``: what it was built against, as ``swa_repro.vllm.provision.SHADOW``), else ``spec``."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    mine = _version(dist)
    lows = sorted((s.version for s in spec if s.operator in (">=", "==", "~=") and spec.contains(s.version)),
                  key=Version)
    pin = mine if mine and spec.contains(mine) else (lows[0] if lows else None)
    return SpecifierSet(f"=={pin}") if pin else spec
