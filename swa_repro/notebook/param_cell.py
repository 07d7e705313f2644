"""The cell right after a notebook's ``parameters`` cell: every parameter checked, in the notebook's
own words, before anything is computed or saved.

``swa-repro run -p`` checks its values before papermill starts (``params.check_parameters``); a
user who edits the parameters cell in the lab bypasses that. Issue #42 saw ``model =
"google/gemma-2-9b-it"`` in 07 fail four cells in, after the set's folder was written, and 03 run 17
cells before ``fixes = "bogus_fix"`` failed. :func:`check` runs the same checks (it calls
``check_parameters``, so a value the CLI refuses is refused here too), plus the mode, the output
folder and the cases the shape parameters make (``core.case``'s own checks), and raises one
:class:`ParameterError`: the cell fails, so papermill and the lab's Run All stop there (the kernel
aborts the queued cells), and ``artifact_set`` calls it too, so a bad set of parameters never gets
a folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from swa_repro.core.errors import CaseError, UsageError
from swa_repro.notebook.places import NOTEBOOKS_DIR, RESERVED, output_path


class ParameterError(UsageError):
    """A bad value in a notebook's parameters cell. IPython shows ``_render_traceback_`` in place of
    the traceback (``InteractiveShell.showtraceback``), so the lab and papermill's output get this
    one line; the cell still fails."""

    def _render_traceback_(self) -> list[str]:
        return [f"ParameterError: {self}"]


SEED = ("prefix_lens", "extend_lens", "window_left", "num_qo_heads", "num_kv_heads", "head_dim", "page_size")


def _seed(ns: dict):
    from swa_repro.notebook import story

    extra = {"backend": ns["backend"]} if "backend" in ns else {}
    return story.seed_case(**{k: ns.get(k) for k in SEED}, **extra)


def _tiles(ns: dict):  # notebook 01's multi-tile case (its cell 'bug.with_(name="tiles_bug", ...)')
    return _seed(ns).with_(prefix_lens=tuple(ns["tile_prefix_lens"]), extend_lens=tuple(ns["tile_extend_lens"]),
                           window_left=ns["tile_window_left"], num_qo_heads=ns["tile_num_qo_heads"],
                           num_kv_heads=ns["tile_num_kv_heads"])


def _split(ns: dict):  # notebook 01's split-KV case
    return _seed(ns).with_(prefix_lens=(ns["split_prefix"],), extend_lens=(ns["split_extend"],),
                           window_left=ns["split_window_left"])


def _gqa(ns: dict):  # notebook 02's GQA case
    from swa_repro.notebook import story

    return story.gqa_case(num_qo_heads=ns["gqa_num_qo_heads"], num_kv_heads=ns["gqa_num_kv_heads"],
                          prefix=ns["gqa_prefix"], extend=ns["gqa_extend"], window=ns["gqa_window_left"],
                          head_dim=ns.get("head_dim"), page_size=ns.get("page_size"))


def _long(ns: dict):  # notebook 02's long request
    from swa_repro.notebook import story

    return story.long_case(extend=ns["long_extend"], window=ns["long_window_left"], num_qo_heads=ns.get("num_qo_heads"),
                           num_kv_heads=ns.get("num_kv_heads"), head_dim=ns.get("head_dim"),
                           page_size=ns.get("page_size"))


# (what the case is called, the parameter that says a notebook makes it, how): built as the notebook
# builds it, so a shape the case refuses (heads not divisible, a window past the KV) stops here
CASES = (("the seed case", "extend_lens", _seed), ("the multi-tile case", "tile_extend_lens", _tiles),
         ("the split-KV case", "split_extend", _split), ("the GQA case", "gqa_extend", _gqa),
         ("the long case", "long_extend", _long))


def notebook_file(notebook: str) -> Path | None:
    """The copy of ``notebook`` the kernel runs (its cwd: the lab's scratch/, or where ``swa-repro
    run`` ran it from), else the repo's; None if neither is there."""
    return next((p for p in (Path.cwd() / f"{notebook}.py", NOTEBOOKS_DIR / f"{notebook}.py") if p.is_file()), None)


def check(notebook: str, ns: dict) -> bool:
    """Every parameter of ``notebook``'s parameters cell, with its value in ``ns`` (the notebook's
    ``globals()``): True, or one :class:`ParameterError` naming the first bad one as the cell writes it."""
    from swa_repro.notebook.params import notebook_parameters

    path = notebook_file(notebook)
    names = list((notebook_parameters(path) if path else None) or {})
    for name in ("mode", "output_dir"):
        if name in ns and name not in names:
            names.insert(0, name)
    for name in names:
        if name in ns:
            _check_one(name, ns[name], path)
    for what, marker, build in CASES:
        if marker in names:
            try:
                build(ns)
            except (CaseError, UsageError, TypeError) as e:
                raise ParameterError(f"{what} of these parameters: {e}; change them in the parameters cell") from None
    return True


def _shown(name: str, value) -> str:
    text = repr(value)
    return f"{name} = {text if len(text) <= 60 else text[:57] + '...'}"


def _check_one(name: str, value, path: Path | None) -> None:
    from swa_repro.core.mode import MODES
    from swa_repro.core.outputs import out_dir
    from swa_repro.notebook.params import check_parameters

    try:
        if name == "output_dir":  # a Path once artifact_set has run: the cell run again alone
            if not isinstance(value, (str, Path)):
                raise UsageError("give a folder as a string")
            out_dir(output_path(value), "output_dir")
            return
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise UsageError(f"a {type(value).__name__} is not a parameter value; give numbers, strings, lists, "
                             "True, False or None") from None
        if name == "mode" and value not in MODES:
            raise UsageError(f"choose one of {', '.join(MODES)}")
        if name not in RESERVED and path is not None:
            check_parameters({name: value}, [path])
    except UsageError as e:
        raise ParameterError(f"{_shown(name, value)}: {_reason(name, value, str(e), path)}; "
                             "change it in the parameters cell") from None


def _reason(name: str, value, msg: str, path: Path | None) -> str:
    """``check_parameters``' line without its command-line framing (``--parameters NAME=VALUE:``,
    ``notebook NN``): what is wrong with the value, as the cell shows it."""
    from swa_repro.notebook.params import _short

    stem = path.stem if path else ""
    try:
        given = f"--parameters {name}={_short(json.dumps(value))}: "
    except (TypeError, ValueError):  # not JSON: _check_one's own line
        given = ""
    for prefix in (given, f"--parameters {name}: notebook {stem} ", f"--parameters {name}: "):
        msg = msg.removeprefix(prefix)
    m = re.fullmatch(r"expects (.*?); got .*? \(([^()]*)\)(; its parameters: .*)?", msg)
    if m:
        want, why = m[1], m[2]
        return "choose " + why.removeprefix("not ") if why.startswith("not one of") else f"{why}; it takes {want}"
    return msg
