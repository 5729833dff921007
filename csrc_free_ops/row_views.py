"""Tensors seen as rows of their last dim, as the row kernels read them (poly_norm's and the
row norms' launch sequences share these)."""

from __future__ import annotations

import torch


def sizes(x: torch.Tensor) -> tuple[int, int]:
    """(rows, columns) of x seen as rows of its last dim."""
    n_cols = x.shape[-1]
    return x.numel() // n_cols, n_cols


def rows(t: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """t viewed as (rows, last dim): the tensor the kernel reads and its row and column strides."""
    if t.is_contiguous():
        return t, t.shape[-1], 1
    t2d = t.reshape(-1, t.shape[-1])
    return t2d, t2d.stride(0), t2d.stride(1)


def output_like(x: torch.Tensor, contiguous: bool) -> torch.Tensor:
    """A contiguous tensor of x's shape and dtype (empty_like is the cheaper call on the host)."""
    return torch.empty_like(x) if contiguous else torch.empty(x.shape, dtype=x.dtype, device=x.device)
