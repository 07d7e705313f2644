"""``swa-repro patch status|diff|apply|revert``."""

from __future__ import annotations

import sys
from pathlib import Path

import swa_repro.sglang.patch as patch_pkg
from swa_repro.core.errors import UsageError
from swa_repro.engine.patching import (
    backup_info,
    check_outputs,
    check_paths,
    diff_or_copy,
    read_backend,
    revert_in_place,
    sha256_hex,
)
from swa_repro.sglang import fix
from swa_repro.sglang.patch.classify import classify
from swa_repro.sglang.patch.edit import transform
from swa_repro.sglang.patch.files import apply_in_place, installed_path


def register(sub):
    p = sub.add_parser("patch", help="classify / diff / patch / revert sglang's FlashInfer "
                       "backend for the sliding-window plan bug (PR #31501)",
                       description=patch_pkg.__doc__.splitlines()[0])
    p.add_argument("action", choices=("status", "diff", "apply", "revert"))
    p.add_argument("--source", type=Path, help="flashinfer_backend.py to read (default: the "
                   "installed sglang's)")
    p.add_argument("--out", type=Path, help="apply: write the patched file here")
    p.add_argument("--in-place", action="store_true", help="apply: patch the file itself, "
                   "with a backup (`revert` restores it); a symbolic link is refused: give its target")
    p.add_argument("--force", action="store_true", help="apply --out: replace FILE if it exists")
    p.add_argument("--reverse", action="store_true", help="diff/apply: fixed -> unfixed, to "
                   "show the bug on sglang >= 0.5.16")
    p.add_argument("--fix", metavar="NAME[,NAME]|all", help="status/diff/apply: the fixes for every finding "
                   "class of sglang 0.5.14-0.5.23 instead of PR #31501 alone: " + ", ".join(fix.ALL) + "; a fix "
                   "of a model file (commandr_window_hook: srt/models/commandr.py) edits that file (the "
                   "installed one, or --source); `all` edits the backend and names the others")
    p.set_defaults(func=run)


def run(args) -> int:
    check_outputs(args)
    if args.reverse and args.action not in ("diff", "apply"):
        raise UsageError("--reverse goes with `diff` or `apply`")
    names = fix.parse_names(args.fix) if args.fix is not None else None
    if names and args.action == "revert":
        raise UsageError("--fix goes with status, diff or apply: `revert` restores whatever was patched in place")
    if names and args.reverse:
        raise UsageError("--reverse goes without --fix: `swa-repro patch revert` restores a file patched in place")
    target = _target_file(args.fix, names)
    path = args.source if args.source else installed_path(target)
    check_paths(args, path)
    if args.action == "revert":
        print(revert_in_place(path))
        return 0
    text = read_backend(path)  # one reader: not UTF-8, a BOM, empty, does not parse: one line
    info = backup_info(path)  # its metadata, if patched in place: not JSON or a key missing is one line
    if names:
        return _run_fixes(args, path, text, names, target)
    s = classify(text)
    if args.action == "status":
        if s.state == "unknown":
            print(f"swa-repro patch: {path}: " + "; ".join(s.reasons), file=sys.stderr)
        if info and info["patched_sha256"] == sha256_hex(text.encode()):
            print(f"swa-repro patch: {path} was patched in place by swa-repro "
                  "(`swa-repro patch revert` restores it)", file=sys.stderr)
        print(s.state)
        return 0
    target = "unfixed" if args.reverse else "fixed"
    if args.in_place:
        print(apply_in_place(path, target))
        return 0
    new = transform(text, target)  # refuses unknown
    return diff_or_copy(args, path, text, new, f"is already {target}", f"{s.state} -> {target}")


def _target_file(text: str | None, names) -> str:
    """The one file the fixes edit (``all``: the backend); named fixes of two files are one line."""
    if not names:
        return fix.BACKEND
    groups = fix.by_file(names)
    if "all" in [x.strip() for x in text.split(",")] or len(groups) == 1:
        return next(iter(groups)) if len(groups) == 1 else fix.BACKEND
    raise UsageError("--fix " + text + ": these fixes edit different files (" + "; ".join(
        f"{', '.join(ns)}: {f}" for f, ns in groups.items()) + "); run one `swa-repro patch` per file")


def _others(path: Path, target: str, names) -> None:
    """``all``'s fixes of other files than ``target``: their state in the file beside ``path`` (the
    same sglang), or how to reach them; on stderr, so a diff on stdout stays one file's."""
    for rel, ns in fix.by_file(names).items():
        if rel == target:
            continue
        parts = Path(target).parts
        beside = path.parents[len(parts) - 1] / rel if path.parts[-len(parts):] == parts else None
        st = fix.states(beside.read_text(), ns, rel) if beside is not None and beside.is_file() else {}
        for n in ns:
            s = st.get(n)
            print(f"swa-repro patch: {n} edits {beside or rel}, not this file" + (f" (there: {s.state})" if s else "")
                  + f"; `swa-repro patch status|diff|apply --fix {n}` works on that file", file=sys.stderr)


def _run_fixes(args, path: Path, text: str, names, target: str) -> int:
    """``--fix``: the same actions and safety as PR #31501's patch, for the chosen fixes of ``target``
    (``all``'s fixes of other files are named on stderr once the action has succeeded)."""
    states = fix.states(text, names, target)
    if args.action == "status":
        for n, st in states.items():
            print(f"{n}: {st.state}" + (f" ({st.why})" if st.why else ""))
        _others(path, target, names)
        return 0
    mine = fix.by_file(names).get(target, ())
    label = f"--fix {','.join(mine)}"
    done = lambda t: all(s.state == "applied" for s in fix.states(t, names, target).values())  # noqa: E731
    if args.in_place:
        print(apply_in_place(path, edit=lambda t: fix.apply_fixes(t, names, target), label=label, done=done))
        _others(path, target, names)
        return 0
    new = fix.apply_fixes(text, names, target)  # refuses a structure it does not know
    rc = diff_or_copy(args, path, text, new, f"already has {label}", label)
    _others(path, target, names)
    return rc
