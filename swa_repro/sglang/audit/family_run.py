"""``swa-repro audit --sglang X --model FAMILY[,..]|all [--gpu sm80|sm90|sm100]``: parent and child.

Parent (:func:`audit_families`): arguments checked (``families.check_args``), the release's overlay
(``provision``), the families it serves read off its model files (a family it lacks, named: one
line), then one child for all families and GPU classes (``overlay_run.run_child``), each (family,
GPU class) cached by content (``core.cache.cached_cells``). To the
child's document it adds what the release's own server code says about the family
(``serving_path``: flashinfer kept or refused, the default prefill path and the default backend on
that GPU class), and ``family_verdict.answer`` turns both into the sentence a user acts on.

Child: ``python -m swa_repro.sglang.audit.family_run --overlay DIR --out F --families a,b --gpus sm90,sm100``
(``audit.family`` per family, built once and driven once per platform switch for all the GPU classes;
a family the release cannot build is recorded with why).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.engine import families as efam
from swa_repro.engine.child import beside, child_main, child_parser
from swa_repro.engine.families import GPU_CLASSES
from swa_repro.sglang import checkpoint as ckpt
from swa_repro.sglang import families as fam
from swa_repro.sglang.audit.family_verdict import NOT_DRIVEN, answer, cell_of
from swa_repro.sglang.checkpoint import Checkpoint
from swa_repro.sglang.overlay_run import check_no_foreign, child_parts, import_release, overlay_for, run_child



# ----------------------------------------------------------------------------- parent
MODULE = "swa_repro.sglang.audit.family_run"


def audit_families(version: str, family, gpu: str | None, *, fixes=None, note=print, transformers: str = "venv") -> dict:
    """Audit ``family`` (comma-separated, or ``all``; or a ``checkpoint.Checkpoint``, the user's
    config.json) of release ``version`` on ``gpu``; ``fixes``: with these ``swa-repro patch --fix``
    fixes applied to a copy of its overlay (``fix.overlay``); ``transformers``: ``release`` builds the
    release's classes with the transformers it pins (``release_transformers``)."""
    gclass = fam.check_args("all" if isinstance(family, Checkpoint) else family, gpu)[1]
    return audit_release(version, family, [gclass.name], fixes=fixes, note=note,
                         transformers=transformers)[gclass.name]


def audit_release(version: str, family, gpus: list[str], *, fixes=None, note=print, archs: bool = False,
                  transformers: str = "venv") -> dict:
    """``{gpu: document}`` for every GPU class in ``gpus``, from one child for the release (one
    import of its sglang, each family built once, driven once per platform switch). Each (family,
    GPU class) is cached on its own (``core.cache.cached_cells``): a later audit of fewer or other
    cells of the same release reuses those made, and computes only the missing ones. ``family``: a
    ``checkpoint.Checkpoint`` audits the user's values (checked against the release's model file
    before the child: ``checkpoint.check_release``), its cells keyed on the small config too. ``archs``
    (with ``all``): every other sliding-window architecture the release serves too (``arch_cells``),
    each at its published defaults, keyed on its small config. The release's ServerArgs facts
    (``_serving``: a child of its own, a fork per model and GPU class) are asked beside the family
    child (``engine.child.beside``), not after it."""
    from swa_repro.core.cache import cached_cells
    from swa_repro.core.versions import SGLANG_MIN_RELEASE as MIN_RELEASE
    from swa_repro.core.versions import sglang_release_key as parse

    ck = family if isinstance(family, Checkpoint) else None
    names = [ck.family] if ck else fam.check_args(family, gpus[0] if gpus else None)[0]
    for g in gpus:
        fam.check_args("all" if ck else family, g)
    if parse(version) < MIN_RELEASE:
        raise UsageError(f"--sglang {version}: the audit drives sglang 0.5.10 and later")
    said: list[str] = []  # the overlay's progress lines wait: a family the release lacks is the only line
    overlay, info, fixed = overlay_for(version, fixes, note=said.append, doing=f"building {','.join(names)}",
                                       transformers=transformers)
    if ck:
        small_args, key = checkpoint_args(ck, version, overlay)
    else:
        names = fam.check_release_has(version, overlay, names, explicit="all" not in family.split(","))
        small_args, key = [], {}
    from swa_repro.sglang.audit import arch_cells

    smalls, static = arch_cells.plan(version, overlay) if archs and not ck else ({}, {})
    for line in said:
        note(line)
    cells = [{"family": f, "gpu": g, **key} for g in gpus for f in names]
    cells += [{"family": a, "gpu": g, "config": arch_cells.digest(x["small"])} for g in gpus for a, x in smalls.items()]

    def compute(missing):
        fs, gs = list(dict.fromkeys(c["family"] for c in missing)), list(dict.fromkeys(c["gpu"] for c in missing))
        with arch_cells.smalls_file({a: x["small"] for a, x in smalls.items() if a in fs}) as extra:
            doc, secs, _ = run_child(MODULE, overlay, ["--families", ",".join(fs), "--gpus", ",".join(gs),
                                                       *small_args, *extra], f"auditing sglang {version}", cache=False)
        rel = {**doc["release"], "child_seconds": secs}
        return [{"release": rel, "family": next(x for x in doc["by_gpu"][c["gpu"]] if x["family"] == c["family"])}
                for c in missing]

    # the release's ServerArgs child beside the family child (independent of it): the second core
    later = beside(_serving, overlay, version, names, ck, {
        **{a: {"architectures": [a]} for a in static if a != arch_cells.FALLBACK},
        **{a: x["small"]["config"] for a, x in smalls.items()}})
    try:
        docs, how = cached_cells("family-cell", child_parts(MODULE, overlay), cells, compute,
                                 valid=whole_cell) if cells else ([], {})
    except BaseException:  # the family's failure is the one said, as before
        later.cancel()
        raise
    serving = later.result()
    from swa_repro.sglang.audit.family_fix import remedy

    out = {}
    for g in gpus:
        mine = [d for c, d in zip(cells, docs) if c["gpu"] == g]
        rel = dict(mine[0]["release"]) if mine else {"sglang": version}
        rel.update(overlay_info=info, result_cache=how, fixes=fixed, transformers=built_with(rel, info))
        fams = [d["family"] for d in mine] + [dict(d) for d in static.values()]
        for f in fams:
            if f["family"] in smalls:
                f["discovered"] = smalls[f["family"]]["discovered"]
            f["serving"] = serving.get(f["family"])
            f["answer"] = answer(f, g)
            f["remedy"] = remedy(f["family"], cell_of(f), g, version) if f["answer"]["state"] != NOT_DRIVEN else \
                {"fix": None, "instead": "no verdict: no path was driven; audit it again (SWA_REPRO_NO_CACHE=1 "
                 "recomputes it without the cache)"}
            if ck:
                f["checkpoint"] = ckpt.record(ck)
        out[g] = {"release": rel, "gpu": g, "families": fams}
    return out


def built_with(rel: dict, info: dict) -> dict:
    """Which transformers built the cells (the child's ``transformers.__version__`` and file) and where it
    came from: this venv, or the release's pin (``release_transformers``: its METADATA line, the overlay)."""
    tf = info.get("transformers")
    where = {"from": "release", "pinned_by": tf["pinned_by"], "installer": tf.get("installer"),
             "overlay": tf["overlay"]} if tf else {"from": "venv"}
    return {**(rel.get("transformers") or {}), **where}


def whole_cell(doc) -> bool:
    """A cached cell is one the child made: its release, and its family either not built (an
    ``error``) or with the paths it drove; a cell with no path at all is no evidence (issue #43)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("release"), dict):
        return False
    f = doc.get("family")
    return isinstance(f, dict) and "family" in f and bool(f.get("error") or (isinstance(f.get("paths"), list)
                                                                            and f["paths"]))


def checkpoint_args(ck: Checkpoint, version: str, overlay: Path) -> tuple[list[str], dict]:
    """The child's ``--small`` (the user's config cut to a few layers) and the cells' extra key part;
    one line first for what the release cannot build (``checkpoint.check_release``)."""
    from dataclasses import asdict

    ckpt.check_release(ck, version, overlay)
    small = json.dumps(asdict(ckpt.small_config(ck)), sort_keys=True, default=str)
    return ["--small", small], {"config": hashlib.sha256(small.encode()).hexdigest()[:16]}


def _serving(overlay: Path, version: str, names: list[str], ck: Checkpoint | None = None, archs: dict | None = None) -> dict:
    """family -> the release's server facts for it (``serving_server``: the release's own ServerArgs
    resolved for the config the audit builds, the family's small config or the checkpoint's, on each
    GPU class); ``archs``: the table's architecture columns, ``{arch: config.json dict}``)."""
    from dataclasses import asdict

    from swa_repro.sglang.serving_server import serving

    models = {ck.family: ckpt.small_config(ck).config} if ck else {n: efam.small_config(n).config for n in names}
    models.update(archs or {})
    # as JSON holds them (lists, not tuples): an answer renders the same fresh and from the committed table
    return json.loads(json.dumps({n: asdict(fp) for n, fp in serving(overlay, version, models).items()}))


def executor_of(live: str | None):
    """``--live``: ``cuda`` runs each driven call on this GPU's FlashInfer (after one warm-up call
    per compiled module, ``audit.live.warm``: the JIT builds overlap), ``model`` on the kernel
    model on CPU (what a CPU host can check the pipeline with); None: the key-level audit only."""
    if live is None:
        return None
    from swa_repro.sglang.audit import live as audit_live

    if live == "model":
        return audit_live.model_executor()
    if not torch_cuda():
        raise UsageError("--live cuda needs a CUDA device and flashinfer; --live model runs the kernel model on CPU")
    return audit_live.flashinfer_executor("cuda")  # audit.family_live.live_of warms every module first


def torch_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def child(overlay: Path, families: list[str], gpus: list[str], paths=None, live: str | None = None,
          live_budget_s: float | None = None, small: dict | None = None, smalls: dict | None = None) -> dict:
    """``live_budget_s``: seconds from the child's start after which no more calls are run live
    (each is said not run), so a GPU step that runs out of time still writes what it ran. ``small``:
    a checkpoint's small config (``checkpoint.small_config`` as a dict), built instead of the family's
    published defaults; ``smalls``: ``{name: small config}`` of the table's architecture columns."""
    t0 = time.monotonic()
    deadline = None if live_budget_s is None else t0 + live_budget_s
    import_release(overlay)
    from swa_repro.engine.tolerance import ATOL, RTOL
    from swa_repro.sglang import harness
    from swa_repro.sglang.audit import core as audit_core
    from swa_repro.sglang.audit import family as audit_family
    from swa_repro.sglang.audit import family_live
    from swa_repro.sglang.audit.family_build import vllm_placeholder

    vllm_placeholder()  # before anything imports the model registry (0.5.14 imports it with the backend)
    harness.backend_module()
    t_import = time.monotonic() - t0
    by_gpu = {g: [] for g in gpus}
    executor = executor_of(live)
    jobs = None if executor is None else []  # every family's driven calls, run live after all are driven
    for name in families:
        try:
            mine = (smalls or {}).get(name) or small
            docs = audit_family.audit_family(name, [GPU_CLASSES[g] for g in gpus], paths, jobs,
                                             small=efam.SmallConfig.from_dict(mine) if mine else None)
        except Exception as e:  # one family the release cannot build: said, the others still run
            from swa_repro.sglang import releases

            docs = dict.fromkeys(gpus, {"family": name, "error": " ".join(releases.explain_error(e))})
        for g in gpus:
            by_gpu[g].append(docs[g])
    t_live = time.monotonic()
    warmed = family_live.run_jobs(jobs or [], executor, deadline)
    t_live = time.monotonic() - t_live
    n = check_no_foreign(overlay)
    rel = audit_core.release_info()
    import transformers  # which one built the cells: the venv's, or the release's own (--transformers release)

    rel.update(origin="overlay", overlay=str(overlay), import_seconds=round(t_import, 1),
               transformers={"version": transformers.__version__, "file": transformers.__file__},
               audit_seconds=round(time.monotonic() - t0 - t_import - t_live, 1), sglang_modules_from_overlay=n)
    doc = {"release": rel, "gpus": gpus, "by_gpu": by_gpu}
    if live is not None:
        doc["live"] = {"executor": live, "device": _device_name() if live == "cuda" else "cpu (the kernel model)",
                       "budget_s": live_budget_s, "seconds": round(t_live, 1),
                       "tolerance": {"atol": ATOL, "rtol_model": RTOL}, **warmed}
    return doc


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def main(argv=None) -> int:
    p = child_parser(MODULE)
    p.add_argument("--families", required=True)
    p.add_argument("--gpus", required=True, help=f"comma-separated, of {', '.join(GPU_CLASSES)}")
    p.add_argument("--paths", help="comma-separated audit paths (default: all)")
    p.add_argument("--live", choices=("cuda", "model"), help="also run each driven call (see executor_of)")
    p.add_argument("--live-budget-s", type=float, help="run no call live after this many seconds (said not run)")
    p.add_argument("--small", type=json.loads, help="a checkpoint's small config as JSON (instead of the family's)")
    p.add_argument("--smalls-file", help="JSON {architecture: small config} of the table's architecture columns")
    return child_main(p, lambda overlay, a: child(overlay, a.families.split(","), a.gpus.split(","),
                                                  a.paths.split(",") if a.paths else None, a.live,
                                                  a.live_budget_s, a.small, _smalls(a.smalls_file)), argv)


def _smalls(path: str | None) -> dict | None:
    return json.loads(Path(path).read_text()) if path else None


if __name__ == "__main__":
    sys.exit(main())


# ----------------------------------------------------------------------------- text
def _count(r: dict, key: str, agg=sum) -> int:
    vals = [s[key] for s in r["keys"].values()]
    return agg(vals) if vals else 0


def render(doc: dict) -> list[str]:
    """The audit as text: per family, what the release built and derived, then per layer kind and
    path the key verdict at the real window, the cap and the backends, then the answer."""
    rel = doc["release"]
    fx = rel.get("fixes")
    from swa_repro.sglang.patch.classify import state_text

    tf = rel.get("transformers") or {}
    out = [("PATCHED COPY (swa-repro patch --fix " + ",".join(fx["fixes"]) + "): " if fx else "")
           + f"sglang {rel['sglang']} (overlay {rel.get('overlay')}): backend {state_text(rel['state'])}; "
           + (f"transformers {tf['version']} ({tf['from']}); " if tf.get("version") else "")
           + f"GPU class {doc['gpu']} "
           f"({GPU_CLASSES[doc['gpu']].cards})"]
    for f in doc["families"]:
        if f.get("error"):
            out += [f"{f['family']}: not built: {f['error']}", ""]
            continue
        c, b = f["config"], f["build"]
        if f.get("checkpoint"):
            ck = f["checkpoint"]
            mine = [k for k, v in ck["values"].items() if v["from"] == "user"]
            out.append(f"checkpoint {ck['path']}: {ck['architecture']} read with {ck['config_class']}; from the file: "
                       f"{', '.join(mine) or 'none of the attention keys'}; {len(ck['keys_from_default'])} keys "
                       "from the class defaults")
        out.append(f"{f['family']}: transformers {c['hf_class']}() window {c['sliding_window']} (HF, inclusive), "
                   f"head_dim {c['head_dim']}, heads {c['num_qo_heads']}/{c['num_kv_heads']}, cap {c['cap']:g}; "
                   f"{c['layers_built']} of {c['layers_published']} layers built by {b['model_class']} ({b['model_file']})")
        out.append(f"  runner sliding_window_size = {b['runner_window']}  <- {b['runner_rule']}")
        for kind, k in f["kinds"].items():
            out.append(f"  {kind:<7} layer: {k['layer']}; intended window_left {k['intended_window']}")
        out.append(f"  {'path':<32} {'kind':<7} {'keys':<9} {'q+extra':>11} {'max extra':>9} {'missing':>7}  cap; "
                   "wrapper: sglang's backend -> what FlashInfer runs")
        for r in f["paths"]:
            if r.get("status") != "driven":
                out.append(f"  {r['path']:<32} {r['kind']:<7} {r['status']}: {r['why'][:120]}")
                continue
            vs = f" (vs the layer's own window: {r['verdict_vs_layer']})" if "verdict_vs_layer" in r else ""
            wr = "; ".join(f"{k}: {', '.join(v)}" for k, v in r["wrappers"].items())
            out.append(f"  {r['path']:<32} {r['kind']:<7} {r['verdict']:<9} "
                       f"{str(_count(r, 'queries_with_extra')) + '/' + str(_count(r, 'queries')):>11} "
                       f"{_count(r, 'max_extra_per_query', max):>9} {_count(r, 'missing_keys'):>7}  "
                       f"{r['cap'][:60]}; {wr}{vs}")
        a = f["answer"]
        extra = "; ".join(str(x) for x in (a.get("flags"), a.get("note")) if x)
        why = [a["why"]] if isinstance(a.get("why"), str) else a.get("why") or []
        out += [f"  ANSWER: {a['state']}" + (f" ({extra})" if extra else ""), *(f"    {w}" for w in why[:8]),
                *([f"    ... {len(why) - 8} more"] if len(why) > 8 else [])]
        if f.get("remedy"):
            from swa_repro.sglang.audit.family_fix import remedy_text

            out.append(f"  WHAT TO DO: {remedy_text(f['remedy'])}")
        out.append("")
    return out


def incomplete(doc: dict) -> list[str]:
    """Families not built, paths the release has that were not driven, and families with no driven path."""
    out = []
    for f in doc["families"]:
        if f.get("error"):
            out.append(f"{f['family']}: not built: {f['error']}")
            continue
        out += [f"{f['family']} {r['kind']} {r['path']}: {r['status']}: {r['why']}" for r in f["paths"]
                if r.get("status") not in ("driven", "absent")]
        if f.get("answer", {}).get("state") == NOT_DRIVEN:
            out.append(f"{f['family']}: not driven: no path of this family was driven")
    return out
