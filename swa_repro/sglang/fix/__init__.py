"""Opt-in fixes for every plan/forward finding class of sglang 0.5.14-0.5.23's FlashInfer backend.

``swa-repro patch --fix NAME[,NAME]|all`` (``patch.cli``) applies them with the same safety as PR
#31501's patch (a copy by default, ``--in-place`` with a sha256-checked backup, a refusal on a file
whose structure is not the one the fix was written against). The fixes and the source lines they
mirror: ``fix.fixes``; the editing primitives: ``fix.source``. The names are the audit's finding
classes (``audit.table.CLASSES``), so ``swa-repro audit --sglang X --fix all`` asks the same
questions of the patched release. The fixes of the family- and GPU-class-level findings
(``audit --model``) are ``fix.family_fixes``; a fix edits one file (``Fix.file``, under the sglang
package), and each function here reads and edits the one file it is given (``file``, default the
backend): a fix of another file is not its business.
"""

from __future__ import annotations

from swa_repro.core.errors import UsageError
from swa_repro.engine.patching import PatchError
from swa_repro.sglang.fix.anchors import State, Unknown
from swa_repro.sglang.fix.family_fixes import FAMILY_FIXES, FAMILY_ORDER
from swa_repro.sglang.fix.fixes import FIXES as BACKEND_FIXES
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.fix.source import Source, apply_edits
from swa_repro.sglang.patch.classify import REL_PATH, parse

__all__ = ["ALL", "BACKEND", "FIXES", "apply_fixes", "by_file", "parse_names", "states"]

BACKEND = str(REL_PATH)
FIXES = {**BACKEND_FIXES, **FAMILY_FIXES}
ALL = ORDER + FAMILY_ORDER  # what --fix all applies, in this order (ORDER: the finding classes)


def by_file(names) -> dict[str, tuple]:
    """file -> the fixes of ``names`` that edit it, in application order."""
    out = {}
    for n in ALL:
        if n in names:
            out.setdefault(FIXES[n].file, []).append(n)
    return {f: tuple(ns) for f, ns in out.items()}


def parse_names(text: str) -> tuple[str, ...]:
    """``all`` or comma-separated names -> names in application order, each with what it requires.
    ``all`` beside names (``all,commandr_window_hook``, as the audit's remedy spells out what ``all``
    includes) is ``all``: every name is in it; an unknown name beside it is still one line."""
    names = [x.strip() for x in (text or "").split(",") if x.strip()]
    if not names:
        raise UsageError(f"--fix selects no fix: give all or some of {','.join(ALL)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # silently once before: what was asked and what ran differed
        raise UsageError(f"--fix names {', '.join(twice)} more than once: give each once")
    bad = [n for n in names if n not in FIXES and n != "all"]
    if bad:
        raise UsageError(f"--fix: unknown {', '.join(bad)}; choose all (every fix) or from {', '.join(ALL)}")
    if "all" in names:
        return ALL
    want = set(names)
    for n in names:
        want |= set(FIXES[n].requires)
    return tuple(n for n in ALL if n in want)


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


def states(text: str, names=ORDER, file: str = BACKEND) -> dict[str, State]:
    """Each fix of ``names`` that edits ``file``: its state in ``text`` (that file's text): needed /
    applied / unknown (with why), from its structure."""
    return {n: _state(text, n) for n in by_file(names).get(file, ())}


def apply_fixes(text: str, names, file: str = BACKEND) -> str:
    """``text`` (``file``'s) with the fixes of ``names`` that edit it applied (in ``ALL``'s order);
    refuses, changing nothing, when a fix's anchors are not there. Checks its own work: the result
    parses and every fix reads applied."""
    names = by_file(names).get(file, ())
    for name in names:
        fix = FIXES[name]
        try:  # every read of the file's structure, so a hand-edited one is refused, not a traceback
            src = Source(text)
            if fix.needs_fixed_31501 and FIXES["paged_only_window"].edits(src):
                raise PatchError(f"--fix {name} needs PR #31501's window plumbing, which this file lacks: "
                                 f"add paged_only_window (--fix paged_only_window,{name}); nothing was written")
            text = apply_edits(text, fix.edits(src))
        except (Unknown, SyntaxError) as e:
            raise PatchError(f"--fix {name}: {e}; this file is not a structure the fix knows "
                             f"(sglang 0.5.14-0.5.23's {file}); nothing was written") from None
        try:
            parse(text)
        except SyntaxError as e:  # a bug of the fix, never the user's
            raise PatchError(f"--fix {name} produced a file that does not parse ({e}); nothing was written") from None
    left = {n: s for n, s in states(text, names, file).items() if s.state != "applied"}
    if left:
        raise PatchError("after the edits, " + "; ".join(f"{n} reads {s.state} ({s.why})" for n, s in left.items())
                         + "; nothing was written")
    return text
