"""The errors users see. Each message says what to change; the CLI prints it as one line, exit 2.

They live at the bottom layer so every module can raise them without importing the CLI.
"""

from __future__ import annotations


class CaseError(ValueError):
    """An invalid :class:`~swa_repro.core.case.Case`: the message says which field to change."""


class UsageError(Exception):
    """Bad input outside a Case: the message says what to do."""
