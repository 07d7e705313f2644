"""``engine.config_classes``: the one rule both engines' ``release_configs`` use for a release's own config
classes (its ``_CONFIG_REGISTRY``): each class built with its defaults, and the ``model_type`` serving an
architecture. sglang and vLLM pass only what differs (vLLM: its loader's renames, the text part, the config
module of the model's own name).

Oracles: the classes' own ``to_dict()`` / ``dir()`` / ``architectures`` beside each entry; the rule's picks
by hand on small registries (a declared architecture, one named class, one class under two types, two
classes, the module of the model's own name).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import skip_module_unless

skip_module_unless("transformers")

TYPES = {"a": {"class": "AConfig", "where": "cfg/a.py:3", "architectures": ["AForX"]},
         "b": {"class": "BConfig", "where": "cfg/b.py:5"},
         "b_alias": {"class": "BConfig", "where": "cfg/b.py:5"},  # one class registered under two types
         "c": {"class": "CConfig", "where": "cfg/c.py:7"}}


@pytest.mark.parametrize("arch, names, own, want, how", [
    ("AForX", {"BConfig"}, set(), "a", "AConfig declares architectures=['AForX'] (cfg/a.py:3)"),
    ("CForX", {"CConfig", "Other"}, set(), "c", "models/x.py names CConfig (cfg/c.py:7)"),
    ("BForX", {"BConfig"}, set(), "b", "models/x.py names BConfig (cfg/b.py:5)"),
    ("BForX", {"BConfig", "CConfig"}, {"c"}, "c", "models/x.py names CConfig (cfg/c.py:7)"),
    ("MidForX", {"Other"}, {"b"}, "b", "the config module of the model's own name defines BConfig (cfg/b.py:5)"),
    ("BForX", {"BConfig", "CConfig"}, set(), None,
     "models/x.py names 2 of the release's config classes (BConfig, CConfig) and none declares BForX"),
    ("Other", set(), set(), None, "no config class of the release's registry declares Other or is named by models/x.py"),
])
def test_the_model_type_serving_an_architecture(arch, names, own, want, how):
    from swa_repro.engine.config_classes import model_type_for

    assert model_type_for(arch, TYPES, names, "models/x.py", own) == (want, how)


def test_sglang_takes_one_class_registered_under_two_types_as_that_class(tmp_path):
    """Before, sglang's rule counted types, not classes: a model file naming a class its registry holds under
    two ``model_type``s got no config (``names 2 of the release's config classes (BConfig, BConfig)``); vLLM's
    counted classes. One rule now: the class is the same config, the first type is taken."""
    from swa_repro.sglang.release_configs import model_type_for

    f = tmp_path / "b_model.py"
    f.write_text("from cfg import BConfig\n\nclass BForX:\n    def __init__(self, config: BConfig):\n        pass\n")
    assert model_type_for("BForX", f, TYPES) == ("b", "models/b_model.py names BConfig (cfg/b.py:5)")


def _json(d: dict) -> dict:
    """As the child's answer carries it (JSON: ``id2label``'s int keys as strings)."""
    return json.loads(json.dumps(d, default=str))


def test_each_class_is_built_with_its_defaults_or_says_why_not(tmp_path):
    """Per type: the class's ``to_dict()``, its names beyond ``PretrainedConfig``'s, the architectures it
    declares, where it is defined; a class whose defaults raise gives the error; a lazy registry entry that
    cannot import gives its error at the registry's file; vLLM's options add the text part and sub-config keys."""
    from transformers import PretrainedConfig

    from swa_repro.engine.config_classes import entries

    class TextCfg(PretrainedConfig):
        model_type = "t_text"

        def __init__(self, hidden_size=8, **kw):
            self.hidden_size = hidden_size
            super().__init__(**kw)

    class Composite(PretrainedConfig):
        model_type = "t_comp"
        architectures = ("CompForX",)

        def __init__(self, **kw):
            self.text_config = TextCfg()
            self.embed_dim = 4
            super().__init__(**kw)

        def get_text_config(self, *a, **k):
            return self.text_config

        def per_layer(self, i):
            return i

    class Broken(PretrainedConfig):
        model_type = "t_broken"

        def __init__(self, **kw):
            raise ValueError("needs a checkpoint\nsecond line")

    class Lazy(dict):
        def __getitem__(self, k):
            if k == "lazy":
                raise ImportError("no module named remote_cfg")
            return super().__getitem__(k)

    reg = Lazy(comp=Composite, broken=Broken, lazy=None)
    got = entries(reg, tmp_path, "cfg/registry.py")
    inst = Composite()
    assert got["comp"]["defaults"] == _json(inst.to_dict()) and got["comp"]["defaults"]["embed_dim"] == 4
    assert {"per_layer", "embed_dim", "text_config"} <= set(got["comp"]["attrs"])
    assert not set(got["comp"]["attrs"]) & set(dir(PretrainedConfig()))
    assert got["comp"]["architectures"] == ["CompForX"] and got["comp"]["class"] == "Composite"
    line = Path(__file__).read_text().splitlines().index("    class Composite(PretrainedConfig):") + 1
    assert got["comp"]["where"] == f"{Path(__file__).resolve()}:{line}"  # outside the overlay: the whole path
    assert "text" not in got["comp"] and "hidden_size" not in got["comp"]["attrs"]
    assert got["broken"]["error"] == "ValueError: needs a checkpoint" and "defaults" not in got["broken"]
    assert got["lazy"] == {"class": "?", "where": "cfg/registry.py", "error": "ImportError: no module named remote_cfg"}
    vllm = entries(reg, tmp_path, "cfg/registry.py", text_part=True, sub_attrs=True)["comp"]
    assert vllm["text"] == {"class": "TextCfg", "model_type": "t_text", "defaults": _json(TextCfg().to_dict())}
    assert "hidden_size" in vllm["attrs"]  # its sub-config's keys (a vision tower's reads)
