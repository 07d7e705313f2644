"""``swa-repro patch status|diff|apply|revert --vllm [--fix cap-route]``: vLLM's soft-cap fix
(``vllm.fix``) on the installed vLLM's FlashInfer backend file, or ``--source FILE``. The command is
sglang's (``sglang.patch.cli``, registered first by ``cli.COMMANDS``) plus ``--vllm``, as ``vllm.cli``
adds it to ``audit``; without ``--vllm`` nothing changes.

The same actions and safety as the sglang patch (``engine.patching``): ``apply --out FILE`` writes
a patched copy, ``apply --in-place`` keeps a sha256-checked backup beside the file and ``revert``
restores it byte for byte; a file that is neither the original nor swa-repro's patch is left alone.
The installed file is found without importing vLLM (its import needs CUDA extensions).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.vllm import fix as vfix
from swa_repro.vllm.provision import BACKEND


def register(sub) -> None:
    """``--vllm`` added to the ``patch`` command registered before it (sglang's: ``cli.COMMANDS``)."""
    from swa_repro.engine.commands import extended

    p = extended(sub, "patch")
    p.add_argument("--vllm", action="store_true", help="vLLM's FlashInfer backend instead (the installed "
                   "vllm/v1/attention/backends/flashinfer.py, or --source): its fix " + ", ".join(vfix.FIXES)
                   + " (the default --fix), as `swa-repro audit --vllm X --fix` checks it")
    other = p.get_default("func")
    p.set_defaults(func=lambda a: run(a) if a.vllm else other(a))


def installed_backend() -> tuple[Path, str]:
    """``(vllm/v1/attention/backends/flashinfer.py of the importable vLLM, its version)``."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"vllm is not installed in this Python ({sys.executable}); install it or pass --source FILE")
    path = Path(next(iter(spec.submodule_search_locations))).parent / BACKEND
    if not path.is_file():
        raise UsageError(f"{path} does not exist: this vLLM has no FlashInfer backend file there; pass --source FILE")
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = "installed"
    return path, version


def edit(text: str, version: str, source: Path | None) -> str:
    """``vllm.fix.edit``, its refusal naming ``--source`` where the file was given."""
    try:
        return vfix.edit(text, version)
    except UsageError:
        if source is None:
            raise
        raise UsageError(f"--source {source}: not vLLM's FlashInfer backend as 0.20.0-0.34.0 write it (the fix's "
                         "two route anchors are not there); nothing was changed") from None


def state(text: str, version: str, source: Path | None = None) -> str:
    """``applied`` (every edit's new text is there), ``needed`` (none is, and both anchors found), or
    ``partly applied (missing: ...)``, read from each edit's structure (``vfix.hunks``), never from a
    comment; one line why not where the anchors are not there."""
    s, missing = vfix.state(text)
    if s == "partly applied":
        return f"partly applied (missing: {', '.join(missing)})"
    if s == "needed":
        edit(text, version, source)  # one line if an anchor is missing
    return s


def edit_whole(text: str, version: str, source: Path | None, path: Path) -> str:
    """:func:`edit` of a file with none of the fix; a partly applied one is refused (one line), never
    edited again over its half nor called done."""
    s = state(text, version, source)
    if s.startswith("partly"):
        raise UsageError(f"{path}: --fix cap-route is {s}; nothing was changed: restore the original "
                         "(`swa-repro patch revert --vllm`, or reinstall vllm) and apply it again")
    return text if s == "applied" else edit(text, version, source)


def run(args) -> int:
    from swa_repro.engine.patching import (
        apply_in_place,
        check_outputs,
        check_paths,
        diff_or_copy,
        read_backend,
        revert_in_place,
    )

    check_outputs(args)
    name = vfix.check(args.fix or "cap-route")
    if args.reverse:
        raise UsageError("--reverse goes without --vllm: `swa-repro patch revert --vllm` restores a file patched in place")
    path, version = (args.source, "--source") if args.source else installed_backend()
    check_paths(args, path)
    if args.action == "revert":
        print(revert_in_place(path))
        return 0
    text = read_backend(path)
    if args.action == "status":
        print(f"{name}: {state(text, version, args.source)} ({path})")
        return 0
    label = f"--vllm --fix {name}"
    if args.in_place:
        revert = "swa-repro patch revert --vllm" + (f" --source {path}" if args.source else "")
        edit_whole(text, version, args.source, path)  # a partly applied file: one line before any backup check
        print(apply_in_place(path, edit=lambda t: edit_whole(t, version, args.source, path), label=label,
                             done=lambda t: state(t, version, args.source) == "applied", revert=revert))
        return 0
    new = edit_whole(text, version, args.source, path)
    return diff_or_copy(args, path, text, new, f"already has {label}", label)
