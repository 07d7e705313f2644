"""Issue #40's cost-of-the-fix benchmark without a GPU: its cases and plans, the goals computed from
a results file, the report section, and the command line (``--dry-run``, bad input)."""

from __future__ import annotations

import json

import pytest

from benchmarks import fix_cost
from benchmarks import fix_cost_plan as fp
from benchmarks.fix_cost_report import find, render_fix_cost

SHAPES = {m: dict(v) for m, v in fp.FROZEN.items()}


def test_the_frozen_shapes_are_what_transformers_configs_give():
    pytest.importorskip("transformers")
    got, source = fp.model_shapes()
    assert source.startswith("transformers ")
    for m, want in fp.FROZEN.items():
        assert got[m] == pytest.approx(want), m
    assert got["gemma-2-9b"]["sliding"] == got["gemma-2-9b"]["full"] == 21  # alternating
    assert (got["gemma-3-12b"]["sliding"], got["gemma-3-12b"]["full"]) == (40, 8)  # 5 : 1


def test_cases_cover_every_phase_and_length_and_verify_runs_past_the_window():
    full, quick = fp.cases(), fp.cases(quick=True)
    assert len({c.key for c in full}) == len(full) == 24 and len(quick) == 12
    for m in fp.CHECKPOINTS:
        mine = [c for c in full if c.model == m]
        assert sorted(c.tokens for c in mine if c.phase == "prefill") == [4096, 8192, 16384, 32768]
        assert sorted(c.tokens for c in mine if c.phase == "decode") == [4096, 8192, 16384, 32768]
        verify = [c for c in mine if c.phase == "verify"]
        assert {c.topk for c in verify} == {1, 2} and all(c.draft == 8 for c in verify)
        assert all(c.tokens > SHAPES[m]["window_left"] + 1 for c in verify)
    assert [c.phase for c in full][:8] == ["decode"] * 8  # cheapest first


def test_shipped_and_fixed_plans_are_the_release_s_and_the_fix_s():
    g2, g3 = SHAPES["gemma-2-9b"], SHAPES["gemma-3-12b"]
    pre = fp.plans(g2, fp.Case("gemma-2-9b", "prefill", 8192))
    assert all(p.window == -1 and p.cap == 0 and p.backend == "auto" for (v, _), p in pre.items() if v == "shipped")
    assert (pre["fixed", "sliding"].window, pre["fixed", "sliding"].cap) == (4095, 50.0)
    assert (pre["fixed", "full"].window, pre["fixed", "full"].cap) == (-1, 50.0)
    assert (pre["window", "sliding"].window, pre["window", "sliding"].cap) == (4095, 0.0)
    assert ("window", "full") not in fp.plans(g3, fp.Case("gemma-3-12b", "prefill", 8192))  # no cap: one fix
    ver = fp.plans(g3, fp.Case("gemma-3-12b", "verify", 8192, 8, 8, 2))
    assert ver["shipped", "sliding"].keys == "first" and ver["shipped", "sliding"].run_window == 1023
    assert ver["fixed", "sliding"].window == ver["fixed", "sliding"].run_window == 1023 + 7  # widened by the draft
    dec = fp.plans(g2, fp.Case("gemma-2-9b", "decode", 4096, 32))
    assert {p.window for p in dec.values()} == {-1} and dec["shipped", "sliding"].keys == "last"
    assert (dec["shipped", "full"].cap, dec["fixed", "full"].cap) == (0.0, 50.0)


def test_modules_are_few_and_all_are_built_at_once_the_quick_builds_first():
    mods = fp.modules(SHAPES, fp.cases())
    assert len(mods) == 10 and len(set(mods)) == 10
    assert {fp.module_spec(m)["kind"] for m in mods} == {"ragged", "decode", "verify"}
    (wave,) = fp.waves(mods)
    assert sorted(wave) == sorted(mods)
    kinds = [fp.module_spec(m)["kind"] for m in wave]
    assert kinds == sorted(kinds, key=["decode", "verify", "ragged"].index)  # fa3 (ragged, "auto") last
    for m in mods:
        s = fp.module_spec(m)
        assert fp.module_name(s["kind"], s["backend"], s["window"], s["cap"]) == m


def _rec(key, model, phase, shipped, fixed, window=None, rounds=None, error=None):
    """A results record: ``shipped``/``fixed``/``window`` = (sliding ms, full ms, plan ms)."""
    r = {"key": key, "model": model, "phase": phase}
    if error:
        return r | {"error": error}
    for v, t in (("shipped", shipped), ("fixed", fixed), ("window", window)):
        if t is None:
            continue
        r.update({f"{v}_sliding_ms": t[0], f"{v}_full_ms": t[1], f"{v}_plan_ms": t[2]})
        for i, layer in enumerate(("sliding", "full")):
            r[f"{v}_{layer}_rounds"] = [t[i] * f for f in (rounds or {}).get(v, [1.0])]
    return r


def _doc(records):
    return {"provenance": {"gpu": "Fake GPU", "driver": "1", "torch": "t", "cuda": "c", "flashinfer": "0.7.2",
                           "date": "2026-12-06T00:00:00+00:00", "command": "python benchmarks/fix_cost.py"},
            "models": SHAPES, "models_source": "test", "status": "complete", "budget_s": 180, "elapsed_s": 1,
            "jit": {"prefill/auto/d256/bf16/swa/cap": {"s": 12.5}}, "records": records}


def test_goals_are_computed_from_the_measurement():
    ok = _rec("g3/prefill", "gemma-3-12b", "prefill", (4.0, 4.0, 1.0), (0.5, 4.04, 1.0))
    assert fp.goals(_doc([ok]))["full_met"] is True and fp.goals(_doc([ok]))["sliding_met"] is True
    slow = _rec("g2/prefill", "gemma-2-9b", "prefill", (4.0, 4.0, 1.0), (1.0, 4.4, 1.0), window=(0.9, 4.0, 1.0))
    g = fp.goals(_doc([ok, slow, _rec("x", "gemma-2-9b", "decode", None, None, error="budget")]))
    assert g["full_met"] is False and g["worst_full"]["key"] == "g2/prefill"
    assert g["worst_full"]["full"] == pytest.approx(1.1)
    assert g["window_full_met"] is True and g["window_sliding_met"] is True  # the cap's cost, not the window's
    assert len(g["cases"]) == 2  # the error record is no measurement
    case = next(c for c in g["cases"] if c["key"] == "g2/prefill")
    assert case["step"] == pytest.approx((21 * 1.0 + 21 * 4.4 + 1) / (21 * 4 + 21 * 4 + 1))
    no = fp.goals(_doc([]))
    assert no["full_met"] is None and no["sliding_met"] is None and no["worst_full"] is None


def test_a_ratio_is_held_to_its_goal_plus_the_rounds_own_noise():
    args = ("k", "gemma-3-12b", "prefill", (1.0, 1.0, 1.0), (1.0, 1.03, 1.0))
    assert fp.goals(_doc([_rec(*args)]))["full_met"] is False  # 3% > 2%, no noise measured
    noisy = _rec(*args, rounds={"shipped": [0.98, 1.0, 1.02]})
    g = fp.goals(_doc([noisy]))
    assert g["cases"][0]["full_tol"] == pytest.approx(0.04) and g["full_met"] is True
    assert fp.spread([2.0]) == 0.0 and fp.spread([]) == 0.0


def test_the_report_renders_the_results_file_and_its_verdicts(tmp_path):
    assert find(tmp_path) is None
    assert "Not measured yet" in "\n".join(render_fix_cost(root=tmp_path))
    rec = tmp_path / "recordings" / "call-1" / "fix-cost.json"
    rec.parent.mkdir(parents=True)
    doc = _doc([_rec("gemma-2-9b/prefill/8192x1", "gemma-2-9b", "prefill", (1.1, 1.1, 0.9), (0.8, 1.2, 0.9),
                     window=(0.75, 1.1, 0.9)),
                _rec("gemma-3-12b/verify/8192x8/n8k1", "gemma-3-12b", "verify", (0.05, 0.25, 1.3), (0.05, 0.25, 2.2)),
                _rec("gemma-3-12b/decode/4096x32", "gemma-3-12b", "decode", None, None, error="budget")])
    doc["records"][1]["fixed_mask_cut_ms"] = 0.85
    doc["records"][0]["tokens"] = 8192  # past gemma-2's window of 4096
    rec.write_text(json.dumps(doc))
    assert find(tmp_path) == rec
    text = "\n".join(render_fix_cost(root=tmp_path))
    assert "Fake GPU" in text and "flashinfer 0.7.2" in text
    assert "full-attention layers within 2% of shipped" in text and "**NOT met**" in text and "**met**" in text
    assert "| gemma-2-9b/prefill/8192x1 | 1.100 | 0.800 | 0.727 | 1.100 | 1.200 | 1.091 |" in text
    assert "| 0.850 |" in text  # the verify mask cut
    assert "- gemma-3-12b/decode/4096x32: budget" in text and "| prefill/auto/d256/bf16/swa/cap | 12.5 |" in text
    assert "costs full-attention layers +9.1% (fixed / window-only" in text  # 1.2 / 1.1
    assert "a sliding-window layer takes 0.73x its shipped time" in text  # 0.8 / 1.1
    assert "Verify: the fix's plan takes +0.90 ms per step, of which the tree-mask cut" in text


def test_a_call_cut_short_does_not_hide_a_whole_measurement(tmp_path):
    def put(path, n_measured, date):
        recs = [_rec(f"k{i}", "gemma-3-12b", "decode", (1, 1, 1), (1, 1, 1)) for i in range(n_measured)]
        doc = _doc(recs + [_rec("late", "gemma-3-12b", "prefill", None, None, error="budget")])
        doc["provenance"]["date"] = date
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
        return path

    whole = put(tmp_path / "benchmarks" / "results" / "fix_cost.json", 3, "2026-12-06T06:00:00+00:00")
    put(tmp_path / "recordings" / "call-2" / "fix-cost.json", 1, "2026-12-07T06:00:00+00:00")  # newer, cut short
    assert find(tmp_path) == whole
    newer = put(tmp_path / "recordings" / "call-3" / "fix-cost.json", 3, "2026-12-08T06:00:00+00:00")
    assert find(tmp_path) == newer


def test_dry_run_lists_cases_and_modules_without_a_gpu(capsys):
    assert fix_cost.main(["--dry-run", "--quick", "--models", "gemma-3-12b"]) == 0
    out = capsys.readouterr().out
    assert "cases (6):" in out and "gemma-3-12b/verify/8192x8/n8k2" in out and "gemma-2-9b" not in out
    assert "wave 1: prefill/auto/d256/bf16/swa/nocap" in out and "wave 2" not in out


@pytest.mark.parametrize("argv, says", [(["--dry-run", "--models", "llama"], "--models: unknown llama"),
                                         ([], "--out PATH is needed"),
                                         (["--out", "x.json", "--rounds", "0"], "--rounds 1..20")])
def test_bad_arguments_say_what_to_do_in_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        fix_cost.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and len(err.strip().splitlines()) == 1
