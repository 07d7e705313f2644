"""A release's files as an *overlay*: where the cache keeps one and the command that installs into one.

Both engines audit a release from its files put first on ``sys.path`` of this venv in a child
(``engine.child``): sglang's wheel installed with ``--no-deps --target`` (``sglang.provision``),
vLLM's Python files unpacked and its few pure-Python dependencies installed the same way
(``vllm.provision``). uv next to this interpreter (or on PATH) hard-links from its download cache:
1-4 s a release against minutes for an environment (issue 9).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def release_overlay(project: str, version: str) -> Path:
    """Where the cache keeps ``project``'s release overlay: one place for the folder provisioning
    fills (``sglang.provision.overlay_dir``) and the one a copy's bytecode is read from (``bytecode``)."""
    from swa_repro.core.cache import cache_root

    return cache_root() / project / version


def install_command(target: Path) -> list[str]:
    """``pip install --no-deps --target target`` by uv next to this interpreter or on PATH, else
    ``python -m pip``; the caller appends the requirements."""
    uv = Path(sys.executable).with_name("uv")
    uv = str(uv) if uv.is_file() else shutil.which("uv")
    if uv:
        return [uv, "pip", "install", "--python", sys.executable, "--no-deps", "--target", str(target)]
    return [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target)]
