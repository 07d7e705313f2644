"""``audit --sglang X --model PATH`` (issue #41): a user's own config.json through the release's own
model file, at the user's values.

Two real audits of 0.5.23 (one module fixture each, cached after the first run): a Mistral config
whose ``sliding_window`` is null (no window at all: not affected) and a Gemma-2 config with
``sliding_window: 1024`` (judged at 1024). Oracle: the file read back as plain JSON, a second route
beside ``checkpoint.read``'s transformers class: the window the answer reports and the lengths the
runs drove (``family.family_shape``: extend ``window + 256`` past the window) follow from it. Bad
input is one line, exit 2, before any audit (``conftest.no_work``: the child and the installer fail
the test).
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from conftest import skip_module_unless

skip_module_unless("transformers")

from swa_repro.cli import main

GEMMA2 = {  # google/gemma-2-9b config.json, its window changed to 1024
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 1024, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0.dev0", "use_cache": True, "vocab_size": 256000}
MISTRAL = {  # mistralai/Mistral-7B-Instruct-v0.2-like config.json: sliding_window null
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.36.0", "use_cache": True, "vocab_size": 32000}


def _folder(root, name: str, values) -> str:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(values if isinstance(values, str) else json.dumps(values))
    return str(d)


def _audit(folder: str, status: int) -> dict:
    """``swa-repro audit --sglang 0.5.23 --model FOLDER --json``, its one family; the command's exit
    ``status`` (``core.exit_status``: 0 not affected, 1 a finding) is held too."""
    from conftest import release_overlay

    release_overlay("0.5.23")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["audit", "--sglang", "0.5.23", "--model", folder, "--json"])
    assert rc == status, (rc, err.getvalue()[-400:])
    (f,) = json.loads(out.getvalue())["families"]
    return f


def serving_of(folders: list[str]) -> dict:
    """The release's ServerArgs facts of every checkpoint in ``folders``, from one child of 0.5.23: the
    cells (each model's name and small config) each checkpoint's audit asks beside its family child, so
    the two audits below (and test_server_run's Mistral) read them instead of a ServerArgs child each."""
    from conftest import release_overlay

    from swa_repro.sglang import checkpoint as ckpt
    from swa_repro.sglang.audit import family_run

    cks = [ckpt.read(f) for f in folders]
    return family_run._serving(release_overlay("0.5.23"), "0.5.23", [], None,
                               {ck.family: ckpt.small_config(ck).config for ck in cks})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ck")
    folders = {"mistral": _folder(root, "mistral-nowindow", MISTRAL), "gemma2": _folder(root, "gemma2-1024", GEMMA2)}
    serving_of(list(folders.values()))
    return folders


@pytest.fixture(scope="module")
def mistral(checkpoints):
    folder = checkpoints["mistral"]
    return folder, _audit(folder, 0)  # no window at all: not affected


@pytest.fixture(scope="module")
def gemma2(checkpoints):
    folder = checkpoints["gemma2"]
    return folder, _audit(folder + "/config.json", 1)  # a window (and a cap) 0.5.23 drops: affected


def _plain(folder: str) -> dict:
    """The oracle's route: the file as JSON, no transformers class."""
    with open(f"{folder}/config.json") as fh:
        return json.load(fh)


# ----------------------------------------------------------------------------- the user's values
def test_a_null_window_mistral_is_not_affected(mistral):
    folder, f = mistral
    assert _plain(folder)["sliding_window"] is None
    assert f["answer"]["state"] == "not affected", f["answer"]
    assert f["config"]["sliding_window"] is None and set(f["config"]["kinds"]) == {"full"}
    assert f["build"]["runner_window"] is None and list(f["kinds"]) == ["full"]
    assert {r["kind"] for r in f["paths"]} == {"full"}  # no layer was driven as a sliding one
    assert f["checkpoint"]["values"]["sliding_window"] == {"value": None, "from": "user"}


def test_a_gemma2_config_with_window_1024_is_judged_at_1024(gemma2):
    folder, f = gemma2
    w = _plain(folder)["sliding_window"]
    assert w == 1024 and f["config"]["sliding_window"] == w  # not Gemma2Config's 4096
    assert f["kinds"]["sliding"]["intended_window"] == w - 1 == f["kinds"]["sliding"]["layer_window"]
    assert f["build"]["runner_window"] == w - 1  # resolve_sliding_window_size on the user's model
    ragged = next(r for r in f["paths"] if r["path"] == "extend_ragged_no_prefix" and r["kind"] == "sliding")
    assert sum(s["queries"] for s in ragged["keys"].values()) == (w + 256) + 40  # extend = window + 256, and 40
    assert sum(s["queries_with_extra"] for s in ragged["keys"].values()) == 256  # the queries past 1024 only
    assert f["answer"]["state"] == "affected on the default path"


def test_each_value_says_whether_the_file_or_the_class_default_gave_it(gemma2, mistral):
    for folder, f in (gemma2, mistral):
        raw, ck = _plain(folder), f["checkpoint"]
        assert ck["path"].endswith("config.json") and ck["architecture"] == raw["architectures"][0]
        for key, v in ck["values"].items():
            assert v["from"] == ("user" if key in raw else "default"), key
            if key in raw:
                assert v["value"] == raw[key], key
        assert not set(ck["keys_from_default"]) & set(raw)
        assert ck["file"] == raw
    assert mistral[1]["checkpoint"]["values"]["head_dim"] == {"value": 4096 // 32, "from": "default"}


# ----------------------------------------------------------------------------- bad input (conftest.no_work)
def _say(no_work, capfd, model: str) -> tuple[int, list[str]]:
    capfd.readouterr()
    rc = main(["audit", "--sglang", "0.5.23", "--model", model])
    return rc, capfd.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("values, must", [
    ("{not json", "is not valid JSON"),
    ({"model_type": "gemma2"}, "has no architectures"),
    ({"architectures": [], "model_type": "gemma2"}, "has no architectures"),
    ({"architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3"},
     "Olmo3ForCausalLM is not in sglang 0.5.23's models/"),
    ({**GEMMA2, "layer_types": ["sliding_attention"]}, "refuses the file"),  # 1 type for 42 layers
])
def test_a_bad_config_is_one_line_exit_2_before_any_work(values, must, no_work, capfd):
    rc, err = _say(no_work, capfd, _folder(no_work, "bad", values))
    assert rc == 2 and len(err) == 1 and must in err[0], (rc, err)


def test_a_key_the_model_file_reads_without_a_default_is_named(no_work, capfd):
    models = no_work / "ov" / "sglang" / "srt" / "models"
    (models / "gemma2.py").write_text("class Gemma2MLP:\n    def __init__(self, config):\n"
                                      "        self.act = config.hidden_act\n"
                                      "class Gemma2ForCausalLM:\n    def __init__(self, config):\n"
                                      "        self.mlp = Gemma2MLP(config)\nEntryClass = Gemma2ForCausalLM\n")
    rc, err = _say(no_work, capfd, _folder(no_work, "nohidden", {k: v for k, v in GEMMA2.items() if k != "hidden_act"}))
    assert rc == 2 and len(err) == 1 and "lacks hidden_act" in err[0] and "gemma2.py:3" in err[0], (rc, err)


def test_an_architecture_the_release_lacks_names_the_releases_here_that_serve_it(no_work, capfd):
    models = no_work / "0.5.99" / "sglang" / "srt" / "models"  # another release's overlay beside this one's
    models.mkdir(parents=True)
    (models / "olmo3.py").write_text("class Olmo3ForCausalLM: pass\nEntryClass = [Olmo3ForCausalLM]\n")
    rc, err = _say(no_work, capfd, _folder(no_work, "olmo3", {"architectures": ["Olmo3ForCausalLM"],
                                                              "model_type": "olmo3"}))
    assert rc == 2 and len(err) == 1 and "not in sglang 0.5.23's models/" in err[0], (rc, err)
    assert "sglang 0.5.99 (already on this machine) serves it" in err[0], err


@pytest.mark.parametrize("model, must", [("./no/such/folder", "no such file or folder"),
                                         ("{tmp}", "holds no config.json")])
def test_a_path_without_a_config_is_one_line(model, must, no_work, capfd):
    rc, err = _say(no_work, capfd, model.format(tmp=no_work))
    assert rc == 2 and len(err) == 1 and must in err[0], (rc, err)


def test_the_release_model_file_read_finds_what_gemma2_needs_beyond_its_class():
    """0.5.23's gemma2.py reads ``config.hidden_act`` (Gemma2Config has only hidden_activation), and
    every published family's config passes the same check (no key reported that the release has)."""
    from conftest import release_overlay

    from swa_repro.core.checkpoint_config import config_object
    from swa_repro.engine import families
    from swa_repro.engine.config_reads import config_reads
    from swa_repro.engine.families import MODELS
    from swa_repro.sglang import checkpoint
    from swa_repro.sglang import model_configs as mc

    overlay = release_overlay("0.5.23")
    gemma2 = mc.model_file_in(overlay / "sglang" / "srt" / "models", "Gemma2ForCausalLM")
    assert config_reads(gemma2, "Gemma2ForCausalLM")["hidden_act"].startswith("gemma2.py:")
    for fam in ("gemma2", "mistral", "gpt-oss", "exaone4"):
        ck = checkpoint.Checkpoint(fam, "-", families.small_config(fam).config, MODELS[fam][2], "x", None)
        ck = checkpoint.Checkpoint(fam, "-", ck.values, ck.architecture, *config_object(ck.values, "-"))
        assert checkpoint.check_release(ck, "0.5.23", overlay).name.endswith(".py")


def test_a_remote_code_config_is_read_from_its_json_alone(tmp_path):
    """A model_type transformers has no class for: a plain PretrainedConfig of the file's values, its
    auto_map dropped from what the release reads (no remote code, no network)."""
    from swa_repro.sglang import checkpoint

    values = {**GEMMA2, "model_type": "my_gemma2_remote", "auto_map": {"AutoConfig": "x.MyConfig"}}
    ck = checkpoint.read(_folder(tmp_path, "remote", values))
    assert ck.config_class.startswith("PretrainedConfig (plain") and ck.config.sliding_window == 1024
    small = checkpoint.small_config(ck)
    assert "auto_map" not in small.config and small.sliding_window == 1024 and small.config["num_hidden_layers"] == 2
    assert checkpoint.record(ck)["values"]["sliding_window"] == {"value": 1024, "from": "user"}


def test_a_remote_code_config_with_rope_scaling_is_read_not_refused(tmp_path):
    """stepfun-ai/Step-3.5-Flash's shape (examples/checkpoints/step3p5-flash): a remote-code
    ``model_type`` with ``rope_scaling`` before ``max_position_embeddings``; transformers 5.12.1's
    plain ``from_dict`` raises on it (its RoPE standardization reads a key not yet set), which was a
    wrong refusal: the release reads the file through its own class."""
    from swa_repro.sglang import checkpoint

    values = {**GEMMA2, "model_type": "my_remote_rope", "auto_map": {"AutoConfig": "x.MyConfig"},
              "rope_scaling": {"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 4096,
                               "low_freq_factor": 1.0, "high_freq_factor": 32.0}}
    values = {"rope_scaling": values.pop("rope_scaling"), **values}  # the published order: rope first
    ck = checkpoint.read(_folder(tmp_path, "rope", values))
    raw = json.loads((tmp_path / "rope" / "config.json").read_text())
    assert ck.config_class.startswith("PretrainedConfig (plain")
    assert (ck.config.sliding_window, ck.config.max_position_embeddings) == (raw["sliding_window"],
                                                                              raw["max_position_embeddings"])
    assert checkpoint.small_config(ck).sliding_window == raw["sliding_window"]


def test_a_key_the_releases_own_config_class_defaults_is_no_missing_key():
    """stepfun-ai/Step-3.5-Flash's config.json (examples/checkpoints/step3p5-flash) has no
    ``rms_norm_eps``; 0.5.23 step3p5.py:518 reads it and the release re-parses the file through its
    registry's Step3p5Config (configs/step3p5.py:19 defaults it), so the release builds it: no "lacks"
    refusal. Oracle: the file read as plain JSON lacks the key, the release's class file declares it."""
    from conftest import REPO, release_overlay

    from swa_repro.sglang import checkpoint

    overlay = release_overlay("0.5.23")
    folder = REPO / "examples" / "checkpoints" / "step3p5-flash"
    assert "rms_norm_eps" not in json.loads((folder / "config.json").read_text())
    assert "rms_norm_eps" in (overlay / "sglang" / "srt" / "configs" / "step3p5.py").read_text()
    ck = checkpoint.read(str(folder))
    assert checkpoint.check_release(ck, "0.5.23", overlay).name == "step3p5.py"


def test_a_window_the_config_class_never_reads_is_a_stray_not_a_sliding_layer(tmp_path):
    """SpecForge's EAGLE-3 draft for Gemma-3-1B (examples/checkpoints/llama-eagle3-gemma3-1b) carries
    its target's ``sliding_window: 512`` under ``model_type: llama``; transformers' Llama model never
    reads it (no window in modeling_llama.py), so its one layer is full, not "layer != HF" at 511. The
    same window under a class that reads it (Mistral) stays sliding."""
    import inspect

    from conftest import REPO
    from transformers.models.llama import modeling_llama

    from swa_repro.core.checkpoint_config import layer_kinds
    from swa_repro.sglang import checkpoint

    folder = REPO / "examples" / "checkpoints" / "llama-eagle3-gemma3-1b"
    raw = json.loads((folder / "config.json").read_text())
    assert (raw["model_type"], raw["sliding_window"]) == ("llama", 512)
    assert "sliding_window" not in inspect.getsource(modeling_llama)
    assert set(layer_kinds(checkpoint.read(str(folder)).text_config())) == {"full"}
    mistral = checkpoint.read(_folder(tmp_path, "m", {**MISTRAL, "sliding_window": raw["sliding_window"]}))
    assert set(layer_kinds(mistral.text_config())) == {"sliding"}


# ----------------------------------------------------------------------------- doctor --model PATH
@pytest.fixture
def installed_0_5_23(monkeypatch):
    """An installed sglang 0.5.23 (the doctor's release); the rest of the doctor is not under test."""
    from swa_repro.core import mode
    from swa_repro.notebook import doctor

    real = mode.dist_version
    monkeypatch.setattr(mode, "dist_version", lambda d: "0.5.23" if d == "sglang" else real(d))
    monkeypatch.setattr(doctor, "doctor_report", dict)


@pytest.mark.parametrize("values, must", [
    ({"model_type": "gemma2"}, "has no architectures"),
    ({"architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3"}, "is not in sglang 0.5.23's models/"),
])
def test_doctor_model_takes_a_checkpoint_and_says_what_is_wrong_in_one_line(values, must, no_work, installed_0_5_23,
                                                                            capfd):
    capfd.readouterr()
    rc = main(["doctor", "--model", _folder(no_work, "bad", values)])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and must in err[0], (rc, err)


def test_doctor_model_answers_for_the_users_checkpoint(mistral, installed_0_5_23, capfd):
    folder, f = mistral
    capfd.readouterr()
    assert main(["doctor", "--json", "--model", folder]) == 0
    r = json.loads(capfd.readouterr().out)["family"]
    assert r["model"].endswith("config.json") and r["answer"]["state"] == f["answer"]["state"] == "not affected"
    assert {v["kind"] for v in r["verdicts"]} == {"full"}  # the user's null window: no sliding layer


# ----------------------------------------------------------------------------- a key nested in sub-configs
def test_a_key_set_in_a_sub_config_of_a_sub_config_counts_as_set():
    """transformers' ``ColModernVBertConfig`` nests its vision tower two levels down (``vlm_config`` ->
    ``vision_config``, a ``SiglipVisionConfig``): vLLM 0.34.0 colmodernvbert.py:268-269 hands that config to
    ``SiglipVisionModel``, whose siglip.py:621 reads ``config.layer_norm_eps`` off it. The key counts as set
    (before: only the config, its text part and its direct sub-configs were asked: "lacks layer_norm_eps");
    a key no config sets still does not. The same for a plain config (a ``model_type`` transformers lacks),
    whose nested ``*_config`` stay dicts. Oracle: the class's own ``to_dict()``, walked as plain JSON."""
    from swa_repro.core.checkpoint_config import Checkpoint, config_object

    values = {"architectures": ["ColModernVBertForRetrieval"], "model_type": "colmodernvbert"}
    ck = Checkpoint("-", "-", values, values["architectures"][0], *config_object(values, "-"))
    nested = ck.config.to_dict()["vlm_config"]
    assert "layer_norm_eps" not in nested and "layer_norm_eps" in nested["vision_config"]  # two levels down
    assert ck.has("layer_norm_eps") and not ck.has("no_such_key_anywhere")
    assert {type(c).__name__ for c in ck.sub_configs()} >= {"ModernVBertConfig", "SiglipVisionConfig"}
    plain = {"architectures": ["MyVlm"], "model_type": "my_vlm_remote", "vlm_config": {"vision_config": {
        "layer_norm_eps": 1e-6}, "text_config": {"hidden_size": 8}}, "id2label": {"0": "a"}}
    pk = Checkpoint("-", "-", plain, "MyVlm", *config_object(plain, "-"))
    assert pk.config_class.startswith("PretrainedConfig (plain") and pk.has("layer_norm_eps") and pk.has("hidden_size")
    assert not pk.has("no_such_key_anywhere") and not pk.has("0")  # a dict that is no sub-config is not one
