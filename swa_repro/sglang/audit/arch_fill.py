"""Values the audit sets where an architecture column's published defaults leave a key unset that the
release's model file reads while it builds (parent side, ``ast`` only; never for a user's checkpoint,
whose missing key stays one line: ``checkpoint.check_release``).

Why: a class's defaults are not a checkpoint. transformers' ``Gemma4Config()`` leaves its
``vision_config`` / ``audio_config`` None, which every published Gemma 4 checkpoint carries and
0.5.23 models/gemma4_mm.py:202-214 builds; ``ExaoneMoeConfig()`` has no ``is_moe_layer``, which
models/exaone_moe.py:497-504 indexes per layer; ``Step3p5Config()`` no ``use_head_wise_attn_gate``
(models/step3p5.py:470). None of these moves the window: each is set to the smallest value the
model file accepts, read at the line that reads it, and said in the column's provenance
(``set_by_audit``: key -> value and why). A window key has no smallest value: it is taken from the
config's own text part where the model file's class reads the same key there (the assistant of
Gemma 4 reads its target's), else the column is not built and says so.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

BOOL_PREFIXES = ("use_", "is_", "has_", "enable_", "with_")


def sub_config_defaults(model_type: str) -> dict:
    """``{key: sub-config defaults}`` for each sub-config transformers' class for ``model_type`` leaves
    None whose class is concrete (``Gemma4Config.sub_configs``' ``vision_config: Gemma4VisionConfig``);
    ``AutoConfig`` (any model_type) is left to a checkpoint."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    inst = cls()
    out = {}
    for key, sub in (getattr(cls, "sub_configs", None) or {}).items():
        if getattr(inst, key, None) is None and isinstance(sub, type) and sub.__name__ != "AutoConfig":
            d = sub().to_dict()
            out[key] = {k: v for k, v in d.items() if not k.startswith("_") and k != "transformers_version"}
    return out


@cache
def _parents(path: Path) -> tuple[ast.Module, dict]:
    """The file's one parse (``config_reads.model_tree``, shared with discovery and the read rules) and
    its parent map."""
    from swa_repro.engine.config_reads import model_tree

    tree = model_tree(Path(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    return tree, parents


def _site(path: Path, key: str, line: int):
    """The ``config.KEY`` / ``self.config.KEY`` load at ``line`` of ``path``, with the parent map."""
    tree, parents = _parents(path)
    node = next((x for x in ast.walk(tree) if isinstance(x, ast.Attribute) and x.attr == key
                 and x.lineno == line and isinstance(x.ctx, ast.Load)), None)
    return node, parents


def _indexed(node, parents) -> bool:
    """``config.K[i]`` (here or elsewhere in the same function), or ``v = config.K`` and ``v[i]`` in the same
    function (exaone_moe.py:497-504)."""
    up = parents.get(node)
    if isinstance(up, ast.Subscript) and up.value is node:
        return True
    fn = up
    while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        fn = parents.get(fn)
    if fn is not None and any(isinstance(x, ast.Subscript) and isinstance(x.value, ast.Attribute) and  # step3p5.py
                              x.value.attr == node.attr and ast.unparse(x.value.value) == ast.unparse(node.value)
                              for x in ast.walk(fn)):  # :432-433 tests config.K, then indexes config.K[layer_id]
        return True
    if isinstance(up, ast.Assign) and len(up.targets) == 1 and isinstance(up.targets[0], ast.Name):
        fn = up
        while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = parents.get(fn)
        name = up.targets[0].id
        return fn is not None and any(isinstance(x, ast.Subscript) and isinstance(x.value, ast.Name)
                                      and x.value.id == name for x in ast.walk(fn))
    return False


def fill(key: str, where: str, models: Path, n_layers: int | None, values: dict):
    """``(value, why)`` for ``key`` read at ``where`` (``file.py:line`` under ``models``), or None when
    only a checkpoint can say (a window the config's text part lacks, a per-layer list of unknown
    length, a read the site does not tell the kind of)."""
    if "window" in key:
        text = values.get("text_config")
        if isinstance(text, dict) and text.get(key) is not None:
            return text[key], f"the config's text_config sets {key}={text[key]!r} (the target's window)"
        return None
    file, _, line = where.rpartition(":")
    node, parents = _site(models / file, key, int(line))
    if node is None:
        return None
    up = parents.get(node)
    if isinstance(up, ast.Compare) and len(up.comparators) == 1 and isinstance(up.ops[0], (ast.Eq, ast.Is)):
        other = up.comparators[0] if up.left is node else up.left
        if isinstance(other, ast.Constant):
            return other.value, f"{where} compares it with {other.value!r}: the one value it accepts"
    if isinstance(up, ast.Subscript) and up.value is node and isinstance(up.slice, ast.Constant) and \
            isinstance(up.slice.value, str):  # a dict of named values (step3p5.py:446-451 attention_other_setting)
        names = _named_items(models / file, key)
        own = next((values[p] for p in TEXT_PARTS if isinstance(values.get(p), dict)), values)
        got = {n: own.get(n, 1) for n in names}
        return got, (f"{where} reads {', '.join(map(repr, names))} of it: the config's own "
                     f"{', '.join(n for n in names if n in own) or 'none'} (1 for any other)")
    if _membership(node, parents):
        return [], f"{where} tests membership in it: an empty list, the smallest container"
    boolish = key.startswith(BOOL_PREFIXES)
    if _indexed(node, parents):
        if not n_layers:
            return None
        v = False if boolish else 1
        return [v] * n_layers, f"{where} indexes it per layer: {v!r} for each of the {n_layers} layers"
    if boolish:
        return False, f"{where} reads a flag: False (off)"
    if isinstance(up, ast.Call) and getattr(up.func, "id", None) == "float":
        return 1e-6, f"{where} reads a float: 1e-06"
    return 1, f"{where} reads a count or size: 1, the smallest"


def _membership(node, parents) -> bool:
    """``x in config.K`` / ``not in``, or ``v = config.K`` and ``x not in v`` in the same function (0.5.10
    step3p5.py:478-479 ``yarn_only_types``, which its Step3p5Config does not define)."""
    def tested(name_of):
        return lambda x: isinstance(x, ast.Compare) and len(x.ops) == 1 and isinstance(x.ops[0], (ast.In, ast.NotIn)) \
            and name_of(x.comparators[0])
    up = parents.get(node)
    if tested(lambda c: c is node)(up):
        return True
    if isinstance(up, ast.Assign) and len(up.targets) == 1 and isinstance(up.targets[0], ast.Name):
        fn, name = up, up.targets[0].id
        while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = parents.get(fn)
        return fn is not None and any(map(tested(lambda c: isinstance(c, ast.Name) and c.id == name), ast.walk(fn)))
    return False


def _named_items(path: Path, key: str) -> list[str]:
    """The string constants ``config.KEY[...]`` is read with anywhere in ``path``, in order."""
    tree, _ = _parents(path)
    out = []
    for x in ast.walk(tree):
        if isinstance(x, ast.Subscript) and isinstance(x.value, ast.Attribute) and x.value.attr == key and \
                isinstance(x.slice, ast.Constant) and isinstance(x.slice.value, str) and x.slice.value not in out:
            out.append(x.slice.value)
    return out


def legacy_keys(model_type: str, values: dict) -> dict:
    """``{key: (value, why)}``: a per-layer key the release reads in the legacy form transformers' class
    folds into its own ``layer_types``, written back through that class's own map. transformers
    5.x configuration_deepseek_v4.py pops ``compress_ratios`` (per-layer 0/4/128) into ``layer_types``
    through ``_COMPRESS_RATIO_TO_LAYER_TYPE``; 0.5.23 configs/model_config.py:1429 reads
    ``hf_config.compress_ratios`` (a published DeepSeek-V4 ``config.json`` carries it)."""
    import importlib

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    mod = importlib.import_module(CONFIG_MAPPING[model_type].__module__)
    out, lt = {}, values.get("layer_types")
    for name, table in vars(mod).items():
        if not (name.startswith("_") and name.endswith("_TO_LAYER_TYPE") and isinstance(table, dict)) or not lt:
            continue
        key = name.strip("_").removesuffix("_TO_LAYER_TYPE").lower() + "s"
        inverse = {t: r for r, t in table.items()}
        if key not in values and all(t in inverse for t in lt):
            why = (f"transformers' {mod.__name__.rsplit('.', 1)[-1]}.py folds {key} into layer_types ({name}); "
                   f"the release reads {key}: written back per layer")
            out[key] = ([inverse[t] for t in lt], why)
    return out


def layer_count(values: dict) -> dict:
    """``{key: (value, why)}``: the layer count of a release class whose defaults leave it unset but
    carry the per-layer pattern it counts from (0.5.23 configs/nemotron_h.py:64-66: ``num_hidden_layers``
    "deprecated ... derived from layers_block_type"), for the text part where the config nests one
    (``text_config`` / ``llm_config``, configs/nano_nemotron_vl.py)."""
    for part in ("text_config", "llm_config", None):
        d = values.get(part) if part else values
        if not isinstance(d, dict) or d.get("num_hidden_layers") is not None:
            continue
        pattern = next((k for k, v in d.items() if isinstance(v, list) and v and "layer" in k and "type" in k
                        and k != "layer_types" and not k.startswith("mtp")), None)
        if pattern:
            n = len(d[pattern])
            why = f"the class leaves num_hidden_layers unset and counts its layers from {pattern} ({n} entries)"
            if part:
                return {part: ({**d, "num_hidden_layers": n}, f"{part}.num_hidden_layers: {why}")}
            return {"num_hidden_layers": (n, why)}
    return {}


# ----------------------------------------------------------------------------- a window the audit sets
AUDIT_WINDOW = 128  # gpt-oss's published window, the smallest of the named families: short prompts pass it
SET_WINDOW = "a window the audit sets"  # how a set_by_audit line starts when the column's window is the audit's
TEXT_PARTS = ("text_config", "llm_config")


def set_window(where: str = "") -> str:
    """The ``set_by_audit`` line of a window key the audit sets (:func:`audit_window`; the fallback's
    columns: ``fallback_cells.audit_pattern``): its value, where the release reads it, and that a checkpoint's
    own window is audited with ``--model PATH``."""
    return (f"{SET_WINDOW}: {AUDIT_WINDOW}{', ' + where if where else ''}; the class defaults set none (a checkpoint's "
            "window: audit it with --model PATH)")


def set_pattern(what: str, n: int) -> str:
    """The ``set_by_audit`` line of the ``layer_types`` the audit writes out: ``every other`` ``what``, ``n`` layers."""
    return f"{SET_WINDOW}: every other {what}, {n} layers"


def audit_window(values: dict, model_file: Path, arch: str, sites=()) -> tuple[dict, dict]:
    """``(values to set, {key: why})`` where a release class's defaults give no window at all (0.5.23
    configs/step3p5.py:29-30 ``layer_types=None, sliding_window=None``): only a checkpoint has one, so the
    column is built at :data:`AUDIT_WINDOW` (the paths size their prompts past any window:
    ``family.family_shape`` ``window + 256``), each window key the model file reads set to it, and where the
    file makes a layer sliding by comparing ``layer_types[i]`` with a constant (models/step3p5.py:442
    ``layer_types[layer_id] == "sliding_attention"``) the pattern written out with that constant. Its
    verdict is conditional: a checkpoint's own window is audited with ``--model PATH`` (never this: a
    user's file decides). ``sites``: where the release hands a layer its window (``swa_archs``' ``file:line``),
    whose ``config.KEY`` counts as read there too (a text model built from ``config.llm_config``, which the
    reads of the outer class do not follow: 0.5.23 nemotron_h.py:743). Empty when no window key the
    defaults leave unset is read."""
    from swa_repro.engine.config_reads import config_reads

    part = next((p for p in TEXT_PARTS if isinstance(values.get(p), dict)), None)
    d = values[part] if part else values
    reads = {**site_keys(model_file.parent, sites), **config_reads(model_file, arch, build_only=True)}
    wins = [k for k in reads if "window" in k and d.get(k) is None]
    if not wins:
        return {}, {}
    new = {k: AUDIT_WINDOW for k in wins}
    why = {k: set_window(f"read at {reads[k]}") for k in wins}
    if "layer_types" in reads and not d.get("layer_types"):
        file, _, _ = reads["layer_types"].rpartition(":")
        consts = pattern_constants(model_file.parent / file)
        slide = next((c for c in consts if "slid" in c), None)
        n = d.get("num_hidden_layers")
        if slide is None or not isinstance(n, int) or n < 1:
            return {}, {}
        full = next((c for c in consts if "full" in c), "full_attention")
        new["layer_types"] = [(slide, full)[i % 2] for i in range(n)]
        why["layer_types"] = set_pattern(f"layer {slide!r} ({file} compares layer_types[i] with it), the others "
                                         f"{full!r}", n)
    if part:
        return {part: {**d, **new}}, {f"{part}.{k}": w for k, w in why.items()}
    return new, why


def pattern_constants(path: Path) -> list[str]:
    """The string constants ``path`` compares a ``layer_types[...]`` element with (``==`` / ``!=``), in order."""
    tree, _ = _parents(path)
    out = []
    for x in ast.walk(tree):
        if isinstance(x, ast.Compare) and len(x.comparators) == 1 and isinstance(x.ops[0], (ast.Eq, ast.NotEq)):
            sides = (x.left, x.comparators[0])
            if any(isinstance(s, ast.Subscript) and "layer_types" in ast.unparse(s.value) for s in sides):
                out += [s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)
                        and s.value not in out]
    return out


def site_keys(models: Path, sites) -> dict:
    """``{key: "file:line"}``: the ``config.KEY`` / ``self.config.KEY`` window keys read at each site."""
    out = {}
    for site in sites:
        file, _, line = site.rpartition(":")
        if not (models / file).is_file():
            continue
        tree, _ = _parents(models / file)
        for x in ast.walk(tree):
            if isinstance(x, ast.Attribute) and x.lineno == int(line) and "window" in x.attr and \
                    ast.unparse(x.value).split(".")[-1] == "config":
                out.setdefault(x.attr, site)
    return out


# ----------------------------------------------------------------------------- a present key in the wrong form
def read_forms(values: dict, files, reads: dict | None = None) -> dict:
    """``{key: (value, why)}`` for a key the defaults give in a form the model file cannot take, or a value
    it refuses outright, rewritten as the file reads it (in the text part where the config nests one):

    * ``config.K.split(",")`` on a list default: the list joined (0.5.23 configs/step3p5.py:35
      ``moe_layers_enum=(3, 4, ...)``, a tuple; models/step3p5.py:544 splits it, as a published
      ``config.json``'s comma string);
    * a number the file indexes per layer (models/step3p5.py:415-461 ``rope_theta = config.rope_theta``, then
      ``rope_theta[layer_id]``): the class's number for each layer;
    * ``assert self.Y == C`` with ``self.Y = getattr(config, "K", d)`` (or ``config.K``) in the same function:
      ``C``, the one value it accepts (models/nemotron_h_mtp.py:222-225 ``num_mtp_layers == 1``)."""
    part = next((p for p in TEXT_PARTS if isinstance(values.get(p), dict)), None)
    d = values[part] if part else values
    out = {}
    for path in files:
        for key, (v, why) in {**_split_forms(path, d), **_assert_forms(path, d), **_scalar_forms(path, d)}.items():
            out.setdefault(key, (v, why))
    if part and out:
        return {part: ({**d, **{k: v for k, (v, _) in out.items()}},
                       "; ".join(f"{part}.{k}: {w}" for k, (_, w) in out.items()))}
    return out


def _config_key(node) -> str | None:
    """``K`` of ``config.K`` / ``self.config.K`` / ``getattr(config, "K", d)``."""
    if isinstance(node, ast.Attribute) and ast.unparse(node.value).split(".")[-1] == "config":
        return node.attr
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2 and \
            ast.unparse(node.args[0]).split(".")[-1] == "config" and isinstance(node.args[1], ast.Constant):
        return node.args[1].value
    return None


@cache
def _form_sites(path: Path) -> tuple[list, list, frozenset, list, dict]:
    """What :func:`read_forms`' three readings look for in ``path``, whatever the config: ``config.K.split(sep)``
    calls ``(K, sep, line)``, ``assert NAME == C`` over ``NAME = config.K`` ``(K, C, NAME, line)``, the keys an
    ``isinstance`` tests, and every ``config.K`` load ``(K, node)``, each in the tree's walk order; the last
    holds :func:`_indexed`'s answers as they are asked. Walked once per file: a plan asked each file ~40
    times (every column's every round), each walking the whole tree three times (~4 CPU-s of 0.5.23's plan)."""
    tree, parents = _parents(path)
    splits, asserts, either, loads = [], [], set(), []
    for x in ast.walk(tree):
        if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr == "split" and \
                len(x.args) == 1 and isinstance(x.args[0], ast.Constant) and isinstance(x.args[0].value, str):
            key = _config_key(x.func.value)
            if key:
                splits.append((key, x.args[0].value, x.lineno))
        if isinstance(x, ast.Call) and x.args and getattr(x.func, "id", None) == "isinstance":
            either.add(_config_key(x.args[0]))  # nemotron_h.py:543: a number or a list, both taken
        if isinstance(x, ast.Attribute) and isinstance(x.ctx, ast.Load):
            key = _config_key(x)
            if key:
                loads.append((key, x))
        if not (isinstance(x, ast.Assert) and isinstance(x.test, ast.Compare) and len(x.test.ops) == 1 and
                isinstance(x.test.ops[0], ast.Eq) and isinstance(x.test.comparators[0], ast.Constant)):
            continue
        name, want = ast.unparse(x.test.left), x.test.comparators[0].value
        fn = x
        while fn is not None and not isinstance(fn, ast.FunctionDef):
            fn = parents.get(fn)
        for st in ast.walk(fn) if fn is not None else []:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and ast.unparse(st.targets[0]) == name:
                key = _config_key(st.value)
                if key:
                    asserts.append((key, want, name, x.lineno))
    return splits, asserts, frozenset(either), loads, {}


def _split_forms(path: Path, d: dict) -> dict:
    out = {}
    for key, sep, line in _form_sites(path)[0]:
        if isinstance(d.get(key), (list, tuple)):
            why = (f"{path.name}:{line} splits it on {sep!r}: the class's default sequence written as the "
                   "string a published config.json carries")
            out[key] = (sep.join(map(str, d[key])), why)
    return out


def _assert_forms(path: Path, d: dict) -> dict:
    out = {}
    for key, want, name, line in _form_sites(path)[1]:
        if key in d and d[key] != want:
            out[key] = (want, f"{path.name}:{line} asserts {name} == {want!r}: the one value it accepts")
    return out


def _scalar_forms(path: Path, d: dict) -> dict:
    _, parents = _parents(path)
    _, _, either, loads, indexed = _form_sites(path)
    n, out = d.get("num_hidden_layers"), {}
    for key, x in loads:
        v = d.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(n, int) and n > 0 and \
                key not in either and key not in out:
            if x not in indexed:
                indexed[x] = _indexed(x, parents)
            if indexed[x]:
                why = f"{path.name}:{x.lineno} indexes it per layer: the class's {v!r} for each of the {n} layers"
                out[key] = ([v] * n, why)
    return out


def none_reads(values: dict, model_file: Path, arch: str) -> list[str]:
    """``["key (file:line)", ...]``: the keys a release class defaults to None that its model file reads while it
    builds: what a checkpoint must supply where the class gives no sizes at all (0.5.23 configs/jet_nemotron.py:29-41
    ``hidden_size``, ``num_attention_heads``, ``layer_types``, ``efficient_attention_config``: None)."""
    from swa_repro.engine.config_reads import config_reads

    reads = config_reads(model_file, arch, build_only=True)
    return [f"{k} ({w})" for k, w in reads.items() if k in values and values[k] is None]
