"""What a family's audit answers on one GPU class: the driven runs of the child (``family_run``) and the
release's own server facts (``serving_server``: FlashInfer kept or refused, the default prefill path
and backend per GPU class) turned into the one state a user acts on (``answer``), with the runs that
show it. Kept apart from ``family_run``, which builds and drives: this module only reads its document.
"""

from __future__ import annotations

AFFECTED = ("affected on the default path", "only with flags", "only with speculative decoding")
HYBRID = "unknown (hybrid SWA pool)"  # answer: served on the hybrid SWA KV pool, which could not be driven (hybrid_pool)
# every kernel told what the layer asks, the layer another window (vllm.audit.verdict's)
LAYER_NOT_HF = "layer != HF"
SERVING_GPU = {"sm80": "other", "sm90": "sm90", "sm100": "sm100"}  # serving_path.GPUS
DEFAULT_EXTEND = {"ragged": ("extend_ragged_no_prefix", "extend_ragged_prefix"), "paged-only": ("extend_paged",)}
ALWAYS = ("decode", "cuda_graph_decode")  # every server decodes; decode CUDA graphs are on by default
NOT_DRIVEN = "not driven"  # an answer with no driven run behind it: never "not affected" (issue #43)


def _bad(f: dict, paths) -> list[str]:
    """``kind path: verdict`` / ``kind path: cap dropped`` of the driven runs on ``paths`` whose keys
    are not what the layer asks (``verdict_vs_layer`` where the layer asks another window than
    transformers' mask: that difference is :func:`layer_off`'s, not the backend's)."""
    out = []
    for r in f.get("paths", []):
        if r["path"] in paths and r.get("status") == "driven":
            if r.get("verdict_vs_layer", r["verdict"]) != "exact":
                out.append(f"{r['kind']} {r['path']}: {r['verdict']}")
            if r["cap"].startswith("dropped"):
                out.append(f"{r['kind']} {r['path']}: cap dropped")
    return out


def answer(f: dict, gpu: str) -> dict:
    """:func:`pooled_answer`, said conditional where the column's window is one the audit set (``arch_fill``:
    the release's config class defaults give none, 0.5.23 configs/step3p5.py:29-30): ``window_from`` and a
    note; the state keeps its words (a checkpoint's own window is audited with ``--model PATH``)."""
    a = pooled_answer(f, gpu)
    if (f.get("discovered") or {}).get("window_from") != "audit" or a["state"] == "not built":
        return a
    w = (f.get("config") or {}).get("sliding_window")
    said = (f"at a window the audit set ({w}; the release's config class sets none): your checkpoint's window: run "
            "swa-repro audit --sglang RELEASE --model PATH/config.json")
    return {**a, "window_from": "audit", "note": "; ".join(filter(None, [said, a.get("note")]))}


def pooled_answer(f: dict, gpu: str) -> dict:
    """The user's answer: affected on the default path / only with flags / only with speculative
    decoding / not affected / flashinfer refused / not built; with the default backend on ``gpu``.
    A model the release serves on its hybrid SWA KV pool (``ModelConfig.is_hybrid_swa``, from
    ``is_hybrid_swa_model``'s architecture list) is judged on that pool where its runs were driven on it
    (``audit.hybrid_pool``: the release's ``SWAKVPool`` and allocator, each sliding call's SWA slots read
    back to positions): the same states, said so in the note. Where the pool could not be driven it is
    :data:`HYBRID`, with why."""
    a = _answer(f, gpu)
    if (f.get("discovered") or {}).get("fallback") or ((f.get("build") or {}).get("model_config") or {}).get("fallback"):
        # built by the Transformers fallback, or a column only it was thought to serve (fallback_cells)
        from swa_repro.sglang.audit.fallback_cells import note

        a["note"] = "; ".join(filter(None, [note(f), a.get("note")])) or None
    hybrid = ((f.get("build") or {}).get("model_config") or {}).get("is_hybrid_swa")
    if not hybrid or a["state"] in ("not built", "flashinfer refused"):
        return a
    pooled = [r["hybrid_pool"] for r in f.get("paths") or [] if r.get("status") == "driven" and r.get("hybrid_pool")]
    if pooled and a["state"] != NOT_DRIVEN:
        swa = next((p for p in pooled if p.get("layer_pool") == "swa"), None)
        if swa is None:  # the built layers are all full ones: they live in the full pool, untranslated
            return {**a, "note": "; ".join(filter(None, [
                "judged on sglang's hybrid SWA KV pool (ModelConfig.is_hybrid_swa): the layers built are all full "
                "attention, which read the full pool untranslated", a.get("note")]))}
        return {**a, "note": "; ".join(filter(None, [(
            f"judged on sglang's hybrid SWA KV pool (ModelConfig.is_hybrid_swa: {swa['pool']} + {swa['allocator']}, "
            "sliding calls' SWA slots read back to positions through the release's translate_loc_from_full_to_swa; "
            f"out-of-window SWA slots freed by {swa['eviction']} before decode/verify, then reused by another "
            f"request){_stale(f)}"), a.get("note")]))}
    errors = [f"{r['kind']} {r['path']}: {r.get('why')}" for r in f.get("paths") or []
              if r.get("status") not in ("driven", "absent")]
    why = "it could not be driven (why: the runs' errors)" if errors else "no run was driven on it"
    return {**a, "state": HYBRID, "ordinary_pool": a["state"], "flags": "--disable-hybrid-swa-memory",
            "why": errors[:3] or a.get("why"),
            "note": "; ".join(filter(None, [
                f"sglang serves {f['build'].get('model_class')} on its hybrid SWA KV pool "
                f"(ModelConfig.is_hybrid_swa): {why}; the verdict on the ordinary pool "
                f"(--disable-hybrid-swa-memory): {a['state']}", a.get("note")]))}


def _stale(f: dict) -> str:
    """The driven runs on the hybrid pool whose sliding calls read slots the request no longer holds
    (``foreign_keys``: a freed position's SWA slot, cleared to the padding slot, or another request's)."""
    bad = [r["path"] for r in f.get("paths") or [] if r.get("hybrid_pool") and r.get("kind") == "sliding"
           and any((s or {}).get("foreign_keys") for s in (r.get("keys") or {}).values())]
    return f"; slots the request no longer holds read on: {', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}" \
        if bad else ""


def layer_off(f: dict) -> list[str]:
    """Each layer kind whose own window is not transformers' mask (the model file's choice, as vLLM's
    verdict words it: ``vllm.audit.verdict.judge``), where a driven run's keys show it."""
    shown = {r["kind"] for r in f.get("paths") or [] if r.get("status") == "driven" and r["verdict"] != "exact"}
    cap = float((f.get("config") or {}).get("cap") or 0.0)
    return [f"{kind} layer asks window_left {k['layer_window']}, transformers' mask {k['intended_window']}"
            for kind, k in sorted((f.get("kinds") or {}).items())
            if kind in shown and k.get("layer_window") != k.get("intended_window")] + \
        [f"{kind} layer carries cap {k.get('cap') or 0:g}, the config's attn_logit_softcapping {cap:g}"
         for kind, k in sorted((f.get("kinds") or {}).items()) if cap > 0 and float(k.get("cap") or 0.0) != cap]


def _answer(f: dict, gpu: str) -> dict:
    if f.get("error"):
        return {"state": "not built", "why": f["error"]}
    sv = f.get("serving") or {}
    backend = (sv.get("default_backend") or {}).get(SERVING_GPU[gpu])
    sv = {**sv, **(sv.get("by_gpu") or {}).get(SERVING_GPU[gpu], {})}  # this GPU class's servers
    note = None if backend in (None, "flashinfer") else \
        f"default backend on {gpu} is {backend}: FlashInfer only with --attention-backend flashinfer"
    if sv.get("flashinfer_kept") is False:
        return _refused(f, sv, backend)
    for key, state in (("crash", "crashes on FlashInfer"), ("fallback", "fallback: not audited")):
        if f.get(key):  # arch_cells: decided from the release's source, not driven
            return {"state": state, "why": [f[key]], "default_backend": backend, "note": note}
    default = DEFAULT_EXTEND.get(sv.get("default_prefill"), ("extend_ragged_no_prefix", "extend_ragged_prefix"))
    other = tuple(p for ps in DEFAULT_EXTEND.values() for p in ps if p not in default) + ("cuda_graph_extend",)
    spec = tuple(r["path"] for r in f.get("paths") or [] if "verify" in r["path"])
    for state, paths, flags in (("affected on the default path", default + ALWAYS, None),
                                ("only with flags", other, sv.get("to_other")),
                                ("only with speculative decoding", spec, None)):
        bad = _bad(f, paths)
        if bad:
            return {"state": state, "why": bad + layer_off(f), "flags": flags, "default_backend": backend,
                    "note": note}
    off = layer_off(f)
    if off:  # every kernel is told what the layer asks; the layer asks another window than HF's
        return {"state": LAYER_NOT_HF, "why": off, "default_backend": backend, "note": note}
    undriven = [f"{r['kind']} {r['path']}: {r['status']}" for r in f.get("paths") or []
                if r.get("status") not in ("driven", "absent")]
    if not any(r.get("status") == "driven" for r in f.get("paths") or []):  # no run is no evidence (issue #43)
        return {"state": NOT_DRIVEN, "why": undriven[:6] or ["no path of this family was driven"],
                "default_backend": backend, "note": note}
    state = "not affected" if not undriven else "unknown (not driven)"
    return {"state": state, "why": undriven[:6], "default_backend": backend, "note": note}


def _refused(f: dict, sv: dict, backend) -> dict:
    """``--attention-backend flashinfer`` refused; a split server that the release keeps
    (``--prefill-attention-backend flashinfer``: the extend paths; ``--decode-...``: decode) reaches
    FlashInfer around the refusal, a path of its own: its bad paths are "only with flags"; where the
    driven ones are all exact, not affected (said why)."""
    split = [s for s in (sv.get("split") or {}).values() if s.get("kept")]
    out = {"state": "flashinfer refused", "why": sv.get("refusal"), "default_backend": backend}
    reached = set()
    for s in split:
        paths = DEFAULT_EXTEND.get(s.get("default_prefill"), ()) if s.get("default_prefill") else ALWAYS
        reached.update(paths)
        bad = _bad(f, paths)
        if bad:
            return {"state": "only with flags", "why": bad, "flags": [s["flag"]], "default_backend": backend,
                    "note": f"--attention-backend flashinfer is refused ({sv.get('refusal')}); {s['flag']} is kept "
                            "and reaches FlashInfer"}
    if split and any(r.get("status") == "driven" for r in f.get("paths") or [] if r["path"] in reached):
        return {"state": "not affected", "why": [], "default_backend": backend,
                "note": f"--attention-backend flashinfer is refused ({sv.get('refusal')}); "
                        f"{' / '.join(s['flag'] for s in split)} kept: the driven paths they reach are exact"}
    return out


def cell_of(f: dict) -> dict:
    """One family of one audit: the answer and the facts behind it."""
    a = f["answer"]
    if f.get("error"):
        return {"state": a["state"], "why": [a["why"]]}
    if "kinds" not in f:  # decided from the release's source (arch_cells: a crash, the fallback), not driven
        return {"state": a["state"], "why": a["why"], "default_backend": a.get("default_backend"),
                "note": a.get("note")}
    kinds = f["kinds"]
    caps = sorted({r["cap"].split(" (")[0] for r in f["paths"] if r.get("status") == "driven"})
    bad = {}
    for r in f["paths"]:
        if r.get("status") == "driven" and r["verdict"] != "exact":
            bad.setdefault(r["kind"], []).append(f"{r['path']}: {r['verdict']}")
    why = a.get("why")
    return {"state": a["state"], "why": [why] if isinstance(why, str) else why or [],
            "flags": a.get("flags"), "default_backend": a.get("default_backend"), "note": a.get("note"),
            "window_hf": f["config"]["sliding_window"],
            "layer_window": {k: v["layer_window"] for k, v in kinds.items()},
            "runner_window": f["build"]["runner_window"], "runner_rule": f["build"]["runner_rule"],
            "cap": f["config"]["cap"], "cap_state": "/".join(caps), "not_exact": bad,
            **({"ordinary_pool": a["ordinary_pool"]} if "ordinary_pool" in a else {}),
            **({"window_from": a["window_from"]} if "window_from" in a else {})}


# ----------------------------------------------------------------------------- child
