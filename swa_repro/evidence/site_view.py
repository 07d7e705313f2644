"""A GPU machine's site-packages seen from here: the entries of this interpreter's that the machine
has, linked into a folder, so that an import it lacks fails here as it would there. Shared by
``sglang.device_image.device_view`` (the sglang bundle's check) and ``vllm.bundle_measure`` (the vLLM
bundle's import chain)."""

from __future__ import annotations

import importlib.metadata as md
import sysconfig
from pathlib import Path

from swa_repro.evidence.sglang_bundle import norm


def site_view(dest: Path, present, site_packages: Path | None = None, owned: dict | None = None) -> Path:
    """``dest`` holding a symbolic link to each entry of ``site_packages`` (default: this interpreter's)
    that a ``present`` distribution (normalized names) owns, or that no distribution owns, and none to
    the rest; ``owned``: top-level module -> its distributions, normalized (default: today's
    ``sys.path``'s)."""
    sp = Path(site_packages or sysconfig.get_paths()["purelib"])
    if owned is None:
        owned = {t: {norm(d) for d in ds} for t, ds in md.packages_distributions().items()}
    dest.mkdir(parents=True, exist_ok=True)
    for e in sp.iterdir():
        if e.suffix == ".pth" or e.name == "__pycache__":
            continue
        if e.suffix == ".dist-info":
            keep = norm(e.name.split("-")[0]) in present
        else:
            dists = owned.get(e.name.split(".")[0] if e.is_file() else e.name, set())
            keep = not dists or bool(dists & present)
        if keep:
            (dest / e.name).symlink_to(e)
    return dest
