"""A model family's attention layers, built by the release's own model-loading code (child side).

In the child of ``audit --sglang X --model FAMILY`` (X's overlay first on ``sys.path``):

1. one rank of sglang's own process groups (gloo, world size 1), as sglang's layer tests set them up
   (0.5.23 test/layer_ut_utils.py:13-35 ``init_single_process_dist``; ``publish_build_topology``
   where the release has it, 0.5.21+): the model's parallel linears read the TP size from them;
2. the family's small config (``families.small_config``) written as ``config.json`` and read by the
   release's ``ModelConfig`` (configs/model_config.py), as a server reads a checkpoint folder, with
   ``context_length`` at what the audit's batches need (a server's ``--context-length``);
3. the model built by the release's loader, ``model_loader.loader._initialize_model`` (0.5.23
   loader.py:285-312), on the meta device (no weights, no download);
4. the runner's ``sliding_window_size`` derived by the release's own code: 0.5.16+
   ``resolve_sliding_window_size`` (0.5.23 model_runner_components/load_model_utils.py:144-157,
   called at model_runner.py:1353), before that the statements of ``ModelRunner.load_model`` that set
   it (0.5.14 model_runner.py:1469-1482; the same statements in 0.5.10 :1223-1236, 0.5.11 :1444-1457,
   0.5.12 :1530-1543, 0.5.13 :1410-1423), executed on the built model and config.

``vllm._custom_ops`` is a placeholder (the rotary embedding imports it on a CPU host, 0.5.23
rotary_embedding/base.py:138; nothing here runs a rotary).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import json
import os
import socket
import sys
import tempfile
import textwrap
import types
from dataclasses import dataclass, field

import torch

from swa_repro.engine.families import SmallConfig
from swa_repro.sglang.families import def_line, rel_line


@dataclass(frozen=True, eq=False)
class Built:
    """What the release built for one family."""
    small: SmallConfig
    model_config: object  # the release's ModelConfig
    layers: tuple  # the model's RadixAttention modules, by layer id
    runner_window: int | None  # ModelRunner.sliding_window_size, as the release derives it
    runner_rule: str  # which code derived it, file:line
    model_file: str  # the model class's file:line
    facts: dict = field(default_factory=dict)  # ModelConfig's is_hybrid_swa, sliding_window_size, ...


def single_rank() -> str:
    """sglang's process groups for one CPU rank (gloo), once per process; how, for the record."""
    ps = importlib.import_module("sglang.srt.distributed.parallel_state")
    if ps.model_parallel_is_initialized():
        return "already initialized"
    how = "init_distributed_environment(gloo, world 1) + initialize_model_parallel()"
    try:
        from sglang.test.test_utils import publish_build_topology  # 0.5.21+
    except ImportError:
        publish_build_topology = None
    if publish_build_topology is not None:
        publish_build_topology(tp_size=1, ep_size=1, pp_size=1)
        how = "publish_build_topology(tp=ep=pp=1) + " + how
    if not torch.distributed.is_initialized():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                        distributed_init_method=f"tcp://127.0.0.1:{port}")
    ps.initialize_model_parallel(backend="gloo")
    return how


def mock_server_args(model_path: str):
    """The release's test-kit ``ServerArgs``: ``make_mock_server_args()`` (test/kits/attention_unittest/
    mock_server_args.py:28, dataclass defaults without ``__post_init__``), single rank on the CPU."""
    try:
        from sglang.test.kits.attention_unittest.mock_server_args import make_mock_server_args
    except ImportError:
        from swa_repro.sglang.releases_kit import plain_server_args as make_mock_server_args
    return make_mock_server_args(tp_size=1, pp_size=1, dp_size=1, device="cpu", model_path=model_path)


_INSTALLED = []  # the published test context, kept for the process


def server_args(model_path: str) -> str:
    """Releases that read a process-global ``ServerArgs`` while building a model (0.5.14-0.5.19,
    e.g. 0.5.14 rotary_embedding/base.py:152 ``get_global_server_args()``) get the kit's, as the kit
    installs it (``set_global_server_args_for_scheduler``, 0.5.14 dense_attention.py:375). 0.5.20+
    retired it (``RuntimeError``) for namespace bags: a context is published the kits' way,
    ``get_context().override_server_args(...).install()`` (0.5.20 runtime_context.py:1225-1245)."""
    sa = importlib.import_module("sglang.srt.server_args")
    try:
        sa.get_global_server_args()
        return "already set"
    except RuntimeError:  # retired: namespace bags
        pass
    except ValueError:
        sa.set_global_server_args_for_scheduler(mock_server_args(model_path))
        return "set_global_server_args_for_scheduler(make_mock_server_args())"
    except AttributeError:
        return "no global server args in this release"
    rc = importlib.import_module("sglang.srt.runtime_context")
    try:
        rc.get_exec()
        return "a context is published"
    except ValueError:
        _INSTALLED.append(rc.get_context().override_server_args(tp_size=1, pp_size=1, dp_size=1, device="cpu",
                                                                model_path=model_path))
        _INSTALLED[-1].install()
        return "get_context().override_server_args(tp=pp=dp=1, device=cpu).install()"


def dp_attention(mc, model_path: str) -> str:
    """Releases up to 0.5.20 keep attention-DP ranks in module globals that some model files read
    while building (gpt-oss, exaone4: 0.5.14 dp_attention.py:355-371): set by the release's own
    ``initialize_dp_attention(server_args, model_config)`` (:279), as the model runner does."""
    dpa = importlib.import_module("sglang.srt.layers.dp_attention")
    init = getattr(dpa, "initialize_dp_attention", None)
    if init is None or getattr(dpa, "_ATTN_DP_SIZE", 0) is not None:
        return "not needed"
    try:
        args = mock_server_args(model_path)
    except TypeError as e:  # 0.5.20's composed ServerArgs has no kit recipe: a model that needs DP says so
        return f"skipped: {e}"
    init(args, mc)
    return "initialize_dp_attention(make_mock_server_args(), model_config)"


def vllm_placeholder() -> None:
    """``vllm._custom_ops`` whose names raise when called (``releases.Missing``)."""
    from swa_repro.sglang.releases import Missing

    if "vllm._custom_ops" in sys.modules:
        return
    def missing(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(f"vllm._custom_ops.{name}")

    pkg, ops = types.ModuleType("vllm"), types.ModuleType("vllm._custom_ops")
    pkg.__path__ = []
    ops.__getattr__ = missing
    sys.modules.update({"vllm": pkg, "vllm._custom_ops": ops})


def config_folder(small: SmallConfig) -> str:
    """A checkpoint folder holding only the small config's ``config.json``."""
    folder = tempfile.mkdtemp(prefix=f"swa-repro-{small.family}-")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(small.config, f)
    return folder


def plain_config_class(config: dict) -> str:
    """A checkpoint whose ``model_type`` neither transformers nor the release registers (a
    remote-code model, its ``auto_map`` dropped by ``checkpoint.small_config``) is read by the
    release's ``ModelConfig`` through a plain ``PretrainedConfig`` subclass registered for that type
    with ``AutoConfig`` (its values are the file's, as ``checkpoint.config_object`` read them)."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    mt = config.get("model_type")
    if not isinstance(mt, str) or not mt or mt in CONFIG_MAPPING:
        return "registered"
    AutoConfig.register(mt, type(f"Plain_{mt}_Config", (PretrainedConfig,), {"model_type": mt}))
    return f"plain PretrainedConfig registered for model_type {mt!r}"


def pinned_config_api() -> str | None:
    """What the release's pinned transformers gives every config that the installed one lacks, given as the
    pin defines it. 0.5.23 pins transformers==5.19.0 (its METADATA) and reads ``text_config.is_heterogeneous``
    for every Gemma 4 config (utils/hf_transformers/config.py:120, from ``_GEMMA4_MODEL_TYPES`` :66-73);
    5.19.0 defines it on ``PreTrainedConfig`` (integrations/heterogeneity/configuration_utils.py:315-316:
    ``hasattr(self, "_heterogeneity_spec")``), the venv's older transformers not at all (AttributeError, the
    Gemma4ForConditionalGeneration columns not built). A config the installed transformers read carries no
    per-layer spec, so it is False: the release's own else branch (config.py:133-137) then gives the full and
    sliding layers the config's ``head_dim`` / ``num_key_value_heads`` (a 5.19.0 spec would give the full
    layers ``global_head_dim``); the sliding layers' are the same either way. None where nothing was missing."""
    from transformers import PretrainedConfig

    if hasattr(PretrainedConfig, "is_heterogeneous"):
        return None
    PretrainedConfig.is_heterogeneous = property(lambda self: hasattr(self, "_heterogeneity_spec"))
    return ("PretrainedConfig.is_heterogeneous as transformers 5.19.0 defines it (hasattr(self, "
            "'_heterogeneity_spec')): False, no per-layer spec; full layers take the config's head_dim")


def model_config(folder: str, context_length: int):
    """The release's ``ModelConfig`` read from the small config's ``config.json`` (offline). A
    published default shorter than the audit's batches (Exaone4Config: 2048 positions) is extended
    the way the release's own refusal says (0.5.23 model_config.py:1302-1316,
    ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``)."""
    from sglang.srt.configs.model_config import ModelConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
    return ModelConfig(model_path=folder, context_length=context_length)


def build_model(mc):
    """The release's loader builds the model class for ``mc`` on the meta device. The model
    registry is imported first, off meta: some model modules make tensors at import (0.5.14)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader import loader

    loader.get_model_architecture(mc)
    with torch.device("meta"), no_fused_mlp_gemm(), fallback_stays_on_meta():
        return loader._initialize_model(mc, LoadConfig())


@contextlib.contextmanager
def fallback_stays_on_meta():
    """The Transformers fallback builds transformers' model on the meta device itself (0.5.23
    models/transformers.py:624-630), then ``_init_parameters`` (:669-681) moves every parameter to the
    accelerator: ``get_device()`` (0.5.23, raises on a host without one) or ``"cuda"`` (0.5.10 :660-672).
    The audit builds every model on meta and reads only its attention layers, made before that step
    (:642 ``_create_attention_instances``): the parameters stay on meta. Releases without the file untouched."""
    try:
        base = importlib.import_module("sglang.srt.models.transformers").TransformersBase
    except (ImportError, AttributeError):
        yield
        return
    orig = base.__dict__.get("_init_parameters")
    base._init_parameters = lambda self, module: None
    try:
        yield
    finally:
        if orig is None:
            del base._init_parameters
        else:
            base._init_parameters = orig


@contextlib.contextmanager
def no_fused_mlp_gemm():
    """The release's MLP picks a fused gate/up GEMM at build time on CUDA (0.5.23 layers/dual_gemm.py:30,
    ``DualGemm._select_mode`` :32-42, from llama.py:121), importing nvidia-cutlass-dsl, which the GPU bundle
    does not carry (Mistral and Qwen2 failed to build on the H100 of 2026-12-05: "No module named
    'cutlass'"). The audit never runs an MLP, so the mode is what the release picks off CUDA, None
    (dual_gemm.py:37-38), while the model is built; releases without the class are untouched."""
    try:
        dg = importlib.import_module("sglang.srt.layers.dual_gemm").DualGemm
    except (ImportError, AttributeError):
        yield
        return
    orig = dg.__dict__["_select_mode"]
    dg._select_mode = lambda self, *a, **k: None
    try:
        yield
    finally:
        dg._select_mode = orig


def attention_layers(model) -> tuple:
    """The model's ``RadixAttention`` modules in layer order."""
    found = [m for m in model.modules() if type(m).__name__ == "RadixAttention"]
    found += [m for m in (getattr(model, "attention_instances", None) or {}).values() if m not in found]
    return tuple(sorted(found, key=lambda m: m.layer_id))


def runner_window(model, mc) -> tuple[int | None, str]:
    """``(sliding_window_size, rule)`` exactly as the release's model runner sets it after loading."""
    try:
        lmu = importlib.import_module("sglang.srt.model_executor.model_runner_components.load_model_utils")
        fn = lmu.resolve_sliding_window_size
    except (ImportError, AttributeError):
        return _inline_runner_window(model, mc)
    src, line = inspect.getsourcelines(fn)
    return fn(model, mc), f"resolve_sliding_window_size ({rel_line(inspect.getsourcefile(fn), line)})"


def _inline_runner_window(model, mc) -> tuple[int | None, str]:
    """Releases before 0.5.16 set it inside ``ModelRunner.load_model``: the statement
    ``self.sliding_window_size = None`` and the ``if`` chain after it, executed with ``self`` holding
    the built model and config (the module's globals: its logger)."""
    mr = importlib.import_module("sglang.srt.model_executor.model_runner")
    path = inspect.getsourcefile(mr)
    tree = ast.parse(open(path).read())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "load_model")
    body = fn.body
    i = next(k for k, s in enumerate(body) if isinstance(s, ast.Assign) and ast.unparse(s) ==
             "self.sliding_window_size = None")
    block = ast.Module(body=body[i:i + 2], type_ignores=[])
    env = dict(vars(mr), self=types.SimpleNamespace(model=model, model_config=mc, sliding_window_size=None))
    exec(compile(block, path, "exec"), env)
    return env["self"].sliding_window_size, \
        f"ModelRunner.load_model ({rel_line(path, body[i].lineno)}-{body[i + 1].end_lineno})"


def build(small: SmallConfig, context_length: int) -> Built:
    """Steps 1-4 of the module docstring for one family."""
    vllm_placeholder()
    single_rank()
    folder = config_folder(small)
    plain_config_class(small.config)
    server_args(folder)
    pinned = pinned_config_api()
    mc = model_config(folder, context_length)
    dp_attention(mc, folder)
    model = build_model(mc)
    window, rule = runner_window(model, mc)
    cls = type(model)
    where = def_line(cls)
    facts = {k: _plain(getattr(mc, k, None)) for k in ("is_hybrid_swa", "sliding_window_size", "attention_chunk_size",
                                                      "context_len", "head_dim", "num_attention_heads")}
    facts["num_kv_heads"] = mc.get_num_kv_heads(1)
    facts["model_class"] = cls.__name__
    if pinned and getattr(getattr(mc, "hf_config", None), "model_type", None) in _gemma4_types():
        facts["pinned_transformers_api"] = pinned
    facts["fallback"] = fallback_route(cls)
    return Built(small, mc, attention_layers(model), window, rule, where, facts)


def _gemma4_types() -> tuple:
    """The release's ``_GEMMA4_MODEL_TYPES`` (0.5.23 utils/hf_transformers/config.py:66), where it has one."""
    try:
        return tuple(importlib.import_module("sglang.srt.utils.hf_transformers.config")._GEMMA4_MODEL_TYPES)
    except (ImportError, AttributeError):
        return ()


def fallback_route(cls) -> dict | None:
    """What the release's Transformers fallback does with a window (``fallback_cells.route``), where the
    loader built ``cls`` from it (0.5.23 model_loader/utils.py:230-231: no ``EntryClass`` lists the
    architecture); None for a model file of its own."""
    from pathlib import Path

    from swa_repro.sglang.audit.fallback_cells import route
    from swa_repro.sglang.swa_archs import FALLBACK_FILE

    path = Path(inspect.getsourcefile(cls))
    return route(path.parents[1]) if path.name == FALLBACK_FILE and path.parent.name == "models" else None


def _plain(x):
    return x if x is None or isinstance(x, (bool, int, float, str)) else str(x)


def layer_text(layer) -> str:
    """What a layer asks of the backend, in its own attribute names."""
    return textwrap.shorten(f"RadixAttention(layer_id={layer.layer_id}, sliding_window_size="
                            f"{layer.sliding_window_size}, logit_cap={layer.logit_cap}, head_dim={layer.head_dim}, "
                            f"q_heads={layer.tp_q_head_num}, kv_heads={layer.tp_k_head_num})", 200)
