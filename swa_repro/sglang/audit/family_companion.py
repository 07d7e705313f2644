"""The families table's companion (``docs/audit/families.md``, "With the fixes, and what to do"): the
newest release audited with ``swa-repro patch --fix all`` on each GPU class, and what a user does per
family (``family_fix.remedy``) from the main table's cells of that release. Below the table, which
renders it (``family_table.markdown``), above the audit it runs (``family_run.audit_release``).
"""

from __future__ import annotations

from swa_repro.sglang.audit.family_fix import FIXED_RELEASE, remedy, remedy_text
from swa_repro.sglang.audit.family_verdict import cell_of


def fixed_cells(gpus, version: str = FIXED_RELEASE, note=print) -> dict:
    """``{"sglang", "command", "cells": {gpu: {family: cell}}}``: every family of ``version`` audited
    with ``--fix all`` (``fix.overlay``) on each GPU class, by one child for all of them."""
    from swa_repro.sglang.audit.family_run import audit_release
    from swa_repro.sglang.fix import parse_names

    docs = audit_release(version, "all", list(gpus), fixes=parse_names("all"), note=note)
    return {"sglang": version, "command": f"swa-repro audit --sglang {version} --model all --gpu G --fix all",
            "cells": {g: {f["family"]: cell_of(f) for f in docs[g]["families"]} for g in gpus}}


def markdown(table: dict, fams: list[str], short) -> list[str]:
    """The companion section: per GPU class, each family's cell of the newest release with
    ``--fix all``, and what to do per family (``remedy``) from the main table's cells of that release."""
    fx = table.get("fixed")
    out = ["## With the fixes, and what to do", ""]
    if fx:
        out += [f"sglang {fx['sglang']} with every fix of `swa-repro patch --fix all` (`{fx['command']}`; the "
                "family fixes are in `swa_repro/sglang/fix/family_fixes.py`, their upstream diffs in "
                "`docs/upstream/families.md`):", "", "| GPU | " + " | ".join(fams) + " |", "|---|" + "---|" * len(fams)]
        out += [f"| {g} | " + " | ".join(short(c.get(f)) for f in fams) + " |" for g, c in fx["cells"].items()]
        out.append("")
    newest = [r for r in table["rows"] if r["sglang"] == (fx or {}).get("sglang", table["rows"][-1]["sglang"])]
    out += ["What to do, per family and GPU class (sglang " + (newest[0]["sglang"] if newest else "?") + "):", ""]
    for f in fams:
        seen = {}
        for r in newest:
            c = r["cells"].get(f)
            if c is not None:
                seen.setdefault(remedy_text(remedy(f, c, r["gpu"])), []).append(r["gpu"])
        out += [f"- **{f}** ({', '.join(gs)}): {text}" for text, gs in seen.items()]
    return out + [""]
