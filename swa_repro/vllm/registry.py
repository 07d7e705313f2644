"""vLLM release X's own model registry, and what its model file hands each attention layer, read
with ``ast`` from the release's overlay (its model files cannot be imported here: ``vllm.families``).

* :func:`served`: architecture -> (module, class), the release's
  ``vllm/model_executor/models/registry.py`` dicts that serve a model (``_TEXT_GENERATION_MODELS``,
  ``_MULTIMODAL_MODELS``, ... ``_TRANSFORMERS_BACKEND_MODELS``: what its ``_VLLM_MODELS`` merges);
* :func:`attention_files`: the files that build an architecture's attention layers: its module (a
  package: every file in it), else where it hands its language model to another registered
  architecture (``init_vllm_registered_model(..., architectures=[...])``, a multimodal model's
  text model), else the sibling model modules it imports (``MistralAttention(LlamaAttention)``);
* :func:`window`: how the window reaches the layer. vLLM's ``Attention`` takes
  ``per_layer_sliding_window`` where the model file passes one, else ``cache_config.sliding_window``,
  which the engine sets to ``hf_text_config.sliding_window`` only when the config has no
  ``layer_types`` or every layer is sliding (0.34.0 ``engine/arg_utils.py:2321-2327``,
  ``model_executor/layers/attention/attention.py:281-289``). The expression the file passes (and the
  assignments of the name it passes) say the effect: ``config``, ``+1`` (cohere2's
  ``config.sliding_window + 1``), ``cache`` (no per-layer window), or ``other`` (a window read from
  another key: cited, not modelled).
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

MODELS = "vllm/model_executor/models"
REGISTRY = f"{MODELS}/registry.py"
ATTN_FILE = "vllm/model_executor/layers/attention/attention.py"
# the dicts _VLLM_MODELS merges (a release lacking one simply has none of it)
SERVING = ("_TEXT_GENERATION_MODELS", "_EMBEDDING_MODELS", "_LATE_INTERACTION_MODELS", "_REWARD_MODELS",
           "_TOKEN_CLASSIFICATION_MODELS", "_SEQUENCE_CLASSIFICATION_MODELS", "_MULTIMODAL_MODELS",
           "_SPECULATIVE_DECODING_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS", "_TRANSFORMERS_BACKEND_MODELS")
KEY = "per_layer_sliding_window"


def served(overlay: Path) -> dict[str, tuple[str, str]]:
    """architecture -> (module, class) of the release in ``overlay`` (its registry's literals)."""
    return dict(_served(str(overlay / REGISTRY)))


@lru_cache(maxsize=16)
def _served(path: str) -> tuple:
    p = Path(path)
    tree = ast.parse(p.read_text()) if p.is_file() else ast.Module(body=[], type_ignores=[])
    out = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if not (isinstance(target, ast.Name) and target.id in SERVING and isinstance(node.value, ast.Dict)):
            continue
        for k, v in zip(node.value.keys, node.value.values):
            if isinstance(k, ast.Constant) and isinstance(v, ast.Tuple) and len(v.elts) == 2 \
                    and all(isinstance(e, ast.Constant) for e in v.elts):
                out.setdefault(k.value, (v.elts[0].value, v.elts[1].value))
    return tuple(out.items())


def module_files(overlay: Path, module: str) -> list[Path]:
    """A registry module's file, or every file of its package (``transformers/``)."""
    p = overlay / MODELS / module
    if p.is_dir():
        return sorted(p.rglob("*.py"))
    return [p.with_suffix(".py")] if p.with_suffix(".py").is_file() else []


def _text(path: Path) -> str:
    return _read(str(path))


@lru_cache(maxsize=1024)
def _read(path: str) -> str:
    return Path(path).read_text(errors="replace")


@lru_cache(maxsize=1024)
def _tree(path: str) -> ast.AST:
    return ast.parse(_read(path))


def builds_attention(path: Path) -> bool:
    """The file constructs an attention layer of its own (vLLM's ``Attention``, or llama's
    ``attn_cls``)."""
    return bool(re.search(rf"\b{KEY}\b|\b(Attention|attn_cls)\(", _text(path)))


def attention_files(overlay: Path, arch: str, seen: frozenset = frozenset()) -> list[Path]:
    """The files that build ``arch``'s attention layers (module docstring)."""
    reg = served(overlay)
    if arch not in reg or arch in seen:
        return []
    files = module_files(overlay, reg[arch][0])
    if any(builds_attention(f) for f in files):
        return files
    text = "\n".join(_text(f) for f in files)
    inner = re.findall(r"architectures\s*=\s*\[\s*[\"'](\w+)[\"']", text)  # its language model, registered
    for a in inner:
        got = attention_files(overlay, a, seen | {arch})
        if got:
            return got
    out = []
    for mod in re.findall(r"^from (?:vllm\.model_executor\.models)?\.(\w+) import", text, re.MULTILINE):
        f = overlay / MODELS / f"{mod}.py"
        if f.is_file() and f not in out and mod not in ("utils", "interfaces", "interfaces_base", "module_mapping"):
            out.append(f)
    return [f for f in out if builds_attention(f)][:1]


def rel(overlay: Path, path: Path) -> str:
    return str(path.relative_to(overlay))


def _passes(tree: ast.AST):
    """Each expression the file hands ``per_layer_sliding_window`` (a call's keyword, or
    ``kwargs["per_layer_sliding_window"] = ...``) -> (node, its text, the line naming the key)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == KEY:
                    yield kw.value, ast.unparse(kw.value), kw.lineno
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                                                  and t.slice.value == KEY for t in node.targets):
            yield node.value, ast.unparse(node.value), node.lineno


def _assigned(tree: ast.AST, name: str) -> list[str]:
    """The values the file assigns to ``name`` (``sliding_window``, ``self.sliding_window``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, (ast.Name, ast.Attribute)) and ast.unparse(t) == name for t in targets):
                out.append(ast.unparse(node.value))
    return out


def effect_of(texts: list[str]) -> tuple[str | None, str]:
    """-> (``+1`` / ``config`` (the config's ``sliding_window``) / None (another source), the text
    that says so)."""
    for eff, pat in (("+1", r"sliding_window\s*\+\s*1\b"), ("config", r"\.sliding_window\b|[\"']sliding_window[\"']")):
        hit = next((t for t in texts if re.search(pat, t)), None)
        if hit is not None:
            return eff, hit
    return None, ""


@lru_cache(maxsize=1024)
def file_window(path: str) -> tuple | None:
    """One file's first window it hands a layer -> (effect or None, line, text, the text that says
    so); None where it hands none (a parameter handed through, qwen3's, is none)."""
    tree, other = _tree(path), None
    for node, text, lineno in _passes(tree):
        if text == KEY:
            continue
        texts = [text] + (_assigned(tree, text) if isinstance(node, (ast.Name, ast.Attribute)) else [])
        eff, hit = effect_of(texts)
        if eff:
            return eff, lineno, text, hit
        other = other or (None, lineno, text, "")
    return other


def window(overlay: Path, files: list[Path]) -> tuple[str, str]:
    """How the layers get their window -> (effect, ``file:line: text``) (module docstring)."""
    other = None
    for f in files:
        got = file_window(str(f))
        if got is None:
            continue
        eff, lineno, text, hit = got
        where = f"{rel(overlay, f)}:{lineno}: {KEY}={text}"
        if eff:
            return eff, where + (f" ({hit})" if hit != text else "")
        other = other or where
    if other:
        return "other", other
    return "cache", cache_line(overlay)


def cache_line(overlay: Path) -> str:
    """vLLM's ``Attention`` falling back to the model-level window (``cache_config.sliding_window``)."""
    p = overlay / ATTN_FILE
    for i, ln in enumerate(_text(p).splitlines() if p.is_file() else [], 1):
        if re.search(r"sliding_window = cache_config\.sliding_window", ln):
            return f"{ATTN_FILE}:{i}: {ln.strip()}"
    return f"{ATTN_FILE}: not found"


def line_of(overlay: Path, files: list[Path], pattern: str) -> str | None:
    """The first line of ``files`` matching ``pattern`` as ``file:line: text``."""
    for f in files:
        for i, ln in enumerate(_text(f).splitlines(), 1):
            if re.search(pattern, ln):
                return f"{rel(overlay, f)}:{i}: {ln.strip()}"
    return None


def sinks_conditional(files: list[Path]) -> bool:
    """The sinks the file passes are sometimes None (granite's ``self.sinks = None`` beside its
    ``nn.Parameter``): present only for some configs, which the audit does not evaluate."""
    for f in files:
        for m in re.finditer(SINKS, _text(f)):
            expr = m.group(0).split("=", 1)[1].strip()
            if re.search(rf"^\s*{re.escape(expr)}\s*=\s*None\b", _text(f), re.MULTILINE):
                return True
    return False


CAP = r"soft_cap\w*\s*=.*attn_logit_softcapping"  # gemma2's attn_logits_soft_cap=config.attn_logit_softcapping
SINKS = r"(?<![.\w])sinks=(?!None\b)[\w.]+"  # the keyword: gpt-oss' sinks=self.sinks
QPAS = r"query_pre_attn_scalar\s*\*\*\s*-0\.5"


def window_architectures(overlay: Path) -> dict[str, tuple[str, str]]:
    """Every architecture the release serves whose layers get a window from the model file
    (``per_layer_sliding_window``) -> (effect, source line)."""
    out = {}
    for arch in sorted(served(overlay)):
        files = attention_files(overlay, arch)
        if files:
            eff, where = window(overlay, files)
            if eff != "cache":
                out[arch] = (eff, where)
    return out
