"""``swa-repro sglang-check --kit-only``: sglang's own attention test kit, on the installed sglang
exactly as it is on disk (no swap, no in-memory patch), any release that ships the kit (0.5.13+).

Cases: what sglang's flashinfer entry points run through the kit's ``run_dense_attention_case``
(repo test/registered/attention/dense/test_flashinfer.py ``test_projected_dense_attention_cases``:
``make_dense_cases("flashinfer")``, extend and decode; swa/test_flashinfer.py
``test_projected_swa_attention_cases``: ``make_swa_no_prefix_input_config_cases`` +
``make_swa_prefix_input_config_cases``), with their ``HEAD_DIM = 64``, ``HIDDEN_SIZE = 256``.
Those files are not in the wheel; their layout/CUDA-graph/split-op/spec runner cases need CUDA
graphs and are not run. The kit's assertion is ``assert_close(atol=rtol=3e-2)``
(0.5.23 dense_attention.py:1287).

Modes: ``live`` runs the kit untouched on CUDA. ``model`` (CPU) replaces, in the backend module
only, FlashInfer's wrapper classes by the kernel-model wrappers (as ``harness.sglang_env``), its
``torch`` by ``engine.standins.CpuTorch`` (decode allocates ``device="cuda"`` buffers) and the Triton
kv-indices kernel by its torch port (``releases.kv_indices_everywhere``), and it adapts two
things, both because the kit was written for CUDA: the prefill route is paged-only
(``SGLANG_FLASHINFER_USE_PAGED=1``: the kernel model has no non-causal paged prefix + LSE merge
of the default ragged route), and the kit runs under ``torch.no_grad()``: its
``_populate_prefix_kv`` writes grad-requiring K/V outside ``no_grad`` (0.5.23 :918-958), which
CUDA's ``store_cache`` kernel takes (memory_pool.py:176) and the CPU fallback
``v_cache[indices] = v`` (:219) refuses.

``--sglang X [--fix NAMES]``: the same in a child with X's overlay first on ``sys.path``
(``overlay_run``). Child: ``python -m swa_repro.sglang.kit --overlay DIR --out FILE --mode M``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import sys
import unittest

from swa_repro.core.errors import UsageError

KIT = "sglang.test.kits.attention_unittest.attention_methods.dense_attention"
KIT_FROM = (0, 5, 13)
HEAD_DIM, HIDDEN_SIZE = 64, 256  # test/registered/attention/{dense,swa}/test_flashinfer.py
CASE_SETS = ("make_dense_cases", "make_swa_no_prefix_input_config_cases", "make_swa_prefix_input_config_cases")


def require_kit_release(version: str, flag: str = "installed") -> None:
    """A one-line refusal for a release without the kit (< 0.5.13)."""
    from swa_repro.core.versions import sglang_release_key as parse

    try:
        old = parse(version) < KIT_FROM
    except UsageError:
        if flag == "--sglang":
            raise
        return  # an installed dev/local build: the kit's import decides
    if old:
        where = f"--sglang {version}" if flag == "--sglang" else f"the installed sglang {version}"
        raise UsageError(f"{where} has no attention test kit: sglang ships "
                         "sglang/test/kits/attention_unittest from 0.5.13")


def load_kit():
    try:
        import importlib

        return importlib.import_module(KIT)
    except ImportError as e:
        raise UsageError(f"sglang's attention test kit does not import ({KIT}): {e}") from None


def header() -> dict:
    """The sglang under test: version, backend file, its sha256[:12] and each fix's state."""
    import sglang

    from swa_repro.sglang.fix import states
    from swa_repro.sglang.patch.files import installed_path

    path = installed_path()
    text = path.read_text()
    return {"sglang": sglang.__version__, "sglang_dir": str(sglang.__path__[0]), "backend_file": str(path),
            "sha256": hashlib.sha256(text.encode()).hexdigest()[:12],
            "fixes": {n: {"state": s.state, "why": s.why} for n, s in states(text).items()}}


@contextlib.contextmanager
def model_env(fb):
    """The CPU substitutions and adaptations of the module docstring, restored on exit."""
    import torch

    from swa_repro.engine.standins import CpuTorch
    from swa_repro.sglang import harness, releases

    names = dict(harness.MODEL_CLASSES, global_workspace_buffer=None, torch=CpuTorch())
    with harness._namespace(fb, names), releases.release_env(fb, use_paged=True), torch.no_grad():
        yield


def _short(e: BaseException) -> str:
    """One line; assert_close's message up to its greatest absolute difference."""
    return " ".join(str(e).split()).split(" Greatest relative difference")[0][:200]


def run_kit(mode: str) -> tuple[list[dict], str | None]:
    """``(rows, setup error)``: one row per case, status passed / failed / skipped / error."""
    kit = load_kit()
    cases = [c for f in CASE_SETS for c in getattr(kit, f)("flashinfer")]
    kw = dict(head_dim=HEAD_DIM, hidden_size=HIDDEN_SIZE, device="cuda" if mode == "live" else "cpu")
    rows = [{"case": c.name, "forward_mode": c.forward_mode.name, "sliding_window_size": c.sliding_window_size}
            for c in cases]
    tc = unittest.TestCase()
    with contextlib.ExitStack() as st:
        if mode == "model":
            try:
                from swa_repro.sglang import harness

                st.enter_context(model_env(harness.backend_module()))
            except Exception as e:  # say so in every row, never crash
                why = f"model-mode substitution failed for this release: {type(e).__name__}: {_short(e)}"
                return [r | {"status": "error", "message": why} for r in rows], why
        for row, case in zip(rows, cases):
            try:
                kit.run_dense_attention_case(tc, case, **kw)
                row |= {"status": "passed"}
            except unittest.SkipTest as e:
                row |= {"status": "skipped", "message": _short(e)}
            except AssertionError as e:
                row |= {"status": "failed", "message": _short(e)}
            except Exception as e:  # the harness could not drive it: say which, in the row
                row |= {"status": "error", "message": f"{type(e).__name__}: {_short(e)}"}
    return rows, None


def kit_doc(mode: str, mode_reason: str) -> dict:
    doc = {**header(), "mode": mode, "mode_reason": mode_reason,
           "substitution": "none (real FlashInfer, CUDA)" if mode == "live" else
           "kernel-model wrappers, CPU torch and kv-indices port in the backend module; paged-only prefill; no_grad",
           "case_sets": [f'{f}("flashinfer")' for f in CASE_SETS], "head_dim": HEAD_DIM, "hidden_size": HIDDEN_SIZE}
    doc["results"], setup = run_kit(mode)
    if setup:
        doc["setup_error"] = setup
    doc["ok"] = all(r["status"] in ("passed", "skipped") for r in doc["results"])
    return doc


def format_doc(doc: dict) -> str:
    fixes = ", ".join(f"{n}={f['state']}" for n, f in doc["fixes"].items())
    lines = [f"sglang {doc['sglang']}: {doc['backend_file']} sha256 {doc['sha256']}; fixes: {fixes}",
             f"mode {doc['mode']} ({doc['substitution']}); kit cases of {', '.join(doc['case_sets'])}"]
    if doc.get("overlay"):
        lines.append(f"overlay {doc['overlay']}" + (f" with --fix {','.join(doc['fixed']['fixes'])}"
                                                    if doc.get("fixed") else " (as shipped)"))
    for r in doc["results"]:
        lines.append(f"  {r['case']:<40} {r['forward_mode']:<7} {r['status']:<8} {r.get('message', '')}".rstrip())
    n = {s: sum(r["status"] == s for r in doc["results"]) for s in ("passed", "failed", "skipped", "error")}
    lines.append(", ".join(f"{v} {k}" for k, v in n.items()) + ("" if doc["ok"] else ": KIT FAILED"))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI (from check.main)
def main(a) -> int:
    """``--kit-only`` [``--sglang X`` [``--fix NAMES``]]; exit 1 if a case failed or errored."""
    from swa_repro.core.mode import resolve_mode

    if a.cases is not None or a.peer or a.trace_dir is not None or getattr(a, "force", False):  # "" too
        raise UsageError("--kit-only runs sglang's kit alone: drop --cases/--peer/--trace-dir/--force")
    if a.sglang is not None:  # "" ran the installed sglang; 0.5.15.post2 went to the installer
        from swa_repro.core.versions import check_sglang_release as check_release

        check_release(a.sglang)
    fixes = None
    if a.fix is not None:
        if not a.sglang:
            raise UsageError("--fix applies to a release's overlay: give --sglang VERSION too "
                             "(the installed sglang is run as it is on disk)")
        from swa_repro.sglang.fix import parse_names

        fixes = parse_names(a.fix)
    if a.sglang:
        require_kit_release(a.sglang, "--sglang")
        info = resolve_mode(a.mode)
        from swa_repro.sglang.overlay_run import overlay_for, run_child

        note = (lambda s: print(s, file=sys.stderr)) if a.json else print
        overlay, _, fixed = overlay_for(a.sglang, fixes, note=note, doing="running its kit")
        doc, secs, how = run_child("swa_repro.sglang.kit", overlay,
                                   ["--mode", info.mode, "--mode-reason", info.reason], f"sglang {a.sglang}'s kit",
                                   cache=info.mode == "model")
        doc.update(overlay=str(overlay), fixed=fixed, child_seconds=secs, result_cache=how)
    else:
        doc = installed_doc(a.mode)
    print(json.dumps(doc, default=str) if a.json else format_doc(doc))
    return 0 if doc["ok"] else 1


def installed_doc(requested_mode: str) -> dict:
    """The kit on the importable sglang, in this process."""
    import logging
    import warnings

    from swa_repro.core.mode import resolve_mode

    try:
        v = md.version("sglang")
    except md.PackageNotFoundError:
        raise UsageError("sglang is not installed: give --sglang VERSION to run a release's overlay") from None
    require_kit_release(v)
    info = resolve_mode(requested_mode)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if info.mode == "model":
        from swa_repro.sglang import releases

        releases.ensure_sgl_kernel()
    return kit_doc(info.mode, info.reason)


def _child(overlay, a) -> dict:
    from swa_repro.sglang.overlay_run import check_no_foreign, import_release

    import_release(overlay)
    doc = kit_doc(a.mode, a.mode_reason)
    doc["sglang_modules_from_overlay"] = check_no_foreign(overlay)
    return doc


if __name__ == "__main__":
    from swa_repro.engine.child import child_main, child_parser

    p = child_parser("swa_repro.sglang.kit")
    p.add_argument("--mode", choices=("model", "live"), required=True)
    p.add_argument("--mode-reason", default="")
    sys.exit(child_main(p, _child))
