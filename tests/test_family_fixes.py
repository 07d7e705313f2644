"""The fixes of the family- and GPU-class-level findings (issue #25, ``fix.family_fixes``), checked
against oracles of their own: the window transformers intends (``families.small_config``), the
cutlass choice executed from the release's own statements with the platform and runner stubbed,
and 0.5.23 audited per family with ``--fix all`` (the companion table's audit, content-cached).
Other releases: ``-m matrix``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from swa_repro.cli import main
from swa_repro.sglang import fix
from swa_repro.sglang.audit.family_verdict import AFFECTED, HYBRID, LAYER_NOT_HF
from swa_repro.sglang.fix import family_fixes as ff
from swa_repro.sglang.fix.family_fixes import FAMILY_ORDER
from swa_repro.sglang.fix.fixes import ORDER

REPO = Path(__file__).resolve().parents[1]
RELEASES = ("0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22")


def _text(version: str, rel: str) -> str:
    from conftest import release_overlay

    return (release_overlay(version) / "sglang" / rel).read_text()


def _ruff_dirty(code: str) -> str | None:
    r = subprocess.run([sys.executable, "-m", "ruff", "format", "--diff", "--isolated", "-"], input=code,
                       capture_output=True, text=True)
    return None if r.returncode == 0 else r.stdout + r.stderr


def _fn(text: str, name: str, cls: str | None = None):
    """A function (or a class's method) of ``text`` alone, executed into a namespace."""
    tree = ast.parse(text)
    scope = tree.body if cls is None else next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    env: dict = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "<fixed>", "exec"), env)
    return env[name]


# ----------------------------------------------------------------------------- each fix on its file
def _check_fix(version: str, name: str):
    rel = fix.FIXES[name].file
    text = _text(version, rel)
    assert fix.states(text, (name,), rel)[name].state == "needed"
    new = fix.apply_fixes(text, (name,), rel)
    assert fix.states(new, (name,), rel)[name].state == "applied" and fix.apply_fixes(new, (name,), rel) == new
    ast.parse(new)
    return text, new


NEEDED_0_5_23 = tuple(n for n in FAMILY_ORDER if n != "ragged_prefix_full_layers")  # 0.5.21+ have that one


def test_the_full_layers_prefix_fix_reads_applied_where_the_release_has_it():
    for version, want in (("0.5.23", "applied"), ("0.5.20", "needed")):
        assert fix.states(_text(version, fix.BACKEND), ("ragged_prefix_full_layers",))[
            "ragged_prefix_full_layers"].state == want
    assert not (REPO / "docs" / "upstream" / "ragged_prefix_full_layers.diff").exists()


@pytest.mark.parametrize("name", NEEDED_0_5_23)
def test_family_fix_applies_once_and_is_ruff_clean_on_0_5_23(name):
    text, new = _check_fix("0.5.23", name)
    assert _ruff_dirty(text) is None and _ruff_dirty(new) is None
    assert fix.apply_fixes(text, ORDER, fix.FIXES[name].file) == (text if name == "commandr_window_hook"
                                                                       else fix.apply_fixes(text, ORDER))


@pytest.mark.matrix
@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("name", FAMILY_ORDER)
def test_family_fix_applies_on_every_release(version, name):
    if name == "ragged_prefix_full_layers" and version >= "0.5.21":
        pytest.skip("0.5.21+ plan the full layers' paged pass over the prefix themselves")
    text, new = _check_fix(version, name)
    if version >= "0.5.20":
        assert _ruff_dirty(new) is None
    if name == "sm100_no_cutlass_window":
        assert (_cutlass_choice(text, None, 30.0), _cutlass_choice(new, None, 30.0)) == ("cutlass", "fa2")
        assert _cutlass_choice(new, 4095, None) == "cutlass"


def test_commandr_fix_plans_the_window_the_layers_ask():
    """Issue #40 point 4: the hook returns what the sliding layers pass to RadixAttention (CohereAttention's
    own ``self.sliding_window_size = ...`` for a sliding layer, executed), HF's inclusive count, which vLLM
    keeps on purpose; the layers are not edited (the old fix gave the runner, and them, ``- 1``)."""
    from swa_repro.engine.families import small_config

    small = small_config("cohere2")
    text, new = _check_fix("0.5.23", "commandr_window_hook")
    cfg = types.SimpleNamespace(sliding_window=small.sliding_window, layer_types=["sliding_attention"])
    init = fix.source.Source(text).method("CohereAttention", "__init__")
    branch = next(n for n in ast.walk(init) if isinstance(n, ast.If) and "sliding_attention" in ast.unparse(n.test))
    me = types.SimpleNamespace(v2=True)
    exec(compile(ast.Module(body=[branch], type_ignores=[]), "<layer>", "exec"),  # noqa: S102
         {"self": me, "config": cfg, "layer_id": 0})
    tree = ast.parse(new)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    methods = lambda c: {m.name: m for m in classes[c].body if isinstance(m, ast.FunctionDef)}  # noqa: E731
    assert ff.HOOK in methods("Cohere2ForCausalLM") and ff.HOOK not in methods("CohereForCausalLM")
    env: dict = {}
    exec(compile(ast.Module(body=[methods("Cohere2ForCausalLM")[ff.HOOK]], type_ignores=[]), "<hook>", "exec"),  # noqa: S102
         env)
    assert env[ff.HOOK](types.SimpleNamespace(config=cfg)) == me.sliding_window_size == small.sliding_window
    assert ast.unparse(ff._radix_window_kw(fix.source.Source(new)).value) == "self.sliding_window_size"
    assert small.intended_window == small.sliding_window - 1  # what the audit reports as layer != HF


def _cutlass_choice(text: str, window, cap, head_dim=128) -> str:
    """The statements of ``__init__`` from ``fmha_backend = "auto"`` to the ragged wrapper, executed
    on an sm100 with no piecewise graph, for a runner of ``window`` and a config of ``cap``."""
    src = fix.source.Source(text)
    init = src.method("FlashInferAttnBackend", "__init__")
    body = init.body
    i = next(k for k, s in enumerate(body) if ast.unparse(s) == "fmha_backend = 'auto'")
    j = next(k for k, s in enumerate(body) if ast.unparse(s).startswith("self.prefill_wrapper_ragged ="))
    code = compile(ast.Module(body=body[i:j], type_ignores=[]), "<init>", "exec")
    mc = types.SimpleNamespace(head_dim=head_dim, v_head_dim=head_dim,
                               hf_text_config=types.SimpleNamespace(attn_logit_softcapping=cap))
    env = {"model_runner": types.SimpleNamespace(sliding_window_size=window, model_config=mc),
           "get_platform": lambda: types.SimpleNamespace(is_sm100=True), "is_sm100_supported": lambda: True,
           "check_cuda_graph_backend": lambda *a: False, "Phase": types.SimpleNamespace(PREFILL=0),
           "Backend": types.SimpleNamespace(TC_PIECEWISE=0)}
    if ff.CUTLASS_GATE in text:
        env[ff.CUTLASS_GATE] = _fn(text, ff.CUTLASS_GATE)
    exec(code, env)  # noqa: S102
    return env["fmha_backend"]


def _ragged_backends(text: str, window, cap, head_dim=128, switch: str | None = None) -> dict:
    """The backend each ragged wrapper of ``__init__`` is built with (shared, sliding-window), executing
    its statements from ``fmha_backend = "auto"`` through the sliding-window wrapper on an sm100."""
    src = fix.source.Source(text)
    body = src.method("FlashInferAttnBackend", "__init__").body
    i = next(k for k, s in enumerate(body) if ast.unparse(s) == "fmha_backend = 'auto'")
    j = next(k for k, s in enumerate(body) if "prefill_wrapper_ragged_swa = BatchPrefill" in ast.unparse(s))
    built = []
    mc = types.SimpleNamespace(head_dim=head_dim, v_head_dim=head_dim,
                               hf_text_config=types.SimpleNamespace(attn_logit_softcapping=cap))
    me = types.SimpleNamespace(workspace_buffer=None, is_multimodal=False, enable_mis=False,
                               enable_deterministic=False, use_paged=False)
    if switch is not None and switch != "skip_prefill":
        setattr(me, switch, True)
    env = {"model_runner": types.SimpleNamespace(sliding_window_size=window, model_config=mc), "self": me,
           "skip_prefill": switch == "skip_prefill", "get_platform": lambda: types.SimpleNamespace(is_sm100=True),
           "is_sm100_supported": lambda: True, "check_cuda_graph_backend": lambda *a: False,
           "Phase": types.SimpleNamespace(PREFILL=0), "Backend": types.SimpleNamespace(TC_PIECEWISE=0),
           "BatchPrefillWithRaggedKVCacheWrapper": lambda *a, backend: built.append(backend) or backend}
    if ff.CUTLASS_GATE in text:
        env[ff.CUTLASS_GATE] = _fn(text, ff.CUTLASS_GATE)
    exec(compile(ast.Module(body=body[i:j + 1], type_ignores=[]), "<init>", "exec"), env)  # noqa: S102
    return {"shared": me.prefill_wrapper_ragged, "sliding": me.prefill_wrapper_ragged_swa}


@pytest.mark.parametrize("switch", ["skip_prefill", "is_multimodal", "enable_mis", "enable_deterministic", "use_paged"])
def test_the_sliding_window_ragged_wrapper_exists_whenever_the_runner_has_a_window(switch):
    """Issue #40 (non-blocking): built whatever the backend's switches, as the shared one is (a hand copy
    of use_ragged's gates left it None where a path still plans it, e.g. the dLLM CUDA-graph path)."""
    new = fix.apply_fixes(_text("0.5.23", fix.BACKEND), ORDER)
    assert _ragged_backends(new, 4095, None, switch=switch)["sliding"] is not None
    assert _ragged_backends(new, None, None, switch=switch)["sliding"] is None  # no window, no wrapper


@pytest.mark.parametrize("window, cap, want", [(4095, None, ("cutlass", "fa2")), (4095, 50.0, ("fa2", "fa2")),
                                               (None, None, ("cutlass", None))])
def test_sm100_only_the_sliding_window_wrapper_leaves_cutlass(window, cap, want):
    """``--fix all`` on 0.5.23: the sliding layers' ragged wrapper is fa2 (cutlass plans no window), the
    shared one (full layers) stays cutlass unless the layers cap."""
    new = fix.apply_fixes(_text("0.5.23", fix.BACKEND), fix.ALL)
    got = _ragged_backends(new, window, cap)
    assert (got["shared"], got["sliding"]) == want
    assert _ragged_backends(new, window, cap, head_dim=256)["shared"] == "fa2"  # the release's own head-dim gate


@pytest.mark.parametrize("window, cap, want", [(None, None, "cutlass"), (4095, None, "cutlass"), (None, 50.0, "fa2"),
                                               (None, 0.0, "cutlass"), (127, 30.0, "fa2")])
def test_sm100_fix_keeps_fa2_on_the_shared_wrapper_only_for_a_cap(window, cap, want):
    """The shared ragged wrapper serves the full layers once the ragged fixes give the sliding ones their
    own (issue #40 point 5): a window alone keeps it on cutlass; a cap (which cutlass drops) does not."""
    text, new = _check_fix("0.5.23", "sm100_no_cutlass_window")
    assert _cutlass_choice(text, window, cap) == "cutlass"  # as shipped: whatever the layers ask
    assert _cutlass_choice(new, window, cap) == want
    assert _cutlass_choice(new, window, cap, head_dim=256) == "fa2"  # the release's own head-dim gate stays


@pytest.mark.parametrize("name", NEEDED_0_5_23)
def test_committed_upstream_diff_is_regenerated_and_applies(name):
    from swa_repro.sglang.fix import upstream_family as uf
    from swa_repro.sglang.fix.upstream_diff import plus_side

    rel = fix.FIXES[name].file
    text = _text("0.5.23", rel)
    committed = (REPO / "docs" / "upstream" / f"{name}.diff").read_text()
    assert committed == uf.diff_of(name, text), "stale: python -m swa_repro.sglang.fix.upstream_family"
    assert committed.startswith(f"--- a/python/sglang/{rel}\n")
    assert plus_side(text, committed) == fix.apply_fixes(text, (name,), rel)
    assert f"## {name}" in (REPO / "docs" / "upstream" / "families.md").read_text()


# ----------------------------------------------------------------------------- the machinery
def test_fixes_of_two_files_are_one_line_exit_2(capfd, tmp_path):
    src = tmp_path / "commandr.py"
    src.write_text("x = 1\n")
    rc = main(["patch", "diff", "--fix", "commandr_window_hook,soft_cap_decode", "--source", str(src)])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "edit different files" in err[0]


def test_all_names_every_fix_and_each_file_takes_its_own():
    assert fix.parse_names("all") == ORDER + FAMILY_ORDER
    assert fix.by_file(fix.parse_names("all"))[ff.COMMANDR] == ("commandr_window_hook",)
    assert set(fix.by_file(fix.ALL)[fix.BACKEND]) == set(ORDER) | {"sm100_no_cutlass_window",
                                                                       "ragged_prefix_full_layers"}


def test_content_digest_sees_a_replaced_model_file(tmp_path):
    from swa_repro.sglang.provision import content_digest

    ov = tmp_path / "ov"
    (ov / "sglang-0.5.23.dist-info").mkdir(parents=True)
    (ov / "sglang-0.5.23.dist-info" / "RECORD").write_text("r\n")
    (ov / "sglang" / "srt" / "models").mkdir(parents=True)
    model = ov / "sglang" / ff.COMMANDR
    model.write_text("a\n")
    before = content_digest(ov)
    model.write_text("b\n")
    assert content_digest(ov) == before  # a shipped overlay: RECORD says what it holds
    (ov / ".swa-repro-fixed.json").write_text(json.dumps({"files": {f"sglang/{ff.COMMANDR}": {}}}))
    fixed_b = content_digest(ov)
    model.write_text("a\n")
    assert content_digest(ov) != fixed_b


# ----------------------------------------------------------------------------- what to do
def _cells_0_5_23():
    t = json.loads((REPO / "docs" / "audit" / "families.json").read_text())
    return [(r["gpu"], f, c) for r in t["rows"] if r["sglang"] == "0.5.23" for f, c in r["cells"].items()]


@pytest.mark.parametrize("gpu, family, cell", _cells_0_5_23(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_cell_says_what_to_do(gpu, family, cell):
    from swa_repro.sglang.audit.family_fix import remedy

    r = remedy(family, cell, gpu)
    state, lw = cell["state"], cell.get("layer_window") or {}
    if state == "flashinfer refused":
        assert r["fix"] is None and f"--attention-backend {cell['default_backend']}" in r["instead"]
        assert cell["default_backend"] in cell["why"][0].lower()  # one the refusal itself allows (0.5.23 iquest_q1: "FA3")
    elif state == "crashes on FlashInfer":
        assert r["fix"] is None and "an argument it does not take" in r["instead"]
    elif state == "not built":  # a discovered architecture with no buildable published config
        assert r["fix"] is None and "--model PATH/config.json" in r["instead"]
    elif state == "not driven":  # built at published defaults, no path driven (0.5.23 NemotronHForCausalLM)
        assert r["fix"] is None and "no verdict" in r["instead"] and "--model PATH/config.json" in r["instead"]
    elif state == "fallback: not audited" or (cell.get("note") or "").startswith(
            "served through sglang's Transformers fallback") and state in AFFECTED:  # no fix edits the fallback
        assert r["fix"] is None and "Transformers fallback" in r["instead"]
    elif state == HYBRID:
        assert r["fix"] is None and "--disable-hybrid-swa-memory" in r["instead"]
    elif lw.get("sliding") == -1 and cell.get("window_hf"):
        assert r["fix"] is None and f"--context-length {cell['window_hf']} or less" in r["instead"]
    elif state == LAYER_NOT_HF:
        assert r["fix"] is None and "no fix in swa-repro" in r["instead"]
    elif state == "not affected":
        assert r == {"fix": None, "instead": None}
    else:  # affected somewhere: --fix all, with the family's and the GPU class's own fixes where they apply
        assert r["fix"][0] == "all" and ("commandr_window_hook" in r["fix"]) == (family == "cohere2")
        assert "sm100_no_cutlass_window" not in r["fix"] or gpu == "sm100"


# ----------------------------------------------------------------------------- the audit with the fixes
@pytest.fixture(scope="module")
def fixed_sm100():
    from conftest import release_families

    _text("0.5.23", fix.BACKEND)
    # the families the tests read: one the fixes make exact, one sglang has no fix for, one it refuses; of
    # the whole audit with the fixes (the sweep's child, shared: conftest.release_families)
    doc = release_families("0.5.23", fix.parse_names("all"))["sm100"]
    return {f["family"]: f for f in doc["families"]}


@pytest.mark.slow
def test_0_5_23_cohere2_with_the_fixes_plans_what_its_layers_ask_on_sm100(fixed_sm100):
    """Every kernel is told the layers' window (HF's inclusive count, kept as vLLM keeps it): exact against
    the layer, one key more than transformers' mask: layer != HF, as vLLM's table says it."""
    from swa_repro.engine.families import small_config

    f = fixed_sm100["cohere2"]
    assert f["build"]["runner_window"] == small_config("cohere2").sliding_window
    driven = [r for r in f["paths"] if r.get("status") == "driven"]
    assert driven and all(r.get("verdict_vs_layer", r["verdict"]) == "exact" for r in driven), \
        [r["path"] for r in driven if r.get("verdict_vs_layer", r["verdict"]) != "exact"]
    ragged = {kind: [w for r in driven if r["kind"] == kind for k, ws in r["wrappers"].items() if k.startswith("Ragged")
                     for w in ws] for kind in ("sliding", "full")}
    assert ragged["sliding"] and any(w == "fa2 -> fa2" for w in ragged["sliding"])  # its own wrapper: off cutlass
    assert ragged["full"] and all(w.endswith("-> cutlass") for w in ragged["full"])  # no cap: the full layers keep it
    assert f["answer"]["state"] == "layer != HF" and f["remedy"]["fix"] is None


@pytest.mark.slow
def test_0_5_23_without_a_fix_in_sglang_stays_as_it_was(fixed_sm100):
    assert fixed_sm100["mistral"]["answer"]["state"] == "layer != HF"  # its layers ask no window: the model file
    assert fixed_sm100["mistral"]["remedy"]["fix"] is None
    assert fixed_sm100["gpt-oss"]["answer"]["state"] == "flashinfer refused"


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.14", "0.5.20"])
def test_with_the_fixes_every_path_is_exact_on_older_releases(version):
    """The same audit on releases whose files differ (0.5.14: no head-dim gate on cutlass, the runner's
    window set inline in load_model; 0.5.20: get_platform()); both plan the full layers' paged pass
    over the whole sequence (``ragged_prefix_full_layers``)."""
    from swa_repro.engine.families import small_config
    from swa_repro.sglang.audit.family_run import audit_families

    _text(version, fix.BACKEND)
    doc = audit_families(version, "gemma2,cohere2", "sm100", fixes=fix.parse_names("all"), note=lambda s: None)
    for f in doc["families"]:
        sliding = f["kinds"]["sliding"]
        assert f["build"]["runner_window"] == sliding["layer_window"]  # the runner plans what the layers ask
        driven = [r for r in f["paths"] if r.get("status") == "driven"]
        assert driven and all(r.get("verdict_vs_layer", r["verdict"]) == "exact" for r in driven), \
            [(r["kind"], r["path"]) for r in driven if r.get("verdict_vs_layer", r["verdict"]) != "exact"]
        off = sliding["layer_window"] != small_config(f["family"]).intended_window  # cohere2: HF's count
        assert f["answer"]["state"] == ("layer != HF" if off else "not affected")
