"""PolyNorm Triton kernels, shared by the CUDA and NPU launchers, which differ
only in launch policy (tile shape, grid size, warps).

* Tile kernels hold BLOCK_M whole rows at once and walk row blocks with a grid
  stride.  CUDA launches them with BLOCK_M = 1 and one program per row
  (forward, which then runs without the loop) or a few programs per SM
  (backward); the NPU with BLOCK_M rows sized from the unified buffer and one
  program per vector core.
* Blocked kernels take rows too long for one tile: one row at a time, in
  column blocks of BLOCK_N, two passes (statistics, then output).

Backward kernels write one float32 partial per program of (dw_cubic,
dw_square, dw_linear, dbias) into PARTIAL[pid]; ``param_grads`` sums them in a
fixed order, so gradients are deterministic (no atomics, no shared slots).
"""

import triton
import triton.language as tl

from csrc_free_ops.poly_norm import row_math


@triton.jit
def _fwd_tile(X, Y, blk, stride_xm, stride_xn, stride_ym, n_rows, n_cols, inv_n, eps, w3, w2, w1, b,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """y for the rows of row block blk."""
    cols = tl.arange(0, BLOCK_N)[None, :]
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
def fwd_tile_kernel(
    X, W, B, Y, stride_xm, stride_xn, stride_ym, n_rows, n_cols, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GRID_STRIDE: tl.constexpr,
):  # fmt: skip
    """GRID_STRIDE: programs walk the row blocks with a grid stride; else
    there is one program per row block (no loop, which on CUDA saves up to
    half a microsecond of a 7 us forward).  The launch sequence derives it
    from the grid, so no plan can leave rows unwritten."""
    inv_n = 1.0 / n_cols
    w3, w2, w1, b = row_math.load_params(W, B)
    if GRID_STRIDE:
        for blk in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
            _fwd_tile(X, Y, blk, stride_xm, stride_xn, stride_ym, n_rows, n_cols, inv_n, eps, w3, w2, w1, b,
                      BLOCK_M, BLOCK_N)  # fmt: skip
    else:
        _fwd_tile(X, Y, tl.program_id(0), stride_xm, stride_xn, stride_ym, n_rows, n_cols, inv_n, eps, w3, w2, w1, b,
                  BLOCK_M, BLOCK_N)  # fmt: skip


@triton.jit
def fwd_blocked_kernel(
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
def _store_partial(PARTIAL, dw1, dw2, dw3, db):
    out = PARTIAL + tl.program_id(0) * 4
    tl.store(out, dw3)
    tl.store(out + 1, dw2)
    tl.store(out + 2, dw1)
    tl.store(out + 3, db)


@triton.jit
def bwd_tile_kernel(
    DY, X, W, DX, PARTIAL,
    stride_dym, stride_dyn, stride_xm, stride_xn, stride_dxm,
    n_rows, n_cols, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)[None, :]
    inv_n = 1.0 / n_cols
    w3, w2, w1, _ = row_math.load_params(W, W)
    dw1 = 0.0
    dw2 = 0.0
    dw3 = 0.0
    db = 0.0
    # LOOP_STAGES > 1 software-pipelines the loads of the next row block (CUDA).
    for blk in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0), num_stages=LOOP_STAGES):
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
        a1, a2, a3, c1, c2, c3 = row_math.backward_coefficients(w1, w2, w3, r1, r2, r3, s1, s2, s3, inv_n)
        dx = row_math.backward_values(x, dy, a1, a2, a3, c1, c2, c3)
        tl.store(DX + rows * stride_dxm + cols, dx.to(DX.dtype.element_ty), mask=mask)
        # Rows past n_rows loaded zeros, so their s_k and sum(dy) are 0.
        dw1 += tl.sum(r1 * s1)
        dw2 += tl.sum(r2 * s2)
        dw3 += tl.sum(r3 * s3)
        db += tl.sum(dy)
    _store_partial(PARTIAL, dw1, dw2, dw3, db)


@triton.jit
def bwd_blocked_kernel(
    DY, X, W, DX, PARTIAL,
    stride_dym, stride_dyn, stride_xm, stride_xn, stride_dxm,
    n_rows, n_cols, eps,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    inv_n = 1.0 / n_cols
    w3, w2, w1, _ = row_math.load_params(W, W)
    dw1 = 0.0
    dw2 = 0.0
    dw3 = 0.0
    db = 0.0
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
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
        a1, a2, a3, c1, c2, c3 = row_math.backward_coefficients(w1, w2, w3, r1, r2, r3, s1, s2, s3, inv_n)
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
    _store_partial(PARTIAL, dw1, dw2, dw3, db)
