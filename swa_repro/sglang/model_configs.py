"""Real sliding-window model configurations, read from what ships in the installed packages.

Numbers come from two places and nowhere else:

* the published defaults of ``transformers``' config classes (``Gemma2Config()`` etc.: the
  class attributes a checkpoint's ``config.json`` starts from), instantiated without network;
* sglang's own model file for that architecture, read with ``ast``: the expression that turns
  ``config.sliding_window`` into the ``RadixAttention(sliding_window_size=...)`` that becomes
  FlashInfer's ``window_left`` (``flashinfer_backend.py:1149`` passes ``layer.sliding_window_size``
  to ``forward()``), and the expression that becomes ``logit_cap`` (``logits_soft_cap``,
  ``flashinfer_backend.py:1118``). The expression is evaluated on the config object.

Every :class:`ModelSpec` records which class/attribute and which sglang file:line each value came
from. HF counts the window *inclusive* of the query (``sliding_window=4096``: 4096 keys), FlashInfer
*exclusive* (``window_left=4095``: 4095 keys left of the query), hence ``sliding_window - 1`` in
most sglang models; a model file that passes ``config.sliding_window`` unchanged attends one key
more than HF, and one that passes none serves the model without a window.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from swa_repro.engine.families import MODELS

# Looked for and reported as absent when transformers does not ship them (remote-code models).
ABSENT = {"phi3-small": ("Phi3SmallConfig", "Phi3SmallForCausalLM")}


class ModelConfigError(RuntimeError):
    """A package the table reads from is missing; the message says what to install."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hf_class: str
    architecture: str
    sliding_window: int | None  # HF, inclusive of the query
    window_left: int  # what sglang's sliding layers pass to FlashInfer; -1 = no window
    logit_cap: float  # what sglang's layers pass as logits_soft_cap; 0 = none
    head_dim: int
    num_qo_heads: int
    num_kv_heads: int
    num_layers: int
    num_sliding_layers: int | None  # from HF layer_types, None when the config has none
    window_rule: str  # how sglang turned sliding_window into window_left, with file:line
    cap_rule: str
    sources: dict = field(default_factory=dict)  # value -> "transformers.X().attr" / "sglang file:line"

    @property
    def group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def has_window(self) -> bool:
        return self.window_left >= 0

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- transformers
def _hf_config(cls_name: str, switches: dict):
    try:
        transformers = importlib.import_module("transformers")
    except ModuleNotFoundError as e:
        raise ModelConfigError("transformers is not installed: `pip install transformers` (sglang pins it)") from e
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        return None
    return cls(**switches)


def _hf_int(cfg, attr):
    v = getattr(cfg, attr, None)
    return int(v) if v is not None else None


# ----------------------------------------------------------------------------- sglang sources
def sglang_models_dir() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ModelConfigError("sglang is not installed: `pip install sglang==0.5.15.post1`")
    return Path(list(spec.submodule_search_locations)[0]) / "srt" / "models"


def model_file(architecture: str) -> Path | None:
    """The installed sglang's model file for ``architecture`` (:func:`model_file_in`)."""
    return model_file_in(sglang_models_dir(), architecture)


@lru_cache(maxsize=None)
def model_file_in(models_dir: Path, architecture: str) -> Path | None:
    """The model file under ``models_dir`` whose ``EntryClass`` lists ``architecture`` (the registry's
    rule, sglang/srt/models/registry.py, read without importing every model)."""
    for p in sorted(models_dir.glob("*.py")):
        text = p.read_text()
        if "EntryClass" not in text or architecture not in text:
            continue
        tree = _parse(p)
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass"
                                                    for t in node.targets):
                names = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
                if architecture in names:
                    return p
    return None


def _parse(path: Path) -> ast.Module:
    """The file's one parse in this process (``config_reads.model_tree``: discovery and the plan read it too)."""
    from swa_repro.engine.config_reads import model_tree

    return model_tree(Path(path))


_SAFE_CALLS = {"getattr": getattr, "max": max, "min": min, "int": int, "float": float}


def eval_on_config(expr: ast.expr, config):
    """Evaluate a small sglang expression (``config.sliding_window - 1``, ``getattr(config, ...)``,
    ``self.config.attn_logit_softcapping``) with ``config`` bound; anything else -> ValueError."""
    def ev(n):
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name) and n.id == "config":
            return config
        if isinstance(n, ast.Attribute):
            if isinstance(n.value, ast.Name) and n.value.id == "self" and n.attr == "config":
                return config
            return getattr(ev(n.value), n.attr)
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Sub, ast.Add)):
            a, b = ev(n.left), ev(n.right)
            return a - b if isinstance(n.op, ast.Sub) else a + b
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _SAFE_CALLS and not n.keywords:
            return _SAFE_CALLS[n.func.id](*[ev(a) for a in n.args])
        raise ValueError(f"not a config expression: {ast.unparse(n)}")
    return ev(expr)


def _rel(p: Path) -> str:
    return f"sglang/srt/models/{p.name}"


def _window_from_source(path: Path, config) -> tuple[int | None, str]:
    """``(window_left, rule)``: sglang's ``get_attention_sliding_window_size(config)`` if the file
    defines one (its first ``return``), else an assignment/keyword ``sliding_window_size = <expr on
    config>``; ``None`` when the file passes no window at all."""
    tree = _parse(path)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "get_attention_sliding_window_size":
            for r in ast.walk(node):
                if isinstance(r, ast.Return) and r.value is not None:
                    try:
                        v = eval_on_config(r.value, config)
                    except (ValueError, AttributeError, TypeError):
                        continue
                    return v, f"{ast.unparse(r.value)} ({_rel(path)}:{r.lineno})"
    for n in ast.walk(tree):
        targets = []
        if isinstance(n, ast.Assign):
            targets = [(t, n.value) for t in n.targets if getattr(t, "attr", getattr(t, "id", None)) == "sliding_window_size"]
        for _, value in targets:
            try:
                v = eval_on_config(value, config)
            except (ValueError, AttributeError, TypeError):
                continue
            if isinstance(v, int) and v >= 0:
                return v, f"{ast.unparse(value)} ({_rel(path)}:{n.lineno})"
    bases = _imported_model_files(path)
    if not any("sliding_window" in p.read_text() for p in (path, *bases)):
        also = f" (nor {', '.join(p.name for p in bases)}, which it builds on)" if bases else ""
        return None, f"{_rel(path)}{also} never reads sliding_window: served without a window"
    return None, f"{_rel(path)}: no config expression for sliding_window_size found"


def _imported_model_files(path: Path) -> list[Path]:
    """sglang model files this one imports from (``MistralForCausalLM`` builds on llama.py)."""
    out = []
    for n in _parse(path).body:
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.srt.models."):
            p = path.parent / (n.module.rsplit(".", 1)[1] + ".py")
            if p.is_file():
                out.append(p)
    return out


def _cap_from_source(path: Path, config) -> tuple[float, str]:
    """The first ``logit_cap = <expr>`` (assignment or RadixAttention keyword) that evaluates on
    the config to a positive number; else 0 and where the file says 0 / nothing."""
    tree = _parse(path)
    zero_at = None
    for n in ast.walk(tree):
        pairs = []
        if isinstance(n, ast.Assign):
            pairs = [(n.value, n.lineno) for t in n.targets if getattr(t, "id", None) == "logit_cap"]
        elif isinstance(n, ast.keyword) and n.arg == "logit_cap":
            pairs = [(n.value, n.value.lineno)]
        for value, line in pairs:
            try:
                v = eval_on_config(value, config)
            except (ValueError, AttributeError, TypeError):
                continue
            if v:
                return float(v), f"{ast.unparse(value)} ({_rel(path)}:{line})"
            zero_at = zero_at or f"logit_cap={ast.unparse(value)} ({_rel(path)}:{line})"
    return 0.0, zero_at or f"{_rel(path)} passes no logit_cap (RadixAttention default 0.0)"


# ----------------------------------------------------------------------------- the table
def model_spec(name: str) -> ModelSpec | None:
    """One model's spec, or None if transformers does not ship its config class."""
    cls_name, switches, arch = MODELS[name]
    cfg = _hf_config(cls_name, switches)
    if cfg is None:
        return None
    src = {}
    sw = _hf_int(cfg, "sliding_window")
    src["sliding_window"] = f"transformers.{cls_name}({_kw(switches)}).sliding_window"
    nq, nkv = _hf_int(cfg, "num_attention_heads"), _hf_int(cfg, "num_key_value_heads")
    src["num_qo_heads"] = f"transformers.{cls_name}().num_attention_heads"
    if nkv is None:
        nkv = nq
        src["num_kv_heads"] = f"transformers.{cls_name}().num_attention_heads (num_key_value_heads is None)"
    else:
        src["num_kv_heads"] = f"transformers.{cls_name}().num_key_value_heads"
    hd = _hf_int(cfg, "head_dim")
    if hd is None:
        hd = _hf_int(cfg, "hidden_size") // nq
        src["head_dim"] = f"transformers.{cls_name}().hidden_size // num_attention_heads"
    else:
        src["head_dim"] = f"transformers.{cls_name}().head_dim"
    layers = _hf_int(cfg, "num_hidden_layers")
    lt = getattr(cfg, "layer_types", None)
    n_sliding = sum(t == "sliding_attention" for t in lt) if lt else None
    if lt:
        src["num_sliding_layers"] = f"transformers.{cls_name}().layer_types.count('sliding_attention')"
    path = model_file(arch)
    if path is None:
        wl, rule, cap, cap_rule = None, f"no sglang model file lists {arch}", 0.0, "-"
    else:
        wl, rule = _window_from_source(path, cfg) if sw is not None else (None, "config has no sliding_window")
        cap, cap_rule = _cap_from_source(path, cfg)
    src["window_left"], src["logit_cap"] = rule, cap_rule
    return ModelSpec(name, cls_name, arch, sw, -1 if wl is None else int(wl), cap, hd, nq, nkv, layers, n_sliding,
                     rule, cap_rule, src)


def _kw(d: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in d.items())


def model_specs(names=None) -> list[ModelSpec]:
    """Every model of :data:`MODELS` that the installed transformers ships."""
    return [s for s in (model_spec(n) for n in (names or MODELS)) if s is not None]


def absent_models() -> dict[str, str]:
    """Models looked for but not shipped by the installed transformers (e.g. remote-code Phi-3 small)."""
    try:
        transformers = importlib.import_module("transformers")
    except ModuleNotFoundError:
        return {n: "transformers not installed" for n in ABSENT}
    return {n: f"transformers {transformers.__version__} has no {c} (remote code): not read"
            for n, (c, _) in ABSENT.items() if not hasattr(transformers, c)}


def table(specs=None) -> list[dict]:
    """Rows for a notebook table."""
    return [{"model": s.name, "config": s.hf_class, "sliding_window": s.sliding_window, "window_left": s.window_left,
             "head_dim": s.head_dim, "heads (q/kv)": f"{s.num_qo_heads}/{s.num_kv_heads}",
             "sliding layers": f"{s.num_sliding_layers}/{s.num_layers}" if s.num_sliding_layers is not None else "-",
             "soft cap": s.logit_cap, "sglang window rule": s.window_rule}
            for s in (specs or model_specs())]
