"""One cell's answer (release x family x GPU class) from the child's audit of it.

* **refused**: the release will not serve the family with FlashInfer on this GPU class (its
  ``validate_configuration`` rejects it, or its impl / metadata builder raises
  ``NotImplementedError`` for a layer kind the family has); the reason is the release's own.
* **affected**: a kernel that runs is told something other than what the layer asks for (the
  window, the soft cap, the scale or the sinks; a direct kernel call without a ``logits_soft_cap``
  argument counts as the cap dropped where the layer asks for one).
* **layer != HF**: every kernel is told what the layer asks, but the layer asks for another window
  than transformers' mask of the family (``hf_window_left``; e.g. a model file passing
  ``sliding_window + 1``).
* **not affected**, or **not driven** (the audit could not drive a path; the error says why).
"""

from __future__ import annotations

REFUSAL = ("NotImplementedError", "ValueError")


def cell(doc: dict) -> dict:
    if doc.get("error"):
        return {"state": "not driven", "why": [doc["error"]], "routes": []}
    fam = doc["family"]
    pl = doc.get("platform", {})
    why, routes, state = [], [], "not affected"
    if pl.get("flashinfer_valid") is False:
        return {"state": "refused", "why": [f"validate_configuration: {', '.join(pl['flashinfer_reasons'])}"],
                "routes": []}
    refused = [r for r in doc["rows"] if r.get("error") and r["error"].split(":")[0] in REFUSAL]
    if refused:
        reasons = sorted({f"{r['layer']}: {r['error']}"[:140] for r in refused})
        return {"state": "refused", "why": reasons, "routes": []}
    broken = [r for r in doc["rows"] if r.get("error")]
    for r in doc["rows"]:
        for k in r["kernels"]:
            route = f"{r['layer'][0].upper()} {r['path']}: {k['kernel']}"
            if route not in routes:
                routes.append(route)
            for d in k["differs"]:
                what = f"{r['layer'][0].upper()} {r['path']} {k['kernel']}: {d}"
                if what not in why:
                    why.append(what)
    if why:
        state = "affected"
    hf = {kind: v["hf_window_left"] for kind, v in fam["layers"].items()}
    asked = {r["layer"]: r["asked"]["window_left"] for r in doc["rows"] if r.get("asked")}
    off = [f"{kind} layer asks window_left {w}, transformers' mask {hf[kind]}" for kind, w in sorted(asked.items())
           if kind in hf and w != hf[kind]]
    if off:
        why += off
        state = "affected" if state == "affected" else "layer != HF"
    if broken and state == "not affected":
        return {"state": "not driven", "why": sorted({f"{r['layer']} {r['path']}: {r['error']}" for r in broken}),
                "routes": routes}
    return {"state": state, "why": why, "routes": routes}


def short(c: dict) -> str:
    """The table cell: state plus the gist (cap dropped on which kernels, the window offset)."""
    s = c["state"]
    if s == "not affected":
        return "not affected"
    if s == "refused":
        first = c["why"][0]
        return "refused: " + ("sinks" if "sink" in first else "sliding window" if "sliding" in first
                              else first.split(": ", 1)[-1][:60])
    gist = []
    kernels = sorted({w.split(": ")[0].split(" ")[-1] for w in c["why"] if "logits_soft_cap" in w})
    if kernels:
        gist.append("cap dropped by " + ", ".join(k.replace("_with_kv_cache", "") for k in kernels))
    other = [w.split(": ", 1)[1] for w in c["why"] if ": " in w and "logits_soft_cap" not in w
             and "layer asks" not in w]
    gist += sorted(set(other))[:2]
    gist += [w.replace(" layer asks window_left", ": window_left") for w in c["why"] if "layer asks" in w]
    return f"**{s}**: " + "; ".join(gist) if s == "affected" else f"{s}: " + "; ".join(gist)[:160]


def default_text(pl: dict) -> str:
    if not pl or pl.get("error"):
        return f"unknown ({pl.get('error', 'not probed')})"
    d = pl["default"]
    unchecked = "" if pl.get("default_checked") else " (first in order; its validity not checked: needs compiled code)"
    rank = pl["order"].index("FLASHINFER") + 1 if "FLASHINFER" in pl["order"] else None
    return f"{d}{unchecked}; FlashInfer is #{rank} of {' > '.join(pl['order'])}"
