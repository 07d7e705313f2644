"""A user's checkpoint for ``audit --sglang X --model PATH``: its ``config.json`` read, checked and
cut to a few layers whose values are the user's.

``--model`` takes a ``config.json``, a folder holding one, or a family name (``families``: a
shortcut to a published config, transformers' class defaults). A checkpoint is read as a server
reads it, without weights and without network:

* ``architectures[0]`` names the model class; the release serves it when one of its
  ``srt/models/*.py`` lists it in ``EntryClass`` (sglang's ``ModelRegistry`` rule, read with ``ast``:
  ``model_configs.model_file_in``), else through its Transformers fallback where transformers has a
  class of that name (:func:`fallback_serves`; the audit's child builds it as the release's loader picks);
* the values are the user's; keys the file lacks are what transformers' config class for its
  ``model_type`` sets (a class default, or computed from the user's values: ``layer_types`` from
  ``sliding_window_pattern`` / ``max_window_layers``), each labelled ``"user"`` or ``"default"``. A
  ``model_type`` transformers has no class for (a remote-code model) is read as a plain
  ``PretrainedConfig`` carrying the JSON's values (no defaults beyond PretrainedConfig's own); the
  audit's child registers the same plain class for that ``model_type`` with ``AutoConfig``
  (``family_build.plain_config_class``) so the release's ``ModelConfig`` reads the file without
  remote code;
* the small config given to the release (``SmallConfig``) is the user's file with
  ``num_hidden_layers`` cut to the shortest prefix holding every layer kind (at least 2) and
  ``layer_types`` written out as the full config has them, so the release builds the real layers.

Bad input is one line (``UsageError``, exit 2) before any audit work: a file that does not parse,
no ``architectures``, an architecture the release lacks, a key the release's model class reads
(``config_reads``) that neither the file nor the class default has.
"""

from __future__ import annotations

from pathlib import Path

from swa_repro.core import checkpoint_config as cc
from swa_repro.core.checkpoint_config import layer_kinds, looks_like_path
from swa_repro.core.errors import UsageError
from swa_repro.engine.families import FAMILIES, MODELS, SmallConfig
from swa_repro.sglang import families as fam
from swa_repro.sglang import model_configs as mc
from swa_repro.sglang.swa_archs import FALLBACK_FILE


class Checkpoint(cc.Checkpoint):
    """One ``config.json`` as read (``core.checkpoint_config``), with its sglang family."""

    @property
    def family(self) -> str:
        """The family whose architecture this is (its remedy and server facts), else the architecture."""
        return next((f for f, (_, _, a) in MODELS.items() if a == self.architecture), self.architecture)


def model_arg(text: str | None, gpu: str | None):
    """``--model`` -> a :class:`Checkpoint` (a path) or the family names (``families.check_args``)."""
    if text and not all(x.strip() in (*FAMILIES, "all", "") for x in text.split(",")) and looks_like_path(text):
        fam.check_args("all", gpu)
        return read(text)
    return fam.check_args(text, gpu)[0]


def read(text: str) -> Checkpoint:
    """The file read and parsed (no release asked yet)."""
    return cc.read(text, "sglang", FAMILIES, Checkpoint)


# ----------------------------------------------------------------------------- against a release
def check_release(ck: Checkpoint, version: str, overlay: Path) -> Path:
    """The release's model file for the checkpoint's architecture; one line when it has none, or when
    building the model class reads a key the config lacks (``config_reads``' build reads: the
    constructor, not ``load_weights`` or a branch only some configs take; a key a sub-config or the
    release's own config class sets counts as set: ``Checkpoint.has``)."""
    from swa_repro.engine.config_reads import config_reads

    models = overlay / "sglang" / "srt" / "models"
    path = mc.model_file_in(models, ck.architecture)
    if path is None and fallback_serves(ck.architecture, models):
        return models / FALLBACK_FILE  # the release builds transformers' own class: its config class reads the keys
    if path is None:
        raise UsageError(f"--model {ck.path}: {ck.architecture} is not in sglang {version}'s models/ (no EntryClass "
                         f"lists it) and transformers has no class of that name for its Transformers fallback"
                         f"{served_by(ck.architecture, version, overlay)}")
    missing = [(k, w) for k, w in config_reads(path, ck.architecture, branches=False, build_only=True).items()
               if not ck.has(k)]
    provided = release_provides(ck, version, overlay) if missing else frozenset()  # once, not per key
    for key, where in missing:
        if key not in provided:
            raise UsageError(f"--model {ck.path} lacks {key}, which sglang {version}'s {where} reads and "
                             f"{ck.config_class.split(' ')[0]} does not default: add it to the config")
    return path


def release_provides(ck: Checkpoint, version: str, overlay: Path) -> frozenset:
    """The keys the release's own config class for the file's ``model_type`` sets (its defaults and
    attributes), where its ``_CONFIG_REGISTRY`` has one: the release re-parses every such file through
    that class (0.5.23 utils/hf_transformers/config.py:281-295), so a key it defaults is no missing key.
    stepfun-ai/Step-3.5-Flash's config.json has no ``rms_norm_eps``, which 0.5.23 step3p5.py:518 reads
    and configs/step3p5.py:19 defaults. Asked only when a key is missing and a ``configs/*.py`` of the
    release declares the file's ``model_type`` (the registry is read in a child: no work for a file the
    release has no class for)."""
    from swa_repro.sglang import release_configs
    from swa_repro.sglang.config_routes import declares_model_type

    mt, configs = ck.values.get("model_type"), overlay / "sglang" / "srt" / "configs"
    if ck.provides or not isinstance(mt, str) or not configs.is_dir() or not declares_model_type(configs, mt):
        return ck.provides
    rel = release_configs.registry(version, overlay).get("types", {}).get(mt, {})
    return frozenset([*rel.get("attrs", []), *rel.get("defaults", {})])


def fallback_serves(arch: str, models: Path) -> bool:
    """Whether a server of the release runs ``arch`` through its Transformers fallback: no ``EntryClass``
    lists it, the release has ``models/transformers.py`` and transformers has a class of that name (the
    release's rule: 0.5.23 model_loader/utils.py:230-231 ``not is_native_supported`` ->
    ``resolve_transformers_arch``, :143 ``getattr(transformers, arch, None)``; a class transformers marks
    not backend-compatible is refused there, :181-188, which the audit's build then says)."""
    import transformers

    return (models / FALLBACK_FILE).is_file() and getattr(transformers, arch, None) is not None


def served_by(arch: str, version: str, overlay: Path) -> str:
    """``; sglang 0.5.14, 0.5.16 serve it`` from the other releases already on this machine (cheap)."""
    from swa_repro.core.versions import sglang_release_key as parse

    root = overlay.parent
    have = []
    for d in sorted(root.iterdir() if root.is_dir() else [], key=lambda d: d.name):
        models = d / "sglang" / "srt" / "models"
        if d.name != version and models.is_dir() and mc.model_file_in(models, arch) is not None:
            have.append(d.name)
    try:
        have.sort(key=parse)
    except UsageError:
        pass
    verb = "serves" if len(have) == 1 else "serve"
    return f"; sglang {', '.join(have)} (already on this machine) {verb} it" if have else ""


# ----------------------------------------------------------------------------- the small config
def small_config(ck: Checkpoint) -> SmallConfig:
    """The user's config cut to the shortest prefix (at least 2 layers) holding every layer kind."""
    text = ck.text_config()
    kinds = layer_kinds(text)
    n = min(len(kinds), max([2] + [kinds.index(k) + 1 for k in set(kinds)]))
    cut = {"num_hidden_layers": n}
    if getattr(text, "layer_types", None):
        cut["layer_types"] = list(text.layer_types[:n])
    d = {k: v for k, v in ck.values.items() if k != "auto_map"}  # no remote code: the class or a plain one
    if isinstance(d.get("text_config"), dict) and text is not ck.config:
        d["text_config"] = {**d["text_config"], **per_layer_cut(d["text_config"], len(kinds), n),
                            **pattern_cut(d["text_config"], cut.get("layer_types")), **cut}
    else:
        d.update({**per_layer_cut(d, len(kinds), n), **pattern_cut(d, cut.get("layer_types")), **cut})
    nq = int(text.num_attention_heads)
    hd = getattr(text, "head_dim", None) or int(text.hidden_size) // nq
    # the model's layer count, not layer_types' length: Step-3.5-Flash's lists 48 kinds for 45 layers
    # (its 3 MTP layers', num_nextn_predict_layers; 0.5.23 step3p5.py builds num_hidden_layers)
    full = int(getattr(text, "num_hidden_layers", None) or len(kinds))
    return SmallConfig(ck.family, d, kinds[:n], full, getattr(text, "sliding_window", None), int(hd), nq,
                           int(getattr(text, "num_key_value_heads", None) or nq),
                           float(getattr(text, "attn_logit_softcapping", None) or 0.0),
                           ck.config_class.split(" ")[0].removeprefix("transformers."))


def per_layer_cut(values: dict, full: int, n: int) -> dict:
    """The config's other per-layer lists (a ``*layer*`` key, one entry per layer) cut with the layers:
    a class checks them against ``num_hidden_layers`` (0.5.23 configs/beam.py:142-144 ``mlp_layer_types
    length must equal num_hidden_layers``)."""
    return {k: v[:n] for k, v in values.items() if "layer" in k and k != "layer_types" and isinstance(v, list)
            and len(v) == full > n}


def pattern_cut(values: dict, layer_types: list | None) -> dict:
    """A layer pattern the config class composes itself, cut with the layers: 0.5.23
    configs/iquest_q1.py:73-84 builds ``layer_types`` as ``first_layers_types + hybrid_layers_types_block
    * num_hybrid_layers_block + last_layers_types`` and refuses a count it does not match ("layer type
    pattern has length 88, expected 3"). The cut's own kinds become the first part, the repeated block
    runs 0 times, the other parts are empty: the class then composes exactly the cut."""
    parts = [k for k, v in values.items() if k.endswith("layers_types") and k != "layer_types" and isinstance(v, list)]
    repeats = [k for k, v in values.items() if k.startswith("num_") and k.endswith("_block") and isinstance(v, int)]
    first = [k for k in parts if k.startswith("first")]
    if not layer_types or len(first) != 1 or not repeats:
        return {}
    return {**{k: [] for k in parts}, first[0]: list(layer_types), **{k: 0 for k in repeats}}


def record(ck: Checkpoint) -> dict:
    """What the answer says it read, each attention value with its origin (``core.checkpoint_config.record``)."""
    return cc.record(ck)
