"""``swa-repro audit --sglang X``: audit release X's own code, in a subprocess with X's overlay
(``provision``) first on ``sys.path``. One interpreter cannot hold two sglang releases, and the
installed one must stay untouched, so the child imports X's ``sglang``, checks that every loaded
``sglang.*`` module came from the overlay (never a module of another release), runs the audit as
that release ships (or a what-if) and hands the result back as JSON.

Child: ``python -m swa_repro.sglang.audit.release --overlay DIR --out FILE [--what-if W] [--paths P]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swa_repro.core.errors import UsageError


# ----------------------------------------------------------------------------- parent
def audit_release(version: str, *, what_if: str | None = None, paths=None, fixes=None, note=print) -> dict:
    """Provision release ``version`` and audit it in a child; its document (see :func:`child`).
    ``fixes``: audit the release with these ``swa-repro patch --fix`` fixes applied
    (``fix.overlay``). ``note``: where progress lines go (the first import of a release compiles
    it: a minute or more)."""
    from swa_repro.sglang.provision import provision

    overlay, info = provision(version)
    note(_provision_note(version, overlay, info))
    fixed = None
    if fixes:
        from swa_repro.sglang.fix.overlay import fixed_overlay

        overlay, fixed = fixed_overlay(version, fixes, overlay)
        note(f"sglang {version}: with --fix {','.join(fixes)} ({overlay})")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "audit.json"
        cmd = [sys.executable, "-m", "swa_repro.sglang.audit.release", "--overlay", str(overlay), "--out", str(out)]
        cmd += ["--what-if", what_if] if what_if else []
        cmd += ["--paths", ",".join(paths)] if paths else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parents[3]), *filter(None, [os.environ.get("PYTHONPATH")])]))
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0 or not out.is_file():
            last = [ln for ln in p.stderr.splitlines() if ln.strip()]
            raise UsageError(f"auditing sglang {version} failed: {last[-1] if last else f'exit {p.returncode}'}")
        doc = json.loads(out.read_text())
    doc["release"].update(overlay_info=info, child_seconds=round(time.monotonic() - t0, 1))
    if fixed:
        doc["release"]["fixes"] = fixed
    return doc


def _provision_note(version, overlay, info) -> str:
    how = "cached" if info["cached"] else f"installed in {info['install_seconds']} s"
    return (f"sglang {version}: overlay {overlay} ({how}); auditing it in a subprocess "
            "(the first import of a release compiles it: a minute or more)")


# ----------------------------------------------------------------------------- child
def foreign_modules(overlay: Path) -> list[str]:
    """Loaded ``sglang`` / ``sglang.*`` modules whose file is not under ``overlay``."""
    root = str(overlay.resolve())
    return sorted(k for k, m in list(sys.modules.items())
                  if (k == "sglang" or k.startswith("sglang.")) and getattr(m, "__file__", None)
                  and not str(Path(m.__file__).resolve()).startswith(root))


def child(overlay: Path, what_if: str | None, paths) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    t0 = time.monotonic()
    import sglang  # the overlay's: it is first on sys.path

    if foreign_modules(overlay):
        raise UsageError(f"sglang came from {sglang.__file__}, not from the overlay {overlay}")
    from swa_repro.sglang import releases
    from swa_repro.sglang.audit import core as audit

    releases.ensure_sgl_kernel()
    from swa_repro.sglang import harness

    harness.backend_module()
    t_import = time.monotonic() - t0
    result = audit.run_audit(what_if, paths=paths)
    bad = foreign_modules(overlay)
    if bad:
        raise UsageError(f"{len(bad)} sglang modules did not come from the overlay (e.g. {bad[0]})")
    import flashinfer  # noqa: F401  (the base venv's; only its import is needed)
    from importlib import metadata

    doc = result.to_dict()
    doc["release"].update(origin="overlay", overlay=str(overlay), import_seconds=round(t_import, 1),
                          audit_seconds=round(time.monotonic() - t0 - t_import, 1),
                          sglang_modules_from_overlay=sum(1 for k in sys.modules if k == "sglang"
                                                          or k.startswith("sglang.")),
                          base_flashinfer=metadata.version("flashinfer-python"),
                          base_torch=metadata.version("torch"))
    return doc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m swa_repro.sglang.audit.release")
    p.add_argument("--overlay", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--what-if", choices=("patched", "unpatched"))
    p.add_argument("--paths")
    a = p.parse_args(argv)
    overlay = a.overlay.resolve()
    sys.path.insert(0, str(overlay))  # before anything imports sglang
    try:
        doc = child(overlay, a.what_if, a.paths.split(",") if a.paths else None)
    except Exception as e:  # one line for the parent, never a traceback
        print(f"{type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 2
    a.out.write_text(json.dumps(doc, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
