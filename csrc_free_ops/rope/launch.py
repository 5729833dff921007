"""Launcher helpers shared by the CUDA and NPU rotary launchers: problem
sizes, the kernel's runtime arguments, and tile widths along head_dim."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from csrc_free_ops.host_math import next_pow2
from csrc_free_ops.launcher import scalar_specialization

# Layouts whose kernel scalars are kept (a bound on the cache's memory).
MAX_LAYOUTS = 1024


class Problem(NamedTuple):
    batch: int
    seq_len: int
    n_qh: int
    n_kh: int
    head_dim: int
    rot_dim: int

    @property
    def rows(self) -> int:
        return self.batch * self.seq_len

    @property
    def empty(self) -> bool:
        return self.rows == 0 or self.n_qh + self.n_kh == 0


def problem(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> Problem:
    batch, n_qh, seq_len, head_dim = q.shape
    return Problem(batch, seq_len, n_qh, k.shape[1], head_dim, cos.shape[-1])


def table_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, seq, col) strides of cos/sin; batch stride 0 when shared by the batch."""
    if t.dim() == 2:
        return 0, t.stride(0), t.stride(1)
    return (0 if t.shape[0] == 1 else t.stride(0)), t.stride(1), t.stride(2)


def block_half(p: Problem) -> int:
    return next_pow2(p.rot_dim // 2)


def block_pass(p: Problem) -> int:
    """Tile width of the pass-through dims (1 when the whole head rotates)."""
    return next_pow2(max(1, p.head_dim - p.rot_dim))


def kernel_scalars(p: Problem, q: Tensor, k: Tensor, qo: Tensor, ko: Tensor, cos: Tensor, sin: Tensor) -> tuple:
    """The row kernels' runtime arguments after the six tensors, in order (p: the problem of q, k, cos)."""
    return (
        p.seq_len, p.n_qh, p.n_kh, p.rot_dim // 2, p.rot_dim, p.head_dim,
        *q.stride(), *qo.stride(), *k.stride(), *ko.stride(),
        *table_strides(cos), *table_strides(sin),
    )  # fmt: skip


class Layout(NamedTuple):
    """A call's problem and kernel scalars, with the scalars' Triton specialization."""

    p: Problem
    scalars: tuple
    scalar_key: int


_LAYOUTS: dict[tuple, Layout] = {}


def layout(q: Tensor, k: Tensor, qo: Tensor, ko: Tensor, cos: Tensor, sin: Tensor) -> Layout:
    """The Layout of these tensors, cached by the shapes and strides it is
    made from (training repeats them call after call)."""
    key = (q.shape, q.stride(), k.shape, k.stride(), qo.stride(), ko.stride(),
           cos.shape, cos.stride(), sin.shape, sin.stride())  # fmt: skip
    found = _LAYOUTS.get(key)
    if found is None:
        if len(_LAYOUTS) >= MAX_LAYOUTS:
            _LAYOUTS.clear()
        p = problem(q, k, cos)
        scalars = kernel_scalars(p, q, k, qo, ko, cos, sin)
        found = _LAYOUTS[key] = Layout(p, scalars, scalar_specialization(scalars))
    return found


def rotator(launch_rows: Callable[..., None]) -> Callable[..., None]:
    """A backend's ``rotate_into`` from its ``launch_rows(layout, tensors,
    element_size, *, backward, copy_pass)``, which launches the row kernel on
    ``(*tensors, *layout.scalars)`` (the problem ``layout.p`` is never empty)."""

    def rotate_into(q: Tensor, k: Tensor, qo: Tensor, ko: Tensor, cos: Tensor, sin: Tensor, *, backward: bool,
                    copy_pass: bool) -> None:  # fmt: skip
        """Write the rotation of q, k into qo, ko (which may be q, k); copy_pass copies dims R..D."""
        lay = layout(q, k, qo, ko, cos, sin)
        if not lay.p.empty:
            tensors = (q, k, qo, ko, cos, sin)
            launch_rows(lay, tensors, q.element_size(), backward=backward, copy_pass=copy_pass)

    return rotate_into


def rotated(
    launch_fn: Callable[..., None],
    x: torch.Tensor,
    y: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    backward: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-place rotation of x and y by a backend's launch_fn; outputs keep each input's layout."""
    xo = torch.empty_like(x)
    yo = torch.empty_like(y)
    launch_fn(x, y, xo, yo, cos, sin, backward=backward, copy_pass=cos.shape[-1] < x.shape[-1])
    return xo, yo


class EntryPoints(NamedTuple):
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    forward_: Callable[..., None]


def entry_points(launch_fn: Callable[..., None]) -> EntryPoints:
    """A backend's forward (rope), backward (rope_backward, the inverse
    rotation) and in-place forward (rope_) from its launch function."""

    def forward(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return rotated(launch_fn, q, k, cos, sin, backward=False)

    def backward(dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return rotated(launch_fn, dq, dk, cos, sin, backward=True)

    def forward_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        launch_fn(q, k, q, k, cos, sin, backward=False, copy_pass=False)

    return EntryPoints(forward, backward, forward_)
