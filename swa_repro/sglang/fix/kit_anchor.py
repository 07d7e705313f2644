"""Anchored text edits: the one way ``kit_edits`` and ``kit_tree`` change sglang's kit (an anchor that
is gone or not unique refuses, naming it: never a partial edit)."""

from __future__ import annotations


class KitEditError(RuntimeError):
    """An anchor is missing or not unique: this is not the kit the edits were written against."""


class Anchored:
    """``old`` -> ``new``, ``old`` exactly once in the region from the first ``after`` to the next
    ``before`` (both optional)."""

    def __init__(self, what: str, old: str, new: str, *, after: str | None = None, before: str | None = None):
        self.what, self.old, self.new, self.after, self.before = what, old, new, after, before

    def _region(self, text: str, path: str) -> tuple[int, int]:
        a = 0
        if self.after is not None:
            a = text.find(self.after)
            if a < 0:
                raise KitEditError(f"{path}: {self.what}: anchor {self.after!r} is gone")
        b = len(text)
        if self.before is not None:
            b = text.find(self.before, a)
            if b < 0:
                raise KitEditError(f"{path}: {self.what}: anchor {self.before!r} is gone")
        return a, b

    def state(self, text: str, path: str) -> str:
        """``needed`` / ``applied``; raises when neither the old nor the new text is there once."""
        a, b = self._region(text, path)
        region = text[a:b]
        old, new = region.count(self.old), region.count(self.new)
        if new == 1 and old == (1 if self.old in self.new else 0):
            return "applied"
        if new == 0 and old == 1:
            return "needed"
        raise KitEditError(f"{path}: {self.what}: anchor {self.old.strip().splitlines()[0]!r} "
                           f"{'is gone' if old == 0 else f'occurs {old} times'}")

    def apply(self, text: str, path: str) -> str:
        if self.state(text, path) == "applied":
            return text
        a, b = self._region(text, path)
        i = text.index(self.old, a, b)
        return text[:i] + self.new + text[i + len(self.old):]


def _lines(*ls: str) -> str:
    return "".join(ln + "\n" for ln in ls)
