"""The vLLM table's architecture columns (issue #41 item 4: ``vllm.archs``, ``vllm.arch_table``).

Oracles, each a second route beside ``vllm.archs``':

* the architecture list by text: the release's ``registry.py`` read with a regex (architecture ->
  module) and each module's own file grepped for a window it hands ``per_layer_sliding_window`` or
  one it reads off the config beside an ``Attention(``: every one of them has a column (built, or not
  built with its reason), never dropped;
* a new column's window from transformers' ``configuration_<model_type>.py`` read as text (its
  ``sliding_window: ... = N`` default), not through the config class: the column asks for that window;
* the table's build over a faked child: one fork per distinct parameter set, every column a cell, a
  refusal of a column that passes sinks cites the model file's line, a column not built says why.

The overlays are ``matrix`` (they need the vLLM wheels); the table's assembly runs everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import skip_module_unless

skip_module_unless("transformers")


def _overlay(version: str) -> Path:
    from swa_repro.vllm.provision import provision

    try:
        return provision(version)[0]
    except Exception as e:  # noqa: BLE001 - no cached wheel and no package index
        pytest.skip(f"cannot provision vllm=={version}: {e}")


def _by_grep(overlay: Path) -> set[str]:
    """Architectures whose registry module (one file) hands a window or reads one off the config."""
    models = overlay / "vllm/model_executor/models"
    text = (overlay / "vllm/model_executor/models/registry.py").read_text()
    out = set()
    for a, mod in re.findall(r'^\s*"(\w+)": \(\s*"(\w+)",', text, re.MULTILINE):
        f = models / f"{mod}.py"
        if not f.is_file():
            continue
        src = f.read_text()
        hands = re.search(r"per_layer_sliding_window=(?!per_layer_sliding_window\b|None\b)", src)
        reads = re.search(r"config\.(sliding_window|use_sliding_window)\b", src)
        if hands or reads:
            out.add(a)
    return out


@pytest.mark.matrix
@pytest.mark.parametrize("version", ("0.20.0", "0.34.0"))
def test_every_architecture_whose_file_hands_or_reads_a_window_has_a_column(version):
    from swa_repro.vllm import archs

    overlay = _overlay(version)
    cols = archs.plan(version, overlay)
    want = _by_grep(overlay) - archs.family_archs()
    assert len(want) > 20 and want <= set(cols), sorted(want - set(cols))
    for a, c in cols.items():
        assert ("fam" in c) != ("not_built" in c), a
        if "not_built" in c:
            assert len(c["not_built"]) > 40, (a, c["not_built"])  # says why, and what to do
        rel, line = c["window"].split(":")[:2]
        assert re.search(r"sliding_window|layer_types", (overlay / rel).read_text().splitlines()[int(line) - 1]), a
    assert sum("fam" in c for c in cols.values()) >= 10


def _config_default(model_type: str, key: str = "sliding_window") -> int:
    """transformers' published default of ``key`` for ``model_type``, read as text from its
    ``configuration_<model_type>.py`` (``sliding_window: int | None = 4096``), not through the class."""
    import importlib.util

    root = Path(importlib.util.find_spec("transformers").origin).parent / "models" / model_type
    text = (root / f"configuration_{model_type}.py").read_text()
    return int(re.search(rf"^\s*{key}\s*(?::[^=\n]+)?=\s*(\d+)", text, re.MULTILINE).group(1))


@pytest.mark.matrix
@pytest.mark.parametrize("arch,model_type", [("VaultGemmaForCausalLM", "vaultgemma"),
                                             ("Exaone4ForCausalLM", "exaone4")])
def test_a_new_columns_window_is_its_published_configs(arch, model_type):
    from swa_repro.vllm import archs

    overlay = _overlay("0.34.0")
    facts = archs.discover(overlay)
    assert arch in facts and arch not in archs.family_archs()
    c = archs.column(arch, facts[arch], "0.34.0", overlay)
    w = _config_default(model_type)
    fam = c["fam"]
    assert fam["hf_sliding_window"] == w and fam["layers"]["sliding"]["sliding_window"] == w
    assert fam["layers"]["sliding"]["hf_window_left"] == w - 1 and fam["layers"]["full"]["sliding_window"] is None
    assert fam["sources"]["window"].startswith("vllm/model_executor/models/")


@pytest.mark.matrix
def test_a_column_passing_sinks_is_built_with_them_and_its_line():
    from swa_repro.vllm import archs

    overlay = _overlay("0.34.0")
    cols = archs.plan("0.34.0", overlay)
    sinks = {a: c for a, c in cols.items() if "fam" in c and any(x["sinks"] for x in c["fam"]["layers"].values())}
    assert "OpenAIPrivacyFilterForTokenClassification" in sinks
    for a, c in sinks.items():
        rel, line = c["fam"]["sources"]["sinks"].split(":")[:2]
        assert "sinks=" in (overlay / rel).read_text().splitlines()[int(line) - 1], a


# ----------------------------------------------------------------------------- the table's assembly
def _fam(name: str, window: int, sinks: bool = False) -> dict:
    layer = {"sliding_window": window, "logits_soft_cap": None, "scale": 0.1, "sinks": sinks,
             "hf_window_left": window - 1}
    return {"family": name, "num_qo_heads": 8, "num_kv_heads": 2, "head_dim": 64, "hf_sliding_window": window,
            "hf_cap": None, "layers": {"sliding": layer}, "how": "test",
            "sources": {"window": "m.py:1: w", "sinks": "vllm/model_executor/models/m.py:7: sinks=self.sinks"
                        if sinks else "no sinks passed"}}


def test_the_table_drives_each_parameter_set_once_and_answers_every_column(monkeypatch, tmp_path):
    from swa_repro.engine import families as ef
    from swa_repro.vllm import arch_table, archs, provision
    from swa_repro.vllm.audit import core as audit

    cols = {"A": {"architecture": "A", "window": "m.py:1", "fam": _fam("A", 128)},
            "B": {"architecture": "B", "window": "m.py:1", "fam": _fam("B", 128)},
            "S": {"architecture": "S", "window": "m.py:1", "fam": _fam("S", 128, sinks=True)},
            "N": {"architecture": "N", "window": "m.py:1", "not_built": "no published config: because"},
            "E": {"architecture": "E", "window": "m.py:1", "fam": {**_fam("E", 64), "encoder_only": "m.py:3: E(",
                                                                "refused": "encoder-only attention (m.py:3: E(): no"}}}
    driven = []

    def fake_run(version, families, gpus, **k):
        driven.append(families)
        audits = {}
        for f in k["fams"]:
            sink = any(x["sinks"] for x in f["layers"].values())
            audits[f["family"]] = {"platform": {"flashinfer_valid": not sink, "flashinfer_reasons": ["sinks"],
                                                "default": "FLASHINFER"},
                                   "rows": [{"layer": "sliding", "path": "prefill", "asked": {"window_left": 127},
                                             "kernels": [{"kernel": "k", "how": "run", "differs": []}]}]}
        return {"audits": {"9.0": audits}}, 1.0, {}

    backend = tmp_path / "vllm/v1/attention/backends/flashinfer.py"
    backend.parent.mkdir(parents=True)
    backend.write_text("class FlashInferBackend:\n    @classmethod\n    def supports_sink(cls) -> bool:\n")
    monkeypatch.setattr(provision, "provision", lambda v: (tmp_path, {}))
    monkeypatch.setattr(archs, "plan", lambda v, o: cols)
    monkeypatch.setattr(audit, "run_release", fake_run)
    gpus = [ef.GPU_CLASSES["sm90"]]
    doc = arch_table.build("9.9.9", gpus, note=lambda s: None)
    assert len(driven) == 1 and len(driven[0]) == 2  # A and B ask the same: one fork
    cells = doc["cells"]["sm90"]
    assert set(cells) == set(cols)
    assert cells["A"]["state"] == cells["B"]["state"] == "not affected"
    assert cells["S"]["state"] == "refused" and "m.py:7: sinks=self.sinks" in cells["S"]["why"][-2]
    assert cells["S"]["why"][-1].startswith("the backend: vllm/v1/attention/backends/flashinfer.py:3: def supports_sink")
    assert cells["N"]["state"] == "not built" and cells["N"]["why"] == ["no published config: because"]
    assert cells["E"]["state"] == "refused" and "encoder-only attention (m.py:3: E()" in cells["E"]["why"][0]
    md = "\n".join(arch_table.lines({"architectures": {"9.9.9": doc}}, gpus))
    assert "| A | not affected |" in md and "| S | refused: sinks |" in md and "N (9.9.9)" in md
    assert "| E | refused: encoder-only |" in md


@pytest.mark.matrix
def test_an_encoder_only_column_is_refused_not_driven_as_a_decoder():
    """ModernBert's layers are bidirectional (``EncoderOnlyAttention``), which FlashInferImpl refuses; driven as
    a decoder they read as a window off by one against transformers' causal convention (a false finding)."""
    from swa_repro.vllm import archs

    overlay = _overlay("0.34.0")
    src = (overlay / "vllm/model_executor/models/modernbert.py").read_text()
    assert "EncoderOnlyAttention(" in src  # the second route: the model file's text
    c = archs.column("ModernBertModel", archs.discover(overlay)["ModernBertModel"], "0.34.0", overlay)
    assert "modernbert.py" in c["fam"]["encoder_only"]
    assert "encoder-only attention" in c["fam"]["refused"] and "flashinfer.py:" in c["fam"]["refused"]
    assert "ModernBertModel" not in archs.groups({"ModernBertModel": c})[1]
    facts = archs.discover(overlay)
    for a in ("Gemma3TextModel", "MistralModel"):  # their files pick EncoderOnlyAttention for a bidirectional config
        col = archs.column(a, facts[a], "0.34.0", overlay)  # only: a decoder at the published defaults
        assert "fam" in col and not col["fam"].get("refused"), (a, col.get("not_built"))


@pytest.mark.matrix
def test_a_column_whose_vision_tower_sits_two_sub_configs_down_is_built():
    """ColModernVBert (0.34.0): transformers' ``ColModernVBertConfig`` nests the vision tower's config under
    ``vlm_config.vision_config``; the release hands that tower's config to ``SiglipVisionModel``
    (colmodernvbert.py:268-269), whose siglip.py:621 reads ``config.layer_norm_eps``. Before, the column was
    "not built: lacks layer_norm_eps" (``Checkpoint.has`` asked one level of sub-configs); now it is built and
    gets the refusal its ModernBert layers earn, the same as ModernVBertModel's (one model file). Oracle: the
    release's files read as text (the line reads the key, its class takes a ``SiglipVisionConfig``) and the
    class's ``to_dict()`` as plain JSON (a ``siglip_vision_model`` two levels down that sets the key)."""
    from transformers import CONFIG_MAPPING

    from swa_repro.vllm import archs

    overlay = _overlay("0.34.0")
    facts = archs.discover(overlay)
    col = archs.column("ColModernVBertForRetrieval", facts["ColModernVBertForRetrieval"], "0.34.0", overlay)
    assert "fam" in col, col.get("not_built")
    other = archs.column("ModernVBertModel", facts["ModernVBertModel"], "0.34.0", overlay)
    assert col["fam"]["refused"] == other["fam"]["refused"] and "encoder-only" in col["fam"]["refused"]
    models = overlay / "vllm/model_executor/models"
    siglip = (models / "siglip.py").read_text().splitlines()
    head = next(i for i in range(620, 0, -1) if siglip[i].startswith("class "))
    assert "config.layer_norm_eps" in siglip[620] and "config: SiglipVisionConfig," in "\n".join(siglip[head:620])
    assert re.search(r"SiglipVisionModel\(\s*config\.vision_config,", (models / "colmodernvbert.py").read_text())
    vision = CONFIG_MAPPING["colmodernvbert"]().to_dict()["vlm_config"]["vision_config"]
    assert vision["model_type"] == "siglip_vision_model" and "layer_norm_eps" in vision


# ----------------------------------------------------------------------------- the release's own config classes
@pytest.mark.matrix
def test_a_column_of_the_releases_own_config_class_has_the_layers_its_init_derives():
    """Lfm3Config's ``__init__`` derives ``layer_types`` (conv, full, sliding) from the layer count; read with
    ``ast`` its defaults left them unset and every layer was taken as sliding. Built in a child with the
    release's code (``release_configs``), the column has the class's own layers. The oracle: the release's
    configs/lfm3.py executed on its own (a file, no vLLM import), its default ``layer_types``."""
    import importlib.util

    from swa_repro.vllm import archs

    overlay = _overlay("0.34.0")
    src = overlay / "vllm/transformers_utils/configs/lfm3.py"
    spec = importlib.util.spec_from_file_location("_lfm3_oracle", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    want = mod.Lfm3Config()
    kinds = {{"sliding_attention": "sliding", "full_attention": "full"}.get(t, "other") for t in want.layer_types}
    facts = archs.discover(overlay)
    c = archs.column("Lfm3ForCausalLM", facts["Lfm3ForCausalLM"], "0.34.0", overlay)
    assert set(c["fam"]["layer_kinds"]) == kinds and {"full", "sliding", "other"} <= kinds
    assert c["fam"]["layers"]["sliding"]["sliding_window"] == want.sliding_window
    assert c["config"].startswith("vLLM 0.34.0's vllm/transformers_utils/configs/lfm3.py:")
    vl = archs.column("Lfm3VlForConditionalGeneration", facts["Lfm3VlForConditionalGeneration"], "0.34.0", overlay)
    assert set(vl["fam"]["layer_kinds"]) == kinds, vl.get("not_built")  # its text part: the sub-config it builds
    bagel = archs.column("BagelForConditionalGeneration", facts["BagelForConditionalGeneration"], "0.34.0", overlay)
    assert bagel["not_built"].startswith("no sliding layer at vLLM 0.34.0's vllm/transformers_utils/configs/bagel.py:")
    assert "_CONFIG_ATTRS_MAPPING" in (overlay / "vllm/transformers_utils/config.py").read_text()  # llm_config is
    # its text part only through the loader's rename (config.py:201 ``"llm_config": "text_config"``)


def test_the_releases_config_class_for_an_architecture():
    """Declared architectures first, then the one registry class the model files name, then the one in the
    config module of the model's own name (a vision tower's class imported beside it is not the model's)."""
    from swa_repro.vllm.release_configs import model_type_for

    types = {"a": {"class": "AConfig", "where": "vllm/transformers_utils/configs/a.py:3", "architectures": ["AForX"]},
             "lfm3": {"class": "Lfm3Config", "where": "vllm/transformers_utils/configs/lfm3.py:8"},
             "lfm3_vl": {"class": "Lfm3VlConfig", "where": "vllm/transformers_utils/configs/lfm3_vl.py:55"},
             "mid": {"class": "MidConfig", "where": "vllm/transformers_utils/configs/midashenglm.py:83"}}
    assert model_type_for("AForX", "other", {"Lfm3Config"}, types) == "a"
    assert model_type_for("Lfm3ForCausalLM", "lfm3", {"Lfm3Config"}, types) == "lfm3"
    assert model_type_for("Lfm3VlForX", "lfm3_vl", {"Lfm3Config", "Lfm3VlConfig"}, types) == "lfm3_vl"
    assert model_type_for("MiDashengLMModel", "midashenglm", {"DashengConfig"}, types) == "mid"
    assert model_type_for("Other", "other", {"Lfm3Config", "Lfm3VlConfig"}, types) is None
    assert model_type_for("Other", "other", set(), types) is None
