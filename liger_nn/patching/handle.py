"""The handle apply_liger_ops returns: the report, and what undoes each swap."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from liger_nn.patching.report import PatchReport


class LigerPatch:
    """The handle apply_liger_ops returns: ``report``, ``remove()``, and a
    context manager that removes the patch on exit."""

    def __init__(self, model: nn.Module, report: PatchReport) -> None:
        self.model = model
        self.report = report
        self._undo: list[Callable[[], None]] = []
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def on_remove(self, undo: Callable[[], None]) -> None:
        """What remove() runs to undo one swap just made (the last registered runs first)."""
        self._undo.append(undo)

    def remove(self) -> None:
        """Put the original modules back (with the parameters the replacements
        hold now) and release this patch's share of the rotary swaps.  Idempotent."""
        if not self._active:
            return
        self._active = False
        for undo in reversed(self._undo):
            undo()

    def __enter__(self) -> LigerPatch:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "active" if self._active else "removed"
        return f"LigerPatch({state}, {len(self.report.replaced)} replaced, {len(self.report.left_alone)} left alone)"
