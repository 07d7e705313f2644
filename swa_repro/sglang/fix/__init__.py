"""Opt-in fixes for every plan/forward finding class of sglang 0.5.14-0.5.23's FlashInfer backend.

``swa-repro patch --fix NAME[,NAME]|all`` (``patch.cli``) applies them with the same safety as PR
#31501's patch (a copy by default, ``--in-place`` with a sha256-checked backup, a refusal on a file
whose structure is not the one the fix was written against). The fixes and the source lines they
mirror: ``fix.fixes``; the editing primitives: ``fix.source``. The names are the audit's finding
classes (``audit.table.CLASSES``), so ``swa-repro audit --sglang X --fix all`` asks the same
questions of the patched release.
"""

from __future__ import annotations

from swa_repro.core.errors import UsageError
from swa_repro.sglang.fix.fixes import FIXES, ORDER, State, Unknown
from swa_repro.sglang.fix.source import Source, apply_edits
from swa_repro.sglang.patch.classify import PatchError, parse

__all__ = ["FIXES", "ORDER", "State", "apply_fixes", "parse_names", "states"]


def parse_names(text: str) -> tuple[str, ...]:
    """``all`` or comma-separated names -> names in application order, each with what it requires."""
    names = [x.strip() for x in (text or "").split(",") if x.strip()]
    if not names:
        raise UsageError(f"--fix selects no fix: give all or some of {','.join(ORDER)}")
    if names == ["all"]:
        return ORDER
    bad = [n for n in names if n not in FIXES]
    if bad:
        raise UsageError(f"--fix: unknown {', '.join(bad)}; choose all or from {', '.join(ORDER)}")
    want = set(names)
    for n in names:
        want |= set(FIXES[n].requires)
    return tuple(n for n in ORDER if n in want)


def _state(text: str, name: str) -> State:
    fix = FIXES[name]
    try:
        src = Source(text)
        if fix.needs_fixed_31501 and FIXES["paged_only_window"].edits(src):
            edits = fix.edits(Source(apply_edits(text, FIXES["paged_only_window"].edits(src))))
            return State("needed", "with paged_only_window (it adds the window plumbing)") if edits else \
                State("unknown", "paged_only_window alone changes it")
        if fix.requires:
            sub = [_state(text, r) for r in fix.requires]
            if all(s.state == "applied" for s in sub):
                return State("applied")
            return State("needed" if all(s.state != "unknown" for s in sub) else "unknown",
                         "; ".join(f"{r}: {s.state}" for r, s in zip(fix.requires, sub)))
        return State("needed") if fix.edits(src) else State("applied")
    except Unknown as e:
        return State("unknown", str(e))
    except SyntaxError as e:
        return State("unknown", f"does not parse: {e}")


def states(text: str, names=ORDER) -> dict[str, State]:
    """Each fix's state in ``text``: needed / applied / unknown (with why), from its structure."""
    return {n: _state(text, n) for n in names}


def apply_fixes(text: str, names) -> str:
    """``text`` with the fixes ``names`` applied (in ``ORDER``); refuses, changing nothing, when a
    fix's anchors are not there. Checks its own work: the result parses and every fix reads applied."""
    for name in ORDER:
        if name not in names:
            continue
        fix = FIXES[name]
        try:  # every read of the file's structure, so a hand-edited one is refused, not a traceback
            src = Source(text)
            if fix.needs_fixed_31501 and FIXES["paged_only_window"].edits(src):
                raise PatchError(f"--fix {name} needs PR #31501's window plumbing, which this file lacks: "
                                 f"add paged_only_window (--fix paged_only_window,{name}); nothing was written")
            text = apply_edits(text, fix.edits(src))
        except (Unknown, SyntaxError) as e:
            raise PatchError(f"--fix {name}: {e}; this file is not a structure the fix knows "
                             "(sglang 0.5.14-0.5.23); nothing was written") from None
        try:
            parse(text)
        except SyntaxError as e:  # a bug of the fix, never the user's
            raise PatchError(f"--fix {name} produced a file that does not parse ({e}); nothing was written") from None
    left = {n: s for n, s in states(text, names).items() if s.state != "applied"}
    if left:
        raise PatchError("after the edits, " + "; ".join(f"{n} reads {s.state} ({s.why})" for n, s in left.items())
                         + "; nothing was written")
    return text
