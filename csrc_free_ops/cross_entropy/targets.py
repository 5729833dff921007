"""Bad targets (outside [0, classes) and not ignore_index) raise a ValueError
naming them, checked around the op's launches instead of before them.

A check before the launches would make the host wait for the device to
finish everything queued ahead of the loss, then leave the device idle while
the host enqueued the loss's own work: in a training step the loss's
chunk walk is dozens of launches, so its whole host time would show in the
step.  ``checked_targets`` launches the comparison and its reduction first
and copies their one-value result to the host without waiting; the block
launches the op's kernels; on leaving it the host waits for that copy alone
(on CUDA an event recorded after it, which the device reaches before the
op's kernels) and raises if a target was bad.  The kernels never read out of
bounds on a bad target (its row is NaN, cross_entropy/kernels.py), so the
work launched before the raise is harmless, and nothing it computed is
returned.  Where no read can happen (while torch.compile traces the
launches, during CUDA graph capture) the check is skipped.
"""

from __future__ import annotations

import torch

from csrc_free_ops import launcher


class checked_targets:  # noqa: N801  (a context manager, named for its block)
    """``with checked_targets(op, target, n_classes, ignore_index): <launch the op>``."""

    __slots__ = ("op", "target", "n_classes", "ignore_index", "flag", "event")

    def __init__(self, op: str, target: torch.Tensor, n_classes: int, ignore_index: int) -> None:
        self.op, self.target, self.n_classes, self.ignore_index = op, target, n_classes, ignore_index
        self.flag: torch.Tensor | None = None
        self.event: torch.cuda.Event | None = None

    def __enter__(self) -> checked_targets:
        target = self.target
        if launcher.tracing() or target.numel() == 0:
            return self
        if target.is_cuda and torch.cuda.is_current_stream_capturing():
            return self
        any_bad = _bad(target, self.n_classes, self.ignore_index).any()
        if target.is_cuda:  # pinned and asynchronous: the host reads it once the device has written it
            self.flag = any_bad.to("cpu", non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(target.device))
        else:
            self.flag = any_bad
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None or self.flag is None:
            return False
        if self.event is not None:
            self.event.synchronize()
        if self.flag.item():
            _raise(self.op, self.target, self.n_classes, self.ignore_index)
        return False


def check_targets(op: str, target: torch.Tensor, n_classes: int, ignore_index: int) -> None:
    """The check at once, for what cannot run on bad targets (the references index with them)."""
    with checked_targets(op, target, n_classes, ignore_index):
        pass


def _bad(target: torch.Tensor, n_classes: int, ignore_index: int) -> torch.Tensor:
    return (target != ignore_index) & ((target < 0) | (target >= n_classes))


def _raise(op: str, target: torch.Tensor, n_classes: int, ignore_index: int) -> None:
    bad = _bad(target, n_classes, ignore_index)
    values = target[bad][:5].tolist()
    raise ValueError(
        f"{op}: target holds {values} (first of {int(bad.sum())} bad), outside [0, {n_classes}) and not "
        f"ignore_index={ignore_index}"
    )
