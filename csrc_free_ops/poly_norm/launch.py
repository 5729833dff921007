"""The PolyNorm launch sequence, shared by the CUDA and NPU launchers: they
differ only in the Plan (kernel choice, tile, grid, launch options)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from csrc_free_ops.poly_norm import kernels, param_grads


class Plan(NamedTuple):
    whole_rows: bool  # tile kernel (BLOCK_M whole rows) or the column-blocked kernel
    block_m: int
    block_n: int
    programs: int
    options: dict  # extra launch options (num_warps on CUDA; none on the NPU)
    loop_stages: int | None = None  # pipelining depth of the backward row loop (None: the compiler's default)


# (n_rows, n_cols, element size, backward) -> Plan
Planner = Callable[[int, int, int, bool], Plan]


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, planner: Planner) -> torch.Tensor:
    n_cols = x.shape[-1]
    x2d = x.reshape(-1, n_cols)
    n_rows = x2d.shape[0]
    y = torch.empty(x2d.shape, dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return y.view(x.shape)
    p = planner(n_rows, n_cols, x.element_size(), False)
    args = (x2d, weight.contiguous(), bias, y, x2d.stride(0), x2d.stride(1), y.stride(0), n_rows, n_cols, eps)
    if p.whole_rows:
        kernels.fwd_tile_kernel[(p.programs,)](*args, BLOCK_M=p.block_m, BLOCK_N=p.block_n, **p.options)
    else:
        kernels.fwd_blocked_kernel[(p.programs,)](*args, BLOCK_N=p.block_n, **p.options)
    return y.view(x.shape)


def backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, planner: Planner
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight (3,), dbias (1,)); dweight and dbias in weight's dtype."""
    n_cols = x.shape[-1]
    x2d = x.reshape(-1, n_cols)
    dy2d = grad_out.reshape(-1, n_cols)
    n_rows = x2d.shape[0]
    dx = torch.empty(x2d.shape, dtype=x.dtype, device=x.device)
    if n_rows == 0:
        zeros = torch.zeros(4, dtype=weight.dtype, device=x.device)
        return dx.view(x.shape), zeros[:3].clone(), zeros[3:].clone()
    p = planner(n_rows, n_cols, x.element_size(), True)
    # Every program stores its slot, so the buffer needs no zeroing.
    partial = torch.empty((p.programs, 4), dtype=torch.float32, device=x.device)
    args = (
        dy2d, x2d, weight.contiguous(), dx, partial,
        dy2d.stride(0), dy2d.stride(1), x2d.stride(0), x2d.stride(1), dx.stride(0),
        n_rows, n_cols, eps,
    )  # fmt: skip
    if p.whole_rows:
        kernels.bwd_tile_kernel[(p.programs,)](
            *args, BLOCK_M=p.block_m, BLOCK_N=p.block_n, LOOP_STAGES=p.loop_stages, **p.options
        )
    else:
        kernels.bwd_blocked_kernel[(p.programs,)](*args, BLOCK_N=p.block_n, **p.options)
    dweight, dbias = param_grads.reduce(partial, weight.dtype, **p.options)
    return dx.view(x.shape), dweight, dbias
