"""The family audit's GPU evidence (``recordings/family-live/``, issue #25): each call's two family
children (``scripts/gpu_family.sh``: 0.5.23 as shipped, and with ``swa-repro patch --fix all`` plus
each family fix), read back as one row per driven run: the key verdict the audit gave on the GPU
beside what the real kernel did with the same calls. A site's runs may come from two children (the
CUDA-graph paths' own, ``-graph``, ISOLATE_GRAPH) and a build step's warm-up (``family-build-*``) may
precede them: both are read and said.

``python -m swa_repro.sglang.audit.family_evidence`` regenerates each call folder's ``SUMMARY.md``
(``tests/test_family_live_evidence.py`` holds it to the data).
"""

from __future__ import annotations

import functools
import json
import lzma
import re
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from swa_repro.core.outputs import write_atomic

ROOT = Path(__file__).resolve().parents[3] / "recordings" / "family-live"
SITES = ("shipped", "fixed")


@dataclass(frozen=True)
class Run:
    """One driven path x layer kind on one GPU class, as one site's family child recorded it."""
    family: str
    gpu: str
    path: str
    kind: str
    verdict: str  # the key verdict (extra / missing / exact)
    cap: str  # applied / dropped (...) / none
    calls: int
    executed: int
    wrong_rows: int
    rows: int
    model_agrees: bool | None
    backends: tuple
    errors: tuple

    @property
    def judged(self) -> bool:
        """Every call of the run executed on the kernel and judged."""
        return self.calls > 0 and self.executed == self.calls

    @property
    def key_clean(self) -> bool:
        """The key audit finds nothing: every query's keys as intended and the cap applied or none."""
        return self.verdict == "exact" and not self.cap.startswith("dropped")


PARTS = ("", "-graph")  # family-live-{site}{part}: scripts/gpu_family.sh's ISOLATE_GRAPH runs cuda_graph_* apart


PACK = "data.tar"  # scripts/lib_gpu.sh write_out: a call of over 8 files returns its data files' .xz in it


def _read(call: Path, name: str) -> dict | None:
    """The JSON of a returned ``NAME.xz``: the call folder's own file (every call committed before
    2026-12-07), else the member of its :data:`PACK` (the device returns at most 8 files of a call, and
    ``write_out`` packs the data files where there would be more); None where neither holds it."""
    f = Path(call) / name
    raw = f.read_bytes() if f.is_file() else _member(Path(call) / PACK, name)
    return None if raw is None else json.loads(lzma.decompress(raw))


def _member(tar: Path, name: str) -> bytes | None:
    """The bytes of the regular member ``name`` of ``tar`` (read, never extracted), None where it has none."""
    if not tar.is_file():
        return None
    with tarfile.open(tar) as t:
        m = next((m for m in t.getmembers() if m.isfile() and Path(m.name).name == name), None)
        return None if m is None else t.extractfile(m).read()


@functools.cache
def parts(call: Path, site: str) -> dict[str, dict]:
    """``{part: doc}``: one site's family children as the call wrote them, the CUDA-graph paths' own
    child (``-graph``, ISOLATE_GRAPH) beside the others'; a call may hold either alone."""
    got = {p: d for p in PARTS if (d := _read(call, f"family-live-{site}{p}.json.xz")) is not None}
    if not got:
        raise FileNotFoundError(f"{call}: no family-live-{site}*.json.xz")
    return got


@functools.cache
def load(call: Path, site: str) -> dict:
    """One site's family children as one JSON (their runs merged per GPU class and family), read once
    per process (best_call, family_rows, sentence and consistent read the same calls; callers only
    read it). ``live`` is the first part's; :func:`render` says each part's own."""
    docs = list(parts(Path(call), site).values())
    return docs[0] if len(docs) == 1 else _merge(docs)


def _merge(docs: list[dict]) -> dict:
    by_gpu: dict = {}
    for d in docs:
        for gpu, fams in d["by_gpu"].items():
            mine = by_gpu.setdefault(gpu, {})
            for f in fams:
                m = mine.setdefault(f["family"], {**f, "paths": []})
                m["paths"] = [*m["paths"], *f.get("paths", ())]
                if f.get("error") and not m.get("error"):
                    m["error"] = f["error"]
    gpus = list(dict.fromkeys(g for d in docs for g in d["gpus"]))
    return {**docs[0], "gpus": gpus, "by_gpu": {g: list(fs.values()) for g, fs in by_gpu.items()}}


def build(call: Path, site: str) -> dict | None:
    """The build step's child (``family-build-{site}.json``, SWA_REPRO_WARM_ONLY): the warm-up alone,
    before the judged pass; its ``live.warmup`` says which modules it built in its share of the time."""
    return _read(call, f"family-build-{site}.json.xz")


def runs(doc: dict) -> list[Run]:
    out = []
    for gpu, fams in doc["by_gpu"].items():
        for f in fams:
            for r in f.get("paths", ()):
                if r.get("status") != "driven":
                    continue
                lv = r.get("live") or {}
                out.append(Run(f["family"], gpu, r["path"], r["kind"], r["verdict"], r["cap"], lv.get("calls", 0),
                               lv.get("executed", 0), lv.get("wrong_rows", 0), lv.get("rows", 0), lv.get("model_agrees"),
                               tuple(lv.get("backends") or ()), tuple(lv.get("errors") or ())))
    return out


def not_built(doc: dict) -> dict:
    """``{family: why}`` for the families the child could not build."""
    return {f["family"]: f["error"] for fams in doc["by_gpu"].values() for f in fams if f.get("error")}


def calls(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in Path(root).glob("*/call-*") if (p / "gpu.txt").is_file())


def fixes_applied(call: Path) -> set[str]:
    """The ``swa-repro patch apply --fix`` names the call's commands applied to its fixed site."""
    return set(re.findall(r"patch apply --fix (\S+)", (Path(call) / "gpu.txt").read_text()))


def best_call(family: str, release: str, root: Path = ROOT) -> Path | None:
    """The call whose fixed site had every fix the family needs (``--fix all`` and its model file's,
    ``family_fix.FAMILY_FIX``) and judged the most of ``family``'s runs on ``release`` (ties: the later)."""
    from swa_repro.sglang.audit.family_fix import FAMILY_FIX

    need = {"all", *([FAMILY_FIX[family]] if family in FAMILY_FIX else [])}
    best, score = None, 0
    for call in calls(root):
        if call.parent.name != release or not need <= fixes_applied(call):
            continue
        n = sum(r.judged for r in runs(load(call, "fixed")) if r.family == family)
        if n >= score and n:
            best, score = call, n
    return best


def family_rows(family: str, release: str, gpu: str, root: Path = ROOT) -> tuple[Path | None, list[dict]]:
    """``(call, rows)``: ``family`` on GPU class ``gpu`` from the best call (:func:`best_call`), one row
    per path and layer kind: the key verdict and what the real kernel did, as shipped and fixed."""
    call = best_call(family, release, root)
    if call is None:
        return None, []
    by = {s: {(r.path, r.kind): r for r in runs(load(call, s)) if r.family == family and r.gpu == gpu} for s in SITES}

    def said(r: Run | None) -> str:
        if r is None:
            return "-"
        return f"{r.wrong_rows}/{r.rows} rows off" if r.judged else "not run (live budget)"
    sh = by["shipped"]
    return call, [{"path": p, "kind": k, "keys shipped": sh[p, k].verdict if (p, k) in sh else "-",
                   "cap shipped": sh[p, k].cap.split(" ")[0] if (p, k) in sh else "-",
                   "kernel shipped": said(sh.get((p, k))),
                   "keys fixed": by["fixed"][p, k].verdict, "kernel fixed": said(by["fixed"][p, k]),
                   "ran": ", ".join(by["fixed"][p, k].backends)} for p, k in by["fixed"]]


def sentence(call: Path | None, family: str, release: str, gpu: str) -> str:
    """Where :func:`family_rows`' rows come from, or why there are none."""
    if call is None:
        return (f"no GPU evidence for {family} on sglang {release}: recordings/family-live/ holds "
                f"{', '.join(sorted({c.parent.name for c in calls()})) or 'none'}, and no call judged {family} "
                "on a fixed site with every fix it needs (scripts/gpu_family.sh makes one)")
    gpu_txt = (call / "gpu.txt").read_text()
    card = next((x.split(": ", 1)[1].split(" (UUID")[0] for x in gpu_txt.splitlines() if x.startswith("GPU 0:")), "?")
    judged = sum(r.judged for r in runs(load(call, "fixed")) if r.family == family and r.gpu == gpu)
    if not judged:
        return f"no {gpu} run of {family} was judged in {call.name} ({card}): " + (
            "its kernels do not run on that card" if gpu == "sm100" else "the call's live budget ran out first")
    return (f"real FlashInfer on an {card}, recorded by scripts/gpu_family.sh in "
            f"recordings/family-live/{call.parent.name}/{call.name}: {judged} {gpu} runs judged on the fixed site")


def consistent(call: Path, family: str) -> bool:
    """On every judged run of ``family`` in ``call``, both sites: no row off the reference where the
    key audit of the same run is clean."""
    return not [r for s in SITES for r in runs(load(call, s)) if r.family == family and r.judged
                and r.wrong_rows and r.key_clean]


# ----------------------------------------------------------------------------- text
def _cell(rs: list[Run]) -> str:
    judged = [r for r in rs if r.judged]
    wrong = [r for r in judged if r.wrong_rows]
    keyed = [r for r in rs if not r.key_clean]
    off = [r for r in judged if r.model_agrees is False]
    be = sorted({b for r in judged for b in r.backends})
    return (f"{len(judged)}/{len(rs)} judged; **{len(wrong)} with wrong rows**; key audit: {len(keyed)} not clean"
            + (f"; model off on {len(off)}" if off else "") + (f"; ran {', '.join(be)}" if be else ""))


def render(call: Path) -> list[str]:
    """One call's two sites: per family and GPU class, how many runs were judged on the kernel, how
    many had rows off the float64 reference, how many the key audit flags (extra/missing keys or a
    dropped cap), where the kernel model's prediction was off, and the backends FlashInfer ran."""
    call = Path(call)
    gpu = (call / "gpu.txt").read_text().splitlines()
    head = [x for x in gpu if x.startswith(("date -u:", "GPU 0:", "driver:", "torch:", "steps:"))]
    out = [f"# {call.parent.name} live, {call.name}", "",
           "Generated by `python -m swa_repro.sglang.audit.family_evidence` from this folder's files. Do not edit.", "",
           *[f"- {x}" for x in head], "", *_checkpoints(call)]
    for site in SITES:
        doc = load(call, site)
        out += [f"## {site}", "", *_build_line(call, site)]
        for part, d in parts(call, site).items():
            lv = d.get("live") or {}
            out += [(f"CUDA-graph paths, their own child (`family-live-{site}{part}.json`): " if part else "")
                    + (f"Device {lv.get('device')}; live {lv.get('seconds')} s of a {lv.get('budget_s')} s budget; "
                       f"{warmup_text(lv.get('warmup') or {})}."), ""]
        rs = runs(doc)
        fams = sorted({r.family for r in rs})
        gpus = list(doc["gpus"])
        out += ["| family | " + " | ".join(gpus) + " |", "|---|" + "---|" * len(gpus)]
        for fam in fams:
            out.append(f"| {fam} | " + " | ".join(_cell([r for r in rs if r.family == fam and r.gpu == g]) for g in gpus) + " |")
        for fam, why in not_built(doc).items():
            out.append(f"| {fam} | " + " | ".join(f"not built: {why[:120]}" for _ in gpus) + " |")
        out.append("")
    return out


def _build_line(call: Path, site: str) -> list[str]:
    b = build(call, site)
    if b is None:
        return []
    lv = b.get("live") or {}
    return [(f"Build step (`family-build-{site}.json`, the warm-up alone, before the judged pass): "
             f"{lv.get('warmup_seconds')} s of a {lv.get('budget_s')} s budget; {warmup_text(lv.get('warmup') or {})}."), ""]


def _checkpoints(call: Path) -> list[str]:
    """A checkpoint call's (``CHECKPOINTS``, issue #41) users' configs as the children got them
    (``smalls.json``, ``audit.checkpoint_smalls``): each judged at its own file's window and cap."""
    smalls = _read(call, "smalls.json.xz")
    if smalls is None:
        return []
    intro = ("Users' checkpoints (`CHECKPOINTS`), each built from its own config.json cut to a few layers and "
             "judged at its own values:")
    cols = "| label | architecture | sliding_window | layers built | head_dim | q/kv heads | cap |"
    out = [intro, "", cols, "|---|---|---|---|---|---|---|"]
    for label, s in smalls.items():
        out.append(f"| {label} | {s['config'].get('architectures', ['?'])[0]} | {s['sliding_window']} | "
                   f"{', '.join(s['kinds'])} (of {s['full_layers']}) | {s['head_dim']} | "
                   f"{s['num_qo_heads']}/{s['num_kv_heads']} | {s['cap'] or 'none'} |")
    return [*out, ""]


def warmup_text(warmup: dict) -> str:
    """``audit.live.warm_calls``' outcome per module (seconds, ``error: ...``, still building, or skipped:
    the budget gone before its warm-up began) said as counts: a module still building, failed or skipped
    is a call the judged pass could not run."""
    built = sum(isinstance(v, (int, float)) for v in warmup.values())
    building = sum(isinstance(v, str) and v.startswith("still building") for v in warmup.values())
    failed = sum(isinstance(v, str) and v.startswith("error") for v in warmup.values())
    skipped = sum(isinstance(v, str) and v.startswith("skipped") for v in warmup.values())
    return (f"{len(warmup)} modules warmed up: {built} built"
            + (f", {building} still building at the budget's end" if building else "")
            + (f", {skipped} not started (the live time budget ran out first)" if skipped else "")
            + (f", {failed} failed ({_first_error(warmup)})" if failed else ""))


def _first_error(warmup: dict) -> str:
    e = next(v for v in warmup.values() if isinstance(v, str) and v.startswith("error"))
    return e.removeprefix("error: ").split("\n")[0][:90]


def main(argv=None) -> int:
    for call in calls():
        write_atomic(call / "SUMMARY.md", ("\n".join(render(call)) + "\n").encode())  # never through a link
        print(call / "SUMMARY.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
