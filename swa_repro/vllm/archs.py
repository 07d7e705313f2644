"""The vLLM table's architecture columns: every architecture a release serves with a sliding window,
beside the table's named families (issue #41 item 4; the parent side, nothing of vLLM imported).

Why: the table answered for 5 hand-picked families; a release's ``models/`` serves ~170 architectures
whose attention gets a window (0.34.0). The list follows the release, read off its files
(``registry``): an architecture its registry serves whose attention files hand ``Attention`` a
``per_layer_sliding_window`` (``registry.window``), or hand none but read ``sliding_window`` /
``layer_types`` / ``use_sliding_window`` off the config (the window then reaches the layer as vLLM's
model-level ``cache_config.sliding_window``: ``registry.cache_line``).

Each column is built like a user's checkpoint (``checkpoint.resolve``) from the architecture's published
config, at its values:

* transformers' config class for the ``model_type`` whose auto mapping names the architecture (its
  defaults: what a published ``config.json`` of that type holds beside the keys it sets);
* else the release's own config class (``vllm/transformers_utils/configs``) that its model file imports,
  at the defaults its ``__init__`` declares (constants, read with ``ast``);
* **not built**, saying why, where its model file reads a window but builds no vLLM ``Attention`` (0.20.0
  deepseek_v4.py: an MLA layer of its own, which FlashInfer's ``FlashInferImpl`` does not serve), where
  there is no config, where those defaults set no sliding layer (the window comes from a checkpoint:
  ``--model PATH`` audits one), or where the release's model file reads a key the class lacks
  (``checkpoint.check_reads``' line).

Sinks the FlashInfer backend cannot take are not skipped: the column is driven with them
(``sources.sinks``: the model file's line) and the release's ``validate_configuration`` /
``supports_sink`` refuses it on that GPU class, as the table's gpt-oss. Columns asking the same
parameters are driven once (:func:`groups`): the fork's answer depends on nothing else.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from functools import cache
from pathlib import Path

from swa_repro.core import checkpoint_config as cc
from swa_repro.core.errors import UsageError
from swa_repro.engine import families as ef
from swa_repro.vllm import registry
from swa_repro.vllm.families import FAMILIES

CONFIGS = "vllm/transformers_utils/configs"
# a model file that passes no per-layer window but reads one off the config (qwen2.py's use_sliding_window)
READS = r"config\.(sliding_window|layer_types|use_sliding_window)\b|[\"'](sliding_window|layer_types|use_sliding_window)[\"']"
NOT_BUILT = "not built"


def family_archs() -> set[str]:
    """The table's named families' architectures (their own columns already)."""
    return {ef.MODELS[f][2] for f in FAMILIES}


def discover(overlay: Path) -> dict[str, dict]:
    """architecture -> {``effect``, ``window``: the line that hands the layer its window} (module docstring)."""
    out, reg = {}, registry.served(overlay)
    for arch in sorted(reg):
        files = registry.attention_files(overlay, arch)
        if not files:  # its attention is a layer of its own (0.20.0 deepseek_v4.py: an MLA wrapper)
            hit = registry.line_of(overlay, registry.module_files(overlay, reg[arch][0]), r"config\.sliding_window\b")
            if hit:
                out[arch] = {"effect": "own", "window": hit}
            continue
        effect, where = registry.window(overlay, files)
        if effect == "cache":
            hit = registry.line_of(overlay, files, READS)
            if hit is None:
                continue
            where = f"{hit} (no per-layer window: {where})"
        out[arch] = {"effect": effect, "window": where}
    return out


def release_config(overlay: Path, arch: str) -> tuple[str, str, dict] | None:
    """The release's own config class the architecture's model file imports (``from
    vllm.transformers_utils.configs... import XConfig``) -> (model_type, ``file:line class``, its
    ``__init__``'s constant defaults); None where it imports none with a ``model_type``."""
    module = registry.served(overlay)[arch][0]
    files = registry.module_files(overlay, module) + registry.attention_files(overlay, arch)
    names = [n for f in files for m in re.finditer(r"from vllm\.transformers_utils\.configs[\w.]* import \(?([\w,\s]+)\)?",
                                                   registry._text(f)) for n in re.split(r"[,\s]+", m.group(1)) if n]
    for name in names:
        got = _config_class(str(overlay / CONFIGS), name)
        if got:
            return got
    return None


@cache
def _config_class(folder: str, name: str) -> tuple[str, str, dict] | None:
    for f in sorted(Path(folder).rglob("*.py")):
        for node in ast.parse(f.read_text(errors="replace")).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                mt = next((s.value.value for s in node.body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)
                           and any(getattr(t, "id", "") == "model_type" for t in s.targets)), None)
                init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
                if mt is None or init is None:
                    return None
                args = init.args.args[-len(init.args.defaults):] if init.args.defaults else []
                pairs = list(zip(args, init.args.defaults)) + list(zip(init.args.kwonlyargs, init.args.kw_defaults))
                defaults = {}
                for a, d in pairs:
                    try:
                        defaults[a.arg] = ast.literal_eval(d) if d is not None else None
                    except ValueError:
                        continue
                where = f"{CONFIGS}/{f.relative_to(folder)}:{node.lineno} {name}"
                return mt, where, defaults
    return None


class NotBuilt(Exception):
    """A column with no config to build (its whole ``not built`` line)."""


def column_config(arch: str, version: str, overlay: Path) -> cc.Checkpoint:
    """The config a column is built from (module docstring); :class:`NotBuilt` where none."""
    import transformers

    mt = cc.auto_model_types().get(arch)
    how = f"--model PATH/config.json: swa-repro audit --vllm {version} --model PATH"
    if mt is not None:
        values = {"architectures": [arch], "model_type": mt}
        name, cfg = cc.config_object(values, f"transformers defaults of model_type {mt}")
        ck = cc.Checkpoint(arch, f"transformers defaults of model_type {mt}", values, arch, name, cfg)
    else:
        got = release_config(overlay, arch)
        if got is None:
            raise NotBuilt(f"no published config: transformers {transformers.__version__} maps no model_type to {arch} "
                           f"and its model file imports no config class of the release's {CONFIGS}; audit its "
                           f"checkpoint ({how})")
        mt, where, defaults = got
        values = {**defaults, "architectures": [arch], "model_type": mt}
        name, cfg = cc.config_object(values, f"vLLM {version}'s {where}")
        ck = cc.Checkpoint(arch, f"vLLM {version}'s {where} defaults", values, arch, f"{where} (vLLM {version})", cfg,
                           frozenset(defaults))
    text = ck.text_config()
    try:
        kinds = cc.layer_kinds(text)
    except (AttributeError, TypeError, ValueError) as e:  # a composite class whose text part a checkpoint gives
        what = f"its defaults leave {e.name} unset" if getattr(e, "name", None) else str(e)[:160]
        raise NotBuilt(f"not buildable from {ck.path}: {what}; audit its checkpoint ({how})") from None
    if cc.SLIDING not in kinds:
        raise NotBuilt(f"no sliding layer at {ck.path} (sliding_window={getattr(text, 'sliding_window', None)!r}, "
                       f"layer_types={_short(getattr(text, 'layer_types', None))}): the window comes from a checkpoint; "
                       f"audit one ({how})")
    return ck


def _short(x) -> str:
    return repr(x) if not isinstance(x, (list, tuple)) or len(x) <= 4 else f"[{', '.join(map(repr, x[:4]))}, ... ({len(x)})]"


def column(arch: str, facts: dict, version: str, overlay: Path) -> dict:
    """One column: ``{"fam": checkpoint.resolve's document}`` to drive, or ``{"not_built": why}``;
    with the discovery's facts and the config it came from."""
    from swa_repro.vllm import checkpoint

    out = {"architecture": arch, "model": registry.served(overlay)[arch][0], **facts}
    if facts.get("effect") == "own":
        return {**out, "not_built": f"not served by FlashInferImpl: its model file builds no vLLM Attention layer and "
                "hands the window it reads to an attention of its own (an MLA or other backend chooses its kernels): "
                f"{facts['window']}"}
    try:
        ck = column_config(arch, version, overlay)
        out["config"] = ck.path
        fam = checkpoint.resolve(ck, version, overlay)
    except NotBuilt as e:
        return {**out, "not_built": str(e)}
    except UsageError as e:
        return {**out, "not_built": f"not buildable from {out.get('config', 'its config')}: "
                + str(e).removeprefix(f"--model {out.get('config')} ").removesuffix(": add it to the config")[:300]}
    except (TypeError, ValueError, AttributeError) as e:
        return {**out, "not_built": f"not buildable from {out.get('config')}: {type(e).__name__}: {str(e)[:200]}"}
    fam["how"] = f"{ck.path} + the release's model-file line per value"
    return {**out, "fam": fam}  # an encoder-only one carries the release's refusal (checkpoint.encoder_refusal)


def plan(version: str, overlay: Path) -> dict[str, dict]:
    """architecture -> its column (:func:`column`), the table's named families' aside."""
    from transformers.utils import logging as tl

    skip, level = family_archs(), tl.get_verbosity()
    tl.set_verbosity_error()  # a class's own warnings about its defaults (token ids past a small vocabulary)
    try:
        return {a: column(a, facts, version, overlay) for a, facts in discover(overlay).items() if a not in skip}
    finally:
        tl.set_verbosity(level)


def key(fam: dict) -> str:
    """What a fork's answer depends on: the heads, head_dim and the per-kind parameters."""
    part = {k: fam[k] for k in ("num_qo_heads", "num_kv_heads", "head_dim", "layers")}
    return hashlib.sha256(json.dumps(part, sort_keys=True, default=str).encode()).hexdigest()[:12]


def groups(columns: dict[str, dict]) -> tuple[list[dict], dict[str, str]]:
    """-> (the distinct families to drive, each named ``cols-<key>``; architecture -> that name)."""
    drive, of = {}, {}
    for arch, c in columns.items():
        if "fam" not in c or c["fam"].get("error") or c["fam"].get("refused"):
            continue
        name = f"cols-{key(c['fam'])}"
        drive.setdefault(name, {**c["fam"], "family": name})
        of[arch] = name
    return list(drive.values()), of
