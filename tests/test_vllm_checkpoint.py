"""``audit --vllm X --model PATH`` (issue #41 part 4): a user's own config.json through vLLM release X's
own model registry and model file, at the user's values.

Oracles, each a second route beside ``vllm.checkpoint``'s:

* the table families' per-kind parameters from ``vllm.families.resolve`` (hand-kept patterns per
  family, transformers' defaults): the checkpoint route, given the same config as a file, finds the
  same window, cap and sinks on every release here (cohere2's ``+ 1`` from 0.29.0 on included);
* the registry by text: every architecture whose registry module passes ``per_layer_sliding_window``
  a value (``grep``) is one the checkpoint route answers for (a window it models, or one it cites and does
  not drive: never skipped);
* the user's file read back as plain JSON: the window a sliding layer asks for, and the window the
  release's kernels are told, are the file's, not Gemma2Config's 4096; a Mistral whose window is
  null drives full layers only and is not affected.

The overlays and the real audits are ``matrix`` (they need the vLLM wheels); bad input runs
everywhere, with the installer faked and the child failing the test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import skip_module_unless

skip_module_unless("transformers")

from test_checkpoint_config import GEMMA2, MISTRAL

from swa_repro.cli import main

RELEASES = ("0.20.0", "0.25.0", "0.29.0", "0.30.0", "0.34.0")  # the table's structural epochs


def _folder(root: Path, name: str, values) -> str:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(values if isinstance(values, str) else json.dumps(values))
    return str(d)


def _overlay(version: str) -> Path:
    from swa_repro.vllm.provision import provision

    try:
        return provision(version)[0]
    except Exception as e:  # noqa: BLE001 - no cached wheel and no package index
        pytest.skip(f"cannot provision vllm=={version}: {e}")


def _ck(tmp_path: Path, name: str, values: dict):
    from swa_repro.core import checkpoint_config as cc

    return cc.read(_folder(tmp_path, name, values), "vLLM")


# ----------------------------------------------------------------------------- the release's files, read
@pytest.mark.matrix
@pytest.mark.parametrize("version", RELEASES)
def test_each_table_family_given_as_a_file_asks_what_the_table_route_finds(version, tmp_path):
    from swa_repro.engine import families as sf
    from swa_repro.vllm import checkpoint, families

    overlay = _overlay(version)
    for name in families.FAMILIES:
        table = families.resolve(name, overlay)
        got = checkpoint.resolve(_ck(tmp_path, name, sf.small_config(name).config), version, overlay)
        assert "error" not in got, (name, got["error"])
        for kind, want in table["layers"].items():
            mine = got["layers"][kind]
            assert (mine["sliding_window"], mine["logits_soft_cap"], mine["sinks"], mine["hf_window_left"]) == (
                want["sliding_window"], want["logits_soft_cap"], want["sinks"], want["hf_window_left"]), (name, kind)
        assert set(got["layers"]) == set(table["layers"]) and got["head_dim"] == table["head_dim"], name


@pytest.mark.matrix
@pytest.mark.parametrize("version", ("0.20.0", "0.34.0"))
def test_every_architecture_whose_model_file_passes_a_window_is_answered(version):
    from swa_repro.vllm import registry

    overlay = _overlay(version)
    models = overlay / registry.MODELS
    text = (overlay / registry.REGISTRY).read_text()
    by_grep = {a for a, mod in re.findall(r'^\s*"(\w+)": \(\s*"(\w+)",', text, re.MULTILINE)
               if (models / f"{mod}.py").is_file()  # a window handed on, not through (qwen3's parameter)
               and re.search(r"per_layer_sliding_window=(?!per_layer_sliding_window\b)", (models / f"{mod}.py").read_text())}
    answered = registry.window_architectures(overlay)
    assert by_grep and by_grep <= set(answered), sorted(by_grep - set(answered))
    for arch, (effect, where) in answered.items():
        rel, line = where.split(":")[:2]
        assert "per_layer_sliding_window" in (overlay / rel).read_text().splitlines()[int(line) - 1], (arch, where)
    modelled = [a for a, (e, _) in answered.items() if e in ("config", "+1")]
    assert len(modelled) >= 0.8 * len(answered), sorted(set(answered) - set(modelled))


@pytest.mark.matrix
def test_the_users_window_and_layer_kinds_are_read_not_the_class_defaults(tmp_path):
    from swa_repro.vllm import checkpoint

    overlay = _overlay("0.34.0")
    g2 = checkpoint.resolve(_ck(tmp_path, "g2", GEMMA2), "0.34.0", overlay)
    w = json.loads((tmp_path / "g2" / "config.json").read_text())["sliding_window"]
    assert w == 1024 and g2["layers"]["sliding"]["sliding_window"] == w and g2["layers"]["full"]["sliding_window"] is None
    assert g2["layers"]["sliding"]["hf_window_left"] == w - 1 and g2["layers"]["sliding"]["logits_soft_cap"] == 50.0
    assert g2["sources"]["window"].startswith("vllm/model_executor/models/gemma2.py:")
    mis = checkpoint.resolve(_ck(tmp_path, "mis", MISTRAL), "0.34.0", overlay)
    assert list(mis["layers"]) == ["full"] and mis["layers"]["full"]["sliding_window"] is None
    qwen = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1024, "num_attention_heads": 16,
            "num_key_value_heads": 2, "num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 2048,
            "max_window_layers": 2, "intermediate_size": 2816, "vocab_size": 1000}
    q = checkpoint.resolve(_ck(tmp_path, "qwen", qwen), "0.34.0", overlay)  # no per-layer window in qwen2.py: the
    assert q["sources"]["window"].startswith("vllm/model_executor/layers/attention/attention.py")  # model-level one,
    assert q["layers"]["sliding"]["sliding_window"] is None  # set only where every layer slides
    assert q["layers"]["sliding"]["hf_window_left"] == 2047


# ----------------------------------------------------------------------------- the audit, end to end
def _audit(folder: str, status: int) -> dict:
    import contextlib
    import io

    _overlay("0.34.0")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["audit", "--vllm", "0.34.0", "--model", folder, "--json"])
    assert rc == status, (rc, err.getvalue()[-400:])
    return json.loads(out.getvalue())


@pytest.mark.matrix
def test_a_gemma2_config_with_window_1024_is_driven_at_1024(tmp_path):
    from swa_repro.vllm.audit.verdict import cell

    folder = _folder(tmp_path, "g2", GEMMA2)
    doc = _audit(folder, 1)  # 0.34.0's XQA decode drops the cap on sm90: affected
    w = json.loads(Path(folder, "config.json").read_text())["sliding_window"]
    a = doc["audits"]["9.0"]["Gemma2ForCausalLM"]
    sliding = [r for r in a["rows"] if r["layer"] == "sliding" and r.get("asked")]
    assert sliding and all(r["asked"]["window_left"] == w - 1 for r in sliding)
    told = [k["told"]["window_left"] for r in sliding for k in r["kernels"]]
    assert told and set(told) == {w - 1}
    assert cell(a)["state"] == "affected"
    assert doc["checkpoint"]["values"]["sliding_window"] == {"value": w, "from": "user"}
    assert doc["checkpoint"]["file"] == json.loads(Path(folder, "config.json").read_text())


@pytest.mark.matrix
def test_a_null_window_mistral_is_not_affected(tmp_path):
    from swa_repro.vllm.audit.verdict import cell

    doc = _audit(_folder(tmp_path, "mis", MISTRAL) + "/config.json", 0)
    a = doc["audits"]["9.0"]["MistralForCausalLM"]
    assert {r["layer"] for r in a["rows"]} == {"full"} and cell(a)["state"] == "not affected"
    assert all(k["told"]["window_left"] == -1 for r in a["rows"] for k in r["kernels"])
    assert doc["checkpoint"]["values"]["sliding_window"] == {"value": None, "from": "user"}


EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "checkpoints"


@pytest.mark.matrix
@pytest.mark.parametrize("version", ("0.20.0", "0.34.0"))
def test_the_example_checkpoints_are_judged_at_their_own_windows_on_an_old_and_a_new_release(version):
    """#41's check for vLLM on examples/checkpoints: the Gemma-2 fine-tune (``sliding_window: 1024``) asks and
    is told window_left 1023 on every sliding path, not Gemma2Config's 4095; the Mistral whose window is null
    drives full layers only and is not affected (exit 0). The windows are the files' own, read back as JSON."""
    import contextlib
    import io

    from swa_repro.vllm.audit.verdict import cell

    _overlay(version)
    for name, arch in (("gemma2-window1024", "Gemma2ForCausalLM"), ("mistral-no-window", "MistralForCausalLM")):
        folder = EXAMPLES / name
        w = json.loads((folder / "config.json").read_text())["sliding_window"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            rc = main(["audit", "--vllm", version, "--model", str(folder), "--json"])
        a = json.loads(out.getvalue())["audits"]["9.0"][arch]
        sliding = [r for r in a["rows"] if r["layer"] == "sliding"]
        if w is None:
            assert rc == 0 and not sliding and cell(a)["state"] == "not affected", (name, rc)
            assert all(k["told"]["window_left"] == -1 for r in a["rows"] for k in r["kernels"])
            continue
        assert rc in (0, 1) and sliding and all(r["asked"]["window_left"] == w - 1 for r in sliding if r.get("asked"))
        told = {k["told"]["window_left"] for r in sliding for k in r["kernels"]}
        assert told == {w - 1}, (name, told)


@pytest.mark.matrix
@pytest.mark.parametrize("version", ("0.20.0", "0.34.0"))
def test_an_encoder_only_checkpoint_gets_the_releases_refusal_not_a_decoders_verdict(version, tmp_path):
    """A ModernBert config.json (transformers' ModernBertConfig: a sliding window in its layer_types) was driven
    as a decoder and answered "layer != HF" (its ``sliding_window + 1``, bidirectional). vLLM's model file builds
    ``EncoderOnlyAttention``, which ``FlashInferImpl`` refuses: the answer is that refusal, both lines read back
    from the release's files, as the table's column for the same architecture says (one rule)."""
    import contextlib
    import io

    from transformers import ModernBertConfig

    from swa_repro.vllm import archs

    overlay = _overlay(version)
    values = {**ModernBertConfig().to_dict(), "architectures": ["ModernBertForSequenceClassification"]}
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["audit", "--vllm", version, "--model", _folder(tmp_path, "mb", values), "--json"])
    assert rc == 0
    a = json.loads(out.getvalue())["audits"]["9.0"]["ModernBertForSequenceClassification"]
    assert "rows" not in a and a["refused"] == a["family"]["refused"]  # nothing driven as a decoder
    cited = re.findall(r"(vllm/[\w/]+\.py):(\d+)", a["refused"])
    assert [Path(rel).name for rel, _ in cited] == ["modernbert.py", "flashinfer.py"], a["refused"]
    lines = [(overlay / rel).read_text().splitlines()[int(n) - 1] for rel, n in cited]
    assert "EncoderOnlyAttention(" in lines[0] and "attn_type != AttentionType.DECODER" in lines[1]
    col = archs.column("ModernBertModel", archs.discover(overlay)["ModernBertModel"], version, overlay)
    assert col["fam"]["refused"] == a["refused"]


# ----------------------------------------------------------------------------- bad input: one line, exit 2
@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    """A vLLM overlay whose registry serves Gemma-2 only (and 0.99.0 beside it serving Olmo3); the
    child fails the test."""
    from swa_repro.vllm import provision
    from swa_repro.vllm.audit import core as audit

    for v, arch, mod in (("0.34.0", "Gemma2ForCausalLM", "gemma2"), ("0.99.0", "Olmo3ForCausalLM", "olmo3")):
        reg = tmp_path / "vllm" / v / "vllm" / "model_executor" / "models" / "registry.py"
        reg.parent.mkdir(parents=True)
        reg.write_text(f'_TEXT_GENERATION_MODELS = {{\n    "{arch}": ("{mod}", "{arch}"),\n}}\n')
    monkeypatch.setattr(provision, "provision", lambda v: (tmp_path / "vllm" / "0.34.0", {"cached": True}))

    def never(*a, **k):
        raise AssertionError("no child for bad input")

    monkeypatch.setattr(audit, "_child", never)
    return tmp_path


@pytest.mark.parametrize("values, must", [
    ("{not json", "is not valid JSON"),
    ({"model_type": "gemma2"}, "has no architectures"),
    ({"architectures": [], "model_type": "gemma2"}, "has no architectures"),
    ({"architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3"},
     "Olmo3ForCausalLM is not in vLLM 0.34.0's model registry"),
])
def test_a_bad_config_is_one_line_exit_2_before_any_audit(values, must, fake_vllm, capsys):
    folder = _folder(fake_vllm, "bad", values)
    assert main(["audit", "--vllm", "0.34.0", "--model", folder]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and must in err[0], err
    if "registry" in must:
        assert "vLLM 0.99.0 (already on this machine) serves it" in err[0], err


def test_a_missing_path_and_the_live_step_are_one_line(fake_vllm, capsys):
    assert main(["audit", "--vllm", "0.34.0", "--model", str(fake_vllm / "nothing-here")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    folder = _folder(fake_vllm, "g2", GEMMA2)
    assert main(["audit", "--vllm", "0.34.0", "--model", folder, "--mode", "model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mode with --vllm X --model PATH" in err[0]


@pytest.mark.matrix
def test_a_window_from_another_key_is_cited_not_guessed_and_a_zero_window_is_none(tmp_path):
    """plamo3.py hands ``config.interleaved_sliding_window[layer_idx]``: the cell is not driven, the
    line cited (read back from the release's file); ``sliding_window: 0`` is vLLM's "no window"
    (``ModelConfig``: 0 -> None)."""
    from swa_repro.vllm import checkpoint, registry

    overlay = _overlay("0.34.0")
    if "Plamo3ForCausalLM" not in registry.served(overlay):
        pytest.skip("0.34.0 has no Plamo3ForCausalLM")
    plamo = {"architectures": ["Plamo3ForCausalLM"], "model_type": "plamo3", "hidden_size": 1024,
             "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 2, "sliding_window": 2048,
             "interleaved_sliding_window": [2048, None],  # and the keys plamo3.py reads on every config:
             "layer_types": ["sliding_attention", "full_attention"], "head_dim": 128, "vocab_size": 1000,
             "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "intermediate_size": 2048,
             "max_position_embeddings": 4096}
    got = checkpoint.resolve(_ck(tmp_path, "plamo", plamo), "0.34.0", overlay)
    rel, line = got["error"].split("(", 1)[1].split(":")[:2]
    assert "interleaved_sliding_window" in (overlay / rel).read_text().splitlines()[int(line) - 1]
    zero = checkpoint.resolve(_ck(tmp_path, "zero", {**MISTRAL, "sliding_window": 0}), "0.34.0", overlay)
    assert zero["hf_sliding_window"] is None and all(k["sliding_window"] is None for k in zero["layers"].values())


@pytest.mark.matrix
def test_sinks_the_model_file_passes_only_for_some_configs_are_said_so(tmp_path):
    """granite.py (0.34.0) passes ``sinks=self.sinks`` where ``self.sinks`` is None for some configs:
    the source line says the audit took them as passed; gpt-oss' are always passed."""
    from swa_repro.vllm import checkpoint, registry

    overlay = _overlay("0.34.0")
    if "GraniteForCausalLM" not in registry.served(overlay):
        pytest.skip("0.34.0 has no GraniteForCausalLM")
    granite = {"architectures": ["GraniteForCausalLM"], "model_type": "granite", "hidden_size": 1024,
               "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 2, "sliding_window": 512,
               "layer_types": ["sliding_attention", "full_attention"]}
    got = checkpoint.resolve(_ck(tmp_path, "granite", granite), "0.34.0", overlay)
    rel, line = got["sources"]["sinks"].split(":")[:2]
    assert "sinks=self.sinks" in (overlay / rel).read_text().splitlines()[int(line) - 1]
    assert "None for some configs" in got["sources"]["sinks"] and got["layers"]["sliding"]["sinks"] is True
    assert got["layers"]["sliding"]["sliding_window"] == 512 and got["layers"]["full"]["sliding_window"] is None


@pytest.mark.matrix
def test_a_key_the_model_file_reads_that_the_config_lacks_is_one_line_naming_it_and_the_line(tmp_path, monkeypatch,
                                                                                                  capsys):
    """#41 item 7: a Gemma-2 fine-tune whose ``model_type`` transformers has no class for (a plain
    PretrainedConfig: no defaults) and whose file lacks ``query_pre_attn_scalar``: vLLM's gemma2.py
    reads it on every config (``self.scaling = config.query_pre_attn_scalar**-0.5``), so the build would
    stop in an AttributeError. One line, exit 2, before any child; the key and the line are named, and
    the line (read back from the release's file) reads that key. With the key, the same file resolves."""
    from swa_repro.vllm import checkpoint
    from swa_repro.vllm.audit import core as audit

    overlay = _overlay("0.34.0")

    def never(*a, **k):
        raise AssertionError("no child for bad input")

    monkeypatch.setattr(audit, "_child", never)
    mine = {**GEMMA2, "model_type": "gemma2_finetune",
            "layer_types": ["sliding_attention", "full_attention"] * (GEMMA2["num_hidden_layers"] // 2)}
    lacking = {k: v for k, v in mine.items() if k != "query_pre_attn_scalar"}
    assert main(["audit", "--vllm", "0.34.0", "--model", _folder(tmp_path, "ft", lacking)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lacks query_pre_attn_scalar" in err[0] and "Traceback" not in err[0], err
    rel, line = re.search(r"(vllm/model_executor/models/\w+\.py):(\d+)", err[0]).groups()
    assert rel.endswith("gemma2.py") and "config.query_pre_attn_scalar" in \
        (overlay / rel).read_text().splitlines()[int(line) - 1]
    got = checkpoint.resolve(_ck(tmp_path, "ok", mine), "0.34.0", overlay)
    assert got["layers"]["sliding"]["sliding_window"] == GEMMA2["sliding_window"]


def test_a_key_missing_under_an_older_transformers_than_the_release_requires_says_so(tmp_path):
    """A key transformers' class gained after this venv's (0.34.0 gemma4.py:600 ``per_layer_config``, 0.34.0
    requiring transformers>=5.16.1) is named with the release's requirement, read from its METADATA."""
    from importlib import metadata

    from swa_repro.vllm.checkpoint import older_transformers

    have = metadata.version("transformers")
    meta = tmp_path / "vllm-9.9.9.dist-info" / "METADATA"
    meta.parent.mkdir()
    meta.write_text(f"Name: vllm\nRequires-Dist: transformers>{have}\nRequires-Dist: torch==2.9\n")
    got = older_transformers("9.9.9", tmp_path)
    assert f"transformers {have} here" in got and f"requires transformers>{have}" in got
    meta.write_text(f"Name: vllm\nRequires-Dist: transformers>={have}\n")
    assert older_transformers("9.9.9", tmp_path) == ""
