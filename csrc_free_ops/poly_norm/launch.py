"""The PolyNorm launch sequence, shared by the CUDA and NPU launchers: they
differ only in the Plan (kernel choice, tile, grid, launch options)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

from csrc_free_ops.host_math import cdiv
from csrc_free_ops.launcher import Launcher
from csrc_free_ops.poly_norm import kernels, param_grads


class Plan(NamedTuple):
    whole_rows: bool  # tile kernel (BLOCK_M whole rows) or the column-blocked kernel
    block_m: int
    block_n: int
    programs: int
    options: tuple[tuple[str, int], ...]  # extra launch options (num_warps on CUDA; none on the NPU)
    loop_stages: int | None = None  # pipelining depth of the backward row loop (None: the compiler's default)


# (n_rows, n_cols, element size, backward) -> Plan
Planner = Callable[[int, int, int, bool], Plan]


@functools.lru_cache(maxsize=256)
def _launcher(
    backward: bool, whole_rows: bool, block_m: int, block_n: int, options: tuple, loop_stages, grid_stride: bool
) -> Launcher:
    if not whole_rows:
        kernel = kernels.bwd_blocked_kernel if backward else kernels.fwd_blocked_kernel
        return Launcher(kernel, BLOCK_N=block_n, **dict(options))
    if backward:
        return Launcher(
            kernels.bwd_tile_kernel, BLOCK_M=block_m, BLOCK_N=block_n, LOOP_STAGES=loop_stages, **dict(options)
        )
    return Launcher(kernels.fwd_tile_kernel, BLOCK_M=block_m, BLOCK_N=block_n, GRID_STRIDE=grid_stride, **dict(options))


def walks_row_blocks(p: Plan, n_rows: int) -> bool:
    """Whether the forward tile kernel's programs must loop over row blocks
    (fewer programs than blocks); with one program per block it runs
    loop-free."""
    return p.programs < cdiv(n_rows, p.block_m)


def _launch(p: Plan, backward: bool, *args, grid_stride: bool = True) -> None:
    _launcher(backward, p.whole_rows, p.block_m, p.block_n, p.options, p.loop_stages, grid_stride)(p.programs, *args)


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """t viewed as (rows, last dim): the tensor the kernel reads and its row and column strides."""
    if t.is_contiguous():
        return t, t.shape[-1], 1
    t2d = t.reshape(-1, t.shape[-1])
    return t2d, t2d.stride(0), t2d.stride(1)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, planner: Planner) -> torch.Tensor:
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return y
    p = planner(n_rows, n_cols, x.element_size(), False)
    src, stride_row, stride_col = _rows(x)
    args = (src, _contiguous(weight), bias, y, stride_row, stride_col, n_cols, n_rows, n_cols, eps)
    _launch(p, False, *args, grid_stride=walks_row_blocks(p, n_rows))
    return y


def backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, planner: Planner
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight (3,), dbias (1,)); dweight and dbias in weight's dtype."""
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if n_rows == 0:
        zeros = torch.zeros(4, dtype=weight.dtype, device=x.device)
        return dx, zeros[:3].clone(), zeros[3:].clone()
    p = planner(n_rows, n_cols, x.element_size(), True)
    # Every program stores its slot, so the buffer needs no zeroing.
    partial = torch.empty((p.programs, 4), dtype=torch.float32, device=x.device)
    dy, dy_row, dy_col = _rows(grad_out)
    src, x_row, x_col = _rows(x)
    w = _contiguous(weight)
    _launch(p, True, dy, src, w, dx, partial, dy_row, dy_col, x_row, x_col, n_cols, n_rows, n_cols, eps)
    dweight, dbias = param_grads.reduce(partial, weight.dtype, p.options)
    return dx, dweight, dbias
