"""``swa-repro audit --vllm X [--model FAMILY] [--gpu CLASS]``: the parent side.

Checks the arguments (one line, exit 2), provisions the overlay, runs ``vllm.drive`` in a child
forked from the warm server (``sglang.overlay_run.run_module``), cached by content
(``core.cache``: the overlay's digest, the family, the GPU class, the package code), and prints per
layer kind and path what the layer asks for and what each FlashInfer kernel is told.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.sglang import families as sf

DEFAULT_FAMILY = "gemma2"


def family_params(name: str) -> dict:
    """What ``FlashInferImpl`` is constructed with, from transformers' config of the family
    (``sglang.families.small_config``): not from vLLM's model classes (phase 1)."""
    sc = sf.small_config(name)
    qpas = sc.config.get("query_pre_attn_scalar")
    return {"family": name, "kinds": sorted(set(k for k in sc.kinds if k in (sf.SLIDING, sf.FULL))),
            "num_qo_heads": sc.num_qo_heads, "num_kv_heads": sc.num_kv_heads, "head_dim": sc.head_dim,
            "sliding_window": sc.sliding_window, "cap": sc.cap,
            "scale": float(qpas) ** -0.5 if qpas else sc.head_dim ** -0.5,
            "scale_rule": "query_pre_attn_scalar ** -0.5" if qpas else "head_dim ** -0.5"}


def check(version: str, model: str | None, gpu: str | None) -> tuple[str, sf.GpuClass]:
    from swa_repro.vllm.provision import parse

    parse(version)
    fams, g = sf.check_args(model or DEFAULT_FAMILY, gpu)
    if len(fams) != 1:
        raise UsageError("--model with --vllm: one family at a time (phase 1)")
    return fams[0], g


def run_audit(version: str, family: str, gpu: sf.GpuClass, *, note=print) -> tuple[dict, float, dict]:
    from swa_repro.core.cache import cached, code_hash, interpreter
    from swa_repro.vllm.provision import content_digest, provision

    overlay, info = provision(version)
    note(f"vllm {version}: overlay {overlay} ({'cached' if info['cached'] else 'unpacked now'})")
    fam = family_params(family)
    args = ["--family", json.dumps(fam, sort_keys=True), "--arch", ".".join(map(str, gpu.arch)),
            "--deps", str(overlay / ".deps")]
    parts = {"module": "swa_repro.vllm.drive", "args": args, "overlay": content_digest(overlay),
             "code": code_hash(("core", "kernel", "evidence", "sglang", "vllm")), "interpreter": interpreter()}
    doc, how = cached("vllm-audit", parts, lambda: _child(overlay, args, f"vllm {version} audit"))
    return doc["document"], doc["seconds"], how


def _child(overlay: Path, args: list[str], what: str) -> dict:
    from swa_repro.sglang.overlay_run import run_module

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]))
        t0 = time.monotonic()
        rc, _, stderr = run_module("swa_repro.vllm.drive", ["--overlay", str(overlay), "--out", str(out), *args],
                                   env, Path(tmp))
        if rc != 0 or not out.is_file():
            last = [ln for ln in stderr.splitlines() if ln.strip()]
            raise UsageError(f"{what} failed: {last[-1] if last else f'exit {rc}'}")
        return {"document": json.loads(out.read_text()), "seconds": round(time.monotonic() - t0, 1)}


def _fmt(d: dict) -> str:
    return (f"window_left={d['window_left']} cap={d['logits_soft_cap']} "
            f"sm_scale={d['sm_scale'] if isinstance(d['sm_scale'], str) else round(d['sm_scale'], 6)} "
            f"sinks={d['sinks']}")


def render(doc: dict, version: str, gpu: sf.GpuClass) -> list[str]:
    fam = doc["family"]
    lines = [f"vllm {version} FlashInfer backend ({doc['backend_file'].split('/vllm/', 1)[-1]}), {fam['family']} "
             f"(window {fam['sliding_window']}, cap {fam['cap']}, head_dim {fam['head_dim']}; layer parameters "
             f"from transformers' config, scale {fam['scale_rule']}), {gpu.name} ({gpu.cards}), "
             f"kv layout {doc['kv_cache_layout']}"]
    for r in doc["rows"]:
        lines.append(f"  {r['layer']:7} {r['path']:7} asks {_fmt(r['asked'])}")
        if r.get("error"):
            lines.append(f"          REFUSED by the release: {r['error']}")
        for k in r["kernels"]:
            verdict = "OK" if not k["differs"] else "DIFFERS: " + "; ".join(k["differs"])
            lines.append(f"          {k['kernel']}.{k['how']} told {_fmt(k['told'])}  {verdict}")
    return lines


def main(a) -> int:
    family, gpu = check(a.vllm, a.model, a.gpu)
    note = (lambda s: print(s, file=sys.stderr)) if a.json else print
    doc, seconds, how = run_audit(a.vllm, family, gpu, note=note)
    if a.json:
        print(json.dumps({**doc, "seconds": seconds, "cache": how.get("cache")}, default=str))
        return 0
    print("\n".join(render(doc, a.vllm, gpu)))
    print(f"(child {seconds} s, cache {how.get('cache')})")
    return 0
