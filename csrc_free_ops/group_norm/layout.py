"""The memory layouts GroupNorm reads in place, and the layout of what it
returns: the one contract the launch, the reference and the fake kernel
share.

x is viewed as (N, C, HW).  Two layouts are read without a copy:

* contiguous: channel c's HW positions adjacent;
* channels-last: x dense with the channels innermost, (N, *spatial, C) in
  storage -- ``torch.channels_last`` (4-D), ``torch.channels_last_3d``
  (5-D), or a (N, L, C) tensor transposed to (N, C, L).

y and dx come back in x's layout, as torch's CPU GroupNorm returns them
(its CUDA kernel returns them contiguous); any other x (a strided view) is copied to contiguous first,
and its y and dx are contiguous.  grad_out is read in place when it has
x's layout, else copied to it.  The NPU entries read channels-last x
through a contiguous copy and copy y and dx back (launch._npu_plan says
why); CUDA reads it in place.
"""

from __future__ import annotations

import torch


def dense_channels_last(t: torch.Tensor) -> bool:
    """t dense with its channels (dim 1) innermost."""
    return t.dim() >= 3 and t.movedim(1, -1).is_contiguous()


def channels_last(x: torch.Tensor) -> bool:
    """x is read channels-last: dense that way and not also contiguous (a
    tensor both are, C == 1 or HW == 1, is addressed the same either way)."""
    return not x.is_contiguous() and dense_channels_last(x)


def strides(x: torch.Tensor, is_channels_last: bool) -> tuple[int, int]:
    """(stride_c, stride_s): the element strides of a channel and of a
    spatial position in x's layout (kernels.py's contract)."""
    if is_channels_last:
        return 1, x.shape[1]
    return x.numel() // max(1, x.shape[0] * x.shape[1]), 1


def as_read(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(x in a layout the kernels read, whether that is channels-last)."""
    if x.is_contiguous():
        return x, False
    if dense_channels_last(x):
        return x, True
    return x.contiguous(), False


def like(t: torch.Tensor, is_channels_last: bool) -> torch.Tensor:
    """t in that layout (channels-last or contiguous): itself when it already is, else a copy."""
    if is_channels_last:
        return t if dense_channels_last(t) else t.movedim(1, -1).contiguous().movedim(-1, 1)
    return t if t.is_contiguous() else t.contiguous()


def empty_output(x: torch.Tensor) -> torch.Tensor:
    """An uninitialized tensor of x's shape and dtype in the layout the op
    returns for x (the fake kernel's output, and y and dx themselves)."""
    if channels_last(x):
        return torch.empty_like(x)  # x is dense: preserve_format keeps its strides
    return torch.empty_like(x, memory_format=torch.contiguous_format)
