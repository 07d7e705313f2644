"""A user's checkpoint for ``audit --sglang X --model PATH``: its ``config.json`` read, checked and
cut to a few layers whose values are the user's.

``--model`` takes a ``config.json``, a folder holding one, or a family name (``families``: a
shortcut to a published config, transformers' class defaults). A checkpoint is read as a server
reads it, without weights and without network:

* ``architectures[0]`` names the model class; the release serves it when one of its
  ``srt/models/*.py`` lists it in ``EntryClass`` (sglang's ``ModelRegistry`` rule, read with ``ast``:
  ``model_configs.model_file_in``);
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

import os
from dataclasses import dataclass
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.core.inputs import read_json
from swa_repro.sglang import families as fam
from swa_repro.sglang import model_configs as mc

# The values the audit reads of a checkpoint's attention, reported with where each came from.
ATTENTION_KEYS = ("sliding_window", "layer_types", "sliding_window_pattern", "use_sliding_window",
                  "max_window_layers", "attn_logit_softcapping", "final_logit_softcapping", "head_dim",
                  "num_attention_heads", "num_key_value_heads", "hidden_size", "num_hidden_layers",
                  "query_pre_attn_scalar")
USER, DEFAULT = "user", "default"


@dataclass(frozen=True)
class Checkpoint:
    """One ``config.json`` as read (before a release is asked)."""
    arg: str  # what --model said
    path: str  # the config.json read
    values: dict  # the file's JSON
    architecture: str
    config_class: str  # "transformers.Gemma2Config" or "PretrainedConfig (plain: ...)"
    config: object  # the config object: the user's values, the class filling the rest

    @property
    def family(self) -> str:
        """The family whose architecture this is (its remedy and server facts), else the architecture."""
        return next((f for f, (_, _, a) in mc.MODELS.items() if a == self.architecture), self.architecture)

    def text_config(self):
        """The config holding the layers (a multimodal config's ``text_config``)."""
        get = getattr(self.config, "get_text_config", None)
        return get() if get else self.config


def looks_like_path(text: str) -> bool:
    """A ``--model`` that names a file or folder rather than families."""
    return os.path.exists(text) or text.endswith(".json") or os.sep in text or text.startswith(".")


def model_arg(text: str | None, gpu: str | None):
    """``--model`` -> a :class:`Checkpoint` (a path) or the family names (``families.check_args``)."""
    if text and not all(x.strip() in (*fam.FAMILIES, "all", "") for x in text.split(",")) and looks_like_path(text):
        fam.check_args("all", gpu)
        return read(text)
    return fam.check_args(text, gpu)[0]


def config_path(text: str) -> Path:
    p = Path(text).expanduser()
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise UsageError(f"--model {text}: the folder holds no config.json; give the checkpoint's folder or its "
                             "config.json")
    elif not p.exists():
        raise UsageError(f"--model {text}: no such file or folder; give a checkpoint's config.json, a folder holding "
                         f"one, or a family ({', '.join(fam.FAMILIES)})")
    return p


def read(text: str) -> Checkpoint:
    """The file read and parsed (no release asked yet)."""
    p = config_path(text)
    values = read_json(p, "--model")
    arch = values.get("architectures")
    if not isinstance(arch, list) or not arch or not isinstance(arch[0], str) or not arch[0]:
        raise UsageError(f"--model {p} has no architectures (e.g. \"architectures\": [\"Gemma2ForCausalLM\"]): "
                         "sglang picks the model class by it")
    cls_name, cfg = config_object(values, p)
    return Checkpoint(text, str(p), values, arch[0], cls_name, cfg)


def config_object(values: dict, p) -> tuple[str, object]:
    """transformers' class for ``model_type`` built from the values, else a plain PretrainedConfig."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    mt = values.get("model_type")
    if isinstance(mt, str) and mt in CONFIG_MAPPING:
        cls, name = CONFIG_MAPPING[mt], f"transformers.{CONFIG_MAPPING[mt].__name__}"
    else:
        cls = transformers.PretrainedConfig
        name = f"PretrainedConfig (plain: transformers {transformers.__version__} has no class for model_type {mt!r})"
    try:
        return name, cls.from_dict(dict(values))
    except Exception as e:  # noqa: BLE001 - a class's own validators (huggingface_hub's strict dataclasses)
        raise UsageError(f"--model {p}: {name.split(' ')[0]} refuses the file: {str(e).splitlines()[0][:160]}") \
            from None


# ----------------------------------------------------------------------------- against a release
def check_release(ck: Checkpoint, version: str, overlay: Path) -> Path:
    """The release's model file for the checkpoint's architecture; one line when it has none, or when
    the model class reads a key the config lacks."""
    from swa_repro.sglang.config_reads import config_reads

    models = overlay / "sglang" / "srt" / "models"
    path = mc.model_file_in(models, ck.architecture)
    if path is None:
        raise UsageError(f"--model {ck.path}: {ck.architecture} is not in sglang {version}'s models/ (no EntryClass "
                         f"lists it){served_by(ck.architecture, version, overlay)}")
    text = ck.text_config()
    for key, where in config_reads(path, ck.architecture).items():
        if key not in ck.values and not hasattr(ck.config, key) and not hasattr(text, key):
            raise UsageError(f"--model {ck.path} lacks {key}, which sglang {version}'s {where} reads and "
                             f"{ck.config_class.split(' ')[0]} does not default: add it to the config")
    return path


def served_by(arch: str, version: str, overlay: Path) -> str:
    """``; sglang 0.5.14, 0.5.16 serve it`` from the other releases already on this machine (cheap)."""
    from swa_repro.sglang.provision import parse

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
def small_config(ck: Checkpoint) -> fam.SmallConfig:
    """The user's config cut to the shortest prefix (at least 2 layers) holding every layer kind."""
    text = ck.text_config()
    kinds = fam.layer_kinds(text)
    n = min(len(kinds), max([2] + [kinds.index(k) + 1 for k in set(kinds)]))
    cut = {"num_hidden_layers": n}
    if getattr(text, "layer_types", None):
        cut["layer_types"] = list(text.layer_types[:n])
    d = {k: v for k, v in ck.values.items() if k != "auto_map"}  # no remote code: the class or a plain one
    if isinstance(d.get("text_config"), dict) and text is not ck.config:
        d["text_config"] = {**d["text_config"], **cut}
    else:
        d.update(cut)
    nq = int(text.num_attention_heads)
    hd = getattr(text, "head_dim", None) or int(text.hidden_size) // nq
    return fam.SmallConfig(ck.family, d, kinds[:n], len(kinds), getattr(text, "sliding_window", None), int(hd), nq,
                           int(getattr(text, "num_key_value_heads", None) or nq),
                           float(getattr(text, "attn_logit_softcapping", None) or 0.0),
                           ck.config_class.split(" ")[0].removeprefix("transformers."))


def record(ck: Checkpoint) -> dict:
    """What the answer says it read: the file (``file``: its JSON as read), the class, and each
    attention value with its origin (``keys_from_default``: every key the class set that the file lacks, PretrainedConfig's own aside)."""
    from transformers import PretrainedConfig

    text, raw = ck.text_config(), ck.values.get("text_config") if isinstance(ck.values.get("text_config"), dict) \
        else ck.values
    vals = {}
    for k in ATTENTION_KEYS:
        if k in raw or hasattr(text, k):
            v = raw[k] if k in raw else getattr(text, k)
            vals[k] = {"value": v if isinstance(v, (type(None), bool, int, float, str, list)) else str(v),
                       "from": USER if k in raw else DEFAULT}
    defaulted = []
    if hasattr(text, "to_dict") and type(text) is not PretrainedConfig:  # the class's keys, not PretrainedConfig's
        generic = PretrainedConfig().to_dict()
        defaulted = sorted(k for k in text.to_dict() if k not in raw and k not in generic)
    return {"path": ck.path, "architecture": ck.architecture, "model_type": ck.values.get("model_type"),
            "config_class": ck.config_class, "values": vals, "keys_from_default": defaulted, "file": ck.values}
