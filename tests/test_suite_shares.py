"""The suite computes each expensive thing once (the developers' guide: ``make test`` from nothing on 2
cores within 5 minutes): the tests that read a release's family cells ask for the sweep's whole set
(``conftest.release_families``), the heaviest files start first (``conftest.HEAVY_FIRST``), and a fork server
with nothing learned (one per worker from nothing) does not import torch & co. twice (``engine.preload_seed``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import conftest
import pytest

from swa_repro.engine.families import GPU_CLASSES

TESTS = Path(__file__).resolve().parent


def test_release_families_asks_every_family_and_gpu_class_once(monkeypatch):
    """A subset of cells asked first costs a child of its own and the sweep's a second one for the rest:
    every reader asks for all families x all GPU classes, shipped or with the fixes it names."""
    from swa_repro.sglang.audit import family_run

    asked = []
    monkeypatch.setattr(conftest, "release_overlay", lambda v: asked.append(("overlay", v)))
    monkeypatch.setattr(family_run, "audit_release", lambda v, family, gpus, fixes=None, note=print, archs=False: (
        asked.append((v, family, tuple(gpus), fixes, archs)) or {g: {"gpu": g} for g in gpus}))
    assert conftest.release_families("0.5.23") == {g: {"gpu": g} for g in GPU_CLASSES}
    conftest.release_families("0.5.23", ("a", "b"))
    every = tuple(GPU_CLASSES)
    assert asked == [("overlay", "0.5.23"), ("0.5.23", "all", every, None, False),
                     ("overlay", "0.5.23"), ("0.5.23", "all", every, ("a", "b"), False)]


def test_the_family_cell_readers_share_the_sweep():
    """test_audit_family's and test_family_fixes' 0.5.23 documents and test_remedy's sweep come from
    ``release_families``: none of them audits a family subset of 0.5.23 itself."""
    for name in ("test_audit_family.py", "test_family_fixes.py", "test_remedy.py"):
        text = (TESTS / name).read_text()
        assert "release_families(" in text, name
        assert 'audit_families("0.5.23"' not in text and 'audit_release(v, "all"' not in text, name


def test_every_heavy_first_file_exists():
    """A renamed or removed file in ``HEAVY_FIRST`` would silently lose its early start."""
    assert len(set(conftest.HEAVY_FIRST)) == len(conftest.HEAVY_FIRST)
    assert [n for n in conftest.HEAVY_FIRST if not (TESTS / n).is_file()] == []


def test_the_kit_site_runs_every_kit_file_in_one_child():
    """test_upstream_kit's kit runs and test_kit_swa_cases_cpu's are one cache key per site (the same
    overlay and test files): the second file reads the first's child instead of running its own."""
    from test_kit_swa_cases_cpu import CASES
    from test_upstream_kit import KIT_CASES, KIT_FILES, TEST_FILE

    assert set(KIT_FILES) == {TEST_FILE, KIT_CASES, CASES} and all(f.is_file() for f in KIT_FILES)
    for name in ("test_upstream_kit.py", "test_kit_swa_cases_cpu.py"):
        text = (TESTS / name).read_text()
        assert "_run(kit_copy.kit_overlay(b" in text and "list(KIT_FILES)" in text, name


def test_a_release_file_reader_installs_the_overlay_rather_than_skipping(monkeypatch, tmp_path):
    """A cold suite must run the tests that read a release's files by a second route: ``release_srt``
    asks ``provision`` for the overlay (installed now unless cached), it does not skip when the folder
    is not there yet."""
    from swa_repro.sglang import provision

    asked = []

    def fake(version, *, any_release=False):
        asked.append((version, any_release))
        (tmp_path / "sglang" / "srt" / "models").mkdir(parents=True, exist_ok=True)
        return tmp_path, {}
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(provision, "provision", fake)
    try:
        srt = conftest.release_srt("0.5.23")
    except pytest.skip.Exception as e:  # what it did before: the test reading the release skipped
        pytest.fail(f"release_srt skipped instead of installing the overlay: {e}")
    assert srt == tmp_path / "sglang" / "srt"
    assert asked == [("0.5.23", True)]


def test_the_whole_audit_readers_ask_what_notebook_04_asks(monkeypatch):
    """0.5.23's whole audits (``audit.release``, every path) as shipped and with the fixes are one cache key
    each for notebook 04, test_audit_spec and test_graph_verify: ``release_audits`` asks notebook 04's pair
    (``fix_view.audit_pair``: the finding classes' fixes, ORDER), and neither test file asks another fix set
    of the whole audit (``fix.ALL``, the family fixes too, was a third child of its own)."""
    from swa_repro.notebook import fix_view
    from swa_repro.sglang.audit import release
    from swa_repro.sglang.fix.fixes import ORDER

    asked = []
    monkeypatch.setattr(conftest, "release_overlay", lambda v: None)
    monkeypatch.setattr(release, "audit_release", lambda v, fixes=None, note=print, **k: (
        asked.append((v, tuple(fixes) if fixes else None, k)) or {"release": {}}))
    docs = conftest.release_audits("0.5.23")
    assert set(docs) == {"shipped", "fixed"} and asked == [("0.5.23", None, {}), ("0.5.23", tuple(ORDER), {})]
    assert fix_view.load_release("0.5.23", "all").names == tuple(ORDER)
    for name in ("test_audit_spec.py", "test_graph_verify.py"):
        text = (TESTS / name).read_text()
        assert 'release_audits("0.5.23")' in text and "fixes=fix.ALL" not in text, name


def test_the_checkpoint_server_test_resolves_the_checkpoint_audits_cell(tmp_path):
    """test_server_run's ``--model PATH`` ServerArgs test and test_checkpoint_config's null-window Mistral
    audit ask the same ServerArgs cell (``server_run.server_facts``: the model's name and its small config's
    digest), so one child of 0.5.23 resolves it for both (a Mistral of its own was a child more)."""
    import json

    from test_checkpoint_config import MISTRAL
    from test_server_run import checkpoint

    from swa_repro.sglang import checkpoint as ckpt
    from swa_repro.sglang.server_run import config_digest

    def cell(values, folder):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(values))
        ck = ckpt.read(str(folder))
        return ck.family, config_digest(ckpt.small_config(ck).config)

    assert cell(checkpoint(), tmp_path / "server-run") == cell(MISTRAL, tmp_path / "checkpoint-config")


def test_the_checkpoint_audits_ask_one_serverargs_child_for_both(monkeypatch, tmp_path):
    """test_checkpoint_config's two checkpoint audits each asked the release's ServerArgs beside their family
    child (a ServerArgs child each): ``serving_of`` asks both checkpoints' cells in one call first, the cells
    (name, small config digest) each audit asks, so each audit reads its own."""
    import json

    from test_checkpoint_config import GEMMA2, MISTRAL, serving_of

    from swa_repro.sglang import checkpoint as ckpt
    from swa_repro.sglang.audit import family_run
    from swa_repro.sglang.server_run import config_digest

    asked = []
    monkeypatch.setattr(conftest, "release_overlay", lambda v: tmp_path)
    monkeypatch.setattr(family_run, "_serving", lambda overlay, v, names, ck=None, archs=None: asked.append(
        (v, names, ck, {n: config_digest(c) for n, c in (archs or {}).items()})) or {})
    folders = []
    for name, values in (("m", MISTRAL), ("g", GEMMA2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(values))
        folders.append(str(tmp_path / name))
    serving_of(folders)
    audits = [ckpt.read(f) for f in folders]  # what audit_release hands _serving: each checkpoint alone
    assert asked == [("0.5.23", [], None, {ck.family: config_digest(ckpt.small_config(ck).config) for ck in audits})]
    assert set(asked[0][3]) == {"mistral", "gemma2"}


def _make_test_values(fn, argname: str) -> list:
    """The values of ``fn``'s ``argname`` parametrization that ``make test`` runs (not marked ``matrix``)."""
    (mark,) = [m for m in fn.pytestmark if m.name == "parametrize" and m.args[0].split(",")[0] == argname]
    sets = [p if hasattr(p, "marks") else pytest.param(p) for p in mark.args[1]]
    return [p.values[0] for p in sets if not any(m.name == "matrix" for m in p.marks)]


def test_notebook_02_runs_once_in_make_test():
    """test_story ran notebook 02 twice in make test: test_notebooks_use_recordings_and_fail_on_a_wrong_one's run
    (stand-in recordings) is make test's one and holds what a run must; test_notebook_runs_in_model_mode's run of
    it on the committed recordings (~58 s from nothing, 55 s of it one figure per recorded case) is in the
    release matrix."""
    import inspect

    import test_story

    make_test = _make_test_values(test_story.test_notebook_runs_in_model_mode, "name")
    assert make_test and "02_masks_and_cta_skips" not in make_test, make_test
    assert '"02_masks_and_cta_skips.py"' in inspect.getsource(test_story.test_notebooks_use_recordings_and_fail_on_a_wrong_one)


def test_the_hybrid_pool_probes_releases_make_test_compiles_anyway():
    """test_hybrid_pool's probe of the older route (ScheduleBatch._evict_swa, the allocator in
    swa_memory_pool.py) ran on 0.5.12, a release no other make-test file installs: its overlay and its compile
    for one child. It runs on 0.5.10 (test_server_run's ServerArgs child compiles it anyway), 0.5.12 in the
    release matrix: every release the probe runs on in make test is one test_server_run's children run on."""
    import test_hybrid_pool
    import test_server_run

    probed = _make_test_values(test_hybrid_pool.test_a_two_request_batch_reads_the_swa_slots_the_releases_rules_give,
                               "version")
    served = _make_test_values(test_server_run.test_families_without_a_static_rule_get_the_servers_answer, "version")
    assert len(probed) >= 2 and set(probed) <= set(served), (probed, served)


def _serve_once(monkeypatch, env: dict) -> list:
    """``forkserver.serve()`` in this process on an empty request stream: the names it preloads before forking."""
    from swa_repro.engine import forkserver

    preloads = []
    monkeypatch.setattr(forkserver, "_preload", lambda names, denied: preloads.append(set(names)))
    for k in (*forkserver.STATE, forkserver.LEARNED, "SWA_REPRO_FORKSERVER_SEED"):
        monkeypatch.delenv(k, raising=False)
    for k, v in {**{k: os.environ.get(k, "1") for k in forkserver.SINGLE_THREADED}, **env}.items():
        monkeypatch.setenv(k, v)
    r, w = os.pipe()
    os.close(w)
    saved = os.dup(0)
    os.dup2(r, 0)
    try:
        assert forkserver.serve() == 0
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(r)
    return preloads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux only")
def test_a_fork_server_with_nothing_learned_preloads_the_safe_roots_before_its_first_fork(monkeypatch):
    """From an empty cache a server's first run imported torch & co. itself and the server then again
    (test_upstream_kit's first kit run: 58 s, 25 s with a learned file): a server with nothing learned
    preloads the installed ``SAFE_ROOTS`` first, as a warm one does; ``SWA_REPRO_FORKSERVER_SEED=0``: nothing."""
    from swa_repro.engine.forkserver import SAFE_ROOTS

    first = _serve_once(monkeypatch, {})[0]
    assert {"torch", "numpy", "transformers"} <= first <= SAFE_ROOTS
    assert _serve_once(monkeypatch, {"SWA_REPRO_FORKSERVER_SEED": "0"})[0] == set()


def test_the_tests_of_a_file_fork_from_one_server():
    """pytest names the running test in ``PYTEST_CURRENT_TEST``, which every child's environment carries: in
    the server's key, each test that ran a child started (and preloaded) a server of its own."""
    from swa_repro.engine.forkserver import server_key

    env = {"PATH": "/bin", "PYTEST_CURRENT_TEST": "tests/test_a.py::test_one (call)"}
    assert server_key(env) == server_key({**env, "PYTEST_CURRENT_TEST": "tests/test_a.py::test_two (setup)"})
    assert server_key(env) != server_key({**env, "PATH": "/usr/bin"})  # the rest of the environment still counts
