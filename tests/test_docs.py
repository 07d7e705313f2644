"""The README is a front page and the rest lives in docs/ pages: its first screen says what the committed
tables say today (no "fixed" for a release whose default paths still drop a window or a cap, no
internal issue numbers), and every relative link of README.md and docs/*.md reaches a file (and a
heading, where it names one)."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
FAMILIES = REPO / "docs" / "audit" / "families.md"
FAMILIES_JSON = FAMILIES.with_suffix(".json")
FIRST_SCREEN = 60  # lines

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def first_screen() -> str:
    return "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])


def sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.;])\s+", " ".join(text.split()))


# ----------------------------------------------------------------------------- the first screen


def test_first_screen_cites_no_internal_issue():
    assert not re.search(r"(?i)\bissues? #\d", first_screen())


def test_first_screen_never_calls_0_5_16_fixed_without_its_path():
    """PR #31501 (0.5.16) fixed the paged-only prefill alone; the ragged prefill, the verify windows and
    the soft cap still hold in 0.5.23 (docs/audit/releases.md): a "fixed" next to 0.5.16 names that path."""
    head = first_screen()
    assert "Fixed: sglang >= 0.5.16" not in head
    said = [s for s in sentences(head) if "0.5.16" in s and re.search(r"(?i)\bfixed\b", s)]
    assert all("paged-only" in s for s in said), said


def table(text: str, first: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the first Markdown table whose header's first cell is ``first``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first} |"))
    block = []
    for ln in lines[start:]:
        if not ln.startswith("|"):
            break
        block.append([c.strip() for c in ln.strip().strip("|").split(" | ")])
    return block[0], block[2:]  # block[1] is the |---| line


def committed_cells(release: str) -> dict[str, dict[str, str]]:
    """{gpu: {family: cell}} of ``release`` in the committed family table, as shipped."""
    text = FAMILIES.read_text()
    out = {}
    for gpu in ("sm90", "sm100", "sm80"):
        header, rows = table(text.split(f"\n## {gpu}\n", 1)[1], "sglang")
        row = next(r for r in rows if r[0] == release)
        out[gpu] = dict(zip(header[1:], row[1:]))
    return out


def fixed_section() -> str:
    return FAMILIES.read_text().split("\n## With the fixes", 1)[1].split("\n## ", 1)[0]


def fixed_cells() -> dict[str, dict[str, str]]:
    """{gpu: {family: cell}} of the companion table: the newest release with ``--fix all``."""
    header, rows = table(fixed_section(), "GPU")
    return {r[0]: dict(zip(header[1:], r[1:])) for r in rows}


def front_rows() -> list[tuple[list[str], str, str]]:
    """(families, as shipped, what to do) per row of the README's "What is true today" table."""
    return [([f.strip() for f in r[0].split(",")], r[1], r[2])
            for r in table(first_screen(), "model family")[1]]


def test_first_screen_names_the_newest_release_the_table_covers():
    releases = re.findall(r"(?m)^\| (0\.5\.\d+(?:\.post\d+)?) \|", FAMILIES.read_text())
    newest = max(releases, key=lambda v: [int(x) for x in re.findall(r"\d+", v)])
    assert f"**sglang {newest}**" in first_screen()
    assert f"sglang {newest} with every fix" in fixed_section()


def test_first_screen_table_is_the_committed_table_on_every_gpu_class():
    """Each family's "as shipped" cell is its cell of docs/audit/families.md on sm80, sm90 and sm100
    alike; every family of the table is on the first screen."""
    shipped = committed_cells("0.5.23")
    named = [f for fams, _, _ in front_rows() for f in fams]
    assert sorted(named) == sorted(fixed_cells()["sm90"])  # the families; the discovered architectures: a link
    for fams, cell, _ in front_rows():
        for gpu, cells in shipped.items():
            for fam in fams:
                said = cell.split(" (")[0] if cells[fam] == "refused" else cell  # refused (why)
                assert said == cells[fam], (fam, gpu, cell, cells[fam])


def test_first_screen_remedy_is_the_one_the_fixed_table_confirms():
    """Where the first screen says `patch --fix all`, the companion table (0.5.23 with --fix all) says
    not affected on every GPU class; where it says there is no fix, the fixed table still says affected."""
    fixed = fixed_cells()
    assert set(fixed) == {"sm90", "sm100", "sm80"}
    for fams, cell, todo in front_rows():
        for fam in fams:
            states = {fixed[gpu][fam] for gpu in fixed}
            if "--fix all" in todo:  # or the layers' own window where the row says so (Cohere2's convention)
                assert states == ({"layer != HF"} if "layer != HF" in todo else {"not affected"}), (fam, states)
            elif "no fix" in todo:
                assert all(s.startswith("**affected**") or s == "layer != HF" for s in states), (fam, states)
            else:
                assert states == {"refused"} and cell.startswith("refused"), (fam, states)


def test_front_page_has_the_exit_status_table():
    rows = table(README.read_text(), "status")[1]
    assert [r[0] for r in rows] == ["`0`", "`1`", "`2`"]
    assert "not affected" in rows[0][1] and "affected" in rows[1][1] and "not driven" in rows[1][1]
    assert "bad input" in rows[2][1]


# ----------------------------------------------------------------------------- the pages and links


def test_readme_links_every_docs_page():
    linked = {m for m in LINK.findall(README.read_text())}
    generated = {"flashinfer_versions.md"}  # rendered from kernel.sources, linked from the pages that use it
    assert {f"docs/{p.name}" for p in PAGES if p.name not in generated} <= linked


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(md) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", md.read_text())
    return {slug(h) for h in re.findall(r"(?m)^#{1,6} (.+)$", text)}


def broken_links(page) -> list[str]:
    """Relative links of ``page`` (outside code blocks) to no file, or to no heading of a .md file."""
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (frag and dest.suffix == ".md" and frag not in anchors(dest)):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_reaches_a_file(page):
    assert not broken_links(page), f"{page.name}: links to nothing: {broken_links(page)}"


def test_link_checker_sees_a_broken_link(tmp_path):
    """The checker itself, on a page with good links (a file, a heading) and two broken ones."""
    (tmp_path / "b.md").write_text("x\n")
    page = tmp_path / "a.md"
    page.write_text("# A b\n\n[ok](#a-b) [ok](b.md) [gone](missing.md) [anchor](a.md#nope) [web](https://x.y/z)\n")
    assert broken_links(page) == ["missing.md", "a.md#nope"]


def test_user_pages_cite_no_internal_issue_number():
    """Upstream threads (sglang / vllm / flashinfer PRs and issues) stay; this project's own do not."""
    for page in [README, *PAGES]:
        assert not re.search(r"(?i)\bissues? #\d", page.read_text()), page.name


def test_glossary_defines_the_words_a_newcomer_meets():
    """The words the README and the pages use without explaining them each have an entry."""
    entries = re.findall(r"(?m)^- \*\*(.+?)\*\*:", (REPO / "docs" / "glossary.md").read_text())
    words = ["CTA", "split-KV", "fa2 / fa3", "XQA", "trtllm-gen", "NVFP4", "DCP", "overlay", "kit",
             "paged vs ragged", "window_left", "soft cap", "EAGLE / NGRAM verify", "CUDA graph capture / replay"]
    assert not [w for w in words if not any(e.startswith(w) for e in entries)]


def test_the_front_pages_count_of_architecture_columns_is_the_tables():
    """The README's count of the other sliding-window architectures in the newest release is the number of
    non-family columns the committed table has for it (any GPU class: the columns are the same)."""
    import json

    from swa_repro.engine.families import FAMILIES

    t = json.loads(FAMILIES_JSON.read_text())
    newest = t["rows"][-1]["sglang"]
    counts = {len([f for f in r["cells"] if f not in FAMILIES]) for r in t["rows"] if r["sglang"] == newest}
    said = re.search(r"fallback: (\d+) in (\S+?)\)", " ".join(README.read_text().split()))
    assert said and said.group(2) == newest and {int(said.group(1))} == counts, (said and said.groups(), counts)
