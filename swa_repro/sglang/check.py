"""``swa-repro sglang-check``: a case matrix through sglang's real FlashInfer backend, unpatched
and patched, each against the exact float64 reference.

Expectation (exit 1 if it fails): unpatched fails exactly the cases that reach past the window
(:func:`harness.reaches_past_window`, geometry only), patched passes all. Each row says
why it failed: the kernel model rebuilt from the recorded plan/forward arguments (extra keys per
row, first leaking row) and the first row whose measured error is above tolerance.

``peer_suite()`` runs sglang's own attention test kit
(``sglang.test.kits.attention_unittest.attention_methods.dense_attention``) on the same backend,
its extend cases through ``run_dense_attention_case`` unchanged.
"""

from __future__ import annotations

import json
import sys
import unittest
from pathlib import Path

import torch

from swa_repro.core.case import Case
from swa_repro.core.errors import UsageError
from swa_repro.core.mode import resolve_mode
from swa_repro.core.outputs import untracked_dir
from swa_repro.sglang.patch import swap
from swa_repro.sglang.patch.swap import unpatched
from swa_repro.sglang.harness import (HARNESS_RELEASES, reaches_past_window, require_harness_release, run_case,
                                      sglang_env, sglang_info, swa_forward_index)
from swa_repro.sglang.trace import Trace

# sglang's attention test kit is imported inside the functions that use it: sglang is optional and
# slow to import (about a minute on 2 cores), and a bad --cases must fail before that.

HEAD_DIM = 128
MATRIX = (
    # the upstream regression cases (the kit's SWA cases, window 4, page 16, 4/4 heads) ...
    Case((0, 0, 0), (3, 4, 5), window_left=4, name="upstream_no_prefix_3_4_5"),
    Case((3, 4, 5), (2, 2, 2), window_left=4, name="upstream_prefix_3_4_5"),
    Case((0, 0, 0), (6, 8, 12), window_left=4, name="upstream_no_prefix_6_8_12"),
    # ... and longer GQA cases with prefixes and several query tiles (CTA_TILE_Q 128 = 32 rows x 4 heads)
    Case((0, 300, 1000), (300, 200, 300), num_qo_heads=32, num_kv_heads=8, window_left=128,
         name="gqa_batch_tiles"),
    Case((1000,), (300,), num_qo_heads=32, num_kv_heads=8, window_left=128, name="gqa_long_prefix_split_kv"),
)
# (case name, route): the deterministic-inference route reaches the same paged-only branch
ROUTED = tuple((c, "paged") for c in MATRIX) + ((MATRIX[2], "deterministic"),)


def expected_pass(case: Case, patched: bool) -> bool:
    return patched or not reaches_past_window(case)


def run_matrix(mode: str = "model", *, cases=None, trace_dir=None, keep=False):
    """``[(row dict, HarnessResult or None)]`` for every (case, route) x (unpatched, patched)."""
    out = []
    for case, route in ROUTED:
        if cases and case.name not in cases:
            continue
        for patched in (False, True):
            r = run_case(case, patched, mode, route=route)
            row = r.row() | {"route": route, "reaches_past_window": reaches_past_window(case),
                             "expected_pass": expected_pass(case, patched),
                             "window_left_at_plan": _swa_plan_window(r)}
            row["as_expected"] = row["passed"] == row["expected_pass"]
            if trace_dir is not None:
                p = Path(trace_dir) / f"{case.name}.{route}.{'patched' if patched else 'unpatched'}.{mode}.pt"
                row["trace"] = str(r.trace.save(p))
            out.append((row, r if keep else None))
    return out


def _swa_plan_window(r) -> int | None:
    """The window_left sglang gave the SWA wrapper's plan (None: not given, the bug)."""
    fwd = swa_forward_index(r.trace)
    if fwd is None:
        return None
    w = r.trace.calls[fwd].wrapper
    kws = [k for k in r.plan_kwargs if k["wrapper"] == w]
    return kws[-1].get("window_left") if kws else None


# ----------------------------------------------------------------------------- the kit as peer suite
def kit_cases():
    """The kit's extend cases for the flashinfer backend: its SWA window-edge cases and dense ones.
    Decode cases are left out: the decode wrapper is an exact stand-in here, not a model."""
    from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit

    cs = (kit.make_swa_no_prefix_input_config_cases("flashinfer") + kit.make_swa_prefix_input_config_cases("flashinfer")
          + kit.make_dense_cases("flashinfer"))
    return [c for c in cs if not c.forward_mode.is_decode()]


def kit_expected_pass(kit_case, patched: bool) -> bool:
    """The same geometric expectation as the matrix, for a kit case (no window: always pass)."""
    if patched or kit_case.sliding_window_size is None:
        return True
    return not reaches_past_window(Case(kit_case.prefix_lens, kit_case.extend_lens,
                                        window_left=kit_case.sliding_window_size))


def peer_suite(mode: str = "model", patched: bool = False, names=None) -> list[dict]:
    """Run the kit's ``run_dense_attention_case`` on each extend case, paged-only route, through the
    same wrapper substitution as the harness, with head_dim 128 in both modes (the kernel model covers
    FlashInfer's compiled head dims 64/128/256; the kit's default is 16) and the kit's other defaults
    (fp16, hidden 64, shuffled pages). The kit compares with atol = rtol = 3e-2 after its o_proj."""
    from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit

    kw = dict(device="cpu" if mode == "model" else "cuda", head_dim=HEAD_DIM)
    tc = unittest.TestCase()
    rows = []
    for case in kit_cases():
        if names and case.name not in names:
            continue
        row = {"case": case.name, "patched": patched, "params": {k: str(v) for k, v in kw.items()},
               "expected_pass": kit_expected_pass(case, patched)}
        with sglang_env(mode, Trace()) as fb, (swap.patched(fb) if patched else unpatched(fb)):
            try:
                kit.run_dense_attention_case(tc, case, **kw)
                row |= {"passed": True}
            except unittest.SkipTest as e:
                row |= {"passed": None, "skipped": str(e)}
            except AssertionError as e:
                row |= {"passed": False, "error": " ".join(str(e).split())[:240]}
        rows.append(row)
        torch.manual_seed(0)
    return rows


# ----------------------------------------------------------------------------- CLI
def register(sub) -> None:
    p = sub.add_parser("sglang-check", help="case matrix through sglang's FlashInfer backend, unpatched vs patched")
    p.add_argument("--mode", choices=("auto", "model", "live"), default="auto",
                   help="model: CPU kernel model behind sglang's code; live: real FlashInfer on CUDA")
    p.add_argument("--cases", default=None, help=f"comma-separated subset of: {', '.join(c.name for c in MATRIX)} "
                   "(default: all)")
    p.add_argument("--trace-dir", default=None, help="save every run's wrapper-call trace here (.pt) for `swa-repro replay`")
    p.add_argument("--force", action="store_true", help="let --trace-dir be a folder of committed files")
    p.add_argument("--peer", action="store_true", help="also run sglang's own attention test kit (extend cases)")
    p.add_argument("--kit-only", action="store_true",
                   help="only sglang's own attention kit (extend+decode cases), on sglang as it is on disk (0.5.13+)")
    p.add_argument("--sglang", default=None, metavar="VERSION",
                   help="with --kit-only: run release VERSION's kit and code in a child (its overlay)")
    p.add_argument("--fix", default=None, metavar="NAMES",
                   help="with --kit-only --sglang: that release with these `swa-repro patch --fix` fixes (all or names)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=main)


def selected_cases(text: str | None) -> list[str]:
    """``--cases`` -> names ([] = all when not given); given, it must name known cases, at least one:
    an empty filter would check nothing and still exit 0."""
    if text is None:
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - {c.name for c in MATRIX})
    twice = sorted({n for n in names if names.count(n) > 1})
    if unknown or not names or twice:
        what = (f": unknown case(s) {', '.join(unknown)}" if unknown else
                f" names {', '.join(twice)} more than once (give each once)" if twice else " selects no case")
        raise UsageError(f"--cases{what}: choose from {', '.join(c.name for c in MATRIX)}")
    return names


def main(a) -> int:
    if a.kit_only:
        from swa_repro.sglang import kit

        return kit.main(a)
    if a.sglang is not None or a.fix is not None:  # --sglang "" too: it ran the installed release's matrix
        raise UsageError("--sglang/--fix go with --kit-only (the matrix drives the installed "
                         f"{', '.join(HARNESS_RELEASES)}); for other releases use `swa-repro audit --sglang`")
    names = selected_cases(a.cases)
    if a.force and not a.trace_dir:
        raise UsageError("--force goes with --trace-dir (a committed folder)")
    if a.trace_dir:
        untracked_dir(a.trace_dir, "--trace-dir", force=a.force)  # created when missing (Trace.save); checked before any run
    require_harness_release()
    info = resolve_mode(a.mode)
    rows = [r for r, _ in run_matrix(info.mode, cases=set(names), trace_dir=a.trace_dir)]
    peer = {s: peer_suite(info.mode, p) for s, p in (("unpatched", False), ("patched", True))} if a.peer else None
    doc = matrix_doc(info, rows, peer)
    ok = doc["expectation_met"]
    if a.json:
        print(json.dumps(doc, default=str))
    else:
        print(format_table(doc))
    sys.stdout.flush()
    if "stub_violation" in doc:
        print(f"error: {doc['stub_violation']}", file=sys.stderr)
    return 0 if ok else 1


def stub_provenance() -> dict | None:
    """What the ``sgl_kernel`` transport stub (``swa-repro bundle --sglang``) saw in this process, if it
    stands in for sglang-kernel: names looked up and names called (evidence/stubs/sgl_kernel). The marker
    keeps out placeholders that answer every name, like releases.py's CPU ``sgl_kernel``."""
    m = sys.modules.get("sgl_kernel")
    if getattr(m, "__swa_repro_stub__", False) is not True or not callable(getattr(m, "provenance", None)):
        return None
    return m.provenance()


def matrix_doc(info, rows: list[dict], peer: dict | None = None) -> dict:
    """The report: mode and why, where sglang is and its state, every row, the peer suite."""
    ok = all(r["as_expected"] for r in rows) and all(
        r["passed"] is None or r["passed"] == r["expected_pass"] for rs in (peer or {}).values() for r in rs)
    doc = {"mode": info.mode, "mode_reason": info.reason, **sglang_info(), "expectation_met": ok, "results": rows}
    if peer is not None:
        doc["peer_suite"] = peer
    stub = stub_provenance()
    if stub is not None:
        doc["stubs"] = [stub]
        if stub["called"]:  # the run went through a stub, not sglang-kernel: it proves nothing
            doc["expectation_met"] = False
            doc["stub_violation"] = (f"the run called {', '.join(stub['called'])} of the {stub['stubbed']} stub "
                                     f"(standing in for {stub['replaces']}): this path needs the real wheel")
    return doc


def format_table(doc: dict) -> str:
    lines = [f"sglang {doc['sglang']} ({doc['state']}: {doc['backend_file']}), mode {doc['mode']}: {doc['mode_reason']}",
             f"{'case':<28} {'route':<13} {'patched':<8} {'plan wl':<8} {'max_abs_err':>11}  {'result':<6} {'expected':<8} why"]
    for r in doc["results"]:
        err = "nan" if r["max_abs_err"] is None else f"{r['max_abs_err']:.3g}"
        w = r["why"]
        why = "" if r["passed"] else (
            f"status {','.join(w.get('status', []))}; max {w.get('max_extra_keys_per_row', '?')} extra keys/row"
            + (f"; first leak at req {w['first_leaking_row']['request']} pos {w['first_leaking_row']['position']}"
               if "first_leaking_row" in w else ""))
        lines.append(f"{r['case']:<28} {r['route']:<13} {str(r['patched']):<8} {str(r['window_left_at_plan']):<8} "
                     f"{err:>11}  {'PASS' if r['passed'] else 'FAIL':<6} {'ok' if r['as_expected'] else 'WRONG':<8} {why}")
    for state, rows in doc.get("peer_suite", {}).items():
        res = ", ".join(f"{r['case']}={'PASS' if r['passed'] else 'skip' if r['passed'] is None else 'FAIL'}" for r in rows)
        lines.append(f"peer suite (sglang's dense_attention kit), {state}: {res}")
    for stub in doc.get("stubs", []):
        lines.append(f"stub {stub['stubbed']} for {stub['replaces']}: {len(stub['looked_up'])} names looked up, "
                     f"called: {', '.join(stub['called']) or 'none'}")
    lines.append("expectation met: unpatched fails exactly the cases past the window, patched passes all"
                 if doc["expectation_met"] else "EXPECTATION FAILED: " + doc.get("stub_violation", "see the 'expected' column"))
    return "\n".join(lines)
