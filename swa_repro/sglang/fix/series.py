"""The pieces of a PR-ready patch series against sglang's repository (``git am`` applies it): a
commit, its subject, author and patch text, the findings with an edit of their own in the release
(``fix.ALL``'s order, less what the release already has, read from its code, and what only combines
others), and the writer of a series folder. ``pr_series`` builds the five separate series from them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from swa_repro.core.errors import UsageError
from swa_repro.core.outputs import write_atomic
from swa_repro.sglang.fix import ALL, BACKEND, FIXES, states
from swa_repro.sglang.fix.fixes import ORDER

AUTHOR_ENV = "SWA_REPRO_PATCH_AUTHOR"  # "Name <email>": who sends the series (git am makes them the author)
AUTHOR = "SGLang Contributor <contributor@users.noreply.github.com>"  # neutral: no tool named as the author
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
    "commandr_window_hook": "[Model] Cohere2: give the runner the sliding window its layers use",
    "sm100_no_cutlass_window": "[FlashInfer] sm100: the shared ragged prefill wrapper keeps fa2 for a soft cap",
}


def own_fixes(text: str, file: str = BACKEND, names=ORDER) -> tuple[str, ...]:
    """The fixes of ``names`` that edit ``file`` and are one commit each in ``text`` (that file's):
    needed, with an edit of their own."""
    st = states(text, names, file)
    return tuple(n for n in st if st[n].state != "applied" and not FIXES[n].requires)


def fix_names(texts: dict[str, str]) -> tuple[str, ...]:
    """The fix commits' findings, in ``ALL``'s order (``texts``: file under the sglang package -> the
    release's text)."""
    own = {n for f, t in texts.items() for n in own_fixes(t, f, ALL)}
    return tuple(n for n in ALL if n in own)


def patch_name(k: int, slug: str) -> str:
    """``git format-patch``'s file name of the series' ``k``-th commit (1-based)."""
    return f"{k:04d}-{slug.replace('_', '-')}.patch"


def author() -> str:
    """The patches' ``From:``: :data:`AUTHOR_ENV` where set (the person who sends them), else the
    neutral :data:`AUTHOR`; a value that is not ``Name <email>`` is one line, exit 2."""
    who = os.environ.get(AUTHOR_ENV, "").strip()
    if not who:
        return AUTHOR
    if not re.fullmatch(r"[^<>\n]+ <[^<>@\s]+@[^<>@\s]+>", who):
        raise UsageError(f"{AUTHOR_ENV}={who!r} is not 'Name <email>': set it to the patches' author, or unset it")
    return who


def patch_text(c: Commit, k: int, total: int) -> str:
    """``git format-patch``'s mbox form, so ``git am`` takes the series as commits."""
    return (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            f"From: {author()}\nDate: {DATE}\nSubject: [PATCH {k}/{total}] {c.subject}\n\n"
            f"{c.body.rstrip()}\n---\n{c.diff}--\n2.43.0\n\n")


def write_series(out, commits: list[Commit]) -> list:
    """``out/000k-<slug>.patch`` and ``out/series`` (the order, as quilt lists it); stale patches of
    an earlier series are removed."""
    out.mkdir(parents=True, exist_ok=True)
    names = [patch_name(k, c.slug) for k, c in enumerate(commits, 1)]
    for old in out.glob("*.patch"):
        if old.name not in names:
            old.unlink()
    written = []
    for k, (name, c) in enumerate(zip(names, commits), 1):
        p = out / name
        write_atomic(p, patch_text(c, k, len(commits)).encode())  # never through a link
        written.append(p)
    write_atomic(out / "series", "".join(f"{n}\n" for n in names).encode())
    return written + [out / "series"]
