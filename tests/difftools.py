"""Helpers shared by the sglang-patch tests (not a test module)."""

import difflib


def changed_lines(old, new):
    """Lines of ``old`` replaced/deleted and lines of ``new`` inserted, 1-based."""
    a, b = [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(),
                                                       autojunk=False).get_opcodes():
        if tag != "equal":
            a += range(i1 + 1, max(i2, i1 + 1) + 1)
            b += range(j1 + 1, max(j2, j1 + 1) + 1)
    return a, b
