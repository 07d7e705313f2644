"""``audit --transformers release``: the release's model classes built with the transformers its wheel pins
(``sglang.release_transformers``). Oracles of their own: METADATA lines written here, a fake transformers
package whose version only this file knows, the pin read back with a regular expression of the test's."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from swa_repro.cli import main
from swa_repro.core.errors import UsageError


def _fake_release(root: Path, lines: str, version: str = "0.5.99") -> Path:
    """An sglang overlay with a dist-info METADATA of ``lines`` and its RECORD."""
    d = root / f"sglang-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.4\nName: sglang\nVersion: {version}\n{lines}\n")
    (d / "RECORD").write_text(f"sglang/__init__.py,,\nsglang-{version}.dist-info/METADATA,,\n")
    (root / "sglang").mkdir()
    (root / "sglang" / "__init__.py").write_text("")
    return root


def test_the_pin_is_the_metadata_exact_requirement_else_none(tmp_path):
    from swa_repro.sglang.provision import flashinfer_pin, transformers_pin

    o = _fake_release(tmp_path / "a", "Requires-Dist: transformers-stream-generator\nRequires-Dist: torch==2.9.1\n"
                      "Requires-Dist: transformers==5.19.0\nRequires-Dist: flashinfer_python==0.7.2")
    assert transformers_pin(o) == "5.19.0" and flashinfer_pin(o) == "0.7.2"
    assert transformers_pin(_fake_release(tmp_path / "b", "Requires-Dist: transformers>=4.57")) is None  # no ==
    assert transformers_pin(_fake_release(tmp_path / "c", "Requires-Dist: transformers_stream==1.0")) is None


def test_deps_are_the_unsatisfied_ones_at_the_release_pin_else_as_asked(tmp_path):
    """A requirement the venv satisfies is left to it; one it does not goes in at the release's own ``==`` pin
    where that pin satisfies transformers, else as transformers asks; an extra's never."""
    from swa_repro.sglang.release_transformers import deps

    partial = tmp_path / "partial" / "transformers-9.9.9.dist-info"
    partial.mkdir(parents=True)
    (partial / "METADATA").write_text("Name: transformers\nRequires-Dist: numpy>=1.0\nRequires-Dist: numpy<0.1\n"
                                      "Requires-Dist: packaging>=999\nRequires-Dist: not-a-real-dist-xyz>=1\n"
                                      'Requires-Dist: pytest>=999; extra == "testing"\n')
    release = _fake_release(tmp_path / "rel", "Requires-Dist: numpy==0.0.5\nRequires-Dist: packaging==1.0")
    assert deps(partial.parent, release) == ["numpy==0.0.5", "packaging>=999", "not-a-real-dist-xyz>=1"]


def _one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_bad_switch_lines(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "cache"))
    assert "choose venv" in _one_line(capsys, ["audit", "--sglang", "0.5.23", "--model", "gemma2",
                                               "--transformers", "foo"])
    assert "goes with --model" in _one_line(capsys, ["audit", "--sglang", "0.5.23", "--transformers", "release"])
    assert "without --fix" in _one_line(capsys, ["audit", "--sglang", "0.5.23", "--model", "gemma2", "--fix", "all",
                                                 "--transformers", "release"])
    ck = Path(__file__).resolve().parents[1] / "examples" / "checkpoints"
    path = min(ck.glob("*/config.json"))
    assert "not a checkpoint" in _one_line(capsys, ["audit", "--sglang", "0.5.23", "--model", str(path),
                                                    "--transformers", "release"])
    assert "sglang's for now" in _one_line(capsys, ["audit", "--vllm", "0.34.0", "--model", "gemma2",
                                                    "--transformers", "release"])
    assert not (tmp_path / "cache" / "sglang").exists() and not (tmp_path / "cache" / "vllm").exists()  # before any install


def test_a_release_without_a_pin_is_one_line(capsys, tmp_path, monkeypatch):
    from swa_repro.sglang import provision

    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "cache"))
    fake = _fake_release(tmp_path / "rel", "Requires-Dist: transformers>=4.57")
    monkeypatch.setattr(provision, "provision", lambda v, **k: (fake, {"cached": True}))
    line = _one_line(capsys, ["audit", "--sglang", "0.5.23", "--model", "gemma2", "--transformers", "release"])
    assert "pins no transformers" in line and "--transformers venv" in line


def test_an_install_that_cannot_reach_the_index_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    from swa_repro.engine import overlay
    from swa_repro.sglang.release_transformers import transformers_overlay

    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "cache"))
    fail = "import sys; print('error: Failed to fetch: dns error', file=sys.stderr); sys.exit(1)"
    monkeypatch.setattr(overlay, "install_command", lambda target: [sys.executable, "-c", fail])
    fake = _fake_release(tmp_path / "rel", "Requires-Dist: transformers==5.19.0")
    with pytest.raises(UsageError, match=r"cannot reach the package index to install transformers==5\.19\.0"):
        transformers_overlay("0.5.99", fake)
    assert [p.name for p in (tmp_path / "cache" / "transformers").iterdir() if not p.name.endswith(".lock")] == []


def _with_fake_transformers(root: Path, version: str) -> Path:
    (root / "transformers").mkdir(parents=True)
    (root / "transformers" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    d = root / f"transformers-{version}.dist-info"
    d.mkdir()
    (d / "RECORD").write_text("transformers/__init__.py,,\n")
    return root


def test_the_cache_keys_differ_by_transformers(tmp_path):
    """The same release with and without its own transformers: the child's and the plan's keys differ, and
    each says which transformers (the venv's is not 0.0.7)."""
    from swa_repro.sglang.audit import arch_cache
    from swa_repro.sglang.overlay_run import child_parts

    plain = _fake_release(tmp_path / "plain", "Requires-Dist: transformers==0.0.7")
    own = _with_fake_transformers(_fake_release(tmp_path / "own", "Requires-Dist: transformers==0.0.7"), "0.0.7")
    a, b = child_parts("m", plain), child_parts("m", own)
    assert a != b and b["transformers"] == {"version": "0.0.7", "from": "overlay"} and a["transformers"]["from"] == "venv"
    assert arch_cache.parts("0.5.99", plain) != arch_cache.parts("0.5.99", own)


def test_a_child_on_an_overlay_with_its_own_transformers_imports_it_never_forked(tmp_path, monkeypatch):
    """The fork server has the venv's transformers imported: a fork would run on it. The child is plain,
    and it imports the overlay's."""
    from swa_repro.engine import child, forkserver

    def no_fork(*a, **k):
        raise AssertionError("forked from the server")

    monkeypatch.setattr(forkserver, "run", no_fork)
    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "tiny_tf_child.py").write_text(textwrap.dedent("""
        import sys
        from swa_repro.engine.child import child_main, child_parser

        def run(overlay, a):
            import transformers
            return {"version": transformers.__version__, "file": transformers.__file__}

        sys.exit(child_main(child_parser("tiny_tf_child"), run))
    """))
    monkeypatch.setenv("PYTHONPATH", str(mod))
    own = _with_fake_transformers(tmp_path / "overlay", "0.0.7")
    assert child.shadowed(own) == ["transformers"]
    doc = child.run_in_child("tiny_tf_child", own, [], "the tiny child")["document"]
    assert doc["version"] == "0.0.7" and doc["file"] == str(own / "transformers" / "__init__.py")


@pytest.mark.matrix
@pytest.mark.network
def test_a_column_not_built_on_the_venv_transformers_is_built_with_the_release_pin(tmp_path):
    """0.5.23 serves RecurrentGemmaForCausalLM only through its Transformers fallback, which it refuses for a
    transformers model class that is not backend-compatible (model_loader/utils.py:181-187: "has no SGlang
    implementation and the Transformers implementation is not compatible"): 5.12.1's class does not say
    ``_supports_attention_backend = True``, 5.19.0's (the pin) does. With ``--transformers release`` the column
    is built and driven, and the child says it imported the pinned transformers from the release's copy."""
    import transformers
    from conftest import release_overlay

    from swa_repro.sglang.audit import arch_cells
    from swa_repro.sglang.audit.family_run import MODULE
    from swa_repro.sglang.overlay_run import overlay_for, run_child

    shipped = release_overlay("0.5.23")
    meta = next(shipped.glob("sglang-*.dist-info/METADATA")).read_text()
    pin = re.search(r"^Requires-Dist: transformers==(\S+)$", meta, re.MULTILINE).group(1)
    rel = "models/recurrent_gemma/modeling_recurrent_gemma.py"
    flag = "_supports_attention_backend = True"
    assert flag not in (Path(transformers.__file__).parent / rel).read_text()  # the venv's: not built for it
    overlay, info, _ = overlay_for("0.5.23", note=lambda s: None, transformers="release")
    assert flag in (overlay / "transformers" / rel).read_text()
    arch = "RecurrentGemmaForCausalLM"
    smalls, static = arch_cells.plan("0.5.23", overlay)
    assert arch in smalls, static.get(arch)
    f = tmp_path / "smalls.json"
    f.write_text(json.dumps({arch: smalls[arch]["small"]}))
    doc, _, _ = run_child(MODULE, overlay, ["--families", arch, "--gpus", "sm90", "--smalls-file", str(f)], "audit")
    cell = doc["by_gpu"]["sm90"][0]
    assert not cell.get("error") and any(r.get("status") == "driven" for r in cell["paths"]), cell.get("error")
    tf = doc["release"]["transformers"]
    assert tf["version"] == pin and tf["file"].startswith(str(overlay)) and info["transformers"]["transformers"] == pin
