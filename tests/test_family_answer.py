"""Issue #25, deliverables 4 and 5: ``doctor --model`` and notebook 07 (my model, my GPU, my release),
the keys heatmap drawn from the audit's ranges, and the ranges' compact form."""

from __future__ import annotations

import random

import pytest

from swa_repro.cli import main
from swa_repro.notebook import family_answer as FA
from swa_repro.notebook import key_heatmap as KH
from swa_repro.sglang.audit import rows as R

RELEASE = "0.5.15.post1"  # the pinned baseline: its overlay is the one `make test` already has


# ----------------------------------------------------------------------------- ranges and the heatmap
def _random_lines(rng, n_rows=40, width=48):
    lines, prev = [], None
    for q in range(n_rows):
        if prev is not None and rng.random() < 0.3:  # some rows repeat: merged into taller boxes
            lines.append((q, *prev))
            continue
        ranges = lambda k: [sorted(rng.sample(range(width), 2)) for _ in range(k)]  # noqa: E731
        prev = (ranges(rng.randint(0, 2)), ranges(rng.randint(0, 3)))
        lines.append((q, *prev))
    return lines


def _dense(lines, width):
    """The oracle, cell by cell from the definitions: in a seen range, in a wanted range."""
    out = {}
    for q, want, seen in lines:
        for j in range(width):
            s = any(lo <= j <= hi for lo, hi in seen)
            w = any(lo <= j <= hi for lo, hi in want)
            out[q, j] = "ok" if s and w else "extra" if s else "missing" if w else None
    return out


@pytest.mark.parametrize("seed", range(6))
def test_heatmap_boxes_paint_exactly_the_dense_oracle(seed):
    rng = random.Random(seed)
    width, lines = 48, _random_lines(rng)
    bx = KH.boxes(lines, undefined=[(45, 47)], width=width)
    painted = {}
    for cat, rects in bx.items():
        for x, w, y, h in rects:
            assert w > 0 and h > 0
            for q in range(y, y + h):
                for j in range(x, x + w):
                    assert (q, j) not in painted, ("overlap", q, j)
                    painted[q, j] = cat
    want = {k: v for k, v in _dense(lines, width).items() if v is not None}
    want.update({(q, j): "undefined" for q in (45, 46, 47) for j in range(width)})
    assert painted == want
    assert len(bx["ok"]) < sum(1 for _, _, s in lines for _ in s) + 1 or seed  # rows merged where equal


def test_a_sliding_window_at_4096_is_one_run_and_comes_back_exactly():
    W, n = 4095, 8192
    lines = [(q, [[max(q - W, 0), q]], [[0, q]]) for q in range(n)]  # the window dropped: every key seen
    runs = R.encode(lines)
    assert len(runs) == 2  # before and after the window fills
    assert R.decode(runs) == [(q, [list(r) for r in w], [list(r) for r in s]) for q, w, s in lines]
    bx = KH.boxes(R.decode(runs))
    assert sum(h for _, _, _, h in bx["extra"]) == n - W - 1  # one box per leaking row, no dense mask
    assert all(x == 0 and w == y - W for x, w, y, _ in bx["extra"])


@pytest.mark.parametrize("seed", range(4))
def test_rows_round_trip(seed):
    rng = random.Random(seed)
    lines = [(q, [[q - 3, q]], [[rng.choice([0, q - 3]), q]]) for q in range(5, 60)] + \
            [(q, [list(r) for r in R.merge([sorted(rng.sample(range(90), 2))])], []) for q in range(70, 80)]
    assert R.decode(R.encode(lines)) == lines


# ----------------------------------------------------------------------------- the GPU class
@pytest.mark.parametrize("requested, capability, name, says", [
    ("sm100", (9, 0), "sm100", "given"),
    ("auto", (9, 0), "sm90", "this GPU is sm90"),
    (None, (10, 0), "sm100", "this GPU is sm100"),
    (None, (8, 6), "sm80", "this GPU is sm86"),
    (None, (12, 0), "sm80", "none of the audited classes"),
])
def test_gpu_class_from_the_capability(requested, capability, name, says):
    g = FA.gpu_class(requested, capability)
    assert g.name == name and says in g.why


def test_without_cuda_the_class_is_assumed_and_said(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    g = FA.gpu_class("auto")
    assert g.name == "sm90" and "no CUDA device here: assumed sm90" in g.why


# ----------------------------------------------------------------------------- doctor --model: bad input
@pytest.fixture
def fake_install(monkeypatch, no_work):
    """An installed sglang of a chosen version whose overlay serves Gemma-2 only; no child may run."""
    from swa_repro.core import mode
    from swa_repro.notebook import doctor

    version = {"sglang": "0.5.23"}
    real = mode.dist_version
    monkeypatch.setattr(mode, "dist_version", lambda d: version["sglang"] if d == "sglang" else real(d))
    monkeypatch.setattr(doctor, "doctor_report", lambda: {})  # the rest of the doctor is not under test here
    return version


@pytest.mark.parametrize("installed, argv, must", [
    ("0.5.23", ["--model", "llama9"], "--model 'llama9': unknown family"),
    ("0.5.23", ["--model", "all"], "--model takes one family"),
    ("0.5.23", ["--model", "gemma2,gemma3"], "--model takes one family"),
    ("0.5.23", ["--model", "gemma2", "--gpu", "sm75"], "--gpu 'sm75': choose one of sm80, sm90, sm100"),
    ("0.5.23", ["--gpu", "sm90"], "--gpu goes with --model"),
    ("0.5.23", ["--model", "cohere2"], "--model cohere2: not in this release: sglang 0.5.23 has no model file for Cohere2ForCausalLM"),
    ("0.5.13", ["--model", "gemma2"], "sglang 0.5.13 is outside 0.5.14-0.5.23"),
    ("0.6.0", ["--model", "gemma2"], "sglang 0.6.0 is outside 0.5.14-0.5.23"),
    (None, ["--model", "gemma2"], "no sglang is installed here: install one"),
])
def test_doctor_model_bad_input_is_one_line_exit_2(installed, argv, must, fake_install, capfd):
    fake_install["sglang"] = installed
    capfd.readouterr()
    rc = main(["doctor", *argv])
    out, err = capfd.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and must in lines[0] and "Traceback" not in out + err, (rc, out, err)


# ----------------------------------------------------------------------------- the real thing (cached)
def _baseline_overlay():
    from conftest import release_overlay

    pytest.importorskip("sglang")
    release_overlay(RELEASE)


@pytest.mark.slow
def test_doctor_model_rederives_the_family_answer(capfd, monkeypatch):
    """The installed release's gemma2 on sm90, audited now: the answer, the per-path verdicts, the
    fix computed and audited again; the same state as the committed table's cell (both computed)."""
    _baseline_overlay()
    from swa_repro.core import mode
    from swa_repro.engine.provenance import TABLE_DIR
    from swa_repro.sglang.audit import table

    monkeypatch.setattr(mode, "dist_version", lambda d, real=mode.dist_version: RELEASE if d == "sglang" else real(d))
    v = FA.verdict("gemma2", "sm90")
    assert v["release"] == RELEASE and v["gpu"] == "sm90"
    rows = {(r["kind"], r["path"]): r for r in FA.verdict_rows(v["audit"])}
    assert rows["sliding", "extend_paged"]["verdict"] == "extra" and rows["full", "extend_paged"]["verdict"] == "exact"
    assert rows["sliding", "extend_paged"]["max_extra_per_query"] > 0
    fx = v["fix"]
    assert fx["remedy"] == v["audit"]["remedy"] and fx["fixes"] == ["all"]  # the audit's remedy (family_fix)
    assert fx["exact"] == (not FA.bad(fx["fixed"])) and len(FA.bad(fx["fixed"])) < len(FA.bad(v["audit"]))
    assert fx["exact"] and fx["fixed_state"] == "not affected"
    committed = table.committed(TABLE_DIR / "families.json")
    row = next(r for r in committed["rows"] if r["sglang"] == RELEASE and r["gpu"] == "sm90")
    assert row["cells"]["gemma2"]["state"] == v["answer"]["state"]


@pytest.fixture(scope="module")
def nb07(tmp_path_factory):
    """Notebook 07 run once, headless, through the project's runner; the tests below read its set."""
    _baseline_overlay()
    from swa_repro.notebook.places import NOTEBOOKS_DIR
    from swa_repro.notebook.runner import ensure_kernel, run_one

    out = tmp_path_factory.mktemp("nb07")
    params = {"model": "gemma2", "gpu": "sm90", "sglang_release": RELEASE}
    return out, run_one(NOTEBOOKS_DIR / "07_my_model_my_gpu.py", out, "model", params, ensure_kernel(), 900)


# In the release matrix: make test's one run of notebook 07 is test_remedy's (0.5.23's cohere2 on sm100, whose
# cells the sweep made), which holds the same (model mode, its checks, the three keys figures, the answer); this
# run on the pinned baseline's gemma2 was a second notebook 07 (~40 s from nothing). The baseline's answer
# itself stays in make test: test_doctor_model_rederives_the_family_answer (its cells, shipped and fixed).
@pytest.mark.slow
@pytest.mark.matrix
def test_notebook_07_answers_my_model_my_gpu_my_release(nb07):
    out, r = nb07
    assert r["status"] == "ok", r["error"]
    assert r["mode"] == "model" and r["checks_failed"] == 0 and r["checks_passed"] >= 3
    assert {"07_my_model_my_gpu_keys.png", "07_my_model_my_gpu_keys_zoomed.png",
            "07_my_model_my_gpu_keys_fixed.png"} <= {str(f).rsplit("/", 1)[-1] for f in r["figures"]}
    html = (out / "07_my_model_my_gpu.html").read_text()
    assert "Mode: model" in html and "the CPU audit is all there is" in html
    assert "ANSWER: affected on the default path" in html and "swa-repro patch --fix all: the audit of the release with it says not affected" in html
