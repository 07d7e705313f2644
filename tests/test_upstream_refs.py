"""upstream_refs: every finding has its upstream paragraph, every citation is a well-formed GitHub
thread of the repo and kind it claims, and the threads the findings are known by are cited."""

from __future__ import annotations

import re

import pytest

from swa_repro.engine.upstream_refs import FLASHINFER, SGLANG
from swa_repro.sglang.fix import ALL as ORDER
from swa_repro.sglang.fix import upstream as up
from swa_repro.sglang.fix.upstream_refs import NONE_FOUND, REFS, upstream_section

ALL = [(name, r) for name in ORDER for r in REFS[name]]


def test_every_finding_has_an_entry():
    assert set(REFS) == set(ORDER)
    for name in ORDER:
        assert REFS[name] or NONE_FOUND.get(name, "").startswith("queries tried: "), name
    assert set(NONE_FOUND) <= {n for n in ORDER if not REFS[n]}


@pytest.mark.parametrize("name,ref", ALL, ids=[f"{n}-{r.number}" for n, r in ALL])
def test_ref_is_well_formed(name, ref):
    assert ref.repo in (SGLANG, FLASHINFER) and ref.kind in ("issue", "pr")
    assert ref.state in ("open", "closed", "merged", "unknown")
    assert ref.state != "merged" or ref.kind == "pr"
    m = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+)/(issues|pull)/(\d+)", ref.url)
    assert m, ref.url
    assert (m[1], m[2], int(m[3])) == (ref.repo, {"issue": "issues", "pr": "pull"}[ref.kind], ref.number)
    assert ref.title and ref.covers and ref.versus


@pytest.mark.parametrize("name", ORDER)
def test_section_names_each_ref(name):
    text = upstream_section(name)
    assert text.startswith("**Upstream.**")
    for r in REFS[name]:
        assert f"[{r.repo.split('/')[1]} #{r.number}]({r.url})" in text
    if not REFS[name]:
        assert "no upstream issue or PR found (searched: " in text


@pytest.mark.parametrize("name,number", [
    ("paged_only_window", 31501), ("dflash_verify_window", 35208),
    ("ragged_no_prefix_window", 33915), ("ragged_no_prefix_window", 34093),
    ("ragged_prefix_window", 34093), ("soft_cap_prefill", 33915), ("soft_cap_prefill", 34093),
    ("soft_cap_decode", 34093),
])
def test_known_threads_are_cited(name, number):
    assert number in {r.number for r in REFS[name] if r.repo == SGLANG}
    assert f"#{number}]" in upstream_section(name)


def test_readme_generator_uses_it():
    assert vars(up)["upstream_section"] is upstream_section
