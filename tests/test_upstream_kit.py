"""docs/upstream's registered regression test and the attention-kit diffs.

The kit diffs are what ``kit_edits`` makes of sglang 0.5.23's kit and apply to it; an edit whose
anchor is gone refuses loudly. The registered test is laid out as sglang's own
(test/registered/attention/unittests/swa/, ``CustomTestCase``, ``register_cuda_ci``). On a CPU
(``upstream_cpu``: FlashInfer's wrappers replaced by plan-time stand-ins) with the kit edits: the
registered test fails on 0.5.23 as shipped exactly where a plan-time parameter is dropped and
passes with every fix; sglang's own FlashInfer kit tests (tests/sglang_kit_flashinfer_cases.py)
fail as shipped only on the changed cases and pass fixed, and their unchanged cases pass both.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swa_repro.sglang.fix import kit_copy
from swa_repro.sglang.fix import kit_edits as ke
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.fix.kit_anchor import KitEditError
from swa_repro.sglang.fix.kit_tree import FOLLOW_UPS, TRITON
from swa_repro.sglang.fix.upstream_diff import TEST, VERSION, plus_side

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "upstream"
TEST_FILE = DOCS / TEST
KIT_CASES = REPO / "tests" / "sglang_kit_flashinfer_cases.py"
SWA_CASES = REPO / "tests" / "sglang_kit_swa_cases.py"
# the files run on a site with the kit edits: this file's and test_kit_swa_cases_cpu.py's, in one child per
# site (one cache key: the second file reads it), not a child each (a child's cost is importing the release)
KIT_FILES = (TEST_FILE, KIT_CASES, SWA_CASES)
NAMES = (*ke.ORDER, *FOLLOW_UPS, ke.ALL)


@pytest.fixture(scope="module")
def overlay():
    from conftest import release_overlay

    return release_overlay(VERSION)


@pytest.fixture(scope="module")
def texts(overlay):
    return ke.read(overlay)


# ----------------------------------------------------------------------------- kit diffs
def test_committed_kit_diffs_are_regenerated(texts):
    made = ke.diffs(texts)
    assert set(made) == set(NAMES)
    for name, d in made.items():
        stale = f"{name}.diff is stale: run python -m swa_repro.sglang.fix.upstream"
        assert (DOCS / f"{name}.diff").read_text() == d, stale


@pytest.mark.parametrize("name", NAMES)
def test_each_kit_diff_applies_to_the_release_kit(texts, name):
    d = (DOCS / f"{name}.diff").read_text()
    per_file = ke.split(d)
    base = FOLLOW_UPS.get(name, ())  # a follow-up applies on top of the edits it names
    under = {**texts, **ke.edit(texts, base)} if base else texts
    want = {p: t for p, t in ke.edit(texts, ke.ORDER if name == ke.ALL else (*base, name)).items()
            if t != under[p]}
    assert set(per_file) == set(want) and all(f"--- a/python/{p}\n" in d for p in want)
    for path, fd in per_file.items():
        got = plus_side(under[path], fd)
        assert got == want[path]
        ast.parse(got)


def test_kit_diffs_touch_only_what_they_say(texts):
    edited = ke.edit(texts)
    dense, verify = edited[ke.DENSE], edited[ke.VERIFY]
    assert set(ke.split((DOCS / "kit_swa_cases.diff").read_text())) == {ke.DENSE}
    assert set(ke.split((DOCS / "kit_dflash_swa_verify.diff").read_text())) == {ke.VERIFY}
    # the SWA case lists keep their cases and gain one each, with keys outside window 4
    for name in ("swa_extend_no_prefix_window_edges", "swa_extend_no_prefix_past_window",
                 "swa_extend_prefix_window_edges", "swa_extend_prefix_past_window"):
        assert dense.count(f'name="{name}"') == 1
    assert "extend_lens=(6, 9, 17)," in dense and "prefix_lens=(9, 5, 17)," in dense
    # the cap: a case field defaulting to 0.0, the layer's and the model config's cap, both references
    assert "    logit_cap: float = 0.0\n" in dense and dense.count("scores = logit_cap * torch.tanh(") == 2
    assert "attn_logit_softcapping=logit_cap if logit_cap > 0 else None," in dense
    # DFlash: no request-granular start left
    assert "prefix_start" not in verify and "(k_idx >= q_pos - window) & (k_idx <= q_pos)" in verify
    assert ke.states(texts) == dict.fromkeys(ke.EDITS, "needed")
    assert ke.states({**texts, **edited}) == {**dict.fromkeys(ke.ORDER, "applied"), TRITON: "needed"}
    # the tree window: by depth, but for the backends the kit declares by index (Triton: its own finding)
    assert 'TREE_WINDOW_BY_INDEX = frozenset({"triton"})' in dense
    assert "if case.backend not in TREE_WINDOW_BY_INDEX:" in dense


def test_a_missing_anchor_refuses_loudly_and_changes_nothing(texts):
    gone = {**texts, ke.VERIFY: texts[ke.VERIFY].replace("prefix_start = max(0, int(prefix_len) - window)",
                                                         "prefix_start = max(0, prefix_len - window)")}
    with pytest.raises(KitEditError, match="DFlash SWA verify masks: key start per query.*is gone"):
        ke.edit(gone)
    doc = '    """SWA prefix cases with prefix lengths below, at, and above the window."""\n'
    twice = {**texts, ke.DENSE: texts[ke.DENSE].replace(doc, doc + doc)}
    with pytest.raises(KitEditError, match="occurs 2 times"):
        ke.edit(twice, ("kit_swa_cases",))
    no_fn = {**texts, ke.DENSE: texts[ke.DENSE].replace("def make_swa_prefix_input_config_cases(", "def f(")}
    with pytest.raises(KitEditError, match="anchor 'def make_swa_prefix_input_config_cases\\(' is gone"):
        ke.edit(no_fn, ("kit_swa_cases",))
    with pytest.raises(KitEditError, match="unknown kit edit"):
        ke.edit(texts, ("kit_bogus",))


def test_apply_to_site_edits_in_place_once(texts, tmp_path, capsys):
    for p, t in texts.items():
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_text(t)
    assert ke.main(["--site", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("applied now") == len(ke.ORDER)
    assert ke.read(tmp_path) == {**texts, **ke.edit(texts)}
    assert ke.main(["--site", str(tmp_path)]) == 0  # again: nothing to do, nothing changed
    assert capsys.readouterr().out.count("already applied") == len(ke.ORDER)
    assert ke.read(tmp_path) == {**texts, **ke.edit(texts)}
    (tmp_path / ke.VERIFY).write_text(texts[ke.VERIFY])  # one edit undone, and another half-done
    half = ke.read(tmp_path)[ke.DENSE].replace("            logit_cap=logit_cap,\n", "", 1)
    (tmp_path / ke.DENSE).write_text(half)
    assert ke.main(["--site", str(tmp_path)]) == 1
    assert "partly edited kit" in capsys.readouterr().err
    assert ke.main(["--site", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line


# ----------------------------------------------------------------------------- the registered test
def test_registered_test_is_laid_out_as_sglangs():
    assert TEST.startswith("test/registered/attention/unittests/swa/test_") and TEST_FILE.is_file()
    text = TEST_FILE.read_text()
    tree = ast.parse(text)
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert roots - {"sglang", "torch"} <= set(sys.stdlib_module_names) and "swa_repro" not in text
    calls = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
    reg = [{k.arg: ast.literal_eval(k.value) for k in c.value.keywords} for c in calls
           if getattr(c.value.func, "id", "") == "register_cuda_ci"]
    # as sglang's registered tests call it (swa/test_flashinfer.py, test_flashinfer_logits_soft_cap.py):
    # per-commit stage base-b on the 1-GPU runner (H100/H200 class: the fa2/fa3 modules the fix plans)
    assert reg == [{"est_time": 20, "stage": "base-b", "runner_config": "1-gpu-large"}]
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    assert [b.id for b in cls.bases] == ["CustomTestCase"]
    assert "from sglang.test.test_utils import CustomTestCase" in text and "unittest.main()" in text
    # the kit builds every case: no KV written, no reference computed here
    assert "set_kv_buffer" not in text and "einsum" not in text and "softmax" not in text
    ruff = shutil.which("ruff") or ("/tmp/rv/bin/ruff" if os.access("/tmp/rv/bin/ruff", os.X_OK) else None)
    if ruff:
        p = subprocess.run([ruff, "format", "--isolated", "--check", str(TEST_FILE)], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr


# ----------------------------------------------------------------------------- on a CPU
def _run(overlay: Path, files: list[Path], tmp_path: Path) -> dict:
    """``upstream_cpu`` in a child on ``overlay`` over ``files``, cached by content (``core.cache``):
    the overlay's release and backend file, its kit files, the test files, swa-repro's code and the
    interpreter; a change of any runs it again."""
    from swa_repro.core.cache import cached, code_hash, interpreter
    from swa_repro.engine.child import child_env, run_module
    from swa_repro.sglang.provision import content_digest

    def run() -> dict:
        out = tmp_path / f"{overlay.name}.json"
        rc, _, err = run_module("swa_repro.sglang.fix.upstream_cpu", [str(overlay), str(out), *map(str, files)],
                                child_env(), tmp_path)
        assert rc == 0 and out.is_file(), err[-3000:]
        return json.loads(out.read_text())

    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    parts = {"overlay": content_digest(overlay), "kit": {p: sha((overlay / p).read_bytes()) for p in ke.FILES},
             "test_files": {f.name: sha(f.read_bytes()) for f in files}, "code": code_hash(),
             "interpreter": interpreter()}
    return cached("upstream-cpu", parts, run)[0]


@pytest.fixture(scope="module")
def cpu(overlay, tmp_path_factory):
    """Five CPU runs: 0.5.23 as shipped and with every fix, each with the kit edits (the registered
    test and the kit's FlashInfer cases) and with the kit as shipped (the kit's cases); and the
    registered test with the fixes as they were before #40 (``prior_eagle_shared_mask_buf``)."""
    from swa_repro.sglang.fix.overlay import fixed_overlay

    tmp = tmp_path_factory.mktemp("upstream-cpu")
    fixed = fixed_overlay(VERSION, ORDER, overlay)[0]
    out = {}
    for site, base in (("shipped", overlay), ("fixed", fixed)):
        out[site, "kit"] = _run(kit_copy.kit_overlay(base), list(KIT_FILES), tmp)
        out[site, "nokit"] = _run(base, [KIT_CASES], tmp)
    prior = fixed_overlay(VERSION, (*ORDER, "prior_eagle_shared_mask_buf"), overlay)[0]
    out["prior", "kit"] = _run(kit_copy.kit_overlay(prior), [TEST_FILE], tmp)
    return out


def _bad(doc: dict, key: str) -> set[str]:
    return {k for k, v in doc[key].items() if v != "pass"}


@pytest.mark.slow
def test_registered_test_on_cpu_fails_shipped_passes_fixed(cpu):
    """As shipped, every test fails but the three whose path 0.5.23 already gets right (paged-only
    and decode windows: PR #31501 and the decode window trim) and the kit precondition check; each
    failure is an assertion off the reference, and within the window-only tests exactly the cases
    with keys outside the window fail. With every fix, everything passes."""
    shipped, fixed = cpu["shipped", "kit"][TEST_FILE.name], cpu["fixed", "kit"][TEST_FILE.name]
    ok = {"test_kit_cases_and_expectations", "test_paged_window", "test_decode_window"}
    assert _bad(shipped, "tests") == set(shipped["tests"]) - ok, shipped["tests"]
    assert all(shipped["tests"][t].startswith("fail: ") for t in _bad(shipped, "tests")), shipped["tests"]
    assert all(v.startswith("fail: Tensor-likes are not close!") for k, v in shipped["subtests"].items()
               if v != "pass"), shipped["subtests"]
    window_only = {k for k in shipped["subtests"] if k.startswith(("test_ragged_no_prefix_window[",
                                                                   "test_ragged_prefix_window["))}
    assert window_only & _bad(shipped, "subtests") == {k for k in window_only if "past_window" in k}
    verify = {k for k in shipped["subtests"] if "_verify_window" in k}
    # EAGLE, NGRAM, Frozen-KV MTP: chain + tree x 2 cases, eager and CUDA graph; DFlash
    assert len(verify) == 25 and verify <= _bad(shipped, "subtests")
    assert len(shipped["tests"]) == 20 and len(shipped["subtests"]) == 62  # 52 cases, 10 kit checks
    assert set(fixed["tests"]) == set(shipped["tests"]) and set(fixed["subtests"]) == set(shipped["subtests"])
    assert _bad(fixed, "tests") == set() and _bad(fixed, "subtests") == set(), fixed


GRAPH_TESTS = ("test_eagle_verify_window_cuda_graph", "test_ngram_verify_window_cuda_graph",
               "test_frozen_kv_mtp_verify_window_cuda_graph")


@pytest.mark.slow
@pytest.mark.parametrize("test", GRAPH_TESTS)
def test_registered_cuda_graph_verify_catches_the_shared_mask_buffer(cpu, test):
    """The fix before #40 (every CUDA-graph verify wrapper on sglang's one packed-mask buffer): with
    the stand-ins' graph-mode buffer rules (``kernel.graph_buffers``) its CUDA-graph verify cases
    past the window fail, topk 1 and 2, through the kit's own ``run_dense_spec_verify_cuda_graph_case``;
    the same cases eager pass, as does every other test. Shipped fails them too; the fix passes."""
    prior, shipped, fixed = (cpu[s, "kit"][TEST_FILE.name] for s in ("prior", "shipped", "fixed"))
    assert _bad(prior, "tests") == set(GRAPH_TESTS)
    mine = {k for k in prior["subtests"] if k.startswith(f"{test}[")}
    assert mine <= _bad(prior, "subtests") and mine <= _bad(shipped, "subtests")
    assert not mine & _bad(fixed, "subtests")
    assert {k.split("topk=")[1].split(",")[0] for k in mine} == {"1", "2"} and len(mine) == 4
    eager = {k.replace("_cuda_graph[", "[") for k in mine}
    assert eager <= set(prior["subtests"]) and not eager & _bad(prior, "subtests")


@pytest.mark.slow
def test_kit_changed_cases_fail_shipped_pass_fixed_unchanged_pass_both(cpu):
    """sglang's own FlashInfer kit tests: with the edited kit, as shipped, exactly the two new SWA
    cases on the default (ragged) route and the DFlash SWA chain fail (the paged-only route is
    windowed in 0.5.23); with every fix all pass. With the kit as shipped, its cases pass on 0.5.23
    as shipped (they never put a key outside the window), and with every fix they pass but the DFlash
    chain, whose shipped expectation encodes the request-granular trim the fix replaces."""
    name = KIT_CASES.name
    edited = {s: cpu[s, "kit"][name] for s in ("shipped", "fixed")}
    shipped_kit = {s: cpu[s, "nokit"][name] for s in ("shipped", "fixed")}
    dflash = "test_runner_mode_spec_verify_cases[case=runner_dflash_verify_swa_chain, topk=1, spec_kind=dflash]"
    assert _bad(edited["shipped"], "subtests") == {
        "test_projected_swa_attention_cases[case=swa_extend_no_prefix_past_window, mode=default]",
        "test_projected_swa_attention_cases[case=swa_extend_prefix_past_window, mode=default]", dflash}
    assert _bad(edited["fixed"], "subtests") == set()
    new = set(edited["shipped"]["subtests"]) - set(shipped_kit["shipped"]["subtests"])
    assert {k.split("case=")[1].split(",")[0] for k in new} == {"swa_extend_no_prefix_past_window",
                                                                "swa_extend_prefix_past_window"}
    assert len(new) == 4 and len(shipped_kit["shipped"]["subtests"]) == 17  # 12 dense, 2 x 2 SWA, DFlash
    assert _bad(shipped_kit["shipped"], "subtests") == set()
    assert _bad(shipped_kit["fixed"], "subtests") == {dflash}
    for doc in (*edited.values(), *shipped_kit.values()):
        assert set(doc["subtests"]) >= set(shipped_kit["shipped"]["subtests"])
