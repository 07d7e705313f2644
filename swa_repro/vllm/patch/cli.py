"""``swa-repro patch status|diff|apply|revert --vllm [--fix cap-route]``: vLLM's soft-cap fix
(``vllm.fix.fixes``) on the installed vLLM's two files it edits, the FlashInfer backend and
``vllm/utils/flashinfer.py`` (where the rule lives: ``vllm.fix.flashinfer_utils``), or ``--source FILE``: a
backend file inside a vLLM tree, whose ``vllm/utils/flashinfer.py`` is edited with it. The command is
sglang's (``sglang.patch.cli``, registered first by ``cli.COMMANDS``) plus ``--vllm``, as ``vllm.audit.cli``
adds it to ``audit``; without ``--vllm`` nothing changes.

The same safety as the sglang patch (``engine.patching``): ``apply --in-place`` keeps a sha256-checked
backup beside each file and ``revert`` restores it byte for byte; a file that is neither the original
nor swa-repro's patch is left alone. Both files are checked before either is written, and a second
write that fails restores the first. ``apply --out`` (one patched copy) is refused: the fix is two
files (use ``diff``, or ``--in-place``).
The installed file is found without importing vLLM (its import needs CUDA extensions).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.vllm.fix import fixes as vfix
from swa_repro.vllm.fix import flashinfer_utils as fix_utils
from swa_repro.vllm.provision import BACKEND

UTILS = fix_utils.UTILS


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


def utils_of(backend: Path, source: Path | None) -> Path:
    """The ``vllm/utils/flashinfer.py`` of the tree ``backend`` is in (``vllm/v1/attention/backends/``);
    one line if there is none."""
    utils = backend.parents[3] / "utils" / "flashinfer.py" if len(backend.parents) > 3 else None
    if utils is None or not utils.is_file():
        where = f"--source {source}" if source else str(backend)
        raise UsageError(f"{where}: no vllm/utils/flashinfer.py beside it (at ../../../utils/); the fix edits both "
                         "files, so give the backend file inside its vLLM tree; nothing was changed")
    return utils


def _editors(version: str, source: Path | None):
    def edit(rel):
        def run(text: str) -> str:
            try:
                return (vfix.edit if rel == BACKEND else fix_utils.edit)(text, version)
            except UsageError:
                if source is None:
                    raise
                raise UsageError(f"--source {source}: not vLLM's FlashInfer backend and utils as 0.20.0-0.34.0 write "
                                 f"them ({rel}: the fix's anchors are not there); nothing was changed") from None
        return run
    return {BACKEND: edit(BACKEND), UTILS: edit(UTILS)}


def state(texts: dict[str, str], version: str, source: Path | None = None) -> str:
    """``applied`` (every edit's new text is there, in both files), ``needed`` (none is, and every
    anchor found), or ``partly applied (missing: ...)``, read from each edit's structure
    (``vfix.hunks``, ``fix_utils.hunks``), never from a comment; one line why not where an anchor is
    not there."""
    h = {**fix_utils.hunks(texts[UTILS]), **vfix.hunks(texts[BACKEND])}
    missing = [k for k, ok in h.items() if not ok]
    if h and not missing:
        return "applied"
    if len(missing) != len(h):
        return f"partly applied (missing: {', '.join(missing)})"
    for rel, fn in _editors(version, source).items():
        fn(texts[rel])  # one line if an anchor is missing
    return "needed"


def edit_whole(texts: dict[str, str], version: str, source: Path | None, where: str) -> dict[str, str]:
    """Both files with the fix; a partly applied pair is refused (one line), never edited again over
    its half nor called done."""
    s = state(texts, version, source)
    if s.startswith("partly"):
        raise UsageError(f"{where}: --fix cap-route is {s}; nothing was changed: restore the originals "
                         "(`swa-repro patch revert --vllm`, or reinstall vllm) and apply it again")
    if s == "applied":
        return dict(texts)
    return {rel: fn(texts[rel]) for rel, fn in _editors(version, source).items()}


def run(args) -> int:
    from swa_repro.engine.patching import check_outputs, check_paths, read_backend, unified_diff

    check_outputs(args)
    name = vfix.check(args.fix or "cap-route")
    if args.reverse:
        raise UsageError("--reverse goes without --vllm: `swa-repro patch revert --vllm` restores a file patched in place")
    if args.out:
        raise UsageError("--out with --vllm: the fix edits two files (the backend and vllm/utils/flashinfer.py); "
                         "use `patch diff --vllm` for a patch of both, or `apply --in-place`")
    backend, version = (args.source, "--source") if args.source else installed_backend()
    check_paths(args, backend)
    first = read_backend(backend) if args.action != "revert" else None  # a device, pipe or huge file: one line
    paths = {BACKEND: backend, UTILS: utils_of(backend, args.source)}
    if args.action == "revert":
        return _revert(paths)
    texts = {BACKEND: first, UTILS: read_backend(paths[UTILS])}
    if args.action == "status":
        print(f"{name}: {state(texts, version, args.source)} ({backend}, {paths[UTILS]})")
        return 0
    new = edit_whole(texts, version, args.source, str(backend))
    if args.in_place:
        return _apply(paths, texts, new, version, args.source, name)
    if new == texts:
        print(f"swa-repro patch: {backend} already has --vllm --fix {name}; nothing to do", file=sys.stderr)
        return 0
    sys.stdout.write("".join(unified_diff(texts[rel], new[rel], str(p).lstrip("/")) for rel, p in paths.items()))
    if args.action == "apply":
        raise UsageError("nothing written: choose `--in-place` (patch both files, each with a backup)")
    return 0


def _apply(paths: dict, texts: dict, new: dict, version: str, source, name: str) -> int:
    """Each file in place with its own backup (``engine.patching.apply_in_place``); where the
    second fails, the first is restored, so the pair is never left half fixed."""
    from swa_repro.engine.patching import apply_in_place, revert_in_place

    revert = "swa-repro patch revert --vllm" + (f" --source {paths[BACKEND]}" if source else "")
    done = []
    try:
        for rel in (UTILS, BACKEND):
            print(apply_in_place(paths[rel], edit=lambda t, rel=rel: new[rel] if t == texts[rel] else t,
                                 label=f"--vllm --fix {name}", done=lambda t, rel=rel: t == new[rel], revert=revert))
            done.append(rel)
    except UsageError:
        for rel in done:
            if paths[rel].read_text() != texts[rel]:
                revert_in_place(paths[rel])
        raise
    return 0


def _revert(paths: dict) -> int:
    """Both files restored from their backups (one without a backup is left as it is: said so)."""
    from swa_repro.core.outputs import backup_paths
    from swa_repro.engine.patching import revert_in_place

    have = [rel for rel, p in paths.items() if backup_paths(p)[1].exists()]
    if not have:
        raise UsageError(f"no swa-repro backup next to {paths[BACKEND]} or {paths[UTILS]}; nothing to revert")
    for rel in have:
        print(revert_in_place(paths[rel]))
    return 0
