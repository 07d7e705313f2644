"""A layer whose logits soft cap is not the one the plan compiled in: computed silently, or refused?

FlashInfer compiles the cap in at ``plan()`` (``logits_soft_cap > 0`` picks the tanh module); the
value ``forward()`` passes only overwrites ``_logits_soft_cap``. So once the plan carries a cap
(``soft_cap_prefill`` / ``soft_cap_decode``), a layer asking for another one runs with a module the
plan chose for someone else: a capped module with a layer cap of 0 divides by it, an uncapped one
drops a layer's cap. The fixes refuse such a layer (``_check_logits_soft_cap``, ``fix.fixes``); this
drives the release's own backend (``audit.paths.drive``) with the model config saying one cap and the
layer another, and reports what each path did.

Child: ``python -m swa_repro.sglang.fix.cap_safety --overlay DIR --out FILE``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from swa_repro.engine.child import child_main, child_parser
from swa_repro.sglang.overlay_run import import_release, overlay_for, run_child


@dataclass(frozen=True)
class Mismatch:
    """The model config's cap (what a fixed plan compiles in) against the layer's own."""
    config_cap: float
    layer_cap: float
    method: str = "tanh"  # RadixAttention.logit_capping_method (radix_attention.py:73)

    @property
    def name(self) -> str:
        m = "" if self.method == "tanh" else f"_{self.method}"
        return f"config{self.config_cap:g}_layer{self.layer_cap:g}{m}"


MISMATCHES = (Mismatch(50.0, 0.0), Mismatch(0.0, 30.0), Mismatch(30.0, 30.0, "sigmoid"))
PATHS = ("extend_ragged_no_prefix", "extend_paged", "decode")
WINDOW = 8


def cap_safety(version: str, fixes=None, note=print) -> dict:
    """``{"runs": [{path, mismatch, status, error}]}`` of release ``version`` (with ``fixes``)."""
    overlay, _, _ = overlay_for(version, fixes, note=note, doing="driving mismatched caps")
    doc, _, _ = run_child("swa_repro.sglang.fix.cap_safety", overlay, [], f"cap safety of sglang {version}")
    return doc


def child(overlay: Path) -> dict:
    import_release(overlay)
    from swa_repro.sglang.audit import paths

    runs, model_cap = [], paths.model_cap
    try:
        for m in MISMATCHES:
            paths.model_cap = lambda runner, cap, m=m: model_cap(runner, m.config_cap)
            cfg = paths.LayerConfig(WINDOW, m.layer_cap)
            for path in PATHS:
                with _method(m.method):
                    run = paths.drive(path, cfg)
                runs.append(dict(path=path, mismatch=m.name, status=run.status, error=run.error))
    finally:
        paths.model_cap = model_cap
    return {"runs": runs}


class _method:
    """Every RadixAttention built inside asks for ``method`` (the audit builds its layer itself)."""

    def __init__(self, method: str):
        self.method = method

    def __enter__(self):
        from sglang.srt.layers.radix_attention import RadixAttention

        self.cls, self.init = RadixAttention, RadixAttention.__init__
        method = self.method

        def init(layer, *a, **kw):
            self.init(layer, *a, **kw)
            layer.logit_capping_method = method

        RadixAttention.__init__ = init

    def __exit__(self, *exc):
        self.cls.__init__ = self.init


def main(argv=None) -> int:
    return child_main(child_parser("swa_repro.sglang.fix.cap_safety"), lambda overlay, a: child(overlay), argv)


if __name__ == "__main__":
    sys.exit(main())
