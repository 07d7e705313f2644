"""A user's checkpoint for ``audit --vllm X --model PATH``: its ``config.json`` (or the folder holding
one; ``core.checkpoint_config``) turned into what each of its layer kinds asks vLLM's
``FlashInferImpl`` for, at the user's values, through release X's own model file.

* ``architectures[0]`` is looked up in the release's registry (``registry.served``: the dicts its
  ``_VLLM_MODELS`` merges, read with ``ast``); one line when the release lacks it (naming the vLLM
  releases on this machine that serve it);
* the files that build its attention (``registry.attention_files``) say how the window reaches the
  layer (``registry.window``: the model file's ``per_layer_sliding_window``, ``+ 1`` where it adds
  one, or vLLM's model-level ``cache_config.sliding_window`` where it passes none), whether the cap
  is passed (``registry.CAP``), the sinks (``registry.SINKS``) and the scale (``registry.QPAS``);
  each value cites that line of the release;
* the values are the user's (the window, ``layer_types`` / ``sliding_window_pattern`` /
  ``use_sliding_window`` / ``max_window_layers`` as transformers' class turns them into layer
  kinds, cap, head_dim, heads), each labelled user / default in ``record``.

The result has the shape of ``vllm.families.resolve`` (``family``: the architecture), so
``vllm.audit.drive`` drives every path of it as it drives a table family. A window the model file takes
from another key (``registry.window``'s ``other``) is the cell's ``error`` (not driven, the line
cited), never a guess.
"""

from __future__ import annotations

import re
from pathlib import Path

from swa_repro.core import checkpoint_config as cc
from swa_repro.core.errors import UsageError
from swa_repro.vllm import registry


def model_arg(text: str | None, families: tuple) -> cc.Checkpoint | None:
    """``--model`` -> the user's config read (a path), or None (family names: ``audit.check``)."""
    names = [x.strip() for x in (text or "").split(",")]
    if not text or all(x in (*families, "all", "") for x in names) or not cc.looks_like_path(text):
        return None
    return cc.read(text, "vLLM", families)


def model_file(ck: cc.Checkpoint, version: str, overlay: Path) -> list[Path]:
    """The release's files that build the checkpoint's attention; one line when it serves none."""
    reg = registry.served(overlay)
    if ck.architecture not in reg:
        raise UsageError(f"--model {ck.path}: {ck.architecture} is not in vLLM {version}'s model registry "
                         f"({registry.REGISTRY}){served_by(ck.architecture, version, overlay)}")
    check_reads(ck, version, overlay)
    files = registry.attention_files(overlay, ck.architecture)
    if not files:
        raise UsageError(f"--model {ck.path}: vLLM {version} serves {ck.architecture} from "
                         f"{registry.MODELS}/{reg[ck.architecture][0]}, which builds no attention layer the audit "
                         "can read")
    return files


LOADER = "vllm/transformers_utils/config.py"  # vLLM's config loader, which sets some keys itself


def loader_sets(overlay: Path) -> set:
    """Keys vLLM's config loader assigns on the config it loads (0.34.0 transformers_utils/config.py:637
    ``config.rope_parameters = {...}``): not the user's to give."""
    import ast

    p = overlay / LOADER
    tree = ast.parse(p.read_text()) if p.is_file() else ast.Module(body=[], type_ignores=[])
    return {x.attr for x in ast.walk(tree) if isinstance(x, ast.Attribute) and isinstance(x.ctx, ast.Store)
            and isinstance(x.value, ast.Name) and x.value.id == "config"}


def check_reads(ck: cc.Checkpoint, version: str, overlay: Path) -> None:
    """One line for a key the release's entry class reads off its config on every config (a read
    inside an ``if`` aside: ``config_reads``' ``branches=False``) that the file lacks and neither its
    class nor vLLM's loader sets: the build would stop there with an ``AttributeError``."""
    from swa_repro.engine.config_reads import VLLM_MODELS, config_reads

    module, cls = registry.served(overlay)[ck.architecture]
    path = overlay / registry.MODELS / f"{module}.py"
    if not path.is_file():  # a package (the Transformers backend): transformers' own code reads it
        return
    skip = loader_sets(overlay)
    for key, where in config_reads(path, cls, VLLM_MODELS, branches=False).items():
        if key not in skip and not ck.has(key):
            raise UsageError(f"--model {ck.path} lacks {key}, which vLLM {version}'s {registry.MODELS}/{where} reads "
                             f"and {ck.config_class.split(' ')[0]} does not default"
                             f"{older_transformers(version, overlay) if ck.config_class.startswith('transformers.') else ''}"
                             ": add it to the config")


def older_transformers(version: str, overlay: Path) -> str:
    """`` (transformers 5.12.1 here; vLLM 0.34.0 requires transformers<5.23.0,>=5.16.1, whose class may set
    it)`` where the release's ``Requires-Dist`` excludes this venv's transformers, else ``""``. Why: a key
    transformers' class gained later (0.34.0 gemma4.py:600 ``config.per_layer_config``) reads as missing
    here although a server with the release's transformers has it; the line says which it is."""
    from importlib import metadata

    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    meta = "\n".join(p.read_text() for p in overlay.glob("vllm-*.dist-info/METADATA"))
    m = re.search(r"^Requires-Dist: transformers([^;\n]*)", meta, re.MULTILINE)
    try:
        have, spec = metadata.version("transformers"), SpecifierSet(m.group(1).strip()) if m else None
    except (metadata.PackageNotFoundError, InvalidSpecifier):
        return ""
    if spec is None or spec.contains(have, prereleases=True):
        return ""
    return f" (transformers {have} here; vLLM {version} requires transformers{spec}, whose class may set it)"


def served_by(arch: str, version: str, overlay: Path) -> str:
    """``; vLLM 0.29.0, 0.34.0 (already on this machine) serve it`` (the other overlays here)."""
    from swa_repro.vllm.provision import parse

    have = sorted((d.name for d in overlay.parent.iterdir() if d.name != version and (d / registry.REGISTRY).is_file()
                   and arch in registry.served(d)), key=parse) if overlay.parent.is_dir() else []
    return f"; vLLM {', '.join(have)} (already on this machine) {'serves' if len(have) == 1 else 'serve'} it" \
        if have else ""


def window_of(text) -> int | None:
    """HF's window; 0 is none (vLLM's ``ModelConfig`` turns ``sliding_window: 0`` into None)."""
    w = getattr(text, "sliding_window", None)
    return int(w) if isinstance(w, int) and not isinstance(w, bool) and w > 0 else None


def layer_windows(effect: str, kinds: tuple, w: int | None) -> dict[str, int | None]:
    """kind -> the ``sliding_window`` the layer hands ``FlashInferImpl`` (HF's count, inclusive)."""
    if effect == "cache":  # model-level: only where every layer slides (engine/arg_utils.py)
        every = w if all(k == cc.SLIDING for k in kinds) else None
        return {k: every for k in (cc.SLIDING, cc.FULL) if k in kinds}
    add = 1 if effect == "+1" else 0
    return {k: (w + add if k == cc.SLIDING and w is not None else None) for k in (cc.SLIDING, cc.FULL) if k in kinds}


# an encoder-only layer (0.34.0 modernbert.py:110 ``EncoderOnlyAttention(``): bidirectional, which the
# backend refuses (0.34.0 flashinfer.py:2083 ``if attn_type != AttentionType.DECODER: raise NotImplementedError``);
# only where the files build no other attention: gemma3.py / llama.py pick ``EncoderOnlyAttention`` for a
# bidirectional config only (0.31.0 gemma3.py:181-189 ``attn_cls = ... ; self.attn = attn_cls(``)
ENCODER = r"\bEncoderOnlyAttention\("
DECODER_CALL = r"\b(Attention|attn_cls)\("
DECODER_ONLY = r"if attn_type != AttentionType\.DECODER"
BACKEND = "vllm/v1/attention/backends/flashinfer.py"


def encoder_refusal(overlay: Path, files: list[Path]) -> tuple[str, str] | None:
    """(the model file's encoder-only line, the release's refusal of it) where the files that build the
    attention build only ``EncoderOnlyAttention``, else None. Why one rule for ``--model PATH`` and the
    table's columns (``archs.column`` resolves through here): driven as a decoder, a bidirectional layer
    reads as a window off by one against transformers' causal mask, a finding the release never reaches,
    since ``FlashInferImpl`` takes decoder attention only."""
    enc = registry.line_of(overlay, files, ENCODER)
    if not enc or any(re.search(DECODER_CALL, registry._text(f)) for f in files):
        return None
    p = overlay / BACKEND
    hit = registry.line_of(overlay, [p], DECODER_ONLY) if p.is_file() else None
    return enc, (f"encoder-only attention ({enc}): FlashInferImpl takes decoder attention only "
                 f"({hit or BACKEND + ': its attn_type check not found'})")


def resolve(ck: cc.Checkpoint, version: str, overlay: Path) -> dict:
    """The checkpoint's per-kind parameters for the release in ``overlay``, each with its source
    (``vllm.families.resolve``'s shape)."""
    files = model_file(ck, version, overlay)
    text = ck.text_config()
    nq = int(text.num_attention_heads)
    hd = int(getattr(text, "head_dim", None) or int(text.hidden_size) // nq)
    nkv = int(getattr(text, "num_key_value_heads", None) or nq)
    w, kinds = window_of(text), cc.layer_kinds(text)
    effect, wsrc = registry.window(overlay, files)
    cap_line, sink_line = registry.line_of(overlay, files, registry.CAP), registry.line_of(overlay, files, registry.SINKS)
    qpas_line = registry.line_of(overlay, files, registry.QPAS)
    hf_cap = float(getattr(text, "attn_logit_softcapping", None) or 0.0) or None
    qpas = getattr(text, "query_pre_attn_scalar", None)
    scale = float(qpas) ** -0.5 if qpas_line and qpas else hd ** -0.5
    windows = layer_windows(effect, kinds, w)
    layers = {k: {"sliding_window": win, "logits_soft_cap": hf_cap if cap_line else None, "scale": scale,
                  "sinks": bool(sink_line), "hf_window_left": w - 1 if k == cc.SLIDING and w else -1}
              for k, win in windows.items()}
    sources = {"window": wsrc, "cap": cap_line or "no line passes attn_logit_softcapping to the layer",
               "scale": qpas_line or "head_dim ** -0.5 (no query_pre_attn_scalar line)",
               "sinks": (sink_line + (" (None for some configs in the model file: audited as passed)"
                                      if registry.sinks_conditional(files) else "")) if sink_line else "no sinks passed", "files": ", ".join(registry.rel(overlay, f) for f in files)}
    out = {"family": ck.architecture, "num_qo_heads": nq, "num_kv_heads": nkv, "head_dim": hd,
           "hf_sliding_window": w, "hf_cap": hf_cap, "layers": layers, "sources": sources,
           "how": f"the user's config ({ck.config_class.split(' ')[0]} for the rest) + the release's model-file "
                  "line per value", "layer_kinds": sorted(set(kinds))}
    enc = encoder_refusal(overlay, files)
    if enc:
        out["encoder_only"], out["refused"] = enc
    if effect == "other":
        out["error"] = (f"the window reaches the layer from another expression ({wsrc}); the audit does not "
                        "model it")
    if not layers:
        out["error"] = f"no sliding or full attention layer ({', '.join(sorted(set(kinds)))})"
    return out
