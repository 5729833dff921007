"""PolyNorm kernels and launchers for Ascend NPUs (triton-ascend).

A separate kernel family from cuda.py because the hardware differs: an NPU
has a few dozen vector cores, each computing out of a small unified buffer
(UB), so the grid is one program per vector core walking its share of the
work, and tile sizes are bounded by the UB instead of by registers.

* Small rows (n_cols <= SMALL_ROW_MAX_COLS): 2-D tiles of BLOCK_M rows x the
  whole row, grid-stride over row blocks.
* Large rows: one row at a time in column blocks of BLOCK_N, two passes
  (statistics, then output), so the UB never overflows.

UB cost model.  Half the UB is the budget, since triton-ascend double-buffers
loads.  A tile element costs its inputs in their dtype plus the float32
temporaries the kernel keeps live at once:
  forward:  1 input  + 4 float32 (x, x^2, a product, y)
  backward: 2 inputs + 6 float32 (x, dy, x^2, x^3, a product, dx)
Tile elements = budget // bytes-per-element, rounded down to a power of two.

dweight/dbias: every program writes its own float32 partials (one slot per
program, in both kernels), summed afterwards in a fixed order: no atomics and
no shared slots, so gradients are deterministic.  No num_warps / num_stages:
triton-ascend ignores them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from csrc_free_ops import device
from csrc_free_ops.poly_norm import param_grads, row_math

SMALL_ROW_MAX_COLS = 2048
MAX_BLOCK_M = 64
FWD_FP32_TEMPS = 4
BWD_FP32_TEMPS = 6


@triton.jit
def _fwd_small_kernel(
    X, W, B, Y, stride_xm, stride_xn, stride_ym, n_rows, n_cols, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)[None, :]
    inv_n = 1.0 / n_cols
    w3, w2, w1, b = row_math.load_params(W, B)
    for blk in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
        mask = (rows < n_rows) & (cols < n_cols)
        x = tl.load(X + rows * stride_xm + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        x2 = x * x
        r1, r2, r3 = row_math.rstds(
            tl.sum(x2, axis=1)[:, None], tl.sum(x2 * x2, axis=1)[:, None], tl.sum(x2 * x2 * x2, axis=1)[:, None],
            inv_n, eps,
        )  # fmt: skip
        y = row_math.forward_values(x, w1 * r1, w2 * r2, w3 * r3, b)
        tl.store(Y + rows * stride_ym + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_large_kernel(
    X, W, B, Y, stride_xm, stride_xn, stride_ym, n_rows, n_cols, eps,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    inv_n = 1.0 / n_cols
    w3, w2, w1, b = row_math.load_params(W, B)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x_row = X + row64 * stride_xm
        s2 = 0.0
        s4 = 0.0
        s6 = 0.0
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols * stride_xn, mask=cols < n_cols, other=0.0).to(tl.float32)
            x2 = x * x
            s2 += tl.sum(x2)
            s4 += tl.sum(x2 * x2)
            s6 += tl.sum(x2 * x2 * x2)
        r1, r2, r3 = row_math.rstds(s2, s4, s6, inv_n, eps)
        a1 = w1 * r1
        a2 = w2 * r2
        a3 = w3 * r3
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
            y = row_math.forward_values(x, a1, a2, a3, b)
            tl.store(Y + row64 * stride_ym + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_small_kernel(
    DY, X, W, DX, PARTIAL,
    stride_dym, stride_dyn, stride_xm, stride_xn, stride_dxm,
    n_rows, n_cols, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)[None, :]
    inv_n = 1.0 / n_cols
    w3, w2, w1, _ = row_math.load_params(W, W)
    dw1 = 0.0
    dw2 = 0.0
    dw3 = 0.0
    db = 0.0
    for blk in tl.range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
        mask = (rows < n_rows) & (cols < n_cols)
        x = tl.load(X + rows * stride_xm + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows * stride_dym + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
        x2 = x * x
        x3 = x2 * x
        r1, r2, r3 = row_math.rstds(
            tl.sum(x2, axis=1)[:, None], tl.sum(x2 * x2, axis=1)[:, None], tl.sum(x3 * x3, axis=1)[:, None],
            inv_n, eps,
        )  # fmt: skip
        s1 = tl.sum(dy * x, axis=1)[:, None]
        s2 = tl.sum(dy * x2, axis=1)[:, None]
        s3 = tl.sum(dy * x3, axis=1)[:, None]
        a1 = w1 * r1
        a2 = w2 * r2
        a3 = w3 * r3
        dx = row_math.backward_values(
            x, dy, a1, a2, a3, a1 * r1 * r1 * s1 * inv_n, a2 * r2 * r2 * s2 * inv_n, a3 * r3 * r3 * s3 * inv_n
        )
        tl.store(DX + rows * stride_dxm + cols, dx.to(DX.dtype.element_ty), mask=mask)
        # Rows past n_rows loaded zeros, so their s_k and sum(dy) are 0.
        dw1 += tl.sum(r1 * s1)
        dw2 += tl.sum(r2 * s2)
        dw3 += tl.sum(r3 * s3)
        db += tl.sum(dy)
    out = PARTIAL + pid * 4
    tl.store(out, dw3)
    tl.store(out + 1, dw2)
    tl.store(out + 2, dw1)
    tl.store(out + 3, db)


@triton.jit
def _bwd_large_kernel(
    DY, X, W, DX, PARTIAL,
    stride_dym, stride_dyn, stride_xm, stride_xn, stride_dxm,
    n_rows, n_cols, eps,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    inv_n = 1.0 / n_cols
    w3, w2, w1, _ = row_math.load_params(W, W)
    dw1 = 0.0
    dw2 = 0.0
    dw3 = 0.0
    db = 0.0
    for row in tl.range(pid, n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x_row = X + row64 * stride_xm
        dy_row = DY + row64 * stride_dym
        sum_dy = 0.0
        m2 = 0.0
        m4 = 0.0
        m6 = 0.0
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
            x2 = x * x
            sum_dy += tl.sum(dy)
            m2 += tl.sum(x2)
            m4 += tl.sum(x2 * x2)
            m6 += tl.sum(x2 * x2 * x2)
            s1 += tl.sum(dy * x)
            s2 += tl.sum(dy * x2)
            s3 += tl.sum(dy * x2 * x)
        r1, r2, r3 = row_math.rstds(m2, m4, m6, inv_n, eps)
        a1 = w1 * r1
        a2 = w2 * r2
        a3 = w3 * r3
        c1 = a1 * r1 * r1 * s1 * inv_n
        c2 = a2 * r2 * r2 * s2 * inv_n
        c3 = a3 * r3 * r3 * s3 * inv_n
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
            dx = row_math.backward_values(x, dy, a1, a2, a3, c1, c2, c3)
            tl.store(DX + row64 * stride_dxm + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw1 += r1 * s1
        dw2 += r2 * s2
        dw3 += r3 * s3
        db += sum_dy
    out = PARTIAL + pid * 4
    tl.store(out, dw3)
    tl.store(out + 1, dw2)
    tl.store(out + 2, dw1)
    tl.store(out + 3, db)


def _prev_power_of_2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def tile_elements(n_inputs: int, elem_bytes: int, fp32_temps: int) -> int:
    """Largest power-of-two tile that fits half the UB under the cost model."""
    per_element = n_inputs * elem_bytes + 4 * fp32_temps
    return _prev_power_of_2(device.npu_ub_bytes() // 2 // per_element)


def plan(n_rows: int, n_cols: int, tile: int) -> tuple[bool, int, int, int]:
    """(small-row kernel?, BLOCK_M, BLOCK_N, programs) for a tile budget."""
    cores = device.npu_vector_cores()
    block_n = triton.next_power_of_2(n_cols)
    if n_cols <= SMALL_ROW_MAX_COLS and block_n <= tile:
        block_m = min(MAX_BLOCK_M, tile // block_n, triton.next_power_of_2(n_rows))
        programs = min(cores, triton.cdiv(n_rows, block_m))
        return True, block_m, block_n, programs
    block_n = min(block_n, tile)
    return False, 1, block_n, min(cores, n_rows)


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    n_cols = x.shape[-1]
    x2d = x.reshape(-1, n_cols)
    n_rows = x2d.shape[0]
    y = torch.empty(x2d.shape, dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return y.view(x.shape)
    small, block_m, block_n, programs = plan(n_rows, n_cols, tile_elements(1, x.element_size(), FWD_FP32_TEMPS))
    args = (x2d, weight.contiguous(), bias, y, x2d.stride(0), x2d.stride(1), y.stride(0), n_rows, n_cols, eps)
    if small:
        _fwd_small_kernel[(programs,)](*args, BLOCK_M=block_m, BLOCK_N=block_n)
    else:
        _fwd_large_kernel[(programs,)](*args, BLOCK_N=block_n)
    return y.view(x.shape)


def backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight (3,), dbias (1,)); dweight and dbias in weight's dtype."""
    n_cols = x.shape[-1]
    x2d = x.reshape(-1, n_cols)
    dy2d = grad_out.reshape(-1, n_cols)
    n_rows = x2d.shape[0]
    dx = torch.empty(x2d.shape, dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return (
            dx.view(x.shape),
            torch.zeros(3, dtype=weight.dtype, device=x.device),
            torch.zeros(1, dtype=weight.dtype, device=x.device),
        )
    small, block_m, block_n, programs = plan(n_rows, n_cols, tile_elements(2, x.element_size(), BWD_FP32_TEMPS))
    partial = torch.empty((programs, 4), dtype=torch.float32, device=x.device)
    args = (
        dy2d, x2d, weight.contiguous(), dx, partial,
        dy2d.stride(0), dy2d.stride(1), x2d.stride(0), x2d.stride(1), dx.stride(0),
        n_rows, n_cols, eps,
    )  # fmt: skip
    if small:
        _bwd_small_kernel[(programs,)](*args, BLOCK_M=block_m, BLOCK_N=block_n)
    else:
        _bwd_large_kernel[(programs,)](*args, BLOCK_N=block_n)
    dweight, dbias = param_grads.reduce(partial, weight.dtype)
    return dx.view(x.shape), dweight, dbias
