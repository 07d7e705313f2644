"""The family table's columns for the architectures a release serves only through its Transformers
fallback (``models/transformers.py``), each audited THROUGH the fallback (parent side; issue #41 item 2).

Why: a server of the release runs any architecture no ``EntryClass`` lists through
``TransformersForCausalLM`` & co (0.5.23 model_loader/utils.py:198-240 ``get_model_architecture`` ->
``resolve_transformers_arch`` :111-195), which builds transformers' own model and hands each layer a
``RadixAttention`` of its own making (0.5.23 transformers.py:904-955 ``_create_attention_instances``:
``sliding_window`` unchanged, only to the layers ``layer_types`` calls sliding, no ``logit_cap``). The
table said "fallback: not audited" for ~24 such architectures. Each is now a column of its own:

* its config: transformers' class defaults of its ``model_type`` (``arch_cells.column_config``, the
  same published defaults as every other column), cut to a few layers (``checkpoint.small_config``);
* built in the audit's child by the release's own loader (``family_build.build``): the loader picks
  the fallback class itself, whose ``__init__`` builds transformers' model and its ``RadixAttention``
  layers; the runner's window derived by the release's ``resolve_sliding_window_size``; then driven
  down every path like any column (``family.audit_family``). A fallback that cannot build is the
  cell's ``not built``, with the line in the release or in transformers (``releases.explain_error``);
* defaults with no sliding layer at all (the window left to a checkpoint: ``SmolLM3Config()``): built at a
  window the audit sets (:func:`audit_pattern`, ``arch_fill.AUDIT_WINDOW``, each key in ``set_by_audit``,
  ``window_from: "audit"``: a conditional verdict, as a native column's); ``not built`` where even that
  cannot build, saying why; never for a user's checkpoint (its file decides);
* what the fallback's source does with the window, read with ``ast`` (:func:`route`): the lines the
  cell's note cites (:func:`note`), and where a release's fallback hands no window, that finding.

An architecture whose ``model_type`` the release re-parses with a config class naming another
architecture (0.5.23 configs/olmo3.py:59-64: Olmo3ForCausalLM -> Olmo2ForCausalLM) is served natively
after all: the same column, its note says by which class (the loader builds what the release picks).
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict
from functools import cache
from pathlib import Path

from swa_repro.core.checkpoint_config import auto_model_types
from swa_repro.core.errors import UsageError
from swa_repro.sglang.swa_archs import FALLBACK_FILE, SwaArch

WORD = "sliding_window_size"


@cache
def route(srt: Path) -> dict:
    """What the release's fallback does with a window, by ``ast`` over its own files:
    ``window`` (the ``sliding_window_size=`` keyword of its ``RadixAttention(...)`` call, or None: the
    window never handed), ``pattern`` (the ``if`` choosing the layers that get it: ``layer_types``),
    ``cap`` (a ``logit_cap=`` keyword, or None), ``hook`` (a ``get_attention_sliding_window_size``
    the runner reads, or None), ``gate`` (flashinfer_backend.py's ``if model_runner.sliding_window_size
    is not None``: the window wrappers exist only then)."""
    path = srt / "models" / FALLBACK_FILE
    out = dict.fromkeys(("file", "window", "pattern", "cap", "hook", "gate"))
    if not path.is_file():
        return out
    tree = ast.parse(path.read_text(encoding="utf-8-sig"))
    out["file"] = f"models/{FALLBACK_FILE}"
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "get_attention_sliding_window_size":
            out["hook"] = f"models/{FALLBACK_FILE}:{node.lineno}"
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("RadixAttention"):
            kw = {k.arg: k for k in node.keywords}
            if WORD in kw and not _constant_none(kw[WORD].value):
                out["window"] = f"models/{FALLBACK_FILE}:{kw[WORD].lineno}"
            if "logit_cap" in kw:
                out["cap"] = f"models/{FALLBACK_FILE}:{kw['logit_cap'].lineno}"
            out["call"] = f"models/{FALLBACK_FILE}:{node.lineno}"
        if isinstance(node, ast.If) and "sliding_attention" in ast.unparse(node.test):
            out["pattern"] = f"models/{FALLBACK_FILE}:{node.lineno}"
    fb = srt / "layers" / "attention" / "flashinfer_backend.py"
    if fb.is_file():
        gate = next((n for n in ast.walk(ast.parse(fb.read_text(encoding="utf-8-sig"))) if isinstance(n, ast.If)
                     and ast.unparse(n.test) == "model_runner.sliding_window_size is not None"), None)
        out["gate"] = gate and f"layers/attention/flashinfer_backend.py:{gate.lineno}"
    return out


def _constant_none(v) -> bool:
    return isinstance(v, ast.Constant) and v.value in (-1, None, 0) or \
        isinstance(v, ast.UnaryOp) and ast.unparse(v) == "-1"


def plan(version: str, overlay: Path, column_config, no_config) -> tuple[dict, dict]:
    """``(smalls, static)`` as ``arch_cells.plan`` returns them, for every architecture only the
    fallback serves (:func:`fallback_only`); ``column_config`` / ``no_config``: ``arch_cells``' (the
    published defaults every column is built from, and its ``NoConfig``), handed in: it imports this."""
    from swa_repro.core.checkpoint_config import SLIDING, layer_kinds
    from swa_repro.sglang import checkpoint as ckpt
    from swa_repro.sglang import release_configs

    srt = overlay / "sglang" / "srt"
    src = route(srt)
    types = release_configs.registry(version, overlay).get("types", {})
    smalls, static = {}, {}
    for arch in fallback_only(srt):
        a = SwaArch(arch, FALLBACK_FILE, tuple(x for x in (src["window"],) if x), fallback=True)
        facts = {"architecture": arch, "model_file": FALLBACK_FILE, "window_sites": list(a.windows),
                 "hybrid_swa": None, "sinks": [], "fallback": src, "served_as": served_as(arch, types)}
        try:
            ck = column_config(a, version, overlay)
            text = ck.text_config()
            kinds = layer_kinds(text)
        except (no_config, UsageError, TypeError, ValueError, AttributeError) as e:
            static[arch] = {"family": arch, "discovered": facts, "error": f"not buildable from transformers' "
                            f"defaults: {str(e)[:300]}"}
            continue
        found, said = {**facts, "config": ck.path}, ""
        if SLIDING not in kinds:
            extra, why = audit_pattern(ck)
            lt = getattr(text, "layer_types", None)
            said = (f"no sliding layer at {ck.path} (sliding_window={getattr(text, 'sliding_window', None)!r}, "
                    f"layer_types={_short(lt)}): the window comes from a checkpoint")
            try:
                ck = column_config(a, version, overlay, extra, why) if extra else ck
                kinds = layer_kinds(ck.text_config()) if extra else kinds
            except (no_config, UsageError, TypeError, ValueError, AttributeError) as e:
                said += f"; at a window the audit set the class refuses it: {str(e)[:200]}"
                kinds = ()
            if SLIDING not in kinds:
                static[arch] = {"family": arch, "discovered": facts, "error": (
                    f"{said}{'' if extra else '; the audit cannot set one (no layer count)'}; audit one (through "
                    f"the fallback): swa-repro audit --sglang {version} --model PATH/config.json")}
                continue
            found.update(set_by_audit=why, window_from="audit")  # the verdict holds at the audit's window
        try:
            smalls[arch] = {"small": asdict(ckpt.small_config(ck)), "discovered": found}
        except RuntimeError as e:  # transformers 5.19.0: a per-layer head_dim read globally (arch_cells.plan)
            static[arch] = {"family": arch, "discovered": facts, "error": f"not buildable from transformers' "
                            f"defaults: {type(e).__name__}: {str(e)[:300]}"}
    return smalls, static


def audit_pattern(ck) -> tuple[dict, dict]:
    """``(values to set, {key: why})`` for a column whose transformers defaults have no sliding layer
    (``SmolLM3Config()``: ``sliding_window=None``, every layer full): the fallback hands ``sliding_window``
    unchanged only to the layers whose ``layer_types[i] == "sliding_attention"`` (0.5.23 transformers.py:
    936-951), so the column is built at ``arch_fill.AUDIT_WINDOW`` with every other full layer made sliding
    (a linear or other layer kept: MiniMax), and ``use_sliding_window`` on where the class gates the window
    with it (Qwen2's ``sliding_window if use_sliding_window else None``); set in the text part where the
    config nests one. A column only (``plan``): a user's checkpoint keeps its own window, or none.
    Empty when the text part cannot be found or has fewer than 2 full layers."""
    from swa_repro.sglang.audit.arch_fill import (
        AUDIT_WINDOW,
        SET_WINDOW,
        set_pattern,
        set_window,
    )

    text = ck.text_config()
    path, n = _text_path(ck.config, text), getattr(text, "num_hidden_layers", None)
    lt = list(getattr(text, "layer_types", None) or ["full_attention"] * (n if isinstance(n, int) else 0))
    full = [i for i, t in enumerate(lt) if t == "full_attention"]
    if path is None or len(full) < 2:
        return {}, {}
    for i in full[::2]:
        lt[i] = "sliding_attention"
    new = {"sliding_window": AUDIT_WINDOW, "layer_types": lt}
    why = {"sliding_window": set_window(),
           "layer_types": set_pattern("full layer 'sliding_attention' (transformers.py:936-951 hands the window only "
                                      "to those)", len(lt))}
    if getattr(text, "use_sliding_window", None) is False:
        new["use_sliding_window"] = True
        why["use_sliding_window"] = f"{SET_WINDOW}: True, the class keeps sliding_window only with it on"
    prefix = ".".join(path) + "." if path else ""
    why = {prefix + k: w for k, w in why.items()}
    if not path:
        return new, why
    top = _plain(getattr(ck.config, path[0]).to_dict())
    leaf = top
    for k in path[1:]:
        leaf = leaf[k]
    leaf.update(new)
    return {path[0]: top}, why


def _text_path(config, text, depth: int = 3) -> tuple | None:
    """The attribute path from ``config`` to its text part (``()``: itself; ``("thinker_config",
    "text_config")``: Qwen2_5OmniConfig's), or None."""
    if text is config:
        return ()
    for k, v in vars(config).items():
        if v is text:
            return (k,)
        if depth and k.endswith("_config") and hasattr(v, "to_dict"):
            p = _text_path(v, text, depth - 1)
            if p is not None:
                return (k, *p)
    return None


def _plain(d: dict) -> dict:
    """A sub-config's ``to_dict()`` as a ``config.json`` holds it (no private or version keys)."""
    return {k: _plain(v) if isinstance(v, dict) else v for k, v in d.items()
            if not str(k).startswith("_") and k not in ("transformers_version", "dtype", "torch_dtype")}


@cache
def _windowed_config_classes() -> frozenset:
    """transformers' config classes whose file mentions ``sliding_window``."""
    import importlib.util

    out = set()
    for f in (Path(importlib.util.find_spec("transformers").origin).parent / "models").glob("*/configuration_*.py"):
        text = f.read_text(encoding="utf-8")
        if "sliding_window" in text:
            out.update(re.findall(r"^class (\w+)\(", text, re.MULTILINE))
    return frozenset(out)


def fallback_only(srt: Path) -> list[str]:
    """Causal-LM / conditional-generation architectures whose transformers config class has a
    ``sliding_window`` and that no file of the release's ``models/`` names: what a server of this
    release runs through the Transformers fallback (text only: transformers' ``configuration_*.py``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    windowed = _windowed_config_classes()
    release = "\n".join(p.read_text(encoding="utf-8-sig") for p in sorted((srt / "models").glob("*.py")))
    return sorted(a for a, mt in auto_model_types().items() if CONFIG_MAPPING_NAMES.get(mt) in windowed
                  and a.endswith(("ForCausalLM", "ForConditionalGeneration")) and a not in release)


def _short(x) -> str:
    x = list(x) if isinstance(x, (list, tuple)) else x
    return repr(x) if not isinstance(x, list) or len(x) <= 4 else f"[{', '.join(map(repr, x[:4]))}, ... ({len(x)})]"


def served_as(arch: str, types: dict) -> str | None:
    """The architecture the release's own config class names instead of ``arch`` (its ``model_type``
    re-parsed: 0.5.23 configs/olmo3.py:59-64), whose ``EntryClass`` then serves it; None: the fallback."""
    rel = types.get(auto_model_types().get(arch) or "", {})
    names = [x for x in rel.get("architectures") or [] if x != arch]
    return f"{names[0]} ({rel['class']}, {rel['where']}, names it for {arch})" if names else None


def note(f: dict) -> str | None:
    """The cell's note for a fallback column that was built: what the fallback did with the window,
    from the child's document (the model class, each kind's layer and the runner's window) and the
    release's lines (:func:`route`)."""
    d, b = f.get("discovered") or {}, f.get("build") or {}
    src = (b.get("model_config") or {}).get("fallback") or d.get("fallback")
    if not src or "kinds" not in f:
        return None
    cls = b.get("model_class") or "?"
    if not cls.startswith("Transformers"):
        return f"not the fallback: sglang serves it as {cls} ({b.get('model_file')}); {d.get('served_as') or ''}"
    out = [f"served through sglang's Transformers fallback ({cls}, {src['file']})"]
    if src["window"] is None:
        out.append(f"the fallback hands no window to RadixAttention ({src.get('call') or src['file']}): the "
                   "window never reaches FlashInfer")
    else:
        out.append(f"it hands sliding_window unchanged ({src['window']}) to the layers layer_types calls sliding "
                   f"({src['pattern']})")
    layers = {k: (v.get("layer_window"), v.get("intended_window")) for k, v in f["kinds"].items()}
    sl = layers.get("sliding")
    if sl and sl[0] == -1:
        out.append("this config sets no layer_types: every layer gets -1, the window dropped")
    elif sl and sl[0] != sl[1]:
        out.append(f"sliding layers ask window_left {sl[0]} where transformers' mask is {sl[1]} (HF counts the "
                   "window inclusively)")
    if b.get("runner_window") is None and src["hook"] is None:
        out.append(f"the fallback defines no get_attention_sliding_window_size, so the runner's window is None "
                   f"({b.get('runner_rule')}) and FlashInferAttnBackend builds no window wrapper "
                   f"({src['gate'] or 'flashinfer_backend.py'}): no layer's window reaches FlashInfer")
    cap = (f.get("config") or {}).get("cap") or 0
    if cap and src["cap"] is None:
        out.append(f"the config's attn_logit_softcapping {cap:g} never reaches the layer (RadixAttention built "
                   f"without logit_cap, {src.get('call')})")
    return "; ".join(out)
