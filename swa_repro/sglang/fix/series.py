"""The fixes as one PR-ready patch series against sglang's repository: ``git am`` applies it.

Each finding with an edit of its own (``fix.ORDER``, less what the release already has and what
only combines others) is one commit. Patch ``k`` is the difference between the file with the first
``k - 1`` fixes and with the first ``k`` (``apply_fixes`` on the release's own text, in ``ORDER``),
so the series stacks without conflicts and ends exactly at ``all.diff``'s file; each finding's
stand-alone ``<finding>.diff`` (``upstream.diffs``) applies to the shipped file alone. Extra
commits (the regression test, the kit's case lists) come after the fixes.
"""

from __future__ import annotations

from dataclasses import dataclass

from swa_repro.sglang.fix import FIXES, ORDER, apply_fixes, states

AUTHOR = "swa-repro <swa-repro@users.noreply.github.com>"
DATE = "Thu, 1 Jan 1970 00:00:00 +0000"  # fixed, so that a regenerated series is byte-identical


@dataclass(frozen=True)
class Commit:
    slug: str  # file name stem, e.g. "ragged_no_prefix_window"
    subject: str  # one line, sglang's "[area] verb ..." form
    body: str  # plain text, wrapped by the caller
    diff: str  # unified, paths as in sglang's repository


SUBJECTS = {
    "ragged_no_prefix_window": "[FlashInfer] plan the sliding window into a ragged wrapper of its own",
    "ragged_prefix_window": "[FlashInfer] ragged extend with prefix: use the windowed ragged wrapper",
    "eagle_verify_window": "[FlashInfer] EAGLE verify: plan window_left on the sliding-window wrapper",
    "dflash_verify_window": "[FlashInfer] DFlash verify: plan window_left on the sliding-window wrapper",
    "soft_cap_prefill": "[FlashInfer] plan logits_soft_cap for prefill, refuse a layer with another cap",
    "soft_cap_decode": "[FlashInfer] plan logits_soft_cap for decode, refuse a layer with another cap",
}


def own_fixes(text: str) -> tuple[str, ...]:
    """The findings of ``text`` that are one commit each: needed, with an edit of their own."""
    st = states(text)
    return tuple(n for n in ORDER if st[n].state != "applied" and not FIXES[n].requires)


def fix_commits(text: str, unified, body) -> list[Commit]:
    """One commit per :func:`own_fixes`, stacked; ``unified(old, new)`` makes a diff, ``body(name)``
    a commit message body."""
    out, cur, done = [], text, []
    for n in own_fixes(text):
        done.append(n)
        new = apply_fixes(text, tuple(done))
        out.append(Commit(n, SUBJECTS[n], body(n), unified(cur, new)))
        cur = new
    return out


def patch_text(c: Commit, k: int, total: int) -> str:
    """``git format-patch``'s mbox form, so ``git am`` takes the series as commits."""
    return (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            f"From: {AUTHOR}\nDate: {DATE}\nSubject: [PATCH {k}/{total}] {c.subject}\n\n"
            f"{c.body.rstrip()}\n---\n{c.diff}--\n2.43.0\n\n")


def write_series(out, commits: list[Commit]) -> list:
    """``out/000k-<slug>.patch`` and ``out/series`` (the order, as quilt lists it); stale patches of
    an earlier series are removed."""
    out.mkdir(parents=True, exist_ok=True)
    names = [f"{k:04d}-{c.slug.replace('_', '-')}.patch" for k, c in enumerate(commits, 1)]
    for old in out.glob("*.patch"):
        if old.name not in names:
            old.unlink()
    written = []
    for k, (name, c) in enumerate(zip(names, commits), 1):
        p = out / name
        p.write_text(patch_text(c, k, len(commits)))
        written.append(p)
    (out / "series").write_text("".join(f"{n}\n" for n in names))
    return written + [out / "series"]
