"""Issue #42 item 4: every notebook checks every parameter in the cell right after its parameters
cell, in the notebook's words, and a bad one stops the notebook there, before anything is computed
or saved (papermill, and the lab's Run All: the kernel aborts the cells queued behind it)."""

from __future__ import annotations

import ast
import json
import re

import pytest

from swa_repro.notebook import artifacts
from swa_repro.notebook.param_cell import ParameterError, check
from swa_repro.notebook.places import NOTEBOOKS_DIR
from swa_repro.notebook.runner import available_notebooks

NOTEBOOKS = available_notebooks(NOTEBOOKS_DIR)
PARAMS_CELL = re.compile(r'# %% tags=\["parameters"\]\n(.*?)\n(?=# %%\n)', re.DOTALL)


def _defaults(stem: str) -> dict:
    body = ast.parse(PARAMS_CELL.search((NOTEBOOKS_DIR / f"{stem}.py").read_text()).group(1)).body
    return {n.targets[0].id: ast.literal_eval(n.value) for n in body if isinstance(n, ast.Assign)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_cell_after_parameters_is_the_one_check(path):
    text = path.read_text()
    after = text[PARAMS_CELL.search(text).end():].split("\n# %%", 2)[0]
    assert f'params_ok = param_cell.check("{path.stem}", globals())' in after
    assert check(path.stem, _defaults(path.stem)) is True  # the defaults pass


# (notebook, parameters as a user edits them, what the one line must say)
BAD = [
    ("07_my_model_my_gpu", {"model": "google/gemma-2-9b-it"}, ("model = 'google/gemma-2-9b-it': google/gemma-2-9b-it: "
     "no such file or folder; give a checkpoint's config.json, a folder holding one, or a family (gemma2")),
    ("07_my_model_my_gpu", {"model": "gemma-2"}, "model = 'gemma-2': choose one of gemma2, gemma3"),
    ("07_my_model_my_gpu", {"gpu": "h100"}, "gpu = 'h100': choose one of auto, sm80, sm90, sm100"),
    ("07_my_model_my_gpu", {"sglang_release": "0.9"}, "sglang_release = '0.9': "),
    ("03_apply_backend_patch", {"fixes": "bogus_fix"}, "fixes = 'bogus_fix': unknown bogus_fix; choose all (every fix) or from"),
    ("04_rerun_checks", {"cases": ["nope"]}, "cases = ['nope']: unknown case nope"),
    ("03_apply_backend_patch", {"window_left": "4"}, "window_left = '4': a str, not an int"),
    ("00_overview", {"num_qo_heads": 4, "num_kv_heads": 3}, "the seed case of these parameters: num_qo_heads=4 is not"),
    ("01_plan_with_and_without_window_left", {"tile_num_kv_heads": 3}, "the multi-tile case of these parameters"),
    ("02_masks_and_cta_skips", {"gqa_num_kv_heads": 7}, "the GQA case of these parameters"),
    ("05_backend_matrix_and_audit", {"prompts": []}, "prompts = []: an empty list"),
    ("06_performance", {"live_backends": "fa4"}, "live_backends = 'fa4': choose one of fa2"),
    ("08_vllm", {"mode": "fast"}, "mode = 'fast': choose one of auto, model, live"),
    ("00_overview", {"seed": object()}, "seed = <object object"),
]


@pytest.mark.parametrize("stem, edit, says", BAD, ids=[f"{b[0][:2]}-{next(iter(b[1]))}" for b in BAD])
def test_a_bad_parameter_is_one_line_in_the_notebooks_words(stem, edit, says):
    with pytest.raises(ParameterError) as e:
        check(stem, {**_defaults(stem), **edit})
    [line] = e.value._render_traceback_()  # what IPython shows instead of a traceback
    assert line.startswith("ParameterError: ") and says in line and "\n" not in line
    assert "--" not in line and "notebook " not in line  # no command-line flags, no "notebook 07 expects"


def test_model_takes_a_checkpoint_folder_or_its_config_json(tmp_path):
    """Notebook 07's ``model``: a checkpoint (issue #41 part 5), read as the audit reads it; a file
    without ``architectures`` is one line in the cell's words."""
    good, bad = tmp_path / "my-model", tmp_path / "no-arch"
    for d, values in ((good, {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "sliding_window": 1024}),
                      (bad, {"model_type": "gemma2"})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(values))
    for model in (str(good), str(good / "config.json")):
        assert check("07_my_model_my_gpu", {**_defaults("07_my_model_my_gpu"), "model": model}) is True
    with pytest.raises(ParameterError) as e:
        check("07_my_model_my_gpu", {**_defaults("07_my_model_my_gpu"), "model": str(bad)})
    [line] = e.value._render_traceback_()
    assert "has no architectures" in line and "--" not in line, line


def test_output_dir_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ParameterError, match=r"output_dir = '.*: output_dir .*/f is a file: give a folder"):
        check("08_vllm", {"mode": "model", "output_dir": str(tmp_path / "f")})


def test_artifact_set_writes_nothing_for_a_bad_parameter(tmp_path, monkeypatch):
    """Were a frontend to run on past the check cell, the set's folder is still never made."""
    monkeypatch.chdir(tmp_path)
    ns = {**_defaults("07_my_model_my_gpu"), "output_dir": str(tmp_path / "art"), "model": "gemma-2"}
    with pytest.raises(ParameterError, match="model = 'gemma-2'"):
        artifacts.artifact_set("07_my_model_my_gpu", ns)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- papermill, for real
@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """07 and 03 run by the project's runner with what a user typed into the cell (the CLI's own
    check, which refuses these before papermill, is what the lab bypasses)."""
    from swa_repro.notebook.runner import ensure_kernel, run_one

    kernel, out = ensure_kernel(), {}
    for stem, params in (("07_my_model_my_gpu", {"model": "google/gemma-2-9b-it"}),
                         ("03_apply_backend_patch", {"fixes": "bogus_fix"})):
        d = tmp_path_factory.mktemp(stem[:2])
        out[stem] = d, run_one(NOTEBOOKS_DIR / f"{stem}.py", d, "model", params, kernel, 300)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("stem, says", [("07_my_model_my_gpu", "model = 'google/gemma-2-9b-it': google/gemma-2-9b-it: no such"),
                                        ("03_apply_backend_patch", "fixes = 'bogus_fix': unknown bogus_fix")])
def test_papermill_stops_at_the_check_cell_and_saves_nothing(stopped, stem, says):
    d, r = stopped[stem]
    assert r["status"] == "failed" and r["error"].startswith(f"ParameterError: {says}")
    cells = [c for c in json.loads((d / f"{stem}.ipynb").read_text())["cells"] if c["cell_type"] == "code"]
    i = next(i for i, c in enumerate(cells) if "param_cell.check(" in "".join(c["source"]))
    [err] = [o for o in cells[i]["outputs"] if o["output_type"] == "error"]
    assert len(err["traceback"]) == 1 and says in err["traceback"][0]  # one line, no traceback
    assert all(c["execution_count"] is None for c in cells[i + 1:])  # no later cell ran
    written = {p.name for p in d.rglob("*")}
    assert written == {f"{stem}.ipynb", f"{stem}.html"}  # no params, mode, checks, figures, interactive/
    assert r["parameters"] is None and r["figures"] == []


@pytest.mark.slow
def test_run_all_in_a_kernel_stops_at_the_check_cell(tmp_path):
    """The lab's Run All sends every cell at once with stop_on_error; the check cell's error makes
    the kernel abort the rest, so no later cell runs on the previous run's state."""
    from jupyter_client.manager import start_new_kernel

    from swa_repro.notebook.runner import ensure_kernel

    text = (NOTEBOOKS_DIR / "07_my_model_my_gpu.py").read_text()
    cells = [c for c in text.split("\n# %%") if not c.lstrip().startswith("[markdown]")][1:4]
    assert "parameters" in cells[0] and "param_cell.check" in cells[1] and "artifact_set" in cells[2]
    cells = [c.split("\n", 1)[1] for c in cells]
    cells[0] = cells[0].replace('model = "gemma2"', 'model = "google/gemma-2-9b-it"')
    cells[0] = cells[0].replace('output_dir = "artifacts"', f'output_dir = "{tmp_path}"')
    km, kc = start_new_kernel(kernel_name=ensure_kernel(), cwd=str(NOTEBOOKS_DIR))
    try:
        ids = [kc.execute(c, stop_on_error=True) for c in [*cells, "print('ran on')"]]
        status = {}
        while len(status) < len(ids):
            m = kc.get_shell_msg(timeout=120)
            if m["parent_header"].get("msg_id") in ids:
                status[m["parent_header"]["msg_id"]] = m["content"]["status"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert [status[i] for i in ids] == ["ok", "error", "aborted", "aborted"]
    assert list(tmp_path.iterdir()) == []
