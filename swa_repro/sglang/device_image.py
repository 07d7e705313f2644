"""What a GPU step imports that neither the device image nor a bundle carries, found on a CPU first.

The sglang bundle's :data:`~swa_repro.evidence.sglang_bundle.CHAIN` was measured for the live audit's
path. The registered regression test also imports ``CustomTestCase`` from ``sglang.test.test_utils``,
which imports ``sglang.benchmark.serving`` (0.5.23 test_utils.py:38) -> ``sglang.benchmark.datasets``
(serving.py:44) -> ``datasets`` (benchmark/datasets/mmmu.py:8). The image lacks ``datasets``: on the H100
on 2026-12-05 both regression runs stopped there before any case ran
(recordings/sglang-live/fix-0.5.23/call-20261205T1245-h100-kit-regress). A CPU child imports the same
files with only :func:`device_view` on its path: the site-packages entries of :data:`IMAGE` and of the
bundles (:func:`carried`), so a required import fails here as it failed there, before device time is spent.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from swa_repro.evidence.sglang_bundle import norm
from swa_repro.evidence.site_view import site_view

# /work/.library/device/KINDS.md: "their image, 'cuda', holds these, as last read on a machine running
# it on 2026-11-17" (nvidia-h100-x1 and nvidia-h200 alike); names as listed there
IMAGE_READ = "2026-11-17"
IMAGE = frozenset([
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio",
    "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake",
    "colorama", "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit",
    "cupy-cuda13x", "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock",
    "flatbuffers", "flax", "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11",
    "h5py", "hf-xet", "httpcore", "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio",
    "iniconfig", "interface-meta", "jax", "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping",
    "jinja2", "joblib", "kiwisolver", "lazy-loader", "lightning", "lightning-utilities", "linear-operator",
    "lineax", "llvmlite", "lxml", "markdown", "markdown-it-py", "markupsafe", "matplotlib", "mdurl", "meson",
    "ml-dtypes", "mpi4py", "mpmath", "msgpack", "multidict", "multipledispatch", "mypy-extensions", "nanobind",
    "narwhals", "networkx", "ninja", "numba", "numba-cuda", "numpy", "numpyro", "nvidia-cublas",
    "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cufft",
    "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse", "nvidia-cusparselt-cu13",
    "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink", "nvidia-nvshmem-cu13", "nvidia-nvtx", "onnx",
    "onnx-ir", "onnxruntime", "onnxscript", "opencv-python-headless", "optax", "opt-einsum", "opt-einsum-fx",
    "optimistix", "orbax-checkpoint", "packaging", "pandas", "pathspec", "patsy", "peft", "pillow", "pip",
    "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf", "psutil", "pyarrow", "pybind11",
    "py-cpuinfo", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions", "pytest", "pytest-benchmark",
    "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist", "python-dateutil", "pytorch-lightning",
    "pyyaml", "regex", "requests", "rich", "sacrebleu", "safetensors", "scikit-build-core", "scikit-image",
    "scikit-learn", "scipy", "seaborn", "sentencepiece", "sentence-transformers", "setuptools", "shellingham",
    "simplejson", "six", "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard",
    "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken", "timm", "tokenizers",
    "toolz", "torch", "torchaudio", "torchdiffeq", "torch-geometric", "torchmetrics", "torchvision", "tqdm",
    "transformers", "treescope", "triton", "typer", "typing-extensions", "typing-inspect", "urllib3", "uvloop",
    "wadler-lindig", "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl", "zipp"
])

def carried() -> frozenset[str]:
    """Every distribution the two bundles install: sglang and its measured chain, flashinfer, its
    tvm-ffi and import deps, and the distributions a stub stands in for."""
    from swa_repro.evidence.bundle import IMPORT_DEPS
    from swa_repro.evidence.sglang_bundle import CHAIN
    from swa_repro.evidence.stubs import MEASURED_WHEELS

    stubbed = {w.split("==")[0] for w in MEASURED_WHEELS} | {"sgl-kernel"}
    return frozenset(norm(d) for d in ("sglang", "flashinfer-python", "apache-tvm-ffi", *CHAIN, *IMPORT_DEPS, *stubbed))


def owners() -> dict[str, set[str]]:
    """top-level module -> the distributions (normalized) that install it, on today's ``sys.path``."""
    return {t: {norm(d) for d in ds} for t, ds in md.packages_distributions().items()}


def have(own=("swa-repro",)) -> set[str]:
    """What the GPU machine holds: the image, the bundles, and ``own`` (this
    project's code, on the device's PYTHONPATH from the checkout)."""
    return {norm(d) for d in IMAGE} | carried() | {norm(d) for d in own}


def device_view(dest: Path, site_packages: Path | None = None) -> Path:
    """``dest`` holding a symbolic link to each entry of this interpreter's site-packages that the GPU
    machine has (its owners meet :func:`have`, or no distribution owns it), and none to the rest: on a
    path of the stdlib, the overlay and ``dest`` alone, an optional import (sglang's ``try: import
    xgrammar``, transformers' ``find_spec("mistral_common")``) finds nothing and takes its fallback, as
    there, and a required one fails with the module's name, as it did there."""
    return site_view(dest, have(), site_packages, owners())


def check(site: Path, files) -> dict:
    """Import ``files`` in a child whose path is the stdlib, ``site`` (the overlay: sglang), this
    project and :func:`device_view` alone: ``{"files": {name: "imports" | the error}}``."""
    repo = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="swa-device-view-") as tmp:
        view = device_view(Path(tmp) / "site")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PYTHONPATH"] = ":".join(map(str, (Path(site).resolve(), repo, view)))
        r = subprocess.run([sys.executable, "-S", "-m", "swa_repro.sglang.device_image", "--inside",
                            *map(str, files)], check=False, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"device_image child failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    """``python -m swa_repro.sglang.device_image SITE FILE...``: each FILE (a test file the GPU runs
    with only the sites on its path) imported as a module, not as ``__main__`` (none of its tests run),
    as the GPU machine would (:func:`check`); prints ``{"files": {name: "imports" | error}}``, exit 1 if
    one fails. On a CPU sglang takes its CPU branches at import (the CUDA ones are the live audit's
    chain, measured with CUDA faked available: sglang_bundle.CHAIN_MEASURED)."""
    import importlib.util
    import logging
    import warnings

    args = list(argv if argv is not None else sys.argv[1:])
    if args[:1] != ["--inside"]:
        doc = check(Path(args[0]), [Path(f) for f in args[1:]])
        print(json.dumps(doc))
        return 0 if all(v == "imports" for v in doc["files"].values()) else 1
    from swa_repro.sglang import releases

    releases.ensure_sgl_kernel()  # the bundle's stub on the GPU machine; no distribution either way
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    out = {"files": {}}
    for i, f in enumerate(map(Path, args[1:])):
        spec = importlib.util.spec_from_file_location(f"device_image_{i}_{f.stem}", f)
        try:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            out["files"][f.name] = "imports"
        except ImportError as e:
            out["files"][f.name] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
