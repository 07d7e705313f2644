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

* the release's own config class where its registry (``_CONFIG_REGISTRY``) names one for that
  ``model_type`` (vLLM's loader parses such a checkpoint through it), or, for an architecture transformers
  has no ``model_type`` for, the registry class that declares it, that its model file names, or that the
  config module of its own name defines: built with its defaults in a child with the release's code
  (``release_configs``: its ``__init__``'s derived ``layer_types``, its text part's sub-config);
* else transformers' config class for the ``model_type`` whose auto mapping names the architecture (its
  defaults: what a published ``config.json`` of that type holds beside the keys it sets);
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
from pathlib import Path

from swa_repro.core import checkpoint_config as cc
from swa_repro.core.errors import UsageError
from swa_repro.engine import families as ef
from swa_repro.vllm import registry
from swa_repro.vllm.families import FAMILIES

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


def imported_names(overlay: Path, arch: str) -> set[str]:
    """Every name the architecture's module and attention files import or use (their config class among them)."""
    from swa_repro.engine.config_classes import names_in

    files = registry.module_files(overlay, registry.served(overlay)[arch][0]) + registry.attention_files(overlay, arch)
    return names_in(ast.parse(registry._text(f)) for f in files)


def release_checkpoint(arch: str, mt: str, entry: dict, version: str) -> cc.Checkpoint:
    """The release's own class built with its defaults (``release_configs``: in a child) as a checkpoint:
    its ``to_dict()``, its text part the sub-config object it builds (a dict in the plain config else)."""
    where = f"{entry['where']} {entry['class']} (vLLM {version})"
    values = {**entry["defaults"], "architectures": [arch], "model_type": mt}
    _, cfg = cc.config_object(values, f"vLLM {version}'s {where}")
    if entry.get("text"):
        t = entry["text"]
        _, text = cc.config_object({**t["defaults"], "model_type": t["model_type"]}, f"{where}'s {t['class']}")
        cfg.text_config = text
    return cc.Checkpoint(arch, f"vLLM {version}'s {where} defaults", values, arch, where, cfg,
                         frozenset(entry.get("attrs", ())) | frozenset(entry["defaults"]))


class NotBuilt(Exception):
    """A column with no config to build (its whole ``not built`` line)."""


def column_config(arch: str, version: str, overlay: Path) -> cc.Checkpoint:
    """The config a column is built from (module docstring); :class:`NotBuilt` where none."""
    import transformers

    from swa_repro.vllm import release_configs

    mt = cc.auto_model_types().get(arch)
    how = f"--model PATH/config.json: swa-repro audit --vllm {version} --model PATH"
    reg = release_configs.registry(version, overlay)
    types = reg["types"]
    own = mt if mt in types else release_configs.model_type_for(
        arch, registry.served(overlay)[arch][0], imported_names(overlay, arch), types)
    if own is not None:  # the release parses this model_type through its own class (transformers_utils/config.py)
        if types[own].get("error"):
            raise NotBuilt(f"no published config here: vLLM {version}'s own class for model_type {own} "
                           f"({types[own]['where']} {types[own]['class']}) does not build from its defaults "
                           f"({types[own]['error']}); audit its checkpoint ({how})")
        ck = release_checkpoint(arch, own, types[own], version)
    elif mt is not None:
        values = {"architectures": [arch], "model_type": mt}
        name, cfg = cc.config_object(values, f"transformers defaults of model_type {mt}")
        ck = cc.Checkpoint(arch, f"transformers defaults of model_type {mt}", values, arch, name, cfg)
    else:
        raise NotBuilt(f"no published config: transformers {transformers.__version__} maps no model_type to {arch} "
                       "and no config class of the release's registry (transformers_utils/config.py "
                       "_CONFIG_REGISTRY) declares it, is named by its model file or is defined beside its name"
                       f"{'; ' + reg['error'] if reg.get('error') else ''}; audit its checkpoint ({how})")
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
                + str(e).removeprefix(f"--model {out.get('config')} ").removesuffix(": add it to the config")[:400]}
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
