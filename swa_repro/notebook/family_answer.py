"""My model, my GPU, my release: the family audit's answer, re-derived here, and the fix that makes it exact.

Used by ``swa-repro doctor --model FAMILY`` and notebook 07. Nothing is quoted from
``docs/audit/families.json``: the release's own code builds the family's layers and is driven at
the real window (``sglang.audit.family_run.audit_families``, a child cached by content in
``core.cache``, so a second ask costs seconds). What to do is the audit's own remedy
(``sglang.audit.family_fix.remedy``, stored with each family by ``family_run.audit_release``),
decided there only, never here: the same for ``audit --model``, ``doctor --model``, notebook 07 and
``docs/audit/families.md``. Here it is checked: the family audited again on a copy of the release
with the remedy's fixes, whose own answer must be "not affected", or what remains is said.
"""

from __future__ import annotations

from dataclasses import dataclass

from swa_repro.core.errors import UsageError
from swa_repro.engine.families import DEFAULT_GPU, FAMILIES, GPU_CLASSES
from swa_repro.sglang import families as fam
from swa_repro.sglang.audit.family_verdict import LAYER_NOT_HF

CAPABILITY = {8: "sm80", 9: "sm90", 10: "sm100"}  # torch.cuda.get_device_capability()[0] -> GPU class
EXTEND = ("extend_paged", "extend_ragged_no_prefix", "extend_ragged_prefix")


@dataclass(frozen=True)
class Gpu:
    name: str  # sm80 | sm90 | sm100
    why: str  # how it was chosen, one sentence


def gpu_class(requested: str | None = None, capability=None) -> Gpu:
    """``requested`` (``--gpu`` / ``gpu=``) wins; else this machine's CUDA device's class
    (``capability``, default ``torch.cuda.get_device_capability()``); else sm90, said so."""
    if requested not in (None, "", "auto"):
        fam.check_args(FAMILIES[0], requested)  # one line for an unknown class
        return Gpu(requested, f"{requested} ({GPU_CLASSES[requested].cards}): given")
    if capability is None:
        try:
            import torch

            capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
        except Exception:  # no torch, a broken driver: no device to read
            capability = None
    if capability is None:
        return Gpu(DEFAULT_GPU, f"no CUDA device here: assumed {DEFAULT_GPU} "
                   f"({GPU_CLASSES[DEFAULT_GPU].cards}); give --gpu sm80|sm90|sm100 for another")
    major, minor = capability
    name = CAPABILITY.get(major)
    if name is None:  # sm120 and the like: no sm100 switch, no fa3 -> what sm80 runs
        return Gpu("sm80", f"this GPU is sm{major}{minor}, none of the audited classes: taken as sm80 "
                   "(fa2, no sm100 switch); give --gpu to choose")
    return Gpu(name, f"this GPU is sm{major}{minor}: {name} ({GPU_CLASSES[name].cards})")


def release_of(requested: str | None = None) -> str:
    """``requested`` (a release number) or the installed sglang's; one line when there is none or
    it is outside the releases the family audit covers."""
    if requested in (None, "", "installed"):
        from swa_repro.core.mode import dist_version

        requested = dist_version("sglang")
        if requested is None:
            raise UsageError(f"no sglang is installed here: install one (pip install sglang=={fam.RELEASES[1]}) or "
                             f"ask about a release: swa-repro audit --sglang {fam.RELEASES[1]} --model FAMILY")
        requested = requested.split("+")[0]
    fam.check_release(requested)
    return requested


def check(model: str, gpu: str | None, release: str | None) -> tuple:
    """Every argument, one line each, before any work: (family or the checkpoint read, GPU class,
    release). A path (``checkpoint.looks_like_path``) is a checkpoint's config.json or its folder,
    read now (``checkpoint.read``); the release checks it before its audit (``checkpoint.check_release``)."""
    from swa_repro.core.checkpoint_config import looks_like_path
    from swa_repro.sglang import checkpoint

    if model not in (None, "") and model not in FAMILIES and looks_like_path(model):
        return checkpoint.read(model), gpu_class(gpu), release_of(release)
    if model in (None, "") or model == "all" or "," in model:
        raise UsageError(f"--model takes one family ({', '.join(FAMILIES)}) or a checkpoint's config.json")
    fam.check_args(model, gpu if gpu not in (None, "", "auto") else None)
    return model, gpu_class(gpu), release_of(release)


def name_of(model) -> str:
    """A family's name, or a checkpoint's architecture (the GPU recordings, ``family_evidence``, are
    the families' published configs: a checkpoint's architecture has none of its own)."""
    return getattr(model, "architecture", model)


def family_audit(release: str, model: str, gpu: str, fixes=None) -> dict:
    """The family's audit document (``audit.family_run``), with the release header beside it."""
    from swa_repro.sglang.audit import family_run

    doc = family_run.audit_families(release, model, gpu, fixes=fixes, note=lambda s: None)
    f = doc["families"][0]
    return {**f, "release": doc["release"], "gpu": gpu}


def bad(f: dict) -> list[tuple[str, str, str]]:
    """``(kind, path, what)`` for every driven path x kind whose keys are not what its layer asks (the
    verdict against transformers' mask where the layer asks that window; against the layer's own
    where it asks another: that is ``layer != HF``, the model file's, ``family_verdict.layer_off``) or
    that drops the cap."""
    out = []
    for r in f.get("paths", []):
        if r.get("status") == "driven":
            if r.get("verdict_vs_layer", r["verdict"]) != "exact":
                out.append((r["kind"], r["path"], r["verdict"]))
            if r["cap"].startswith("dropped"):
                out.append((r["kind"], r["path"], "cap dropped"))
    return out


def verdict_rows(f: dict) -> list[dict]:
    """Per layer kind and path: the key verdict at the real window, how many queries see keys
    outside it, the cap, and what FlashInfer runs; a path not driven says why."""
    rows = []
    for r in f.get("paths", []):
        if r.get("status") != "driven":
            rows.append({"kind": r["kind"], "path": r["path"], "verdict": r.get("status"), "why": r.get("why")})
            continue
        k = r["keys"].values()
        rows.append({"kind": r["kind"], "path": r["path"], "verdict": r["verdict"],
                     "queries": sum(s["queries"] for s in k),
                     "queries_with_extra": sum(s["queries_with_extra"] for s in k),
                     "max_extra_per_query": max((s["max_extra_per_query"] for s in k), default=0),
                     "missing_keys": sum(s["missing_keys"] for s in k), "cap": r["cap"],
                     "runs": "; ".join(f"{w}: {', '.join(v)}" for w, v in r["wrappers"].items())})
    return rows


def fix_answer(release: str, model: str, gpu: str, f: dict) -> dict:
    """``{"remedy", "command", "fixes", "exact", "fixed_state", "remaining", "fixed"}``: the audit's remedy
    of the family (``f["remedy"]``: ``family_fix.remedy``), and with fixes, the family audited again on a
    copy of the release with them (``fixed``, its answer ``fixed_state``); ``exact``: with fixes, that
    audit's answer is "not affected", or ``layer != HF`` (every path serves what the layer asks; the model
    file's window is not HF's, ``fixed_state`` says so); without, no driven path of the release is wrong
    (``bad``)."""
    from swa_repro.sglang.audit.family_fix import fix_names, remedy_text

    r = f.get("remedy") or {"fix": None, "instead": None}
    names = fix_names(r)
    out = {"remedy": r, "command": remedy_text(r), "fixes": list(r.get("fix") or [])}
    if f.get("error"):
        return {**out, "exact": False, "fixed_state": None, "remaining": [f["error"]], "fixed": None}
    if not names:
        left = [" ".join(b) for b in bad(f)]
        return {**out, "exact": not left, "fixed_state": None, "remaining": left, "fixed": None}
    fixed = family_audit(release, model, gpu, fixes=names)
    state = fixed["answer"]["state"]
    return {**out, "exact": state in ("not affected", LAYER_NOT_HF), "fixed_state": state,
            "remaining": [" ".join(b) for b in bad(fixed)], "fixed": fixed}


def fix_sentence(fx: dict) -> str:
    """What to do, and what the audit of the fixed copy said of it."""
    if fx["fixes"] and fx["exact"]:
        said = fx["fixed_state"] if fx["fixed_state"] == "not affected" else \
            f"{fx['fixed_state']} ({'; '.join(fx['fixed']['answer'].get('why') or [])}: the model file's window)"
        return f"{fx['command']}: the audit of the release with it says {said}"
    if fx["fixes"]:
        return (f"{fx['command']}; the audit of the release with it still says {fx['fixed_state']}: "
                + "; ".join(fx["remaining"][:6]))
    if fx["remedy"].get("instead"):
        return fx["remedy"]["instead"]
    if fx["exact"]:
        return "nothing to fix: every driven path is exact and the cap, if any, is applied"
    return "no fix in swa-repro's registry addresses it: " + "; ".join(fx["remaining"][:6])


def verdict(model: str, gpu: str | None = None, release: str | None = None, *, with_fix: bool = True) -> dict:
    """The whole answer: release, GPU class (and why), the family's audit, its answer, the fix."""
    model, g, release = check(model, gpu, release)
    f = family_audit(release, model, g.name)
    out = {"release": release, "gpu": g.name, "gpu_why": g.why, "model": getattr(model, "path", model), "audit": f,
           "answer": f.get("answer") or {"state": "not built", "why": f.get("error")}}
    if with_fix:
        out["fix"] = fix_answer(release, model, g.name, f)
    return out


def lines(v: dict) -> list[str]:
    """``doctor --model``'s text."""
    f, a = v["audit"], v["answer"]
    out = [f"model {v['model']} on sglang {v['release']} (as shipped; audited on CPU now, cache "
           f"{f['release'].get('result_cache', {}).get('cache', '?')}), GPU class {v['gpu_why']}"]
    if f.get("error"):
        return out + [f"  not built: {f['error']}"]
    out.append(f"  window {f['config']['sliding_window']} (HF), runner sliding_window_size "
               f"{f['build']['runner_window']}, cap {f['config']['cap']:g}")
    for r in verdict_rows(f):
        if r["path"] in EXTEND + ("decode", "cuda_graph_decode"):
            out.append(f"  {r['kind']:<7} {r['path']:<24} {r['verdict']:<9}"
                       + (f" {r['queries_with_extra']}/{r['queries']} queries see keys outside the window; "
                          f"cap {r['cap'][:50]}" if "queries" in r else f" {r.get('why') or ''}"[:100]))
    why = [a["why"]] if isinstance(a.get("why"), str) else a.get("why") or []
    out.append(f"  ANSWER: {a['state']}" + "".join(f"; {x}" for x in (a.get("flags"), a.get("note")) if x))
    out += [f"    {w}" for w in why[:6]] + ([f"    ... {len(why) - 6} more"] if len(why) > 6 else [])
    if "fix" in v:
        out.append("  WHAT TO DO: " + fix_sentence(v["fix"]))  # the audit's words (family_run.render)
    return out
