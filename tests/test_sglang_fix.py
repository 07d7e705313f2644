"""`swa-repro patch --fix` on the real flashinfer_backend.py of every release 0.5.14-0.5.23.

Oracles, each independent of the edit code: the file still compiles; each fix's changed lines lie
inside the functions that fix is about (read off the ast of the old and new text); applying twice
changes nothing; the CLI round trip restores the original bytes (sha256); and the key-level audit of
the fixed release (`audit --sglang X --fix all`, sglang's own code on recording stand-ins) reads
every class fixed and every sliding-window query's keys exact, while the full-attention layers'
plans keep the window and cap they had.
"""

from __future__ import annotations

import ast
import difflib
import json
from pathlib import Path

import pytest

from difftools import backend_file  # tests/difftools.py
from swa_repro.cli import main
from swa_repro.engine.patching import PatchError
from swa_repro.sglang import fix
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.fix.source import Source, apply_edits

pytestmark = pytest.mark.network
ROOT = Path(__file__).resolve().parents[1]

RELEASES = ["0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
            "0.5.22", "0.5.23"]
UNFIXED = {"0.5.14", "0.5.15", "0.5.15.post1"}  # before PR #31501 (0.5.16)
B, P, D = "FlashInferAttnBackend", "FlashInferIndicesUpdaterPrefill", "FlashInferIndicesUpdaterDecode"
RAGGED = {f"{B}.__init__", f"{B}.forward_extend", f"{B}._ragged_wrapper", f"{P}.__init__",
          f"{P}.update_sliding_window", f"{P}.call_begin_forward"}
CAP_CHECK = f"{B}._check_logits_soft_cap"
WHERE = {  # the functions each fix may change
    "paged_only_window": {f"{P}.update_sliding_window", f"{P}.call_begin_forward"},
    "ragged_no_prefix_window": RAGGED,
    "ragged_prefix_window": RAGGED,
    "eagle_verify_window": {f"{P}.update_sliding_window", f"{P}.call_begin_forward", f"{B}.forward_extend",
                            "_plans_window", "_is_spec_tree_verify", "_spec_verify_window_left",
                            "_spec_tree_mask_in_window", f"{B}.init_cuda_graph_state", f"{B}._create_prefill_wrappers"},
    "dflash_verify_window": {f"{P}.update_sliding_window", "_plans_window"},
    "soft_cap_prefill": {"_plan_logits_soft_cap", f"{P}.__init__", f"{P}.call_begin_forward",
                         f"{B}.forward_extend", CAP_CHECK},
    "soft_cap_decode": {"_plan_logits_soft_cap", f"{D}.__init__", f"{D}.call_begin_forward",
                        f"{B}.forward_decode", CAP_CHECK},
}
WHERE["soft_cap_cuda_graph"] = WHERE["soft_cap_prefill"] | WHERE["soft_cap_decode"]


def enclosing(text: str) -> dict[int, str]:
    """line -> qualified name of the innermost def holding it (module level: absent)."""
    out = {}

    def visit(node, prefix):
        for n in ast.iter_child_nodes(node):
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
                name = f"{prefix}{n.name}"
                start = min([n.lineno] + [d.lineno for d in n.decorator_list])
                if isinstance(n, ast.FunctionDef):
                    out.update({i: name for i in range(start, n.end_lineno + 1)})
                visit(n, name + ".")

    visit(ast.parse(text), "")
    return out


def changed(old: str, new: str):
    """Lines of ``old`` replaced or deleted and lines of ``new`` inserted or replacing, 1-based."""
    a, b = [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(),
                                                       autojunk=False).get_opcodes():
        if tag != "equal":
            a += range(i1 + 1, i2 + 1)
            b += range(j1 + 1, j2 + 1)
    return a, b


def touched(old: str, new: str) -> set:
    a, b = changed(old, new)
    eo, en = enclosing(old), enclosing(new)
    # a blank line next to an inserted def belongs to no def: it is the def's separator
    return ({eo.get(i, "<module>") for i in a if i <= len(old.splitlines()) and old.splitlines()[i - 1].strip()}
            | {en.get(i, "<module>") for i in b if i <= len(new.splitlines()) and new.splitlines()[i - 1].strip()})


def with_plumbing(text: str, version: str, name: str) -> tuple[str, tuple]:
    names = fix.parse_names(name)
    if version in UNFIXED and fix.FIXES[name].needs_fixed_31501:
        names = ("paged_only_window", *names)
    return text, names


# `make test` runs the fixes on CORE; `make test-matrix` (also run by .ci/run) on every other release.
# Every line of the fix code (fix/, patch/classify) that the tests below run on any of the 11
# releases also runs on 0.5.14 (measured with sys.settrace: 528 of 528 lines); 0.5.23 is the newest.
CORE = ("0.5.14", "0.5.23")


def matrix_params(versions, core=CORE):
    """``versions`` as pytest params, all but ``core`` marked ``matrix``."""
    return [v if v in core else pytest.param(v, marks=pytest.mark.matrix) for v in versions]


@pytest.fixture(scope="module", params=matrix_params(RELEASES))
def release(request):
    return request.param, backend_file(request.param).read_text()


def test_states_as_shipped(release):
    version, text = release
    states = {n: s.state for n, s in fix.states(text).items()}
    assert states.pop("paged_only_window") == ("needed" if version in UNFIXED else "applied")
    assert set(states.values()) == {"needed"}, states


@pytest.mark.parametrize("name", ORDER)
def test_each_fix_alone(release, name):
    version, text = release
    text, names = with_plumbing(text, version, name)
    new = fix.apply_fixes(text, names)
    compile(new, f"{version}-{name}", "exec")
    allowed = set().union(*(WHERE[n] for n in names))
    assert new != text or (name == "paged_only_window" and version not in UNFIXED)
    assert touched(text, new) <= allowed, touched(text, new) - allowed
    assert all(fix.states(new)[n].state == "applied" for n in names)
    assert fix.apply_fixes(new, names) == new  # a second time changes nothing


def test_all_fixes(release):
    version, text = release
    new = fix.apply_fixes(text, ORDER)
    assert touched(text, new) <= set().union(*WHERE.values())
    assert {s.state for s in fix.states(new).values()} == {"applied"}
    # every fix alone, then the rest: the same code as all at once (keyword order aside)
    for name in ORDER[1:]:
        first = fix.apply_fixes(text, fix.parse_names(f"paged_only_window,{name}"))
        assert normalized(fix.apply_fixes(first, ORDER)) == normalized(new)


def normalized(text: str) -> str:
    """ast dump with call keywords sorted (their order is not behaviour)."""
    tree = ast.parse(text)
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            n.keywords.sort(key=lambda k: k.arg or "")
    return ast.dump(tree)


def test_window_plumbing_is_required_before_31501():
    text = backend_file("0.5.14").read_text()
    with pytest.raises(PatchError, match="add paged_only_window"):
        fix.apply_fixes(text, ("eagle_verify_window",))


def test_unknown_structure_is_refused():
    text = backend_file("0.5.23").read_text().replace("wrapper_ragged.begin_forward(", "wrapper_ragged.plan2(")
    assert fix.states(text)["soft_cap_prefill"].state == "unknown"
    with pytest.raises(PatchError, match="nothing was written"):
        fix.apply_fixes(text, ("soft_cap_prefill",))


# ----------------------------------------------------------------------------- the CLI, same safety as PR #31501
def test_cli_copy_in_place_and_revert(tmp_path, capsys):
    src = tmp_path / "flashinfer_backend.py"
    original = backend_file("0.5.23").read_bytes()
    src.write_bytes(original)
    assert main(["patch", "status", "--fix", "all", "--source", str(src)]) == 0
    assert "ragged_no_prefix_window: needed" in capsys.readouterr().out
    out = tmp_path / "fixed.py"
    assert main(["patch", "apply", "--fix", "soft_cap_decode", "--source", str(src), "--out", str(out)]) == 0
    assert src.read_bytes() == original and out.read_text() == fix.apply_fixes(original.decode(), ("soft_cap_decode",))
    assert main(["patch", "apply", "--fix", "all", "--source", str(src), "--in-place"]) == 0
    assert src.read_text() == fix.apply_fixes(original.decode(), fix.ALL)
    assert (tmp_path / "flashinfer_backend.py.swa-repro.bak").read_bytes() == original
    capsys.readouterr()
    assert main(["patch", "apply", "--fix", "all", "--source", str(src), "--in-place"]) == 0
    assert "already" in capsys.readouterr().out
    assert main(["patch", "revert", "--source", str(src)]) == 0
    assert src.read_bytes() == original


@pytest.mark.parametrize("argv, words", [
    (["patch", "apply", "--fix", "nope"], "unknown nope"),
    (["patch", "apply", "--fix", ","], "selects no fix"),
    (["patch", "diff", "--fix", "all", "--reverse"], "--reverse goes without --fix"),
])
def test_cli_refusals(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- the audit of the fixed release
def audit(version, *extra):
    """``swa-repro audit --sglang VERSION --json EXTRA``, the CLI run in this process: the release's
    child forks from this worker's warm server (``engine.forkserver``) instead of a new interpreter
    importing torch & co. again (the CLI as a subprocess: test_cli_errors, test_sglang_kit)."""
    import contextlib
    import io

    from swa_repro.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["audit", "--sglang", version, "--json", *extra])
    assert rc == (0 if "--fix" in extra else 1), err.getvalue()[-2000:]  # 1: the release as shipped is affected
    return json.loads(out.getvalue())


def test_committed_fixed_table_reads_every_release_fixed():
    """docs/audit/fixed/ (`audit --release-table --fix all`, 0.5.14-0.5.23): every class fixed or
    absent, every sliding-window path's keys exact; the test below re-derives one release live."""
    table = json.loads((ROOT / "docs" / "audit" / "fixed" / "releases.json").read_text())
    assert table["fixes"] == list(fix.ALL)  # `--fix all`: the backend fixes and the family fixes
    assert [r["sglang"] for r in table["rows"]] == RELEASES
    for r in table["rows"]:
        assert {c["state"] for c in r["cells"].values()} <= {"fixed", "absent"}, r["sglang"]
        assert r["keys"] and {k["verdict"] for k in r["keys"].values()} == {"exact"}, r["sglang"]


@pytest.mark.parametrize("version", ["0.5.23"])
def test_audit_of_the_fixed_release(version):
    shipped, fixed = audit(version), audit(version, "--fix", "all")
    assert "holds" in {c["state"] for c in shipped["classes"][0].values()}
    assert {c["state"] for c in fixed["classes"][0].values()} <= {"fixed", "absent"}
    run = fixed["runs"][0]
    assert not [f for f in run["findings"] if f["effect"] == "wrong"]
    swa = [d for d in run["driven"] if d["layer"].startswith("swa")]
    assert swa and {d["key_verdict"] for d in swa} == {"exact"}
    assert run["release"]["fixes"]["fixes"] == list(fix.ALL)

    def plans(doc):  # the full-attention layer's plan-time window and cap, per path
        norm = {"window_left not passed": "window_left=-1", "logits_soft_cap not passed": "logits_soft_cap=0.0"}
        out = {}
        for d in doc["runs"][0]["driven"]:
            if d["layer"] == "full":
                p = sorted(d["plans"])
                for a, b in norm.items():
                    p = [x.replace(a, b) for x in p]
                out[d["path"]] = sorted(set(p))
        return out

    assert plans(shipped) == plans(fixed)  # the calls the audit shows right keep what they planned with


def test_edits_keep_everything_else():
    text = "def f(a,\n      b=1,\n      *, c):\n    g(x,\n      y,\n      **kw)\n    h(1)\n"
    src = Source(text)
    fn = src.func("f")
    g, h = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
    new = apply_edits(text, [src.add_parameter(fn, "d: int = -1"), src.add_keyword(g, "z=2"),
                             src.add_keyword(h, "q=3")])
    assert new == "def f(a,\n      b=1,\n      d: int = -1,\n      *, c):\n    g(x,\n      y,\n      z=2,\n      **kw)\n" \
                  "    h(1, q=3)\n"
