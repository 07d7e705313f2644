"""``swa-repro audit --sglang X``: audit release X's own code, in a subprocess with X's overlay
(``provision``) first on ``sys.path`` (the parent/child plumbing: ``sglang.overlay_run``). The
child imports X's ``sglang``, checks that every loaded ``sglang.*`` module came from the overlay,
runs the audit as that release ships (or a what-if) and hands the result back as JSON.

Child: ``python -m swa_repro.sglang.audit.release --overlay DIR --out FILE [--what-if W] [--paths P]``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from swa_repro.engine.child import child_main, child_parser
from swa_repro.sglang.overlay_run import (check_no_foreign, import_release, overlay_for, run_child)


# ----------------------------------------------------------------------------- parent
def audit_release(version: str, *, what_if: str | None = None, paths=None, fixes=None, note=print) -> dict:
    """Provision release ``version`` and audit it in a child; its document (see :func:`child`).
    ``fixes``: audit the release with these ``swa-repro patch --fix`` fixes applied
    (``fix.overlay``). ``note``: where progress lines go (the first import of a release compiles
    it: a minute or more)."""
    overlay, info, fixed = overlay_for(version, fixes, note=note, doing="auditing it")
    args = (["--what-if", what_if] if what_if else []) + (["--paths", ",".join(paths)] if paths else [])
    doc, secs, how = run_child("swa_repro.sglang.audit.release", overlay, args, f"auditing sglang {version}")
    doc["release"].update(overlay_info=info, child_seconds=secs, result_cache=how)
    if fixed:
        doc["release"]["fixes"] = fixed
    return doc


# ----------------------------------------------------------------------------- child
def child(overlay: Path, what_if: str | None, paths) -> dict:
    t0 = time.monotonic()
    import_release(overlay)
    from swa_repro.sglang import harness
    from swa_repro.sglang.audit import core as audit

    harness.backend_module()
    t_import = time.monotonic() - t0
    result = audit.run_audit(what_if, paths=paths)
    n = check_no_foreign(overlay)
    import flashinfer  # noqa: F401  (the base venv's; only its import is needed)
    from importlib import metadata

    doc = result.to_dict()
    doc["release"].update(origin="overlay", overlay=str(overlay), import_seconds=round(t_import, 1),
                          audit_seconds=round(time.monotonic() - t0 - t_import, 1),
                          sglang_modules_from_overlay=n,
                          base_flashinfer=metadata.version("flashinfer-python"),
                          base_torch=metadata.version("torch"))
    return doc


def main(argv=None) -> int:
    p = child_parser("swa_repro.sglang.audit.release")
    p.add_argument("--what-if", choices=("patched", "unpatched"))
    p.add_argument("--paths")
    return child_main(p, lambda overlay, a: child(overlay, a.what_if, a.paths.split(",") if a.paths else None),
                      argv)


if __name__ == "__main__":
    sys.exit(main())
