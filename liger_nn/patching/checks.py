"""What every patch-time check shares: the refusal it raises and the float32 agreement it demands."""

from __future__ import annotations

import torch
from torch import nn

# Float32 agreement the patch-time checks demand (fp32 kernel vs fp32 torch).
CHECK_RTOL = 1e-4


class Skip(Exception):
    """A candidate left alone; the message says why."""


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, both finite, and ``a`` within CHECK_RTOL of ``b`` in relative norm."""
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape or not torch.isfinite(a).all() or not torch.isfinite(b).all():
        return False
    return bool((a - b).norm() <= CHECK_RTOL * b.norm())


def check_agreement(original: nn.Module, drop_in: nn.Module, x: torch.Tensor, what: str) -> None:
    """Raise Skip unless ``drop_in(x)`` is close to ``original(x)`` (no grad); ``what`` names the drop-in."""
    with torch.no_grad():
        try:
            expected = original(x)
        except Exception as exc:
            raise Skip(f"patch-time check raised {type(exc).__name__}: {exc}") from None
        if not isinstance(expected, torch.Tensor) or not close(drop_in(x), expected):
            raise Skip(f"patch-time check: {what}'s output differs from this class's")
