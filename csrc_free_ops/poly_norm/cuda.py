"""PolyNorm kernels and launchers for NVIDIA GPUs (also run on CPU tensors
under TRITON_INTERPRET=1).

Forward: one program per row.  A row of up to ``max_block`` elements is held
in registers in one piece; longer rows are column-blocked in two passes
(statistics, then output), so no row length overflows a block.

Backward: a persistent grid (a few programs per SM) walks the rows with a
grid stride.  Each program keeps its own float32 partial sums of dweight and
dbias and stores them in its own slot; the slots are then summed by one
reduction.  No atomics, so two runs give bitwise-equal gradients.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from csrc_free_ops import device
from csrc_free_ops.poly_norm import param_grads, row_math

# Longest row processed in one piece; longer rows take the column-blocked path.
MAX_ROW_BLOCK = 8192
# Column block of the blocked path.
COL_BLOCK = 4096
# Backward programs per SM: enough rows in flight to hide memory latency
# (16 measured best on an H200 at H=2048; wider rows are occupancy-bound).
BWD_PROGRAMS_PER_SM = 16


@triton.jit
def _fwd_row_kernel(X, W, B, Y, stride_xm, stride_xn, stride_ym, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(X + row * stride_xm + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
    w3, w2, w1, b = row_math.load_params(W, B)
    x2 = x * x
    r1, r2, r3 = row_math.rstds(tl.sum(x2), tl.sum(x2 * x2), tl.sum(x2 * x2 * x2), 1.0 / n_cols, eps)
    y = row_math.forward_values(x, w1 * r1, w2 * r2, w3 * r3, b)
    tl.store(Y + row * stride_ym + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_blocked_kernel(X, W, B, Y, stride_xm, stride_xn, stride_ym, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_xm
    acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc4 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc6 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols * stride_xn, mask=cols < n_cols, other=0.0).to(tl.float32)
        x2 = x * x
        acc2 += x2
        acc4 += x2 * x2
        acc6 += x2 * x2 * x2
    w3, w2, w1, b = row_math.load_params(W, B)
    r1, r2, r3 = row_math.rstds(tl.sum(acc2), tl.sum(acc4), tl.sum(acc6), 1.0 / n_cols, eps)
    a1 = w1 * r1
    a2 = w2 * r2
    a3 = w3 * r3
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        y = row_math.forward_values(x, a1, a2, a3, b)
        tl.store(Y + row * stride_ym + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_row_kernel(
    DY, X, W, DX, PARTIAL,
    stride_dym, stride_dyn, stride_xm, stride_xn, stride_dxm,
    n_rows, n_cols, eps,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    inv_n = 1.0 / n_cols
    w3, w2, w1, _ = row_math.load_params(W, W)
    dw1 = 0.0
    dw2 = 0.0
    dw3 = 0.0
    db = 0.0
    for row in tl.range(pid, n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x = tl.load(X + row64 * stride_xm + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row64 * stride_dym + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
        x2 = x * x
        x3 = x2 * x
        r1, r2, r3 = row_math.rstds(tl.sum(x2), tl.sum(x2 * x2), tl.sum(x3 * x3), inv_n, eps)
        s1 = tl.sum(dy * x)
        s2 = tl.sum(dy * x2)
        s3 = tl.sum(dy * x3)
        a1 = w1 * r1
        a2 = w2 * r2
        a3 = w3 * r3
        dx = row_math.backward_values(
            x, dy, a1, a2, a3, a1 * r1 * r1 * s1 * inv_n, a2 * r2 * r2 * s2 * inv_n, a3 * r3 * r3 * s3 * inv_n
        )
        tl.store(DX + row64 * stride_dxm + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw1 += r1 * s1
        dw2 += r2 * s2
        dw3 += r3 * s3
        db += tl.sum(dy)
    out = PARTIAL + pid * 4
    tl.store(out, dw3)
    tl.store(out + 1, dw2)
    tl.store(out + 2, dw1)
    tl.store(out + 3, db)


@triton.jit
def _bwd_blocked_kernel(
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
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc4 = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc6 = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_s1 = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_s2 = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_s3 = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = tl.load(x_row + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
            x2 = x * x
            acc += dy
            acc2 += x2
            acc4 += x2 * x2
            acc6 += x2 * x2 * x2
            acc_s1 += dy * x
            acc_s2 += dy * x2
            acc_s3 += dy * x2 * x
        r1, r2, r3 = row_math.rstds(tl.sum(acc2), tl.sum(acc4), tl.sum(acc6), inv_n, eps)
        s1 = tl.sum(acc_s1)
        s2 = tl.sum(acc_s2)
        s3 = tl.sum(acc_s3)
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
        db += tl.sum(acc)
    out = PARTIAL + pid * 4
    tl.store(out, dw3)
    tl.store(out + 1, dw2)
    tl.store(out + 2, dw1)
    tl.store(out + 3, db)


def _row_block(n_cols: int, max_block: int) -> tuple[int, bool]:
    """(BLOCK_N, whole row fits in one block)."""
    block = triton.next_power_of_2(n_cols)
    if block <= max_block:
        return block, True
    return min(COL_BLOCK, max_block), False


def _fwd_num_warps(block: int) -> int:
    # H200, bf16, 16384 rows: 4 warps up to 4096 columns, 8 above (16 was 2x slower at 2048).
    return 1 if block <= 256 else 2 if block <= 1024 else 4 if block <= 4096 else 8


def _bwd_num_warps(block: int) -> int:
    # The backward holds ~4 row-sized fp32 arrays: fewer warps per row, more rows per SM.
    return 1 if block <= 512 else 2 if block <= 4096 else 4


def forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, *, max_block: int = MAX_ROW_BLOCK
) -> torch.Tensor:
    n_cols = x.shape[-1]
    x2d = x.reshape(-1, n_cols)
    y = torch.empty(x2d.shape, dtype=x.dtype, device=x.device)
    if x2d.shape[0] == 0:
        return y.view(x.shape)
    block, fits = _row_block(n_cols, max_block)
    kernel = _fwd_row_kernel if fits else _fwd_blocked_kernel
    kernel[(x2d.shape[0],)](
        x2d, weight.contiguous(), bias, y,
        x2d.stride(0), x2d.stride(1), y.stride(0), n_cols, eps,
        BLOCK_N=block, num_warps=_fwd_num_warps(block),
    )  # fmt: skip
    return y.view(x.shape)


def backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, *, max_block: int = MAX_ROW_BLOCK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight (3,), dbias (1,)); dweight and dbias in weight's dtype."""
    n_cols = x.shape[-1]
    x2d = x.reshape(-1, n_cols)
    dy2d = grad_out.reshape(-1, n_cols)
    n_rows = x2d.shape[0]
    dx = torch.empty(x2d.shape, dtype=x.dtype, device=x.device)
    programs = max(1, min(n_rows, device.num_sms(x.device) * BWD_PROGRAMS_PER_SM))
    if n_rows == 0:
        return (
            dx.view(x.shape),
            torch.zeros(3, dtype=weight.dtype, device=x.device),
            torch.zeros(1, dtype=weight.dtype, device=x.device),
        )
    # Every program stores its slot, so the buffer needs no zeroing.
    partial = torch.empty((programs, 4), dtype=torch.float32, device=x.device)
    block, fits = _row_block(n_cols, max_block)
    kernel = _bwd_row_kernel if fits else _bwd_blocked_kernel
    kernel[(programs,)](
        dy2d, x2d, weight.contiguous(), dx, partial,
        dy2d.stride(0), dy2d.stride(1), x2d.stride(0), x2d.stride(1), dx.stride(0),
        n_rows, n_cols, eps,
        BLOCK_N=block, num_warps=_bwd_num_warps(block),
    )  # fmt: skip
    dweight, dbias = param_grads.reduce(partial, weight.dtype, num_warps=4)
    return dx.view(x.shape), dweight, dbias
