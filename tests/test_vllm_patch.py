"""``swa-repro patch ... --vllm`` (issue #27): vLLM's cap-route fix on the installed vLLM's two files
(the FlashInfer backend and ``vllm/utils/flashinfer.py``, issue #40), with the sglang patch's
safety: a backup each, a byte-for-byte revert, and bad input one line with both files untouched.

Oracles: ``vllm.fix.fixes.edit`` (what ``swa-repro audit --vllm X --fix cap-route`` audits) for the
patched text, the original bytes for the revert; an "installed" vLLM is a package folder on
``sys.path`` (found the way the command finds it, without importing vLLM).
"""

from __future__ import annotations

import pytest

from swa_repro.cli import main
from swa_repro.vllm.fix import fixes as vfix
from swa_repro.vllm.fix import flashinfer_utils as fix_utils
from swa_repro.vllm.provision import BACKEND
from tests.test_vllm_fix_rule import UTILS_SNIPPET

# the two route anchors as every release 0.20.0-0.34.0 writes them (vllm.fix.fixes's docstring)
SNIPPET = '''class FlashInferMetadataBuilder:
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        can_use_trtllm = can_use_trtllm_attention(self.num_qo_heads, self.num_kv_heads)
        self.use_trtllm_decode_attention = can_use_trtllm

        # Global hyperparameters shared by all attention layers
        self.global_hyperparameters = infer_global_hyperparameters(
            get_per_layer_parameters(vllm_config, layer_names, FlashInferImpl)
        )
        self.logits_soft_cap = self.global_hyperparameters.logits_soft_cap

    def build(self):
        prefill_use_trtllm = causal and use_trtllm_attention(
            self.num_qo_heads,
        )
'''


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A vLLM "installed" on sys.path: its package folder and the backend file."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise ImportError('the command must not import vllm')\n")
    f = site / BACKEND
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(SNIPPET)
    u = site / fix_utils.UTILS
    u.parent.mkdir(parents=True, exist_ok=True)
    u.write_text(UTILS_SNIPPET)
    monkeypatch.syspath_prepend(str(site))
    return f


def _utils(backend):
    return backend.parents[3] / "utils" / "flashinfer.py"


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_status_apply_in_place_then_revert_byte_for_byte(installed, capsys):
    utils = _utils(installed)
    assert main(["patch", "status", "--vllm"]) == 0
    assert f"cap-route: needed ({installed}, {utils})" in capsys.readouterr().out
    assert main(["patch", "apply", "--vllm", "--in-place"]) == 0
    assert "revert --vllm" in capsys.readouterr().out
    assert installed.read_text() == vfix.edit(SNIPPET, "x")  # exactly what the audit's --fix checks
    assert utils.read_text() == fix_utils.edit(UTILS_SNIPPET, "x")
    assert installed.with_name(installed.name + ".swa-repro.bak").read_text() == SNIPPET
    assert utils.with_name(utils.name + ".swa-repro.bak").read_text() == UTILS_SNIPPET
    assert main(["patch", "status", "--vllm"]) == 0 and "cap-route: applied" in capsys.readouterr().out
    assert main(["patch", "apply", "--vllm", "--in-place"]) == 0 and "already" in capsys.readouterr().out
    assert main(["patch", "revert", "--vllm"]) == 0
    assert installed.read_text() == SNIPPET and sorted(p.name for p in installed.parent.iterdir()) == ["flashinfer.py"]
    assert utils.read_text() == UTILS_SNIPPET and sorted(p.name for p in utils.parent.iterdir()) == ["flashinfer.py"]


def test_a_half_fixed_pair_is_refused_and_left_alone(installed, capsys):
    """Only the utils file fixed (a hand edit, a vLLM that took half): partly applied, never edited
    over its half."""
    utils = _utils(installed)
    utils.write_text(fix_utils.edit(UTILS_SNIPPET, "x"))
    assert main(["patch", "status", "--vllm"]) == 0 and "partly applied (missing: decode route" in \
        capsys.readouterr().out
    assert main(["patch", "apply", "--vllm", "--in-place"]) == 2 and "partly applied" in _one_line(capsys)
    assert installed.read_text() == SNIPPET and utils.read_text() == fix_utils.edit(UTILS_SNIPPET, "x")


def test_a_failed_second_write_restores_the_first(installed, capsys, monkeypatch):
    """The backend file read-only: the utils file, patched first, is restored; both as they were."""
    import os

    utils = _utils(installed)
    os.chmod(installed, 0o444)
    try:
        assert main(["patch", "apply", "--vllm", "--in-place"]) == 2
    finally:
        os.chmod(installed, 0o644)
    capsys.readouterr()
    assert installed.read_text() == SNIPPET and utils.read_text() == UTILS_SNIPPET
    assert sorted(p.name for p in utils.parent.iterdir()) == ["flashinfer.py"]


def test_diff_shows_both_files_and_leaves_them_alone(installed, capsys):
    assert main(["patch", "diff", "--vllm", "--fix", "cap-route"]) == 0
    diff = capsys.readouterr().out
    assert f"+++ b/{str(installed).lstrip('/')}" in diff and f"+++ b/{str(_utils(installed)).lstrip('/')}" in diff
    assert "swa-repro" not in diff.split("+++", 1)[1].lower()
    assert "+            has_logits_soft_cap=self.logits_soft_cap is not None,\n" in diff
    assert "+    has_logits_soft_cap: bool = False,\n" in diff
    assert installed.read_text() == SNIPPET and _utils(installed).read_text() == UTILS_SNIPPET


@pytest.mark.parametrize("argv, says", [
    (["patch", "status", "--vllm", "--fix", "window"], "choose cap-route"),
    (["patch", "diff", "--vllm", "--reverse"], "--reverse goes without --vllm"),
    (["patch", "apply", "--vllm", "--in-place", "--source", "{other}"], "no vllm/utils/flashinfer.py beside it"),
    (["patch", "apply", "--vllm", "--in-place", "--source", "{lookalike}"], "not vLLM's FlashInfer backend"),
    (["patch", "status", "--vllm", "--source", "{missing}"], "no such file"),
    (["patch", "apply", "--vllm", "--out", "{new}"], "the fix edits two files"),
    (["patch", "diff", "--vllm", "--in-place"], "--out / --in-place go with `apply`"),
])
def test_bad_input_is_one_line_and_changes_nothing(installed, tmp_path, capsys, argv, says):
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    look = tmp_path / "tree" / BACKEND  # in a vLLM tree, with a utils file, but not the backend
    look.parent.mkdir(parents=True)
    look.write_text("x = 1\n")
    (tmp_path / "tree" / fix_utils.UTILS).parent.mkdir(parents=True)
    (tmp_path / "tree" / fix_utils.UTILS).write_text(UTILS_SNIPPET)
    paths = {"other": other, "missing": tmp_path / "nope.py", "lookalike": look, "new": tmp_path / "new.py"}
    assert main([a.format(**paths) for a in argv]) == 2
    assert says in _one_line(capsys)
    assert installed.read_text() == SNIPPET and other.read_text() == "x = 1\n" and look.read_text() == "x = 1\n"
    assert _utils(installed).read_text() == UTILS_SNIPPET and not (tmp_path / "new.py").exists()
    assert (tmp_path / "tree" / fix_utils.UTILS).read_text() == UTILS_SNIPPET


def test_without_vllm_installed_it_says_to_pass_source(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["patch", "status", "--vllm"]) == 2
    assert "vllm is not installed" in _one_line(capsys)


@pytest.mark.matrix
def test_a_releases_own_file_patches_and_compiles():
    """0.34.0's backend file (the shared cache's overlay): the patched copy is the audited edit, compiles."""
    from swa_repro.vllm.provision import provision

    src = provision("0.34.0")[0] / BACKEND
    new = vfix.edit(src.read_text(), "0.34.0")
    compile(new, str(src), "exec")
    assert vfix.hunks(new) == {"decode route": True, "prefill route": True, "large pages": True,
                               "nvfp4 refusal": True}
    assert "swa-repro" not in new.lower()
