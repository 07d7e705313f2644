"""What release X's own ``ServerArgs`` decides for a model on a GPU class: run, not restated.

A child (``python -m swa_repro.sglang.server_run --overlay DIR --out F --configs JSON``) imports X's
``sglang`` with CUDA faked as one GPU of each class (:data:`DEVICES`: capability, name, memory; as
``vllm.bundle_measure`` fakes an H100 for what asks at import), writes each model's ``config.json``
to a folder and, per GPU class and model, in a fork of its own (nothing one server's resolution sets,
the environment or a cached platform probe, reaches the next), builds ``ServerArgs(model_path=FOLDER,
**flags)`` and resolves it as a launcher does (``__post_init__``; 0.5.19+ ``resolve_once``) for each
of :data:`SCENARIOS`: no flag (the default backend, the default prefill CUDA graph), ``--attention-backend
flashinfer`` (kept or refused: the assert or error that refuses it, cited file:line where it is raised),
and ``--prefill-attention-backend flashinfer`` / ``--decode-attention-backend flashinfer`` alone (a split
server that may reach FlashInfer around a refusal). Every ``functools.lru_cache`` of the release's
modules is emptied in each fork first, so probes such as ``is_sm100_supported`` (0.5.10
utils/common.py:259) or 0.5.23's ``get_platform()`` read the faked GPU of that fork.

What a resolved server holds is read back by name (``resolved_dict`` where the release has it,
0.5.19+, else the fields): the attention backends, the prefill CUDA graph (0.5.14+ ``cuda_graph_config.
prefill.backend``; before, ``disable_piecewise_cuda_graph``), deterministic inference and the model
config's ``is_multimodal``. ``serving_path.from_server`` turns these into a cell's default path and
backend; its static reading of the same files is the independent oracle (``tests/test_server_run.py``).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

MODULE = "swa_repro.sglang.server_run"
GIB = 2 ** 30
# GPU class (serving_path.GPUS) -> the device a server of that class sees
DEVICES = {"sm90": ((9, 0), "NVIDIA H100 80GB HBM3", 80 * GIB, 132),
           "sm100": ((10, 0), "NVIDIA B200", 180 * GIB, 148),
           "other": ((8, 0), "NVIDIA A100-SXM4-80GB", 80 * GIB, 108)}
SCENARIOS = {"default": {}, "flashinfer": {"attention_backend": "flashinfer"},
             "prefill_flashinfer": {"prefill_attention_backend": "flashinfer"},
             "decode_flashinfer": {"decode_attention_backend": "flashinfer"}}
READ = ("attention_backend", "prefill_attention_backend", "decode_attention_backend", "enable_deterministic_inference",
        "disable_cuda_graph")


# ----------------------------------------------------------------------------- parent
def server_facts(version: str, overlay: Path, configs: dict) -> dict:
    """``{name: {gpu class: {scenario: facts}}}`` for each ``name -> config.json dict`` of ``configs``,
    from one child of release ``version`` for the models not cached yet. Each model is cached on its
    own (``core.cache.cached_cells``: the release's content, the code, its name and config), as the
    family cells are: each server is resolved in a fork of its own, so a model's facts do not depend
    on the others in the child, and an audit of one family reuses what the table's child resolved
    for it (before, each set of models was one entry: every other set ran the whole child again)."""
    from swa_repro.core.cache import cached_cells
    from swa_repro.sglang.overlay_run import child_parts, run_child

    if not configs:
        return {}
    cells = [{"model": n, "config": config_digest(c)} for n, c in configs.items()]

    def compute(missing):
        mine = {c["model"]: configs[c["model"]] for c in missing}
        doc, _, _ = run_child(MODULE, overlay, ["--configs", json.dumps(mine, sort_keys=True, default=str)],
                              f"resolving sglang {version}'s ServerArgs", cache=False)
        return [doc["facts"][c["model"]] for c in missing]

    docs, _ = cached_cells("server-facts", child_parts(MODULE, overlay), cells, compute, valid=whole_facts)
    return dict(zip(configs, docs))


def config_digest(config: dict) -> str:
    """A model's cache key part: its config.json's hash (as the child receives it)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def whole_facts(doc) -> bool:
    """A cached model's facts: every GPU class with every scenario the child resolves."""
    return isinstance(doc, dict) and all(isinstance(doc.get(g), dict) and all(isinstance(doc[g].get(s), dict)
                                                                              for s in SCENARIOS) for g in DEVICES)


# ----------------------------------------------------------------------------- child
class _Props:
    def __init__(self, gpu: str):
        (self.major, self.minor), self.name, self.total_memory, self.multi_processor_count = DEVICES[gpu]
        self.gcnArchName, self.L2_cache_size, self.uuid = "", 50 * 2 ** 20, "GPU-0"


def fake_cuda(gpu: str) -> None:
    """torch reports one GPU of class ``gpu`` (nothing is ever run on it: only resolution asks)."""
    import torch

    c, p = torch.cuda, _Props(gpu)
    c.is_available, c.device_count, c.current_device = (lambda: True), (lambda: 1), (lambda: 0)
    c._lazy_init = lambda: None
    c.get_device_capability = lambda device=None: (p.major, p.minor)
    c.get_device_name = lambda device=None: p.name
    c.get_device_properties = lambda device=None: p
    c.mem_get_info = lambda device=None: (p.total_memory, p.total_memory)


def lru_caches() -> list:
    """Every ``lru_cache`` of the loaded sglang modules (platform probes cached at import)."""
    import functools

    return [v for name, m in list(sys.modules.items()) if name == "sglang" or name.startswith("sglang.")
            for v in list(vars(m).values())  # by type: an op packet's getattr raises (sgl_kernel's, 0.5.10)
            if isinstance(v, functools._lru_cache_wrapper)]


def clear_caches(caches: list | None = None) -> int:
    """Empty ``caches`` (default: :func:`lru_caches`, found now). The child finds them once, before its
    forks: each fork starts from the same modules, and walking every module's namespace in each of
    ~230 forks (0.5.23, 77 models x 3 GPU classes) touched every object's refcount, so each fork copied
    most of the parent's pages (~90 ms a fork on 2 busy cores; the list: < 1 ms)."""
    caches = lru_caches() if caches is None else caches
    for v in caches:
        v.cache_clear()
    return len(caches)


def _plain(v):
    v = getattr(v, "value", v)  # an enum member -> its value
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def _field(obj, name):
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def prefill_graph(rd: dict) -> str | None:
    """The prefill CUDA graph a resolved server captures: ``cuda_graph_config.prefill.backend``
    (tc_piecewise / breakable / disabled ...), else the legacy ``disable_piecewise_cuda_graph``."""
    cg = rd.get("cuda_graph_config")
    if cg is not None:
        b = _plain(_field(_field(cg, "prefill"), "backend"))
        return None if b is None else str(b).lower().split(".")[-1]
    if "disable_piecewise_cuda_graph" in rd:
        return "disabled" if rd["disable_piecewise_cuda_graph"] else "tc_piecewise"
    return None


def resolved(sa) -> dict:
    """A resolved server's values by field name (0.5.19+ keeps them off the fields: ``resolved_dict``)."""
    if hasattr(sa, "resolved_dict"):
        return sa.resolved_dict()
    import dataclasses

    return {f.name: getattr(sa, f.name, None) for f in dataclasses.fields(sa)}


def is_multimodal(sa):
    """The model config the server built (``get_model_config``; 0.5.19+ ``model_config_of``)."""
    try:
        if hasattr(sa, "get_model_config"):
            return bool(sa.get_model_config().is_multimodal)
        from sglang.srt.arg_groups.model_override_base import model_config_of

        return bool(model_config_of(sa).is_multimodal)
    except Exception:  # noqa: BLE001 - a fact not read is None, said so
        return None


def where(e: BaseException) -> str | None:
    """file:line of the release's innermost frame of ``e`` (the assert or raise that refused)."""
    from swa_repro.sglang.families import rel_line

    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/sglang/" in f.filename.replace("\\", "/")]
    return rel_line(frames[-1].filename, frames[-1].lineno) if frames else None


def resolve(server_args, folder: str, flags: dict) -> dict:
    """One server: ``ServerArgs(model_path=folder, **flags)`` resolved; what it holds, or why not."""
    env = dict(os.environ)
    try:
        sa = server_args(model_path=folder, **flags)
        if hasattr(sa, "resolve_once"):
            sa.resolve_once()
        rd = resolved(sa)
        return {"ok": True, **{k: _plain(rd.get(k)) for k in READ}, "prefill_graph": prefill_graph(rd),
                "legacy_graph_flag": rd.get("cuda_graph_config") is None, "is_multimodal": is_multimodal(sa)}
    except BaseException as e:  # noqa: BLE001 - a refusal is the answer
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        return {"ok": False, "error": msg[:300], "where": where(e)}
    finally:
        os.environ.clear()
        os.environ.update(env)


def in_fork(fn) -> dict:
    """``fn()``'s JSON result, computed in a fork (its state dies with it)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the fork
        os.close(r)
        try:
            data = json.dumps({"value": fn()}, default=str)
        except BaseException as e:  # noqa: BLE001
            data = json.dumps({"error": f"{type(e).__name__}: {e}"})
        with os.fdopen(w, "w") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    got = json.loads(data or '{"error": "the fork wrote nothing"}')
    if "error" in got:
        raise RuntimeError(got["error"])
    return got["value"]


def config_folders(configs: dict) -> dict:
    """name -> a folder holding only that model's ``config.json`` (a model type neither transformers
    nor the release registers is read through a plain config class: ``family_build.plain_config_class``)."""
    from swa_repro.sglang.audit.family_build import plain_config_class

    out = {}
    for name, cfg in configs.items():
        plain_config_class(cfg)
        out[name] = tempfile.mkdtemp(prefix="swa-repro-server-")
        Path(out[name], "config.json").write_text(json.dumps(cfg))
    return out


def child(overlay: Path, configs: dict) -> dict:
    fake_cuda("sm90")  # before the import: what asks at import sees a CUDA machine
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from swa_repro.sglang.overlay_run import check_no_foreign, import_release

    import_release(overlay)
    from sglang.srt.server_args import ServerArgs

    folders = config_folders(configs)
    resolve(ServerArgs, next(iter(folders.values())), {})  # the lazy imports once, before the forks
    caches = lru_caches()  # the same in every fork (nothing is imported between them)
    gc.freeze()  # a fork's collections skip the parent's objects: their pages stay shared

    def one(gpu, folder):
        fake_cuda(gpu)
        clear_caches(caches)
        return {s: resolve(ServerArgs, folder, kw) for s, kw in SCENARIOS.items()}

    facts = {n: {g: in_fork(lambda g=g, f=f: one(g, f)) for g in DEVICES} for n, f in folders.items()}
    return {"facts": facts, "sglang_modules_from_overlay": check_no_foreign(overlay)}


def main(argv=None) -> int:
    from swa_repro.engine.child import child_main, child_parser

    p = child_parser(MODULE)
    p.add_argument("--configs", type=json.loads, required=True, help="name -> config.json, as JSON")
    return child_main(p, lambda overlay, a: child(overlay, a.configs), argv)


if __name__ == "__main__":
    sys.exit(main())
