"""``swa-repro audit``: which plan/forward findings hold in an sglang release, from its recorded calls.

* ``swa-repro audit``: the installed sglang as it is. The first line says which release, which
  backend file it read and that file's state (unfixed / fixed / unknown, ``patch.classify``).
* ``--sglang X``: release X's own code (``audit.release``: an overlay, a subprocess), any release
  from 0.5.10 on.
* ``--patched`` / ``--unpatched`` / ``--both``: explicit what-ifs (PR #31501's two methods swapped
  in-process); their header starts ``WHAT-IF`` and their JSON carries ``"what_if"``.
* ``--release-table``: every release in ``--releases``, one subprocess each ->
  ``releases.md`` + ``releases.json`` (``audit.table``).
* ``--sglang X --model PATH|FAMILY[,..]|all [--gpu sm80|sm90|sm100]``: a checkpoint's config.json
  (or its folder; ``sglang.checkpoint``) or a family, its own layers built by release X's model code
  at its real window (``audit.family_run``).

Exit status (CI; ``core.exit_status``, ``--fail-on any|default|never``): 0 not affected, 1 a finding or
an answer not given (not driven, not built, unknown), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from swa_repro.core.errors import UsageError, check_bounds
from swa_repro.core.exit_status import exit_status
from swa_repro.core.outputs import keep_fuller, nonempty_path, out_dir
from swa_repro.core.versions import SGLANG_MIN_RELEASE as MIN_RELEASE
from swa_repro.core.versions import sglang_release_key as parse
from swa_repro.engine.commands import REMOVED_SOURCE
from swa_repro.engine.provenance import TABLE_DIR, table_out
from swa_repro.sglang.audit import paths as ap
from swa_repro.sglang.audit import table as at


def register(sub) -> None:
    p = sub.add_parser("audit", help="plan/forward contract audit of sglang's FlashInfer calls (CPU)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--sglang", metavar="VERSION", help="audit this sglang release's own code (0.5.10 or later; "
                   "installed as a cached overlay, run in a subprocess)")
    p.add_argument("--sglang-source", help=argparse.SUPPRESS)  # removed: says so, exit 2
    g = p.add_mutually_exclusive_group()
    g.add_argument("--patched", dest="what_if", action="store_const", const=["patched"],
                   help="WHAT-IF: with PR #31501's fix applied in-process")
    g.add_argument("--unpatched", dest="what_if", action="store_const", const=["unpatched"],
                   help="WHAT-IF: with PR #31501's fix removed in-process")
    g.add_argument("--both", dest="what_if", action="store_const", const=["unpatched", "patched"],
                   help="both what-ifs")
    p.add_argument("--fix", metavar="NAME[,NAME]|all", help="audit --sglang VERSION with these `swa-repro patch "
                   "--fix` fixes applied (a patched copy of its overlay; nothing installed changes)")
    p.add_argument("--mode", choices=("auto", "model", "live"), default="auto",
                   help="live: also execute every driven call on real FlashInfer (CUDA) and measure its effect "
                   "against the float64 reference; auto (default): live where CUDA and flashinfer are usable")
    p.add_argument("--live-budget", type=float, default=300.0, metavar="S",
                   help="seconds for the live executions (JIT builds included; default 300, at most 3600)")
    p.add_argument("--paths", help=f"comma-separated subset of {','.join(ap.PATHS)}")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--release-table", action="store_true", help="audit each of --releases -> --out/releases.md "
                   "+ releases.json")
    p.add_argument("--releases", default=",".join(at.REQUIRED), help="comma-separated releases for --release-table")
    p.add_argument("--out", type=nonempty_path, default=TABLE_DIR, help="directory for --release-table (docs/audit)")
    p.add_argument("--force", action="store_true", help="with --release-table: replace a table at --out that "
                   "covers releases, families or GPU classes this one does not (the committed full table)")
    p.add_argument("--jobs", type=int, default=1, help="releases audited at once for --release-table (1..32)")
    p.add_argument("--model", metavar="PATH|FAMILY[,FAMILY]|all", help="with --sglang: a checkpoint's config.json "
                   "(or its folder), its own values built by that release's model code, at its real window; or a "
                   "family (transformers' defaults); all = every family the release serves")
    p.add_argument("--gpu", metavar="sm80|sm90|sm100", help="with --model: the GPU class the backend is built "
                   "for (default sm90)")
    p.add_argument("--transformers", metavar="venv|release", help="with --model: the transformers the release's "
                   "model classes are built with: venv (this environment's, the default) or release (the version "
                   "its wheel pins, installed as a cached overlay; plain children)")
    from swa_repro.core.exit_status import add_argument

    add_argument(p)
    p.set_defaults(func=main, what_if=None)


def _paths(text):
    """``--paths`` -> names (None: not given, every path); given, at least one known path, since an
    empty list audited everything instead of what was asked."""
    if text is None:
        return None
    paths = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in paths if x not in ap.PATHS]
    if bad or not paths:
        what = f": unknown {', '.join(bad)}" if bad else " selects no path"
        raise UsageError(f"--paths{what}; choose from {', '.join(ap.PATHS)}")
    return paths


def _bounds(a) -> list:
    """(flag, value, lowest, highest) of every number: an hour of live executions, as many releases
    at once as a large machine's cores can audit."""
    return [("--live-budget", a.live_budget, 1, 3600), ("--jobs", a.jobs, 1, 32)]


def main(a) -> int:
    if a.sglang_source is not None:
        raise UsageError(REMOVED_SOURCE)
    from swa_repro.sglang.release_transformers import check

    a.transformers_choice = check(a.transformers)
    if a.transformers is not None and a.model is None:
        raise UsageError("--transformers goes with --model: it chooses the transformers the release's model classes "
                         "are built with")
    if a.release_table and a.model is not None:
        return _family_table(a)
    if a.model is not None or a.gpu is not None:
        return _families(a)
    paths = _paths(a.paths)
    check_bounds(_bounds(a))
    fixes = _fixes(a)
    if a.release_table:
        return _table(a)
    from swa_repro.core.mode import resolve_mode
    from swa_repro.sglang.audit import core as audit  # lazy: torch and the kernel model, after the arguments are checked

    mode = resolve_mode("model" if a.sglang and a.mode == "auto" else a.mode)  # live without a GPU: one line
    if a.sglang and mode.mode == "live":
        raise UsageError("--sglang audits another release in a CPU subprocess: drop --mode live, or install that "
                         "release and run `swa-repro audit --mode live` there")
    runs = [_one(a.sglang, w, paths, mode.mode, a.live_budget, fixes) for w in (a.what_if or [None])]
    doc = {"sglang": runs[0]["release"]["sglang"], "what_if": runs[0]["what_if"] if len(runs) == 1 else None,
           "mode": mode.mode, "mode_why": mode.reason, "runs": runs, "classes": [at.cells(r) for r in runs],
           "incomplete": [audit.incomplete(r) for r in runs]}
    if a.json:
        print(json.dumps(doc, default=str))
    else:
        for r, cl in zip(runs, doc["classes"]):
            print_run(r, cl)
    sys.stdout.flush()
    bad = [x for inc in doc["incomplete"] for x in inc]
    if bad:  # an audit that did not drive what the release has must not read as "no finding"
        print("audit incomplete: what the release has was not all driven, and no verdict is given for what "
              "was not:", file=sys.stderr)
        for x in bad:
            print(f"  {x}", file=sys.stderr)
        return 1
    return exit_status([s for cl in doc["classes"] for s in class_states(cl, paths)], a.fail_on)


SPEC_CLASSES = ("dflash_verify_window", "eagle_verify_window")  # only a server with speculative decoding


def class_states(classes: dict, paths=None) -> list[str]:
    """The plain audit's finding classes (``table.cell``) as answer states for ``core.exit_status``: a
    class that holds is a finding (on a verify path only: speculative decoding), fixed or absent is
    none, not driven is an answer the audit could not give. With ``--paths``, only the classes of
    those paths are asked."""
    def state(k, c):
        if c["state"] == "holds":
            return "only with speculative decoding" if k in SPEC_CLASSES else "affected on the default path"
        return {"fixed": "not affected", "absent": "not affected"}.get(c["state"], c["state"])

    return [state(k, c) for k, c in classes.items() if paths is None or set(paths) & set(at.CLASSES[k].paths)]


def _fixes(a):
    """``--fix`` -> fix names (None: not given). It patches a copy of a release's overlay, so it
    needs ``--sglang``; the what-ifs swap PR #31501 in memory and would mix with it."""
    if a.fix is None:
        return None
    from swa_repro.sglang.fix import parse_names

    names = parse_names(a.fix)
    if not a.sglang and not a.release_table:
        raise UsageError("--fix audits a patched copy of a release: add --sglang VERSION, or patch the installed "
                         "file (`swa-repro patch apply --fix ... --in-place`) and audit it as installed")
    if a.what_if:
        raise UsageError("--fix goes without --patched/--unpatched/--both: it already fixes the file")
    return names


def _one(version, what_if, paths, mode: str = "model", live_budget: float | None = None, fixes=None) -> dict:
    """One audit run as a dict: of the installed sglang in this process, or of ``version`` in a child."""
    if version:
        from swa_repro.sglang.audit.release import audit_release

        return audit_release(version, what_if=what_if, paths=paths, fixes=fixes,
                             note=lambda s: print(s, file=sys.stderr))
    try:
        import sglang  # noqa: F401  (lazy: optional and slow to import; after the arguments are checked)
    except ImportError:
        raise UsageError("the audit drives sglang's backend: install it (`pip install sglang==0.5.15.post1`) "
                         "or give --sglang VERSION") from None
    from swa_repro.sglang.audit import core as audit

    d = audit.run_audit(what_if, paths=paths, mode=mode, live_budget_s=live_budget).to_dict()
    d["release"]["origin"] = "installed"
    return d


def print_run(r: dict, classes: dict) -> None:
    from swa_repro.sglang.audit import core as audit
    from swa_repro.sglang.audit.reports import report_table

    print(audit.header(r["release"], r["what_if"], r["release"].get("origin", "installed")))
    print(f"  {len(r['findings'])} findings, {len(r['driven'])} path x layer runs driven, "
          f"{len(r['not_driven'])} not driven")
    for row in report_table(r["findings"]):
        print(f"  {row['path']:<24} {row['parameter']:<16} {row['wrapper']:<38} {row['kind']:<8} "
              f"plan={row['plan']} forward={row['forward']} [{row['effect']}] {row['consequence']}")
    for nd in r["not_driven"]:
        print(f"  not driven ({nd['status']}): {nd['path']}/{nd['layer']}: {nd['why']}")
    print(f"keys each query attends ({r.get('mode', 'model')} mode, sglang's tensors on {r.get('device', 'cpu')}; "
          "live columns: measured on real FlashInfer against the float64 reference):")
    for row in key_rows(r):
        print("  " + row)
    print("finding classes" + (" (what-if)" if r["what_if"] else "") + ":")
    for k, c in classes.items():
        print(f"  {at.CLASSES[k].title:<30} {c['state']:<10} {c['evidence'][0] if c['evidence'] else ''}")


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def key_rows(r: dict) -> list[str]:
    """``audit.key_table`` as text: the same columns in both modes (``-``: not measured)."""
    from swa_repro.sglang.audit import core as audit

    rows = [f"{'path':<24} {'layer':<11} {'keys':<9} {'queries+extra':>13} {'max extra':>9} {'missing':>7} "
            f"{'foreign':>7} | {'live wrong rows':>15} {'err':>7} {'err uncapped':>12} {'model vs kernel':>15}"]
    for t in audit.key_table(r):
        wrong = "-" if t["live_rows"] is None else f"{t['live_wrong_rows']}/{t['live_rows']}"
        if t["live_rows"] is None and t["live_errors"]:
            wrong = "not run"
        agree = {True: "agrees", False: "DIFFERS", None: "-"}[t["model_agrees"]]
        rows.append(f"{t['path']:<24} {t['layer']:<11} {t['verdict'] or '-':<9} "
                    f"{str(t['queries_with_extra']) + '/' + str(t['queries']):>13} {t['max_extra_per_query']:>9} "
                    f"{t['missing_keys']:>7} {t['foreign_keys']:>7} | {wrong:>15} {_fmt(t['max_err']):>7} "
                    f"{_fmt(t['max_err_uncapped']):>12} {agree:>15}"
                    + (f"  ({t['live_errors'][:160]})" if t["live_errors"] else ""))
    return rows


def _families(a) -> int:
    """``--model`` (and ``--gpu``): names checked, then the release; one line for each misuse."""
    from swa_repro.sglang import checkpoint
    from swa_repro.sglang.audit import family_run

    if a.model is None:
        raise UsageError("--gpu goes with --model FAMILY: the GPU class of a family's audit")
    model = checkpoint.model_arg(a.model, a.gpu)  # the family names, or the user's config.json read
    if not a.sglang:
        raise UsageError("--model audits a family on a release's own code: add --sglang VERSION (e.g. 0.5.23)")
    if a.release_table or a.what_if or a.paths or a.mode == "live":
        raise UsageError("--model goes without --release-table, --patched/--unpatched/--both, --paths and "
                         "--mode live")
    parse(a.sglang)
    if a.transformers_choice == "release" and not isinstance(model, list):
        raise UsageError("--transformers release goes with a family or all, not a checkpoint: its config.json is "
                         "checked with this venv's transformers")
    doc = family_run.audit_families(a.sglang, a.model if isinstance(model, list) else model, a.gpu, fixes=_fixes(a),
                                    note=lambda s: print(s, file=sys.stderr), transformers=a.transformers_choice)
    print(json.dumps(doc, default=str) if a.json else "\n".join(family_run.render(doc)))
    sys.stdout.flush()
    bad = family_run.incomplete(doc)
    for x in ["audit incomplete: not everything the release has was driven:"] + bad if bad else []:
        print(f"  {x}" if x[0] != "a" else x, file=sys.stderr)
    return 1 if bad else exit_status([f["answer"]["state"] for f in doc["families"]], a.fail_on)


def _family_table(a) -> int:
    """``--release-table --model all [--gpu G[,G]]``: docs/audit/families.{md,json}."""
    from swa_repro.engine.families import DEFAULT_GPU
    from swa_repro.sglang import families
    from swa_repro.sglang.audit import family_table

    if a.model != "all":
        raise UsageError("--release-table --model takes all: the table has every family each release serves")
    gpus = [g.strip() for g in (a.gpu or DEFAULT_GPU).split(",") if g.strip()]
    for g in gpus:
        families.check_args("all", g)
    versions = [v.strip() for v in a.releases.split(",") if v.strip()]
    if not versions or a.what_if or a.sglang or a.paths or a.fix:
        raise UsageError("--release-table --model all takes --releases, --gpu, --jobs and --out only")
    out_dir(a.out, "--out")
    for v in versions:
        if parse(v) < MIN_RELEASE:
            raise UsageError(f"--releases {v}: the audit drives sglang 0.5.10 and later")
    keep_fuller(a.out / "families.json", {"releases": versions, "gpus": gpus}, _family_cover, force=a.force)
    cmd = f"swa-repro audit --release-table --model all --gpu {','.join(gpus)} --releases {','.join(versions)}"
    from swa_repro.sglang.audit.family_fix import FIXED_RELEASE

    tf = a.transformers_choice  # release: each release's pinned transformers; no companion (no --fix with it yet)
    table = family_table.build(versions, gpus, jobs=a.jobs, command=cmd + (" --transformers release" if tf == "release"
                                                                          else ""),
                               note=lambda s: print(s, file=sys.stderr), transformers=tf,
                               fixed=FIXED_RELEASE if FIXED_RELEASE in versions and tf == "venv" else None)
    md, js = family_table.write(table, a.out)
    print(f"wrote {md} and {js}")
    return 0


def _release_cover(doc: dict) -> dict:
    """What a release table holds (``core.outputs.keep_fuller``: a subset never replaces it)."""
    return {"releases": [r["sglang"] for r in doc["rows"]], "fixes": doc.get("fixes") or []}


def _family_cover(doc: dict) -> dict:
    return {"releases": [r["sglang"] for r in doc["rows"]], "gpus": doc["gpus"]}


def _table(a) -> int:
    versions = [v.strip() for v in a.releases.split(",") if v.strip()]
    if not versions:  # an empty table would be written, having audited nothing
        raise UsageError(f"--releases selects no release: give comma-separated versions, e.g. {','.join(at.REQUIRED)}")
    fixes = _fixes(a)
    a.out = table_out(a.out, bool(fixes))
    if a.what_if or a.sglang or a.paths:
        raise UsageError("--release-table audits each release as it ships, every path: drop --sglang, --paths "
                         "and the what-ifs")
    out_dir(a.out, "--out")  # a file, or a path under one, or read-only: one line before any release is audited
    for v in versions:  # every release checked before any is installed
        if parse(v) < MIN_RELEASE:
            raise UsageError(f"--releases {v}: the audit drives sglang 0.5.10 and later")
    keep_fuller(a.out / "releases.json", {"releases": versions, "fixes": fixes or []}, _release_cover, force=a.force)
    cmd = "swa-repro audit --release-table --releases " + ",".join(versions) + (f" --fix {a.fix}" if fixes else "")
    table = at.build_table(versions, jobs=a.jobs, command=cmd, note=lambda s: print(s, file=sys.stderr),
                           fixes=fixes)
    md, js = at.write_table(table, a.out)
    print(f"wrote {md} and {js}")
    return 0
