"""Fewer ``not built`` columns in the family table (#41 h41): the configs the architecture columns are
built from, each held to a second route over the release's own files.

* A remote-code architecture (no transformers class) is built from the release's own config class
  (``release_configs``: its ``_CONFIG_REGISTRY``, imported in a child): the window of the small config is
  the ``sliding_window`` default written in that class's ``__init__`` signature (read here with ``ast``
  from ``configs/*.py``, nothing imported or instantiated);
* a composite config's text part is built where the key the release's vision tower reads is its
  vision config's (0.5.23 siglip.py ``config.layer_norm_eps``): transformers' sub-config has it;
* the keys a build reads are the constructor's, not ``load_weights``' (0.5.23 cohere2_moe.py:566);
* a column that still cannot be built says which key, which line, and which class lacks it: the line
  (read back) reads that key and the class file never mentions it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import skip_module_unless

skip_module_unless("transformers")

from conftest import release_srt


def _overlay(version: str):
    return release_srt(version).parents[1]


@pytest.fixture(scope="module")
def plan_0523():
    from swa_repro.sglang.audit import arch_cells

    return arch_cells.plan("0.5.23", _overlay("0.5.23"))


def _signature_default(path: Path, cls: str, arg: str):
    """The default of ``arg`` in ``cls.__init__``'s signature, as written in the file."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    a = init.args
    pos = a.args[len(a.args) - len(a.defaults):]
    pairs = list(zip(pos, a.defaults)) + [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
    return next(ast.literal_eval(d) for k, d in pairs if k.arg == arg)


@pytest.mark.parametrize("arch, file, cls", [("BeamForCausalLM", "beam.py", "BeamConfig"),
                                             ("Spark2_5ForCausalLM", "spark2_5.py", "Spark2_5Config"),
                                             ("IQuestQ1ForCausalLM", "iquest_q1.py", "IQuestQ1Config")])
def test_a_remote_code_column_is_built_from_the_releases_own_config_class(plan_0523, arch, file, cls):
    smalls, static = plan_0523
    assert arch in smalls and arch not in static, static.get(arch)
    small = smalls[arch]["small"]
    want = _signature_default(_overlay("0.5.23") / "sglang" / "srt" / "configs" / file, cls, "sliding_window")
    assert isinstance(want, int) and small["sliding_window"] == want and small["config"]["sliding_window"] == want
    assert "sliding" in small["kinds"] and small["config"]["architectures"] == [arch]
    assert small["hf_class"] == cls and smalls[arch]["discovered"]["config"].startswith(
        f"sglang 0.5.23's {cls} defaults (sglang/srt/configs/{file}:")


def test_a_composite_configs_vision_key_is_its_sub_configs(plan_0523):
    """Gemma3ForConditionalGeneration: siglip.py reads ``config.layer_norm_eps`` off the vision config,
    which transformers' Gemma3Config carries in ``vision_config``; the text part's window is Gemma3TextConfig's."""
    from transformers import Gemma3Config, Gemma3TextConfig

    from swa_repro.engine.config_reads import config_reads

    smalls, _ = plan_0523
    models = _overlay("0.5.23") / "sglang" / "srt" / "models"
    where = config_reads(models / "gemma3_mm.py", "Gemma3ForConditionalGeneration")["layer_norm_eps"]
    assert where.startswith("siglip.py:") and hasattr(Gemma3Config().vision_config, "layer_norm_eps")
    assert not hasattr(Gemma3Config(), "layer_norm_eps")
    small = smalls["Gemma3ForConditionalGeneration"]["small"]
    assert small["sliding_window"] == Gemma3TextConfig().sliding_window and "sliding" in small["kinds"]


def test_a_build_reads_the_constructors_keys_not_load_weights():
    from swa_repro.engine.config_reads import config_reads

    f = _overlay("0.5.23") / "sglang" / "srt" / "models" / "cohere2_moe.py"
    lines = f.read_text().splitlines()
    line = next(i for i, t in enumerate(lines, 1) if "num_experts=self.config.num_experts" in t)
    enclosing = next(re.search(r"def (\w+)", t).group(1) for t in reversed(lines[:line]) if re.match(r"\s+def \w+", t))
    assert enclosing == "load_weights"
    every = config_reads(f, "Cohere2MoeForCausalLM")
    build = config_reads(f, "Cohere2MoeForCausalLM", build_only=True)
    assert set(build) <= set(every) and "hidden_size" in build
    assert f"cohere2_moe.py:{line}" not in build.values()


def test_a_column_still_not_built_names_the_key_the_line_and_the_class(plan_0523):
    """A column whose key only a checkpoint can give (a window: never invented, #41 hC) names the key
    and the line that reads it (Gemma4AssistantForCausalLM: gemma4_mtp.py reads ``sliding_window``)."""
    _, static = plan_0523
    errs = [d["error"] for d in static.values() if " lacks " in d.get("error", "")]
    assert errs
    srt = _overlay("0.5.23") / "sglang" / "srt"
    for err in errs:
        m = re.search(r"lacks (\w+), which sglang 0\.5\.23's (\w+\.py):(\d+) reads", err)
        assert m, err
        key, file, line = m.groups()
        assert f"config.{key}" in (srt / "models" / file).read_text().splitlines()[int(line) - 1]
        if "window" in key:  # never invented: the line sends the user to their checkpoint
            assert "--model PATH/config.json" in err, err
    assert any(re.search(r"lacks \w*window", e) for e in errs)


def test_a_release_class_that_leaves_the_window_to_a_checkpoint_is_built_at_one_the_audit_sets(plan_0523):
    """Step3p5ForCausalLM: its flag (``use_head_wise_attn_gate``) is set by the audit (arch_fill), and the
    release's Step3p5Config defaults both ``sliding_window`` and ``layer_types`` to None (read here from its
    signature): the column is built at a window the audit sets (#41 hB), said in its provenance
    (``window_from``, each key's why) so its verdict reads as conditional."""
    from swa_repro.sglang.audit import arch_fill

    smalls, static = plan_0523
    cfg = _overlay("0.5.23") / "sglang" / "srt" / "configs" / "step3p5.py"
    assert _signature_default(cfg, "Step3p5Config", "sliding_window") is None
    assert _signature_default(cfg, "Step3p5Config", "layer_types") is None
    assert "Step3p5ForCausalLM" not in static
    col = smalls["Step3p5ForCausalLM"]
    assert col["discovered"]["window_from"] == "audit"
    assert col["small"]["sliding_window"] == arch_fill.AUDIT_WINDOW and "sliding" in col["small"]["kinds"]
    said = col["discovered"]["set_by_audit"]
    assert said["sliding_window"].startswith(arch_fill.SET_WINDOW) and said["layer_types"].startswith(
        arch_fill.SET_WINDOW)


def test_no_column_is_called_remote_code_where_the_release_has_a_class_for_it(plan_0523):
    """Every ``no published config`` line names what it lacks: no class in the release's registry for
    the architecture, or the class's defaults leaving the window (or a key) to a checkpoint."""
    _, static = plan_0523
    lines = [d["error"] for d in static.values() if "no published config" in d.get("error", "")]
    assert lines
    for t in lines:
        assert ("no config class of the release's registry" in t or "config classes" in t
                or "defaults (sglang/srt/" in t), t


def _committed_0523() -> dict:
    import json

    t = json.loads((Path(__file__).resolve().parents[1] / "docs" / "audit" / "families.json").read_text())
    return {r["gpu"]: r["cells"] for r in t["rows"] if r["sglang"] == "0.5.23"}


def test_the_committed_table_drives_them_at_their_class_window():
    """The regenerated table (docs/audit/families.json): Beam's column (the release's BeamConfig) and
    Afmoe's (transformers' AfmoeConfig written out, re-parsed by the release's own AfmoeConfig) are
    built and driven at the window their class declares: read here from BeamConfig's signature and from
    transformers' class, the table's from the child's build through the release's ModelConfig."""
    from transformers import AfmoeConfig

    beam = _signature_default(_overlay("0.5.23") / "sglang" / "srt" / "configs" / "beam.py", "BeamConfig",
                              "sliding_window")
    for gpu, cells in _committed_0523().items():
        for arch, want in (("BeamForCausalLM", beam), ("AfmoeForCausalLM", AfmoeConfig().sliding_window)):
            c = cells[arch]
            assert c["state"] != "not built", (gpu, arch, c["why"])
            assert c["window_hf"] == want and c["layer_window"]["sliding"] == want - 1, (gpu, arch, c)
