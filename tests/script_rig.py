"""A GPU-step script (scripts/gpu_*.sh) run on a CPU: a scratch repo holding the script and
lib_gpu.sh, stand-in bundles and a stand-in python that appends what it is asked to do, with a
timestamp, to an events file (the tests' evidence of order and concurrency)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

from conftest import REPO


def script_rig(tmp_path, script: str, bundles: dict, mock_py: str, sites: dict):
    """-> ``run(*steps, **env) -> (completed process, OUT folder, events)``; ``bundles``: folder name
    -> its install.sh body; ``sites``: env name -> path (``SITE``, ``SITE_FIXED``)."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for f in (script, "lib_gpu.sh"):
        shutil.copy(REPO / "scripts" / f, repo / "scripts")
    for b, body in bundles.items():
        (repo / ".bundle" / b).mkdir(parents=True)
        (repo / ".bundle" / b / "install.sh").write_text(body)
    py = tmp_path / "python3"
    py.write_text(mock_py)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)

    def run(*steps, **env):
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        (tmp_path / "events").unlink(missing_ok=True)
        e = {**os.environ, "PYTHON": str(py), "OUT": str(out), "EVENTS": str(tmp_path / "events"),
             **{k: str(v) for k, v in sites.items()}, **{k: str(v) for k, v in env.items()}}
        r = subprocess.run(["bash", f"scripts/{script}", *steps], cwd=repo, env=e, capture_output=True, text=True,
                           timeout=60, check=False)
        events = (tmp_path / "events").read_text().splitlines() if (tmp_path / "events").exists() else []
        return r, out, events
    run.repo = repo
    return run
