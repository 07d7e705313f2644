"""The child: vLLM release X's FlashInfer backend driven on CPU (``python -m swa_repro.vllm.audit.drive
--overlay DIR --out F --families gemma2,gpt-oss --archs 9.0,10.0``), one JSON document of what each family's
layers ask for and what FlashInfer is told, per GPU class.

The release is imported once (stand-ins first, ``standins``; a CUDA platform built on vLLM's own
``Platform``, whose compute capability the audit sets, since the compiled ``CudaPlatform`` cannot
load without ``vllm._C``); then each (GPU class, family) runs in its own fork of that process, so
the release's ``functools.cache``\\ d route choices (``vllm/utils/flashinfer.py``) and its other
process state start fresh for each. What one fork does is ``paths.audit`` (the release's metadata
builder and ``FlashInferImpl``) and ``platform_default.probe`` (the release's own backend order
for that GPU class, from ``vllm/platforms/cuda.py``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from swa_repro.engine.child import child_main, child_parser
from swa_repro.vllm.audit import env as standins

ARCH = [9, 0]  # what AuditCuda reports; set in each fork before anything asks


def foreign(overlay: Path) -> list[str]:
    root = str(overlay.resolve())
    return sorted(k for k, m in list(sys.modules.items()) if (k == "vllm" or k.startswith("vllm."))
                  and getattr(m, "__file__", None) and not str(Path(m.__file__).resolve()).startswith(root))


def setup(rec: standins.Recorder, kernels=None, device: str = "cpu"):
    """Stand-ins and platform first, then the release's backend module. ``kernels(rec)`` installs the
    ``flashinfer`` the release binds (default: ``standins.install``; the live run's
    ``live_kernels``); on ``device="cuda"`` the release's own torch and Triton kernels run, and the
    torch ports of its compiled and Triton code are the CPU's only."""
    import logging
    import warnings

    import torch

    torch.set_num_threads(1)  # the forks: no OpenMP pool inherited mid-state
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ["VLLM_HAS_FLASHINFER_CUBIN"] = "1"  # vLLM's artifactory probe is a network GET otherwise
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    (kernels or standins.install)(rec)
    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class AuditCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = device_type = "cuda"
        dispatch_key = "CUDA"

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(*ARCH)

        @classmethod
        def is_pin_memory_available(cls) -> bool:
            return False

    platforms._current_platform = AuditCuda()
    import vllm.v1.attention.backends.flashinfer as fb

    from swa_repro.engine.standins import CpuTorch

    fb.get_dcp_world_size_and_rank = lambda *a, **k: (1, 0)
    if device != "cpu":
        return fb
    fb.torch = CpuTorch()  # device="cuda" buffers land on the CPU, as in the sglang audit
    fb._copy_page_indices_kernel = CopyPageIndices()
    if hasattr(fb, "_trtllm_prefill_attn_kvfp8_dequant"):  # a Triton kernel (fp8 cache, trtllm-gen prefill)
        fb._trtllm_prefill_attn_kvfp8_dequant = DequantCopy()
    if hasattr(fb, "custom_ops"):  # vllm._custom_ops: its fp8 quant is compiled (torch.ops._C)
        fb.custom_ops = CustomOpsPort(fb.custom_ops)
    for name, m in list(sys.modules.items()):  # 0.25+: utils/torch_utils.py's PIN_MEMORY, computed when
        if name.startswith("vllm") and getattr(m, "PIN_MEMORY", None) is True:  # imported, before the
            m.PIN_MEMORY = False  # audit's platform (no pinned memory) was current; copied by v1/utils.py & co.
    return fb


class CopyPageIndices:
    """Torch port of the release's Triton ``_copy_page_indices_kernel`` (flashinfer.py, launched
    ``[(num_reqs,)]``): request i's first ``cu[i+1]-cu[i]`` block-table entries to ``out[cu[i]:]``."""

    def __getitem__(self, grid):
        def launch(out, table, stride, cu, BLOCK_SIZE=None):
            for i in range(grid[0]):
                a, b = int(cu[i]), int(cu[i + 1])
                out[a:b] = table[i, :b - a]
        return launch


class DequantCopy:
    """Torch port of the release's Triton ``_trtllm_prefill_attn_kvfp8_dequant`` (flashinfer.py,
    launched ``[(batch, pages per request)]``, trtllm-gen prefill with an fp8 cache on sm100): page
    ``table[b, p]`` of the fp8 cache, k times the k scale and v times the v scale, to page
    ``1 + b * pages + p`` of the bf16 copy (the release's ``mock_block_table``). Positional arguments
    as the release passes them: cache, table, pages per request, out, k scale, v scale, strides."""

    def __getitem__(self, grid):
        def launch(cache, table, per_req, out, k_scale, v_scale, *strides):
            import torch

            fp8 = cache.view(torch.float8_e4m3fn) if cache.dtype == torch.uint8 else cache
            for b in range(grid[0]):
                for q in range(grid[1]):
                    src = fp8[int(table[b, q])].to(torch.float32)
                    out[1 + b * per_req + q, 0] = (src[0] * float(k_scale)).to(out.dtype)
                    out[1 + b * per_req + q, 1] = (src[1] * float(v_scale)).to(out.dtype)
        return launch


class CustomOpsPort:
    """The release's ``vllm._custom_ops`` with ``scaled_fp8_quant`` in torch (its
    ``torch.ops._C.static_scaled_fp8_quant`` is compiled): static per-tensor quantization, ``x /
    scale`` saturated to fp8 e4m3's range, returned with its scale; anything else the module's own."""

    def __init__(self, ops):
        self._ops = ops

    def __getattr__(self, name):
        return getattr(self._ops, name)

    @staticmethod
    def scaled_fp8_quant(input, scale=None, *args, **kwargs):
        import torch

        if scale is None:
            raise NotImplementedError("dynamic fp8 quantization is not ported (the audit passes scale 1.0)")
        fp8 = torch.float8_e4m3fn
        out = (input.float() / scale.float()).clamp(torch.finfo(fp8).min, torch.finfo(fp8).max).to(fp8)
        return out, scale


FORK_DIED = "the fork died"  # a killed fork (the OOM killer's status 9): the machine's event, not the release's answer


def in_fork(fn) -> dict:
    """``fn()`` in a fork of this process -> its JSON document (``{"error": ...}`` if it raised or died)."""
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the fork
        code = 0
        try:
            doc = fn()
        except BaseException as e:  # noqa: BLE001 - one line for the row, never a traceback
            doc, code = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}, 0
        try:
            Path(path).write_text(json.dumps(doc, default=str))
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    try:
        text = Path(path).read_text()
        return json.loads(text) if text else {"error": f"{FORK_DIED} (status {status})"}
    finally:
        os.unlink(path)


def one(fb, rec, fam: dict, arch: tuple) -> dict:
    from swa_repro.vllm.audit import paths, platform_default

    ARCH[:] = list(arch)
    doc = paths.audit(fb, fam, rec)
    doc["platform"] = platform_default.probe(fb, fam, arch)
    doc["family"] = fam
    return doc


def run(overlay: Path, a) -> dict:
    from swa_repro.vllm import families

    fams = a.fams or [families.resolve(n, overlay) for n in a.families.split(",")]
    archs = [tuple(int(x) for x in s.split(".")) for s in a.archs.split(",")]
    rec = standins.Recorder()
    fb = setup(rec)
    out = {f"{x[0]}.{x[1]}": {fam["family"]: {"family": fam, **({"refused": fam["refused"]} if fam.get("refused") else
                                                                 {"error": fam["error"]} if fam.get("error")
                                                                 else in_fork(lambda: one(fb, rec, fam, x)))}
                              for fam in fams} for x in archs}
    bad = foreign(overlay)
    if bad:
        raise RuntimeError(f"{len(bad)} vllm modules did not come from the overlay (e.g. {bad[0]})")
    import vllm

    return {"audits": out, "vllm": getattr(vllm, "__version__", None), "backend_file": fb.__file__,
            "families": fams}


def main(argv=None) -> int:
    p = child_parser("swa_repro.vllm.audit.drive")
    p.add_argument("--families", required=True, help="comma-separated families (vllm.families.FAMILIES)")
    p.add_argument("--fams", type=json.loads, help="the families' parameters as JSON (a checkpoint's: "
                   "vllm.checkpoint.resolve), instead of resolving --families")
    p.add_argument("--archs", required=True, help="GPU classes' compute capabilities, e.g. 9.0,10.0")
    p.add_argument("--deps", type=Path, help="pure-Python imports the venv lacks or has too old, before the venv")
    a, _ = p.parse_known_args(argv)
    use_deps(a.deps)
    return child_main(p, run, argv)


def use_deps(deps: Path | None) -> None:
    """The overlay's ``.deps`` before the venv: a package there (``provision.SHADOW``) is the
    release's, not the venv's (any copy a warm server imported is dropped)."""
    if deps:
        tops = {q.name.split("-")[0] for q in deps.iterdir()} if deps.is_dir() else set()
        for k in [k for k in sys.modules if k.split(".")[0] in tops]:
            del sys.modules[k]
        sys.path.insert(0, str(deps))


if __name__ == "__main__":
    sys.exit(main())
