"""Every Triton kernel of PolyNorm, shared by the CUDA and NPU launches, which
differ only in their Plan (plan.py: tile shape, grid, warps).

* Tile kernels hold BLOCK_M whole rows at once and walk row blocks with a
  grid stride (GRID_STRIDE) or take one row block per program.  CUDA
  launches BLOCK_M = 1 with one program per row forward (loop-free) and a
  few programs per SM backward; the NPU BLOCK_M rows sized from the unified
  buffer and one program per vector core.
* Blocked kernels take rows too long for one tile: one row at a time, in
  column blocks of BLOCK_N, two passes (statistics, then output).
* ``reduce_param_grads_kernel`` sums the backward's per-program partials.

Math runs in COMPUTE (float32, or float64 for float64 x); every load is
converted to it, so parameters may have any float dtype.  eps is a float64
parameter (``eps: tl.float64``; Triton types a Python float fp32
otherwise), added in float64 and the sum rounded to COMPUTE: float64 math
keeps all of eps, and float32 kernels hold no converted copy of it.  With
r_k = rsqrt(mean(x^(2k)) + eps) and a_k = w_k * r_k:

    y  = x*(a1 + x*(a2 + x*a3)) + b
    dx = dy*(a1 + 2*a2*x + 3*a3*x^2) - x*(c1 + 2*c2*x^2 + 3*c3*x^4)
    c_k = a_k * r_k^2 * S_k / n,  S_k = sum(dy * x^k)

The device functions are elementwise with broadcasting, so they serve a 1-D
row (scalar statistics) and a 2-D tile of rows (statistics of shape [M, 1]).

Backward kernels write one partial row per program into ``partials``
(layout: ``PARTIAL_FIELDS``); ``reduce_param_grads_kernel`` sums them in
program order, so gradients are deterministic (no atomics).  A backward of
one program (small inputs: a launch saved on the host) writes dweight and
dbias itself (DIRECT_GRADS).
"""

import triton
import triton.language as tl

from csrc_free_ops.kernel_math import rsqrt

# The backward's partials: one row of these per program, in this order.
PARTIAL_FIELDS = ("dw_cubic", "dw_square", "dw_linear", "dbias")
N_PARTIALS = tl.constexpr(len(PARTIAL_FIELDS))


@triton.jit
def _load_params(weight, bias, COMPUTE: tl.constexpr):
    """(w_cubic, w_square, w_linear, bias) as COMPUTE scalars."""
    w3 = tl.load(weight).to(COMPUTE)
    w2 = tl.load(weight + 1).to(COMPUTE)
    w1 = tl.load(weight + 2).to(COMPUTE)
    b = tl.load(bias).to(COMPUTE)
    return w3, w2, w1, b


@triton.jit
def _rstds(s2, s4, s6, inv_n, eps):
    """rsqrt(mean(x^2k) + eps) for k = 1, 2, 3 from the sums of x^2, x^4, x^6."""
    # eps is float64 (module docstring): each sum is rounded to the sums' dtype, not eps.
    r1 = rsqrt((s2 * inv_n + eps).to(s2.dtype))
    r2 = rsqrt((s4 * inv_n + eps).to(s2.dtype))
    r3 = rsqrt((s6 * inv_n + eps).to(s2.dtype))
    return r1, r2, r3


@triton.jit
def _backward_coefficients(w1, w2, w3, r1, r2, r3, s1, s2, s3, inv_n):
    """(a1, a2, a3, c1, c2, c3) of ``_backward_values``."""
    a1 = w1 * r1
    a2 = w2 * r2
    a3 = w3 * r3
    return a1, a2, a3, a1 * r1 * r1 * s1 * inv_n, a2 * r2 * r2 * s2 * inv_n, a3 * r3 * r3 * s3 * inv_n


@triton.jit
def _forward_values(x, a1, a2, a3, b):
    return x * (a1 + x * (a2 + x * a3)) + b


@triton.jit
def _backward_values(x, dy, a1, a2, a3, c1, c2, c3):
    x2 = x * x
    return dy * (a1 + x * (2.0 * a2 + 3.0 * a3 * x)) - x * (c1 + x2 * (2.0 * c2 + 3.0 * c3 * x2))


@triton.jit
def _inv_n(n_cols, COMPUTE: tl.constexpr):
    return 1.0 / tl.cast(n_cols, COMPUTE)


@triton.jit
def _fwd_tile(x, y, blk, stride_x_row, stride_x_col, stride_y_row, n_rows, n_cols, inv_n, eps, w3, w2, w1, b,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """y for the rows of row block blk."""
    cols = tl.arange(0, BLOCK_N)[None, :]
    rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    mask = (rows < n_rows) & (cols < n_cols)
    xv = tl.load(x + rows * stride_x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE)
    x2 = xv * xv
    r1, r2, r3 = _rstds(
        tl.sum(x2, axis=1)[:, None], tl.sum(x2 * x2, axis=1)[:, None], tl.sum(x2 * x2 * x2, axis=1)[:, None],
        inv_n, eps,
    )  # fmt: skip
    out = _forward_values(xv, w1 * r1, w2 * r2, w3 * r3, b)
    tl.store(y + rows * stride_y_row + cols, out.to(y.dtype.element_ty), mask=mask)


@triton.jit
def fwd_tile_kernel(
    x, weight, bias, y, stride_x_row, stride_x_col, stride_y_row, n_rows, n_cols, eps: tl.float64,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GRID_STRIDE: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """GRID_STRIDE: programs walk the row blocks with a grid stride; else
    there is one program per row block (no loop: no loop overhead in small
    forwards).  The launch sequence derives it
    from the grid, so no plan can leave rows unwritten."""
    inv_n = _inv_n(n_cols, COMPUTE)
    w3, w2, w1, b = _load_params(weight, bias, COMPUTE)
    if GRID_STRIDE:
        for blk in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
            _fwd_tile(x, y, blk, stride_x_row, stride_x_col, stride_y_row, n_rows, n_cols, inv_n, eps,
                      w3, w2, w1, b, BLOCK_M, BLOCK_N, COMPUTE)  # fmt: skip
    else:
        _fwd_tile(x, y, tl.program_id(0), stride_x_row, stride_x_col, stride_y_row, n_rows, n_cols, inv_n, eps,
                  w3, w2, w1, b, BLOCK_M, BLOCK_N, COMPUTE)  # fmt: skip


@triton.jit
def fwd_blocked_kernel(
    x, weight, bias, y, stride_x_row, stride_x_col, stride_y_row, n_rows, n_cols, eps: tl.float64,
    BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    inv_n = _inv_n(n_cols, COMPUTE)
    w3, w2, w1, b = _load_params(weight, bias, COMPUTE)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x_row = x + row64 * stride_x_row
        s2 = tl.cast(0.0, COMPUTE)
        s4 = tl.cast(0.0, COMPUTE)
        s6 = tl.cast(0.0, COMPUTE)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            xv = tl.load(x_row + cols * stride_x_col, mask=cols < n_cols, other=0.0).to(COMPUTE)
            x2 = xv * xv
            s2 += tl.sum(x2)
            s4 += tl.sum(x2 * x2)
            s6 += tl.sum(x2 * x2 * x2)
        r1, r2, r3 = _rstds(s2, s4, s6, inv_n, eps)
        a1 = w1 * r1
        a2 = w2 * r2
        a3 = w3 * r3
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            xv = tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE)
            out = _forward_values(xv, a1, a2, a3, b)
            tl.store(y + row64 * stride_y_row + cols, out.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _narrow(v, ty: tl.constexpr):
    """v converted to ty; float64 reaches 16-bit types through float32 (the
    interpreter's direct float64 -> bfloat16 cast gives garbage)."""
    if ty != tl.float64:
        v = v.to(tl.float32)
    return v.to(ty)


@triton.jit
def _store_partials(partials, dweight, dbias, dw1, dw2, dw3, db, DIRECT_GRADS: tl.constexpr):
    """This program's row of ``partials``, in PARTIAL_FIELDS order; or, when
    the grid is one program (DIRECT_GRADS), dweight and dbias themselves."""
    if DIRECT_GRADS:
        ty = dweight.dtype.element_ty
        tl.store(dweight, _narrow(dw3, ty))
        tl.store(dweight + 1, _narrow(dw2, ty))
        tl.store(dweight + 2, _narrow(dw1, ty))
        tl.store(dbias, _narrow(db, dbias.dtype.element_ty))
    else:
        row = partials + tl.program_id(0) * N_PARTIALS
        tl.store(row, dw3)
        tl.store(row + 1, dw2)
        tl.store(row + 2, dw1)
        tl.store(row + 3, db)


@triton.jit
def bwd_tile_kernel(
    grad_out, x, weight, dx, partials, dweight, dbias,
    stride_dy_row, stride_dy_col, stride_x_row, stride_x_col, stride_dx_row,
    n_rows, n_cols, eps: tl.float64,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr, COMPUTE: tl.constexpr,
    DIRECT_GRADS: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)[None, :]
    inv_n = _inv_n(n_cols, COMPUTE)
    w3, w2, w1, _ = _load_params(weight, weight, COMPUTE)
    dw1 = tl.cast(0.0, COMPUTE)
    dw2 = tl.cast(0.0, COMPUTE)
    dw3 = tl.cast(0.0, COMPUTE)
    db = tl.cast(0.0, COMPUTE)
    # LOOP_STAGES > 1 software-pipelines the loads of the next row block (CUDA).
    for blk in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0), num_stages=LOOP_STAGES):
        rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
        mask = (rows < n_rows) & (cols < n_cols)
        xv = tl.load(x + rows * stride_x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE)
        dy = tl.load(grad_out + rows * stride_dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(COMPUTE)
        x2 = xv * xv
        x3 = x2 * xv
        r1, r2, r3 = _rstds(
            tl.sum(x2, axis=1)[:, None], tl.sum(x2 * x2, axis=1)[:, None], tl.sum(x3 * x3, axis=1)[:, None],
            inv_n, eps,
        )  # fmt: skip
        s1 = tl.sum(dy * xv, axis=1)[:, None]
        s2 = tl.sum(dy * x2, axis=1)[:, None]
        s3 = tl.sum(dy * x3, axis=1)[:, None]
        a1, a2, a3, c1, c2, c3 = _backward_coefficients(w1, w2, w3, r1, r2, r3, s1, s2, s3, inv_n)
        dxv = _backward_values(xv, dy, a1, a2, a3, c1, c2, c3)
        tl.store(dx + rows * stride_dx_row + cols, dxv.to(dx.dtype.element_ty), mask=mask)
        # Rows past n_rows loaded zeros, so their s_k and sum(dy) are 0.
        dw1 += tl.sum(r1 * s1)
        dw2 += tl.sum(r2 * s2)
        dw3 += tl.sum(r3 * s3)
        db += tl.sum(dy)
    _store_partials(partials, dweight, dbias, dw1, dw2, dw3, db, DIRECT_GRADS)


@triton.jit
def bwd_blocked_kernel(
    grad_out, x, weight, dx, partials, dweight, dbias,
    stride_dy_row, stride_dy_col, stride_x_row, stride_x_col, stride_dx_row,
    n_rows, n_cols, eps: tl.float64,
    BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr, DIRECT_GRADS: tl.constexpr,
):  # fmt: skip
    inv_n = _inv_n(n_cols, COMPUTE)
    w3, w2, w1, _ = _load_params(weight, weight, COMPUTE)
    dw1 = tl.cast(0.0, COMPUTE)
    dw2 = tl.cast(0.0, COMPUTE)
    dw3 = tl.cast(0.0, COMPUTE)
    db = tl.cast(0.0, COMPUTE)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x_row = x + row64 * stride_x_row
        dy_row = grad_out + row64 * stride_dy_row
        sum_dy = tl.cast(0.0, COMPUTE)
        m2 = tl.cast(0.0, COMPUTE)
        m4 = tl.cast(0.0, COMPUTE)
        m6 = tl.cast(0.0, COMPUTE)
        s1 = tl.cast(0.0, COMPUTE)
        s2 = tl.cast(0.0, COMPUTE)
        s3 = tl.cast(0.0, COMPUTE)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            xv = tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE)
            dy = tl.load(dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(COMPUTE)
            x2 = xv * xv
            sum_dy += tl.sum(dy)
            m2 += tl.sum(x2)
            m4 += tl.sum(x2 * x2)
            m6 += tl.sum(x2 * x2 * x2)
            s1 += tl.sum(dy * xv)
            s2 += tl.sum(dy * x2)
            s3 += tl.sum(dy * x2 * xv)
        r1, r2, r3 = _rstds(m2, m4, m6, inv_n, eps)
        a1, a2, a3, c1, c2, c3 = _backward_coefficients(w1, w2, w3, r1, r2, r3, s1, s2, s3, inv_n)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            xv = tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE)
            dy = tl.load(dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(COMPUTE)
            dxv = _backward_values(xv, dy, a1, a2, a3, c1, c2, c3)
            tl.store(dx + row64 * stride_dx_row + cols, dxv.to(dx.dtype.element_ty), mask=mask)
        dw1 += r1 * s1
        dw2 += r2 * s2
        dw3 += r3 * s3
        db += sum_dy
    _store_partials(partials, dweight, dbias, dw1, dw2, dw3, db, DIRECT_GRADS)


@triton.jit
def reduce_param_grads_kernel(partials, dweight, dbias, n_programs, BLOCK_P: tl.constexpr):
    """dweight (3,) and dbias (1,) from the (programs, N_PARTIALS) partials,
    summed in program order in the partials' dtype (one program)."""
    acc = tl.zeros([BLOCK_P, N_PARTIALS], dtype=partials.dtype.element_ty)
    fields = tl.arange(0, N_PARTIALS)
    for start in range(0, n_programs, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)[:, None]
        acc += tl.load(partials + rows * N_PARTIALS + fields[None, :], mask=rows < n_programs, other=0.0)
    sums = tl.sum(acc, axis=0)
    tl.store(dweight + fields, _narrow(sums, dweight.dtype.element_ty), mask=fields < 3)
    # dbias as a scalar: triton-ascend rejects the masked-off negative offsets of dbias + fields - 3.
    tl.store(dbias, _narrow(tl.sum(tl.where(fields == 3, sums, 0.0)), dbias.dtype.element_ty))
