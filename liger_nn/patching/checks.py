"""What every patch-time check shares: the refusal it raises and the float32 agreement it demands."""

from __future__ import annotations

import torch

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
