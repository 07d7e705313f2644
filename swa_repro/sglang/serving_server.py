"""A cell's default path and backend from what release X's own ``ServerArgs`` decided, for any architecture.

``server_run`` resolves X's ``ServerArgs`` for the model's ``config.json`` on each GPU class (faked):
with no flag, with ``--attention-backend flashinfer``, and with ``--prefill-attention-backend
flashinfer`` / ``--decode-attention-backend flashinfer`` alone. From those servers this says, per GPU
class (:func:`from_server`):

* the default backend: what the flagless server resolved (``prefill, decode`` where they differ), or
  ``refused: file:line: error`` where the release refuses the model without a backend flag;
* whether ``--attention-backend flashinfer`` is kept (the server resolves flashinfer for both
  phases) or refused (the assert's file:line and message, as raised);
* the EXTEND path that server's FlashInfer backend takes: its resolved prefill CUDA graph and
  ``is_multimodal`` fed into the backend's own ``use_ragged`` rule (``FlashInferAttnBackend.
  init_forward_metadata``, read by ``serving_path._release_rules`` and cited file:line): a piecewise
  (``tc_piecewise``) prefill graph or a multimodal model takes paged-only, anything else ragged;
* a split server (:data:`SPLIT`) that reaches FlashInfer for one phase, in particular around a
  refusal of ``--attention-backend flashinfer`` (0.5.23 Exaone4: model_hook.py:679 refuses it, the
  prefill flag alone is kept): a path of its own, with the flag that takes it.

The sm90 class gives the release-wide fields (``FamilyPath.flashinfer_kept`` ...); every class is in
``FamilyPath.by_gpu``. Where the child cannot run (a release whose ServerArgs does not resolve here),
``serving_path``'s static reading of the same files answers, said so in the notes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.sglang import serving_path as sp

SPLIT = {"prefill": ("prefill_flashinfer", "--prefill-attention-backend flashinfer", 0),
         "decode": ("decode_flashinfer", "--decode-attention-backend flashinfer", 1)}
RAN = "ServerArgs(model_path=<config.json folder>, ...) resolved on a faked {gpu} (swa_repro.sglang.server_run)"


def backends(r: dict) -> tuple:
    """(prefill, decode) backend of a resolved server (a phase flag overrides ``attention_backend``)."""
    ab = r.get("attention_backend")
    return r.get("prefill_attention_backend") or ab, r.get("decode_attention_backend") or ab


RULE_FILES = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/")  # where a server's own rules raise


def is_refusal(r: dict) -> bool:
    """A server that did not resolve because its own rules said no (an assert or raise in
    ``server_args.py`` / ``arg_groups/``), not because something else failed here (a config the
    release's config code cannot read, an import): that is no answer, see :func:`unresolved`."""
    return not r.get("ok") and str(r.get("where") or "").startswith(RULE_FILES)


def unresolved(facts: dict) -> str | None:
    """The first failure of a model's servers that is not a refusal, as ``file:line: error``."""
    bad = [r for by in facts.values() for r in by.values() if not r.get("ok") and not is_refusal(r)]
    return f"{bad[0].get('where')}: {bad[0].get('error')}" if bad else None


def backend_text(r: dict) -> str:
    if not r.get("ok"):
        return f"refused: {r.get('where')}: {r.get('error')}"
    p, d = backends(r)
    return p if p == d else f"{p} prefill, {d} decode"


def refusal_text(r: dict) -> str:
    if r.get("ok"):
        return f"resolved to {backend_text(r)}, not flashinfer"
    return f"{r.get('where')} ({r.get('error')})"


def prefill_path(r: dict, R: dict, arch: str) -> tuple[str, tuple, tuple]:
    """(default_prefill, flags to the other path, notes) of the EXTEND batches of a resolved server
    whose prefill backend is flashinfer: the server's prefill CUDA graph, multimodal and deterministic
    flags through the backend's ``use_ragged`` rule (``R``: ``serving_path._release_rules``)."""
    if "ragged_terms" not in R:
        return "unknown: use_ragged rule not found in FlashInferAttnBackend.init_forward_metadata", (), ()
    graph, mm, notes = r.get("prefill_graph"), r.get("is_multimodal"), []
    flags = {"deterministic": "--enable-deterministic-inference", "use_paged": f"{R.get('use_paged_env')}=1",
             "enable_mis": "--enable-mis", "multi_item": "--multi-item-scoring-delimiter"}
    to_paged = [v for t in R["ragged_terms"] + R["force_paged"] for k, v in flags.items() if k in t]
    unknown = [t for t in R["ragged_terms"] if not any(k in t for k in [*flags, "piecewise"])]
    notes += [f"unknown use_ragged inputs: {unknown}"] if unknown else []
    pcg_term = any("piecewise" in t for t in R["ragged_terms"])
    if arch in R.get("mm_archs", ()) and not mm:
        to_paged.append("--enable-multimodal")
        notes.append(f"the server resolves is_multimodal=False for {arch}: ragged allowed")
    if mm and any("is_multimodal" in t for t in R["force_paged"]):
        notes.append("the server resolves is_multimodal=True, which forces the paged wrapper; no flag switches it")
        return "paged-only", (), tuple(notes)
    if r.get("enable_deterministic_inference"):
        return "paged-only", (), (*notes, "the server resolves deterministic inference on: use_ragged is False")
    if pcg_term and graph == "tc_piecewise":
        off = "--disable-piecewise-cuda-graph" if r.get("legacy_graph_flag") else "--cuda-graph-backend-prefill=disabled"
        notes.append("the server resolves a piecewise (tc_piecewise) prefill CUDA graph: EXTEND batches of <= "
                     "piecewise max tokens replay under it and take paged-only; larger ones run ragged")
        return "paged-only", (off,), tuple(notes)
    if graph is None:
        return "unknown: the resolved server holds no prefill CUDA graph setting", (), tuple(notes)
    on = "--enforce-piecewise-cuda-graph" if r.get("legacy_graph_flag") else "--cuda-graph-backend-prefill=tc_piecewise"
    notes.append(f"the server resolves the prefill CUDA graph {graph}: not piecewise, ragged")
    return "ragged", tuple(dict.fromkeys(to_paged + ([on] if pcg_term else []))), tuple(notes)


def one_gpu(facts: dict, R: dict, arch: str) -> dict:
    """One GPU class's servers -> kept or refused, the path, the split servers."""
    fi = facts["flashinfer"]
    kept = bool(fi.get("ok")) and backends(fi) == ("flashinfer", "flashinfer")
    out = {"flashinfer_kept": kept, "refusal": None if kept else refusal_text(fi),
           "default_backend": backend_text(facts["default"]), "split": {}}
    out["default_prefill"], out["to_other"], out["notes"] = prefill_path(fi, R, arch) if kept else ("refused", (), ())
    for side, (scenario, flag, i) in SPLIT.items():
        r = facts[scenario]
        if r.get("ok") and backends(r)[i] == "flashinfer":
            s = {"flag": flag, "kept": True, "backends": backend_text(r)}
            if side == "prefill":
                s["default_prefill"], s["to_other"], _ = prefill_path(r, R, arch)
        else:
            s = {"flag": flag, "kept": False, "refusal": refusal_text(r)}
        out["split"][side] = s
    return out


def from_server(release: str, family: str, arch: str, facts: dict, R: dict) -> sp.FamilyPath:
    """One architecture's :class:`serving_path.FamilyPath` from its servers (``server_run``:
    GPU class -> scenario -> resolved server or refusal)."""
    by_gpu = {g: one_gpu(facts[g], R, arch) for g in sp.GPUS if g in facts}
    top = by_gpu.get("sm90") or next(iter(by_gpu.values()))
    S = {k: v for k, v in R["src"].items() if k in ("use_ragged", "multimodal_or_mis_forces_paged", "use_paged_env")}
    S.update({f"default_backend_{g}": RAN.format(gpu=g) for g in by_gpu})
    if not top["flashinfer_kept"] and facts.get("sm90", {}).get("flashinfer", {}).get("where"):
        S["refusal"] = facts["sm90"]["flashinfer"]["where"]
    notes = list(top["notes"])
    differ = [g for g, v in by_gpu.items() if (v["flashinfer_kept"], v["default_prefill"]) !=
              (top["flashinfer_kept"], top["default_prefill"])]
    notes += [f"differs on {', '.join(differ)}: see by_gpu"] if differ else []
    around = [f"{v['split'][s]['flag']}" for s in SPLIT for v in [top] if not top["flashinfer_kept"]
              and v["split"][s]["kept"]]
    if around:
        notes.append(f"--attention-backend flashinfer is refused, but {' / '.join(around)} is kept: FlashInfer is "
                     "reached around the refusal (a path of its own: by_gpu split)")
    if not top["flashinfer_kept"] and not around:
        notes.append("--attention-backend flashinfer is refused: not affected by FlashInfer bugs")
    return sp.FamilyPath(release, family, arch, top["flashinfer_kept"], top["refusal"], top["default_prefill"],
                         tuple(top["to_other"]), {g: v["default_backend"] for g, v in by_gpu.items()}, S,
                         tuple(notes), by_gpu)


def serving(overlay: Path, release: str, models: dict) -> dict:
    """name -> :class:`serving_path.FamilyPath` for each ``name -> config.json dict`` (its
    ``architectures[0]`` names the class): the release's ServerArgs run (one child, cached), else its
    source read (``serving_path``), said in the notes."""
    pkg = Path(overlay) / "sglang"
    src, reg = sp._Src(pkg), sp._registered(pkg)
    R = sp._release_rules(src)
    served = {n: c for n, c in models.items() if (c.get("architectures") or [n])[0] in reg}
    try:
        from swa_repro.sglang.server_run import server_facts

        facts, why = server_facts(release, Path(overlay), served), None
    except UsageError as e:
        facts, why = {}, str(e)
    out = {}
    for name, cfg in models.items():
        arch = (cfg.get("architectures") or [name])[0]
        failed = why or (unresolved(facts[name]) if name in facts else None)
        if arch in reg and name in facts and not failed:
            out[name] = from_server(release, name, arch, facts[name], R)
        else:
            fp = sp._family(release, name, arch, src, R, reg)
            said = f"ServerArgs did not resolve here ({failed}): read from the release's source (serving_path)"
            out[name] = replace(fp, notes=fp.notes + ((said,) if failed and arch in reg else ()))
    return out
