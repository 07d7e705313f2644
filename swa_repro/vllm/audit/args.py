"""``swa-repro audit``'s flags checked together, for both projects, before any release is provisioned.

The sglang path (``sglang.audit.cli``) and the vLLM path (``vllm.audit.core``, ``vllm.audit.table``) each
check their own values, but a flag the chosen mode never reads was silently dropped (``--vllm X --patched``
audited the release as it ships; ``--out`` without ``--release-table`` wrote nothing; ``--vllm X
--releases ...`` ignored the list), an empty ``--model ""`` / ``--gpu ""`` fell back to the default
on the vLLM path (sglang's refuses both), a repeated family, GPU class or release was audited and
printed twice, and ``--sglang ""`` audited the *installed* sglang. Here each is one line, exit 2.

``given`` is the set of defaulted flags the user typed (``register`` in ``vllm.audit.cli`` swaps their
defaults for None to tell).
"""

from __future__ import annotations

from swa_repro.core.errors import UsageError

# dest -> what one item of that comma-separated flag is
LISTS = {"vllm": "release", "model": "family", "gpu": "GPU class", "releases": "release", "paths": "path",
         "fix": "fix"}
# flags with a default whose typing is told apart by a None default (vllm.audit.cli.register)
DEFAULTED = ("out", "releases", "jobs", "mode", "live_budget")


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def restore(a, defaults: dict) -> set[str]:
    """The defaulted flags given on the command line; the others get their default back."""
    given = {k for k in defaults if getattr(a, k) is not None}
    for k in set(defaults) - given:
        setattr(a, k, defaults[k])
    return given


def check(a, given: set[str]) -> None:
    """Every misuse of ``audit``'s flags together (one ``UsageError``), before either path runs."""
    _lists(a, given)
    if a.sglang is not None:
        from swa_repro.core.versions import check_sglang_release

        check_sglang_release(a.sglang)  # "" or 0.5.15.post2: one line, never the installed sglang nor the installer
    if not a.release_table:
        extra = [flag(k) for k in ("out", "releases", "jobs") if k in given]
        if extra:
            raise UsageError(f"{', '.join(extra)} go{'es' if len(extra) == 1 else ''} with --release-table: add it, "
                             f"or drop {' and '.join(extra)}")
    elif a.json or given & {"mode", "live_budget"}:
        raise UsageError("--release-table writes its table as --out/*.md and *.json, on CPU: drop --json, --mode "
                         "and --live-budget")
    if a.vllm is not None:
        _vllm(a, given)


def _lists(a, given: set[str]) -> None:
    """A comma-separated flag names something, each item once, ``all`` alone."""
    for dest, noun in LISTS.items():
        text = getattr(a, dest, None)
        if text is None or (dest in DEFAULTED and dest not in given):
            continue
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise UsageError(f"{flag(dest)} selects no {noun} (got {text!r}): name at least one")
        twice = sorted({x for x in items if items.count(x) > 1})
        if twice:
            raise UsageError(f"{flag(dest)} names {', '.join(twice)} more than once: give each {noun} once")
        if dest == "model" and "all" in items and len(items) > 1:
            raise UsageError(f"--model {text}: all is every family already; give all alone or the families")


def _vllm(a, given: set[str]) -> None:
    """What only the sglang path reads, with ``--vllm``."""
    from swa_repro.engine.commands import REMOVED_SOURCE

    if a.sglang_source is not None:
        raise UsageError(REMOVED_SOURCE)
    if a.what_if:
        raise UsageError("--patched/--unpatched/--both swap sglang's PR #31501 in memory: with --vllm, audit the "
                         "fix with --fix cap-route")
    if getattr(a, "transformers", None) is not None:  # sglang's --transformers release (release_transformers)
        raise UsageError("--transformers is sglang's for now: the vLLM audit runs on this venv's transformers")
    if given & {"releases", "jobs"}:
        raise UsageError("--releases and --jobs are sglang's --release-table: with --vllm the table's releases go to "
                         "--vllm X,Y (or table)")
    if a.release_table and a.paths is not None:
        raise UsageError("--paths picks the live step's paths; --release-table --vllm audits every path of each "
                         "release: drop --paths")
    if a.diff and (a.release_table or a.model or a.gpu or a.paths or a.json or given & {"mode", "live_budget"}):
        raise UsageError("--diff prints the fix's diff against the release and audits nothing: give --vllm X --fix "
                         "cap-route --diff alone")
