"""``swa-repro audit --vllm X [--model FAMILY[,..]|all] [--gpu CLASS[,..]]``: the parent side.

Checks the arguments (one line, exit 2), provisions the overlay, runs ``vllm.audit.drive`` once per
release in a child forked from the warm server (``engine.child.run_module``; the child forks
once per GPU class and family), cached by content (``core.cache``: the overlay's digest, the
families, the GPU classes, the package code), and prints per family, GPU class, layer kind and path
what the layer asks for and what each FlashInfer kernel is told, with the cell's verdict
(``verdict.cell``), in short lines with what to do (``verdict.answer_lines``). Exit status: 0 not affected or
refused, 1 a finding or a cell not driven (``core.exit_status``, ``--fail-on``), 2 bad input.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.core.exit_status import exit_status
from swa_repro.engine import families as ef
from swa_repro.vllm.audit import verdict as vv
from swa_repro.vllm.families import FAMILIES

DEFAULT_FAMILY = "gemma2"


def check(version: str, model: str | None, gpu: str | None) -> tuple[list[str], list[ef.GpuClass]]:
    """-> (families, GPU classes); any bad input one line (``UsageError``, exit 2), before any work."""
    from swa_repro.vllm.provision import check_release

    check_release(version)
    names = [x.strip() for x in (model or DEFAULT_FAMILY).split(",") if x.strip()]
    if names == ["all"]:
        names = list(FAMILIES)
    bad = [x for x in names if x not in FAMILIES]
    if bad or not names:
        raise UsageError(f"--model {bad[0] if bad else model!r}: unknown family for --vllm; choose from "
                         f"{', '.join(FAMILIES)} or all, or give a checkpoint's config.json or the folder holding it")
    gpus = [x.strip() for x in (gpu or ef.DEFAULT_GPU).split(",") if x.strip()]
    unknown = [x for x in gpus if x not in ef.GPU_CLASSES]
    if unknown or not gpus:
        raise UsageError(f"--gpu {gpu!r}: choose one or more of {', '.join(ef.GPU_CLASSES)}")
    return names, [ef.GPU_CLASSES[g] for g in gpus]


def arch(g: ef.GpuClass) -> str:
    return ".".join(map(str, g.arch))


def run_release(version: str, families: list[str], gpus: list[ef.GpuClass], *, note=print,
                fix: str | None = None, checkpoint=None, fams: list | None = None) -> tuple[dict, float, dict]:
    """The release's child document (``drive.run``), cached by content -> (document, seconds, how);
    ``fix``: on a copy of the release with that fix (``vllm.fix.fixes``); ``checkpoint``: the user's
    config (``vllm.checkpoint``) audited instead of ``families``, checked against the release first;
    ``fams``: resolved families (``vllm.archs``' columns, named ``families``) driven instead."""
    from swa_repro.core.cache import cached, code_hash, interpreter
    from swa_repro.vllm.provision import content_digest, provision

    overlay, info = provision(version)
    if fix:
        from swa_repro.vllm.fix.fixes import fixed_overlay

        overlay = fixed_overlay(version, overlay)
    note(f"vllm {version}{' with --fix ' + fix if fix else ''}: overlay {overlay} "
         f"(release {'cached' if info['cached'] else 'unpacked now'})")
    args = ["--families", ",".join(families), "--archs", ",".join(arch(g) for g in gpus),
            "--deps", str(overlay / ".deps")]
    if checkpoint is not None:
        from swa_repro.vllm.checkpoint import resolve

        args += ["--fams", json.dumps([resolve(checkpoint, version, overlay)], sort_keys=True)]
    elif fams:
        args += ["--fams", json.dumps(fams, sort_keys=True, default=str)]
    parts = {"module": "swa_repro.vllm.audit.drive", "args": args, "overlay": content_digest(overlay),
             "code": code_hash(("core", "kernel", "evidence", "engine", "vllm")), "interpreter": interpreter()}
    doc, how = cached("vllm-audit", parts, lambda: _child(overlay, args, f"vllm {version} audit"),
                      valid=lambda d: whole(d, families, gpus))
    return doc["document"], doc["seconds"], how


def whole(d, families: list[str], gpus: list[ef.GpuClass]) -> bool:
    """A cached child document is used only whole: its audits hold every family on every GPU class
    asked, each a dict, none a fork the machine killed (``drive.FORK_DIED``: under memory pressure the
    OOM killer's status 9 is no answer of the release's, and a cached one would stand in every later
    table) (``core.cache``: else it is recomputed)."""
    from swa_repro.vllm.audit.drive import FORK_DIED

    audits = d.get("document", {}).get("audits") if isinstance(d, dict) and isinstance(d.get("document"), dict) else None
    return isinstance(audits, dict) and all(isinstance(audits.get(arch(g)), dict)
                                            and all(isinstance(audits[arch(g)].get(f), dict) and audits[arch(g)][f]
                                                    and not str(audits[arch(g)][f].get("error", "")).startswith(FORK_DIED)
                                                    for f in families) for g in gpus)


def run_audit(version: str, family: str, gpu: ef.GpuClass, *, note=print) -> tuple[dict, float, dict]:
    """One family on one GPU class (phase 1's shape): -> (its audit, seconds, how)."""
    doc, seconds, how = run_release(version, [family], [gpu], note=note)
    return doc["audits"][arch(gpu)][family], seconds, how


def run_live(version: str, families: list[str], gpus: list[ef.GpuClass], *, mode: str, fix: str | None = None,
             paths: str | None = None, budget: float = 300.0, note=print) -> dict:
    """The live step (``vllm.audit.live``): ``mode`` live, this GPU's real FlashInfer for its own class
    (any other class said, not run); ``model``, the CPU model of what each kernel is told, per
    class. -> ``{class: document or {"not_run": why}}``."""
    from swa_repro.vllm.provision import provision

    chosen = live_paths(paths)
    overlay, _ = provision(version)
    if fix:
        from swa_repro.vllm.fix.fixes import fixed_overlay

        overlay = fixed_overlay(version, overlay)
    card = None
    if mode == "live":
        import torch

        card = ".".join(map(str, torch.cuda.get_device_capability()))
    out = {}
    for g in gpus:
        if card is not None and arch(g) != card:
            out[g.name] = {"not_run": f"{g.name}'s kernels ({g.cards}) do not run on this card (sm{card})"}
            continue
        note(f"vllm {version}{' with --fix ' + fix if fix else ''}: live on {g.name} "
             f"({'real FlashInfer' if card else 'CPU model of what each kernel is told'})")
        args = ["--families", ",".join(families), "--paths", ",".join(chosen), "--device", "cuda" if card else "cpu",
                "--arch", arch(g), "--budget-s", str(budget), "--deps", str(overlay / ".deps")]
        out[g.name] = _child(overlay, args, f"vllm {version} live", "swa_repro.vllm.audit.live")["document"]
    return out


def _child(overlay: Path, args: list[str], what: str, module: str = "swa_repro.vllm.audit.drive") -> dict:
    from swa_repro.engine.child import run_module

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]))
        t0 = time.monotonic()
        rc, _, stderr = run_module(module, ["--overlay", str(overlay), "--out", str(out), *args], env, Path(tmp))
        if rc != 0 or not out.is_file():
            last = [ln for ln in stderr.splitlines() if ln.strip()]
            raise UsageError(f"{what} failed: {last[-1] if last else f'exit {rc}'}")
        return {"document": json.loads(out.read_text()), "seconds": round(time.monotonic() - t0, 1)}


def _fmt(d: dict) -> str:
    return (f"window_left={d['window_left']} cap={d['logits_soft_cap']} "
            f"sm_scale={d['sm_scale'] if isinstance(d['sm_scale'], str) else round(d['sm_scale'], 6)} "
            f"sinks={d['sinks']}")


def render(doc: dict, version: str, gpu: ef.GpuClass) -> list[str]:
    """One family on one GPU class, as text."""
    fam = doc["family"]
    if fam.get("refused"):  # found in the release's files (an encoder-only model): nothing driven
        return [f"vllm {version} {fam['family']} on {gpu.name}: not driven, the release refuses it",
                f"  layer parameters: {fam['how']}", *(f"    {k}: {v}" for k, v in fam["sources"].items()),
                *vv.answer_lines(vv.cell(doc), {}, version.split(" ")[0], gpu.name)]
    if doc.get("error"):
        return [f"vllm {version} {fam['family']} on {gpu.name}: not driven: {doc['error']}"]
    cell = vv.cell(doc)
    pl = doc.get("platform", {})
    lines = [f"vllm {version} FlashInfer backend ({doc['backend_file'].split('/vllm/', 1)[-1]}), {fam['family']} "
             f"(HF window {fam['hf_sliding_window']}, cap {fam['hf_cap']}, head_dim {fam['head_dim']}), {gpu.name} "
             f"({gpu.cards}), kv layout {doc['kv_cache_layout']}",
             f"  default backend ({pl.get('source', 'platform code')}): {vv.default_text(pl)}",
             f"  layer parameters: {fam['how']}"]
    lines += [f"    {k}: {v}" for k, v in fam["sources"].items()]
    for r in doc["rows"]:
        lines.append(f"  {r['layer']:7} {r['path']:7} asks {_fmt(r['asked']) if r.get('asked') else '-'}")
        if r.get("error"):
            lines.append(f"          REFUSED by the release: {r['error']}")
        for k in r["kernels"]:
            verdict = "OK" if not k["differs"] else "DIFFERS: " + "; ".join(k["differs"])
            lines.append(f"          {k['kernel']}.{k['how']} told {_fmt(k['told'])}  {verdict}")
    return lines + vv.answer_lines(cell, pl, version.split(" ")[0], gpu.name, fixed=" with --fix " in version)


def main(a) -> int:
    """``audit --vllm X`` (one release); ``--release-table`` is ``vllm.audit.table.main``'s, which runs
    this module's releases (``vllm.audit.cli`` picks between them, so this module never imports the table)."""
    from swa_repro.vllm.checkpoint import model_arg

    ck = model_arg(a.model, FAMILIES)  # the user's config.json read, or None (family names)
    families, gpus = check(a.vllm, None if ck else a.model, a.gpu)
    if ck:
        families = [ck.architecture]
    fix = None
    if a.fix is not None or a.diff:
        from swa_repro.vllm.fix import fixes as vfix

        fix = vfix.check(a.fix)
        if a.diff:
            from swa_repro.vllm.provision import provision

            print(vfix.upstream_diff(a.vllm, provision(a.vllm)[0]), end="")
            return 0
    note = (lambda s: print(s, file=sys.stderr)) if a.json else print
    mode = live_mode(a.mode)
    if ck and mode:
        raise UsageError("--mode with --vllm X --model PATH: the live step drives the table's families; audit the "
                         "checkpoint without --mode")
    if a.paths and not mode:
        raise UsageError("--paths with --vllm picks the live step's paths: add --mode model (CPU) or --mode live (GPU)")
    live_paths(a.paths)
    if not 1 <= a.live_budget <= 3600:
        raise UsageError(f"--live-budget {a.live_budget:g}: give 1 to 3600 seconds")
    doc, seconds, how = run_release(a.vllm, families, gpus, note=note, fix=fix, checkpoint=ck)
    if ck:
        from swa_repro.core.checkpoint_config import record

        doc = {**doc, "checkpoint": record(ck)}
    live = run_live(a.vllm, families, gpus, mode=mode, fix=fix, paths=a.paths, budget=a.live_budget,
                    note=note) if mode else None
    status = exit_status(cell_states(doc, families, gpus), a.fail_on)
    if a.json:
        print(json.dumps({**doc, "seconds": seconds, "cache": how.get("cache"), "live": live}, default=str))
        return status
    if ck:
        print(read_line(doc["checkpoint"]))
    for g in gpus:
        for f in families:
            d = doc["audits"][arch(g)][f]
            d.setdefault("family", next(x for x in doc["families"] if x["family"] == f))
            print("\n".join(render(d, a.vllm + (f" with --fix {fix}" if fix else ""), g)))
    if live:
        from swa_repro.vllm.audit.live_report import render as render_live

        for g, d in live.items():
            print("\n".join([f"## {g}: not run: {d['not_run']}"] if "not_run" in d else render_live({g: d})))
    print(f"(child {seconds} s, cache {how.get('cache')})")
    return status


def read_line(ck: dict) -> str:
    """What the audit read of the user's file, and what came from the class's defaults."""
    mine = [k for k, v in ck["values"].items() if v["from"] == "user"]
    other = [k for k, v in ck["values"].items() if v["from"] != "user"]
    return (f"checkpoint {ck['path']}: {ck['architecture']} read with {ck['config_class']}; from the file: "
            f"{', '.join(mine) or 'none of the attention keys'}; from the class's defaults: {', '.join(other) or 'none'}")


def cell_states(doc: dict, families: list[str], gpus: list[ef.GpuClass]) -> list[str]:
    """Every asked cell's answer state (``verdict.cell``) for ``core.exit_status``; a quantized cache's
    finding is one only with a flag (``--kv-cache-dtype``)."""
    out = []
    for g in gpus:
        for f in families:
            d = doc["audits"][arch(g)][f]
            c = vv.cell({**d, "family": d.get("family") or next(x for x in doc["families"] if x["family"] == f)})
            out.append(c["state"])
            out += ["only with flags" if x["state"] in ("affected", "layer != HF") else x["state"]
                    for x in c.get("cache_dtypes", {}).values()]
    return out


def live_paths(paths: str | None) -> list[str]:
    from swa_repro.vllm.audit.live import LIVE_PATHS, OPTIONS

    chosen = [x.strip() for x in (paths or ",".join(LIVE_PATHS)).split(",") if x.strip()]
    bad = [x for x in chosen if x not in LIVE_PATHS + OPTIONS]
    if bad or not chosen:
        raise UsageError(f"--paths {paths!r} with --vllm: choose from {', '.join(LIVE_PATHS + OPTIONS)}")
    return chosen


def live_mode(requested: str) -> str | None:
    """``--mode`` for vLLM: ``live`` (real FlashInfer; one line without CUDA), ``model`` (the CPU model
    of what each kernel is told), ``auto``: live where CUDA and flashinfer are usable, else the audit alone."""
    from swa_repro.core.mode import resolve_mode

    if requested == "model":
        return "model"
    return "live" if resolve_mode(requested).mode == "live" else None
