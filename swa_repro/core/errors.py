"""The errors users see. Each message says what to change; the CLI prints it as one line, exit 2.

They live at the bottom layer so every module can raise them without importing the CLI.
"""

from __future__ import annotations


class CaseError(ValueError):
    """An invalid :class:`~swa_repro.core.case.Case`: the message says which field to change."""


class UsageError(Exception):
    """Bad input outside a Case: the message says what to do."""


def check_bounds(rows) -> None:
    """Each ``(flag, value, lowest, highest)`` of a command's numbers, checked before any work: a
    value outside (NaN too; None = not given) is one line. The highest keeps a run finite and every
    number inside the int32/int64 it is handed to, so no OverflowError can escape."""
    for flag, value, lo, hi in rows:
        if value is not None and not lo <= value <= hi:
            raise UsageError(f"{flag} must be in {lo}..{hi}; got {value}")
