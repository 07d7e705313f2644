"""Checks that notebook cells assert through, so a wrong result fails the papermill run.

``Checks(notebook, output_dir)`` records every ``expect`` as PASS/FAIL, prints it, and rewrites
``<output_dir>/<notebook>.checks.json`` after each one (so a notebook that crashes half-way still
leaves what it checked). ``close()`` raises ``AssertionError`` naming every failure; ``swa-repro
run`` reads the JSON back into ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from swa_repro.core.outputs import write_atomic
from swa_repro.notebook.artifacts import run_id_for  # the run whose artifact set this folder is, if any


def jsonable(x, max_items: int = 64):
    """Details as JSON: numpy/torch scalars -> Python, small arrays -> lists, dataclasses -> dicts,
    the rest -> repr."""
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v, max_items) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):  # a typed row: its fields by name
        return jsonable({f.name: getattr(x, f.name) for f in dataclasses.fields(x)}, max_items)
    if isinstance(x, (list, tuple)):
        return [jsonable(v, max_items) for v in x[:max_items]] + (["..."] if len(x) > max_items else [])
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    if hasattr(x, "tolist") and hasattr(x, "size"):  # numpy array or scalar
        if getattr(x, "size", 0) <= max_items:
            return jsonable(x.tolist(), max_items)
        return f"<array shape={tuple(x.shape)} dtype={x.dtype}>"
    return repr(x)


class Checks:
    def __init__(self, notebook: str, output_dir):
        if not notebook or "/" in notebook or "\\" in notebook:
            raise ValueError(f"notebook must be a bare name like '02_masks_and_cta_skips'; got {notebook!r}")
        self.notebook = notebook
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.output_dir / f"{notebook}.checks.json"
        self.items: list[dict] = []
        self.closed = False
        self._write()  # a stale file from an earlier run must not survive this one

    @property
    def passed(self) -> int:
        return sum(it["ok"] for it in self.items)

    @property
    def failed(self) -> int:
        return len(self.items) - self.passed

    def expect(self, cond, what: str, **details) -> bool:
        """Record one check; ``cond`` may be a Python, numpy or 0-d torch bool. Returns it as bool."""
        ok = bool(cond)
        self.items.append({"ok": ok, "what": what, "details": jsonable(details)})
        extra = "" if ok or not details else "  " + ", ".join(f"{k}={v!r}" for k, v in details.items())
        print(f"{'PASS' if ok else 'FAIL'} {what}{extra}")
        self._write()
        return ok

    def close(self) -> None:
        """Write the final JSON; raise AssertionError listing every failed check."""
        self.closed = True
        self._write()
        print(f"{self.notebook}: {self.passed} passed, {self.failed} failed")
        if self.failed:
            bad = "; ".join(it["what"] for it in self.items if not it["ok"])
            raise AssertionError(f"{self.failed} of {len(self.items)} checks failed in {self.notebook}: {bad}")

    def _write(self) -> None:
        doc = {"notebook": self.notebook, "run_id": run_id_for(self.output_dir), "passed": self.passed,
               "failed": self.failed, "closed": self.closed, "items": self.items}
        write_atomic(self.path, (json.dumps(doc, indent=1) + "\n").encode())

    def __enter__(self) -> "Checks":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # keep the original error; still leave the record behind
            self.closed = True
            self._write()


def read_checks(output_dir, notebook: str) -> dict | None:
    """The checks JSON a notebook left, or None if it made no Checks."""
    p = Path(output_dir) / f"{notebook}.checks.json"
    if not p.exists():
        return None
    return json.loads(p.read_text())
