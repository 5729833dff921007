"""Allocating a prepared call's outputs (registrations/eager.py).

A prepared run's outputs have the same shape, strides, dtype and device on
every call, so the allocation can be fixed once: ``empty_maker(...)`` returns a
callable taking no arguments.  On CUDA it is the caching allocator's entry that
the code Inductor generates calls (``torch._C._dynamo.guards._empty_strided_cuda``:
no argument parsing, no dispatcher); it allocates on the *current* device, so a
prepared run must be called with its tensors' device current (``Calls.run_for``
makes it so).  Elsewhere, or on a torch without that entry, it is
``torch.empty_strided``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

try:
    from torch._C._dynamo.guards import _empty_strided_cuda as _CUDA_EMPTY
except ImportError:  # pragma: no cover - a torch without it allocates through the dispatcher
    _CUDA_EMPTY = None


def _contiguous_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def empty_maker(shape, dtype: torch.dtype, device: torch.device, stride=None) -> Callable[[], torch.Tensor]:
    """A callable returning a new uninitialized tensor of this shape and strides (contiguous ones when
    None), on ``device`` (the current one)."""
    shape = tuple(shape)
    stride = _contiguous_strides(shape) if stride is None else tuple(stride)
    if device.type == "cuda" and _CUDA_EMPTY is not None:
        return functools.partial(_CUDA_EMPTY, shape, stride, dtype)
    return functools.partial(torch.empty_strided, shape, stride, dtype=dtype, device=device)


def empty_like_maker(t: torch.Tensor, memory_format=torch.preserve_format) -> Callable[[], torch.Tensor]:
    """``empty_maker`` with the layout ``torch.empty_like(t, memory_format=...)`` gives."""
    sample = torch.empty_like(t, memory_format=memory_format)
    return empty_maker(sample.shape, sample.dtype, sample.device, sample.stride())
