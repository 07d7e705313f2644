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
* defaults with no sliding layer at all (the window left to a checkpoint): ``not built``, saying so;
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
        if SLIDING not in kinds:
            lt = getattr(text, "layer_types", None)
            static[arch] = {"family": arch, "discovered": facts, "error": (
                f"no sliding layer at {ck.path} (sliding_window={getattr(text, 'sliding_window', None)!r}, "
                f"layer_types={_short(lt)}): the window comes from a checkpoint; "
                f"audit one (through the fallback): swa-repro audit --sglang {version} --model PATH/config.json")}
            continue
        smalls[arch] = {"small": asdict(ckpt.small_config(ck)), "discovered": {**facts, "config": ck.path}}
    return smalls, static


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
