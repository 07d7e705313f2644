"""``examples/checkpoints``' published configs of architectures whose family-table column is "not built"
from class defaults (or whose defaults' window is not the published one), each audited on 0.5.23 as a
user would: ``swa-repro audit --sglang 0.5.23 --model FOLDER --json``. ~40 s a real audit: ``matrix``.

Oracles, each a second route beside the audit's answer: the window read from the config.json as plain
JSON (the answer reports the file's value), and the state the key audit gives (``_key_state``: the
paths' own extra or missing keys and each layer kind's window against transformers' mask, never the
answer's ``state``).
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from conftest import REPO, skip_module_unless

skip_module_unless("transformers")

pytestmark = pytest.mark.matrix

from swa_repro.cli import main

EXAMPLES = REPO / "examples" / "checkpoints"
# folder -> the kinds its one family must show (from the file: layer_types, or none for Llama's stray window)
CASES = {"llama-eagle3-gemma3-1b": {"full"}, "step3p5-flash": {"full", "sliding"}}


@pytest.fixture(scope="module", params=sorted(CASES))
def audited(request):
    from conftest import release_overlay

    release_overlay("0.5.23")
    folder = EXAMPLES / request.param
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["audit", "--sglang", "0.5.23", "--model", str(folder), "--gpu", "sm90", "--json"])
    assert rc in (0, 1), (rc, err.getvalue()[-400:])  # an answer, not a refusal (2)
    (f,) = json.loads(out.getvalue())["families"]
    return request.param, json.loads((folder / "config.json").read_text()), f, rc


def _key_state(f: dict) -> str | None:
    """The state from the key counts alone: no path with an extra or missing key and every layer kind at
    transformers' window is "not affected"; the default prefill (``serving.default_prefill``, no
    prefix) with such keys is "affected on the default path"."""
    bad = {p["path"] for p in f["paths"]
           if any(s["extra_keys"] or s["missing_keys"] for s in p["keys"].values())}
    if not bad and all(k["layer_window"] == k["intended_window"] for k in f["kinds"].values()):
        return "not affected"
    if f"extend_{f['serving']['default_prefill']}_no_prefix" in bad:
        return "affected on the default path"
    return None


def test_the_answer_reports_the_files_window(audited):
    _, raw, f, _ = audited
    assert f["config"]["sliding_window"] == (raw.get("text_config") or raw)["sliding_window"]
    assert f["checkpoint"]["values"]["sliding_window"] == {"value": raw["sliding_window"], "from": "user"}


def test_the_layer_kinds_are_the_files(audited):
    name, raw, f, _ = audited
    assert set(f["kinds"]) == CASES[name]
    if raw.get("layer_types"):  # the driven cut keeps the file's pattern
        assert f["config"]["kinds"] == [t.removesuffix("_attention") for t in raw["layer_types"]][:len(f["config"]["kinds"])]


def test_the_state_is_the_key_audits(audited):
    _, _, f, rc = audited
    state = _key_state(f)
    assert state is not None and f["answer"]["state"] == state, (f["answer"], state)
    assert rc == (0 if state == "not affected" else 1)  # core.exit_status
