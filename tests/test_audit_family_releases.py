"""Family audits of the releases before 0.5.14 (issue #25): 0.5.10 - 0.5.13.post1, each through its own
model files, ModelConfig, loader and ``ModelRunner.load_model`` window rule (``make test-matrix``).

Oracles outside the audit: the release's own files read as text (which architectures its model files
register, the line a verify raises on), the closed form of the keys a windowless ragged extend lets a
query see (from the batch lengths alone), and the non-family audit's committed release table (another
code path: the synthetic layer) for the paged-only window. One cheap check runs in ``make test``:
a family the release lacks is one line, exit 2, before any child.
"""

from __future__ import annotations

import re

import pytest

from conftest import skip_module_unless

skip_module_unless("transformers")

from swa_repro.cli import main  # noqa: E402
from swa_repro.engine.families import MODELS  # noqa: E402

OLD = ("0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1")
ENTRY = re.compile(r"^EntryClass\s*=\s*(\[[^\]]*\]|\w+)", re.M)


def _overlay(version: str):
    from conftest import release_overlay

    return release_overlay(version)


def _registered(overlay) -> set[str]:
    """Architectures the release's model files list in ``EntryClass`` (read as text)."""
    out = set()
    for p in (overlay / "sglang" / "srt" / "models").glob("*.py"):
        for m in ENTRY.finditer(p.read_text(errors="replace")):
            out.update(re.findall(r"\w+", m.group(1)))
    return out


def _run(doc, family, path, kind="sliding"):
    f = next(f for f in doc["families"] if f["family"] == family)
    return f, next(r for r in f["paths"] if r["path"] == path and r["kind"] == kind)


# ----------------------------------------------------------------------------- make test: one cheap check
def test_0_5_10_has_no_gemma4_one_line_exit_2_before_any_child(monkeypatch, capfd):
    """0.5.10 ships no Gemma-4 model file (its models/ lists no Gemma4ForCausalLM): one line, exit 2,
    and no child runs."""
    from swa_repro.sglang.audit import family_run

    ov = _overlay("0.5.10")
    assert "Gemma4ForCausalLM" not in _registered(ov) and "Gemma2ForCausalLM" in _registered(ov)

    def never(*a, **k):
        raise AssertionError("no child may run for a family the release lacks")

    monkeypatch.setattr(family_run, "run_child", never)
    capfd.readouterr()
    rc = main(["audit", "--sglang", "0.5.10", "--model", "gemma4"])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "--model gemma4: not in this release: sglang 0.5.10 has no model file for Gemma4ForCausalLM" in err[0]


# ----------------------------------------------------------------------------- make test-matrix: every older release
@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.parametrize("version", OLD)
def test_older_release_family_audit_through_its_own_code(version):
    from swa_repro.sglang.audit import family_run
    from swa_repro.sglang.audit import table as at

    ov = _overlay(version)
    pytest.importorskip("sglang")
    out = family_run.audit_release(version, "all", ["sm90", "sm100"], note=lambda s: None)
    doc = out["sm90"]
    # the families: exactly those whose architecture the release's model files register
    have = {f for f, (_, _, arch) in MODELS.items() if arch in _registered(ov)}
    assert {f["family"] for f in doc["families"]} == have
    assert ("gemma4" in have) == (version not in ("0.5.10", "0.5.10.post1"))  # gemma4_causal.py from 0.5.11
    assert not [f["error"] for f in doc["families"] if f.get("error")]  # every family it has is built

    # gemma2: the runner's window from the release's ModelRunner.load_model (before 0.5.16's helper)
    f, r = _run(doc, "gemma2", "extend_ragged_no_prefix")
    assert f["build"]["runner_window"] == 4095 and "ModelRunner.load_model" in f["build"]["runner_rule"]
    assert f["kinds"]["sliding"]["layer_window"] == 4095 and f["kinds"]["full"]["layer_window"] == -1
    # ragged, no prefix: no window reaches FlashInfer; a 4352-token prompt's query at p sees p - 4095 too many
    ks = r["keys"]["eager"]
    assert (ks["queries_with_extra"], ks["max_extra_per_query"], ks["extra_keys"]) == (256, 256, 256 * 257 // 2)
    assert r["wrappers"] == {"RaggedKVCacheWrapper": ["auto -> fa3"]} and r["cap"].startswith("dropped")
    # paged-only: the same finding as the synthetic layer's release table (PR #31501 is not in these releases)
    assert at.committed_row(version)["cells"]["paged_only_window"]["state"] == "holds"
    assert _run(doc, "gemma2", "extend_paged")[1]["verdict"] == "extra"
    # a verify on a sliding layer raises in the release's own update_sliding_window (prefix_lens=None)
    for path in ("target_verify_eagle", "target_verify_ngram"):
        r = _run(doc, "gemma2", path)[1]
        assert r["status"] == "sglang raised", r
        line = int(re.search(r"flashinfer_backend\.py:(\d+)", r["why"]).group(1))
        src = (ov / "sglang/srt/layers/attention/flashinfer_backend.py").read_text().splitlines()
        assert "prefix_lens" in src[line - 1], src[line - 1]

    # cohere2: the model class has no window getter, so the runner has none; decode sees every key
    f, r = _run(doc, "cohere2", "decode")
    assert f["build"]["runner_window"] is None and f["kinds"]["sliding"]["layer_window"] == 4096
    assert r["keys"]["eager"]["max_extra_per_query"] == (4352 + 1) - 4096
    assert f["answer"]["state"] == "affected on the default path"

    # sm100: the same calls, the ragged wrapper built for cutlass by the release's is_sm100 switch
    r100 = _run(out["sm100"], "gemma2", "extend_ragged_no_prefix")[1]
    assert r100["wrappers"] == {"RaggedKVCacheWrapper": ["cutlass -> cutlass"]}
    assert r100["keys"]["eager"]["extra_keys"] == 256 * 257 // 2
