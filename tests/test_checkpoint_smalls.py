"""``python -m swa_repro.sglang.audit.checkpoint_smalls`` (issue #41's GPU step): users' checkpoints
read on a release's site as ``audit --model PATH`` reads them, written as the family child's
``--smalls-file``. Oracle: each ``examples/checkpoints/*/config.json`` read back as plain JSON (a
second route beside ``checkpoint.read``'s transformers class): the window, head_dim, heads and cap the
small config carries are the file's, and a null window leaves no sliding layer."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, skip_module_unless

skip_module_unless("transformers")

from swa_repro.sglang.audit import checkpoint_smalls

EXAMPLES = sorted((REPO / "examples" / "checkpoints").glob("*/config.json"))


@pytest.fixture(scope="module")
def overlay():
    from conftest import release_overlay

    return release_overlay("0.5.23")


@pytest.fixture(scope="module")
def written(overlay, tmp_path_factory):
    out = tmp_path_factory.mktemp("smalls") / "smalls.json"
    assert checkpoint_smalls.main(["--overlay", str(overlay), "--sglang", "0.5.23", "--out", str(out),
                                   *map(str, EXAMPLES)]) == 0
    return json.loads(out.read_text())


def _text(values: dict) -> dict:
    return values.get("text_config") or values


NO_WINDOW = {"llama"}  # transformers' modeling_llama.py applies no window: a file's sliding_window there is a stray


def _sliding(values: dict) -> bool:
    """A sliding layer from the file alone: its ``layer_types`` say so, else a window its model reads."""
    if values.get("layer_types"):
        return "sliding_attention" in values["layer_types"]
    return values["sliding_window"] is not None and values.get("model_type") not in NO_WINDOW


@pytest.mark.parametrize("config", EXAMPLES, ids=lambda p: p.parent.name)
def test_each_small_config_carries_the_files_values(written, config):
    values = _text(json.loads(config.read_text()))
    small = written[config.parent.name]  # labelled by its folder
    assert small["sliding_window"] == values["sliding_window"]
    assert small["head_dim"] == values.get("head_dim", values["hidden_size"] // values["num_attention_heads"])
    kv = values.get("num_key_value_heads", values["num_attention_heads"])  # PretrainedConfig's MHA default
    assert (small["num_qo_heads"], small["num_kv_heads"]) == (values["num_attention_heads"], kv)
    assert small["cap"] == float(values.get("attn_logit_softcapping") or 0.0)
    assert ("sliding" in small["kinds"]) == _sliding(values)
    assert small["full_layers"] == values["num_hidden_layers"] >= len(small["kinds"])  # a 1-layer draft: all of it


def test_labels_are_printed_for_the_childs_families(overlay, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert checkpoint_smalls.main(["--overlay", str(overlay), "--sglang", "0.5.23", "--out", str(out),
                                   str(EXAMPLES[0]), str(EXAMPLES[1].parent)]) == 0
    assert capsys.readouterr().out.strip() == f"{EXAMPLES[0].parent.name},{EXAMPLES[1].parent.name}"


@pytest.mark.parametrize("case", ["no overlay", "no config", "one label twice", "architecture the release lacks"])
def test_bad_input_is_one_line_exit_2_nothing_written(overlay, tmp_path, capsys, case):
    out, paths, ov = tmp_path / "s.json", [str(EXAMPLES[0])], str(overlay)
    if case == "no overlay":
        ov = str(tmp_path)
    elif case == "no config":
        paths = [str(tmp_path / "missing")]
    elif case == "one label twice":
        paths = [str(EXAMPLES[0]), str(EXAMPLES[0].parent)]
    else:
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"],
                                                                 "model_type": "llama"}))
        paths = [str(tmp_path / "m")]
    assert checkpoint_smalls.main(["--overlay", ov, "--sglang", "0.5.23", "--out", str(out), *paths]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()
