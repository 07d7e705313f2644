"""FlashInfer's helper modules, JIT-built before the processes that need them ask for them.

sglang's ragged extend over a cached prefix merges its two partial outputs with FlashInfer's
``merge_state`` (sglang 0.5.23 flashinfer_backend.py:83 and :112), a JIT module of its own
(flashinfer 0.7.2 cascade.py:35-40, jit/cascade.py:21); a custom mask is packed by
``segment_packbits`` (prefill.py:2725), the quantization module (quantization/packbits.py:28-29).
The live audit never calls ``merge_state``: it judges each forward on its own. So a process that
does, sglang's regression test, built it alone and late, after waiting on each attention module
before it in test order. Built here at once, beside the attention modules, they leave that chain.

The attention kit's modules (``KIT``: scripts/gpu_kit.sh, #40) likewise: sglang's kit runs fp16 with head
dim 64 on FlashInfer (swa/test_flashinfer.py's HEAD_DIM; the kit's DEFAULT_DTYPE, dense_attention.py:32),
int32 indices, no positional encoding; a sliding layer plans ``window_left >= 0`` (``use_swa``), a capped
one ``logits_soft_cap > 0`` (the registered test's cap cases), on fa2 and fa3 (sm90: sglang's prefill
wrappers take either, flashinfer_backend.py's backend choice), decode without the window flag (sglang
trims a sliding decode's KV instead). The modules every kit process would otherwise build one after
another, each waiting on the last (the 2026-12-06 H100 call: the fixed run stopped building fp16
modules), are built all at once here first: prefill.py:2981-2996 / decode.py:2441-2451 in 0.7.2 name
the arguments.

``python -m swa_repro.kernel.jit_warm [NAME ...]`` (default: all of ``HELPERS``; ``kit``: ``KIT`` and the
helpers) prints one JSON object, ``{name: seconds or "error: ..."}``, and exits 1 if a build failed (the
caller goes on: whoever needs the module builds it again and says why).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# name -> (module, getter) per flashinfer layout, the newest first
HELPERS = {
    "cascade": (("flashinfer.cascade", "get_cascade_module"),),
    "quantization": (("flashinfer.quantization.packbits", "get_quantization_module"),  # 0.7.x
                     ("flashinfer.quantization", "get_quantization_module")),  # 0.6.x: one file
}


# name -> (decode | fa2 | fa3, use_swa, use_logits_cap): fp16, head dim 64, int32 indices (see above)
KIT = {f"{kind}-{'swa' if swa else 'full'}{'-cap' if cap else ''}": (kind, swa, cap)
       for kind in ("fa2", "fa3") for swa in (False, True) for cap in (False, True)}
KIT |= {f"decode-full{'-cap' if cap else ''}": ("decode", False, cap) for cap in (False, True)}
SETS = {"kit": (*KIT, *HELPERS)}


def _attention(name: str):
    """The builder of kit module ``name``: flashinfer's own getter with the arguments plan() passes."""
    import torch
    from flashinfer import decode, prefill

    kind, swa, cap = KIT[name]
    head = (torch.float16, torch.float16, torch.float16, torch.int32, 64, 64, 0, swa, cap)
    if kind == "decode":
        return lambda: decode.get_batch_decode_module(*head)
    return lambda: prefill.get_batch_prefill_module(kind, *head, False)  # no fp16 qk reduction


def getter(name: str):
    """The installed flashinfer's function that builds and loads helper or kit module ``name``."""
    if name in KIT:
        return _attention(name)
    for mod, fn in HELPERS[name]:
        try:
            return getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError):
            continue
    raise LookupError(f"this flashinfer has none of {[f'{m}.{f}' for m, f in HELPERS[name]]}")


def _error(e: BaseException) -> str:
    return f"error: {type(e).__name__}: {str(e)[-300:]}"


def build(names) -> dict:
    """Each helper built (or loaded, when its library exists) in its own thread: ``{name: seconds}``,
    or ``"error: ..."`` for one that failed. The getters are imported first, one after another, in
    this thread: two threads importing flashinfer's submodules at once deadlocked on the H100 on
    2026-12-05 (``_DeadlockError`` on ``flashinfer.trace.templates.quantize``), and the other thread's
    import then failed, so neither helper was built; only the builds run side by side."""
    def one(item):
        name, fn = item
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - reported; the caller goes on
            return name, _error(e)
        return name, round(time.perf_counter() - t, 1)

    names = list(dict.fromkeys(names))
    fns, out = {}, {}
    for name in names:
        try:
            fns[name] = getter(name)
        except Exception as e:  # noqa: BLE001 - reported; the caller goes on
            out[name] = _error(e)
    with ThreadPoolExecutor(max_workers=max(1, len(fns))) as ex:
        out.update(ex.map(one, fns.items()))
    return {n: out[n] for n in names}


def main(argv=None) -> int:
    asked = list(argv if argv is not None else sys.argv[1:]) or list(HELPERS)
    names = [n for a in asked for n in SETS.get(a, (a,))]
    unknown = [n for n in names if n not in HELPERS and n not in KIT]
    if unknown:
        print(f"jit_warm: unknown module {unknown[0]!r}: choose from {', '.join((*SETS, *HELPERS, *KIT))}",
              file=sys.stderr)
        return 2
    res = build(names)
    print(json.dumps(res), flush=True)
    return 1 if any(isinstance(v, str) for v in res.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
