"""What a user does about a family's cell (``audit --model``, ``docs/audit/families.md``): the
``swa-repro patch --fix`` fixes that make it exact, or, where sglang has no fix to make, why and
what to do instead (the table's companion, ``family_companion``, says it per family).

The rules read the cell's own facts (``family_verdict.cell_of``), never a family's name alone:

* refused: sglang refuses ``--attention-backend flashinfer`` for the architecture (gpt-oss, Exaone-4,
  Gemma-4: the release's own server code, ``serving_path``), so nothing in the FlashInfer backend is
  ever run for it: the user serves it with the backend sglang picks on that GPU (the cell's
  ``default_backend``) or one the refusal names.
* a sliding layer built with no window (``layer_window`` -1 where HF has one: Mistral, Qwen2 with
  ``use_sliding_window``): sglang's model file never reads the window (llama.py, qwen2.py in every
  release 0.5.14-0.5.23, no warning), so no attention backend applies it; not a FlashInfer-backend
  bug, and not a fix of this project's size (sglang#22528 asks the same for Qwen3). Within the window
  sliding and full attention agree, so ``--context-length`` at most the window is exact.
* a window in the layers but none in the runner (Cohere2): the model class lacks the hook
  (``fix.family_fixes.commandr_window_hook``), and the backend's own findings on top.
* ``layer != HF`` (``family_verdict.layer_off``: every kernel is told what the layer asks, the layer asks
  another window than transformers' mask; Cohere2 with the hook: HF's inclusive count, kept on
  purpose as vLLM keeps it): no fix, the reason said, as ``vllm.audit.verdict.remedy`` says it.
* on sm100 the ragged wrapper may be cutlass's (head dims 64/128, 192/128 from 0.5.21, 0.5.23
  flashinfer_backend.py:509-522; any head dim before), so an affected cell there names
  ``sm100_no_cutlass_window`` too (a no-op where the release keeps fa2).
"""

from __future__ import annotations

from swa_repro.sglang.audit.family_verdict import AFFECTED, HYBRID, LAYER_NOT_HF

FAMILY_FIX = {"cohere2": "commandr_window_hook"}  # the model-file fix of a family, by its sglang file
FIXED_RELEASE = "0.5.23"
FIRST_FIXABLE = "0.5.14"  # the fixes are written against 0.5.14-0.5.23's files (fix/__init__.py, fix.family_fixes)


def _other_backend(cell: dict, gpu: str, otherwise: str) -> str:
    """The backend to serve a cell with instead of FlashInfer: sglang's default on ``gpu`` where that is
    not FlashInfer, else ``otherwise``."""
    be = cell.get("default_backend")
    return f"--attention-backend {be} (sglang's default on {gpu})" if be and be != "flashinfer" else otherwise


def remedy(family: str, cell: dict, gpu: str, release: str | None = None) -> dict:
    """``{"fix": [names] | None, "instead": text | None}`` for one cell (of ``release``, where known: an
    affected cell of a release older than the fixes is told to upgrade, not given fixes that do not apply)."""
    state = cell["state"]
    if state == "flashinfer refused":
        return {"fix": None, "instead": "no fix in sglang's FlashInfer backend: sglang refuses FlashInfer for "
                f"this architecture ({'; '.join(cell['why'])}); serve it with "
                + _other_backend(cell, gpu, "one of the backends the refusal names")}
    if state == "crashes on FlashInfer":
        return {"fix": None, "instead": "no fix in swa-repro: the model hands FlashInfer's backend an argument it "
                f"does not take ({'; '.join(cell['why'])}); serve it with "
                + _other_backend(cell, gpu, "a backend that takes attention sinks, e.g. triton")}
    if state in AFFECTED and (cell.get("note") or "").startswith("served through sglang's Transformers fallback"):
        return {"fix": None, "instead": "no fix in swa-repro: sglang's Transformers fallback (models/transformers.py) "
                "is not what its fixes edit, and its window does not reach FlashInfer as the model asks (the note says "
                f"where); serve it with --context-length {cell.get('window_hf') or 'WINDOW'} or less (sliding and full "
                "attention agree there), or with a release whose models/ has a file for it"}
    lw = cell.get("layer_window") or {}
    if cell.get("window_hf") and lw.get("sliding", -1) == -1 and "sliding" in lw:
        w = cell["window_hf"]
        return {"fix": None, "instead": "no fix in sglang's FlashInfer backend: sglang's model file gives the "
                f"sliding layers no window (HF {w}; it never reads sliding_window), so no attention backend "
                f"applies it; serve it with --context-length {w} or less (sliding and full attention agree "
                "there), or with a server that implements the window"}
    if state == HYBRID:
        was = cell.get("ordinary_pool")
        then = (f"; there it is {was}" + (": swa-repro patch --fix all applies" if was in AFFECTED else "")) if was else ""
        return {"fix": None, "instead": "sglang serves this model on its hybrid SWA KV pool, which this audit "
                f"could not drive for it (the cell says why); with --disable-hybrid-swa-memory it takes the "
                f"ordinary pool{then}"}
    if state == LAYER_NOT_HF:
        return {"fix": None, "instead": "no fix in swa-repro: the backend plans the window the model file gives "
                f"its layers, which is not transformers' mask ({'; '.join(cell['why'])}); vLLM asks the same "
                "window on purpose (the model's training convention) and its table reports it alike"}
    if state == "not built":  # arch_cells: no published config, or one the model file cannot build
        why = "; ".join(cell.get("why") or [])
        ask = f"swa-repro audit --sglang {release or 'RELEASE'} --model PATH/config.json"
        return {"fix": None, "instead": f"not audited at published defaults ({why})"
                + ("" if "--model PATH" in why else f": audit your checkpoint: {ask}")}
    if state == "not driven":  # built, no path driven (a column's defaults with no attention layer kind)
        return {"fix": None, "instead": f"no verdict: {'; '.join(cell.get('why') or [])}; audit your checkpoint: "
                f"swa-repro audit --sglang {release or 'RELEASE'} --model PATH/config.json"}
    if state == "fallback: not audited":
        return {"fix": None, "instead": "served by sglang's Transformers fallback, which this audit does not "
                "drive (" + "; ".join(cell.get("why") or []) + "): serve it with a backend other than FlashInfer, "
                "or check it on the GPU"}
    if state not in AFFECTED:
        return {"fix": None, "instead": None}
    if release is not None and _before_fixes(release):
        return {"fix": None, "instead": f"no swa-repro fix for sglang {release}: its fixes are written against "
                f"{FIRST_FIXABLE}-{FIXED_RELEASE}'s files; upgrade and ask again: swa-repro audit --sglang "
                f"{FIXED_RELEASE} --model {family} --gpu {gpu}"}
    names = ["all"]
    if FAMILY_FIX.get(family):
        names.append(FAMILY_FIX[family])
    if gpu == "sm100":
        names.append("sm100_no_cutlass_window")
    return {"fix": names, "instead": None}


def _before_fixes(release: str) -> bool:
    from swa_repro.core.versions import sglang_release_key as parse

    return parse(release) < parse(FIRST_FIXABLE)


def fix_names(r: dict) -> tuple[str, ...]:
    """A remedy's fixes as ``patch --fix`` and ``audit --fix`` apply them (``fix.parse_names``; ``all``
    beside the names it includes is ``all``); empty where the remedy is no fix."""
    from swa_repro.sglang.fix import parse_names

    return parse_names(",".join(r["fix"])) if r.get("fix") else ()


def remedy_text(r: dict) -> str:
    if r["fix"]:
        named = [n for n in r["fix"] if n != "all"]
        return "swa-repro patch --fix all" + (f" (it includes {', '.join(named)})" if named else "")
    return r["instead"] or "nothing to do"
