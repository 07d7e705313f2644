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
* **not affected**, or **not driven** (the audit could not drive a path; the error says why; or no
  row, or no kernel call, was recorded at all: absence of evidence is never "not affected", issue #43).

A cell is the default cache (``--kv-cache-dtype auto``); each quantized cache the audit drives
(a row with ``cache_dtype``) gets its own answer of the same kinds in ``cache_dtypes``, so that a
release refusing, say, an NVFP4 cache on a GPU class does not read as refusing the family.
"""

from __future__ import annotations

import re

REFUSAL = ("NotImplementedError", "ValueError")


def cell(doc: dict) -> dict:
    refused = (doc.get("family") or {}).get("refused")  # the release's refusal found in its files before any drive
    if refused:  # (an encoder-only model: ``vllm.checkpoint.encoder_refusal``)
        return {"state": "refused", "why": [refused], "routes": []}
    if doc.get("error"):
        return {"state": "not driven", "why": [doc["error"]], "routes": []}
    pl = doc.get("platform", {})
    if pl.get("flashinfer_valid") is False:
        return {"state": "refused", "why": [f"validate_configuration: {', '.join(pl['flashinfer_reasons'])}"],
                "routes": []}
    rows = doc.get("rows") or []
    out = judge(doc, [r for r in rows if not r.get("cache_dtype")])
    dtypes = sorted({r["cache_dtype"] for r in rows if r.get("cache_dtype")})
    if dtypes:
        out["cache_dtypes"] = {kv: judge(doc, [r for r in rows if r.get("cache_dtype") == kv]) for kv in dtypes}
    return out


def _refusal(r: dict) -> str | None:
    """The release's refusal of a row: its ``validate_configuration`` (``refused``) or a raise of
    :data:`REFUSAL`."""
    if r.get("refused"):
        return r["refused"]
    return r["error"] if r.get("error") and r["error"].split(":")[0] in REFUSAL else None


def judge(doc: dict, rows: list) -> dict:
    """The answer over ``rows`` (one cache dtype's paths of a cell)."""
    fam = doc["family"]
    if not any(r.get("kernels") or _refusal(r) or r.get("error") for r in rows):  # no row, no kernel told: no evidence
        return {"state": "not driven", "why": ["no path was driven: no kernel call recorded"], "routes": []}
    why, routes, state = [], [], "not affected"
    refused = [r for r in rows if _refusal(r)]
    if refused:
        reasons = sorted({f"{r['layer']}: {_refusal(r)}"[:140] for r in refused})
        return {"state": "refused", "why": reasons, "routes": []}
    broken = [r for r in rows if r.get("error")]
    for r in rows:
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
    asked = {r["layer"]: r["asked"]["window_left"] for r in rows if r.get("asked")}
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
        msg = re.sub(r"^(full|sliding): ", "", c["why"][0])  # the release's words, not the layer kind's name
        if "sink" in msg or "sliding" in msg:
            return "refused: " + ("sinks" if "sink" in msg else "sliding window")
        return "refused: " + (msg if len(msg) <= 60 else msg[:60].rsplit(" ", 1)[0] + " ...")
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


# ----------------------------------------------------------------------------- the answer as a user reads it
FLASHINFER_FLAG = "--attention-config.backend FLASHINFER"  # what picks FlashInfer (docs/audit/vllm-releases.md)
SHOWN = 6  # the why lines printed; the rest counted


def remedy(c: dict, version: str) -> list[str]:
    """What to do about a cell, a line each: one whose only findings are the soft cap a kernel is not
    told gets ``--fix cap-route`` (``vllm.fix.fixes``; ``docs/audit/fixed/vllm-releases.md``: with it every
    such cell of the table is not affected) and the audit that checks it; ``layer != HF`` (the model file
    asks another window) has no fix here."""
    if c["state"] == "affected" and c["why"] and all("logits_soft_cap" in w for w in c["why"]):
        return ["swa-repro patch apply --vllm --fix cap-route --in-place",
                "(the installed vLLM's two files, a backup each; `patch diff --vllm` shows the edits first)",
                f"check it: swa-repro audit --vllm {version} --fix cap-route"]
    if c["state"] == "layer != HF":
        return [("no fix in swa-repro: vLLM's model file asks another window than transformers' mask, on every "
                 "backend (docs/audit/vllm-releases.md)")]
    if c["state"] == "affected":
        return ["no fix in swa-repro for this finding: the lines above are what to report upstream"]
    return []


def answer_lines(c: dict, pl: dict, version: str, gpu: str, fixed: bool = False) -> list[str]:
    """The cell's answer in short lines: the state, its reasons one a line (the first :data:`SHOWN`), the
    quantized caches' answers, whether FlashInfer is the default backend on ``gpu`` (else the answer holds
    only with :data:`FLASHINFER_FLAG`), and what to do."""
    out = [f"  ANSWER: {c['state']}"] + [f"    {w}" for w in c["why"][:SHOWN]]
    if len(c["why"]) > SHOWN:
        out.append(f"    ... {len(c['why']) - SHOWN} more (--json has them all)")
    if c.get("cache_dtypes"):
        out.append("  with --kv-cache-dtype: " + "; ".join(f"{kv} {x['state']}" for kv, x in c["cache_dtypes"].items()))
    default = (pl or {}).get("default")
    if c["state"] not in ("refused", "not driven") and default != "FLASHINFER":
        out += [f"  NOTE: FlashInfer is not vLLM {version}'s default backend on {gpu} ("
                + (f"{default} is" if default else "the default is unknown") + "):",
                f"        this answer holds only for a server started with {FLASHINFER_FLAG}"]
    todo = [] if fixed else remedy(c, version)
    return out + [f"  {'WHAT TO DO:' if i == 0 else '           '} {t}" for i, t in enumerate(todo)]
