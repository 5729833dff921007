"""Every Triton kernel of the row norms, RMSNorm and LayerNorm (which runs
them with CENTER), shared by the CUDA and NPU launches, which differ only in
their Plan (plan.py: tile shape, grid, warps).

* Tile kernels hold BLOCK_M whole rows at once: the forward reads x once and
  writes y once; the backward reads x and grad_out once and writes dx once,
  recomputing the row statistics from the x it holds (no saved rstd to
  store, keep or read).  The forward takes one row block per program, or
  walks them with a grid stride (GRID_STRIDE, the NPU's vector-core grid);
  the backward always walks them, each program summing its rows' dweight
  and dbias terms.
* Blocked kernels take rows too long for one tile: one row at a time, in
  column blocks of BLOCK_N, one pass per statistic and one for the output
  (the backward without CENTER takes the squares in its sums' pass, since
  sum(g * xhat) = rstd * sum(g * x): two reads of x, not three).
* ``reduce_param_grads_kernel`` sums the backward's per-program partials.

Constexprs: CENTER subtracts the mean (LayerNorm); ROUND_NORMED rounds the
normalized x to x's dtype before the weight (transformers' Llama casting);
HAS_WEIGHT / HAS_BIAS; EPS and OFFSET are constexprs so that a float64
kernel computes with them exactly (a runtime Python float would reach the
kernel as float32); COMPUTE is the math dtype (float32, float64 for
float64 x), every load is converted to it, so parameters may have any
float dtype.  With xhat = (x - mean) * rstd, g = dy * (OFFSET + w):

    y  = xhat * (OFFSET + w) + b
    dx = rstd * (g - xhat * mean(g * xhat) - mean(g))   (mean(g) with CENTER)
    dweight = sum over rows of dy * xhat,  dbias = sum over rows of dy

Backward kernels write one partial row per program into ``dweight_partials``
and ``dbias_partials`` (programs x columns); ``reduce_param_grads_kernel``
sums them in program order, so gradients are deterministic (no atomics).  A
backward of one program writes dweight and dbias itself (DIRECT_GRADS).
"""

import triton
import triton.language as tl

from csrc_free_ops.kernel_math import rsqrt


@triton.jit
def _narrow(v, ty: tl.constexpr):
    """v converted to ty; float64 reaches 16-bit types through float32 (the
    interpreter's direct float64 -> bfloat16 cast gives garbage)."""
    if ty != tl.float64:
        v = v.to(tl.float32)
    return v.to(ty)


@triton.jit
def _inv_n(n_cols, COMPUTE: tl.constexpr):
    return 1.0 / tl.cast(n_cols, COMPUTE)


@triton.jit
def _rstd(sum_sq, inv_n, EPS: tl.constexpr):
    # Rounded to the sums' dtype: a constexpr float meets them exactly in float64 and as float32 otherwise.
    return rsqrt((sum_sq * inv_n + EPS).to(sum_sq.dtype))


@triton.jit
def _tile_stats(xv, mask, inv_n, EPS: tl.constexpr, CENTER: tl.constexpr):
    """(x - mean, masked to 0, and rstd of shape [M, 1]) of a tile of whole rows."""
    if CENTER:
        mean = tl.sum(xv, axis=1)[:, None] * inv_n
        xc = tl.where(mask, xv - mean, 0.0)
    else:
        xc = xv
    return xc, _rstd(tl.sum(xc * xc, axis=1)[:, None], inv_n, EPS)


@triton.jit
def _as_weighted(xhat, ty: tl.constexpr, ROUND_NORMED: tl.constexpr):
    """xhat as the weight multiplies it: rounded to ty (x's dtype) under Llama's casting."""
    if ROUND_NORMED:
        xhat = _narrow(xhat, ty).to(xhat.dtype)
    return xhat


@triton.jit
def _load_params(weight, bias, cols, mask, OFFSET: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                 HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """(OFFSET + weight, bias) at cols as COMPUTE (1 and 0 where absent)."""
    scale = tl.full(cols.shape, 1.0, COMPUTE)
    shift = tl.zeros(cols.shape, COMPUTE)
    if HAS_WEIGHT:
        scale = OFFSET + tl.load(weight + cols, mask=mask, other=0.0).to(COMPUTE)
    if HAS_BIAS:
        shift = tl.load(bias + cols, mask=mask, other=0.0).to(COMPUTE)
    return scale, shift


@triton.jit
def _fwd_tile(x, y, blk, scale, shift, stride_x_row, stride_x_col, stride_y_row, n_rows, n_cols, inv_n,
              EPS: tl.constexpr, CENTER: tl.constexpr, ROUND_NORMED: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """y for the rows of row block blk."""
    cols = tl.arange(0, BLOCK_N)[None, :]
    rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    mask = (rows < n_rows) & (cols < n_cols)
    xv = tl.load(x + rows * stride_x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE)
    xc, rstd = _tile_stats(xv, mask, inv_n, EPS, CENTER)
    xhat = _as_weighted(xc * rstd, y.dtype.element_ty, ROUND_NORMED)
    out = xhat * scale[None, :] + shift[None, :]
    tl.store(y + rows * stride_y_row + cols, out.to(y.dtype.element_ty), mask=mask)


@triton.jit
def fwd_tile_kernel(
    x, weight, bias, y, stride_x_row, stride_x_col, stride_y_row, n_rows, n_cols,
    EPS: tl.constexpr, OFFSET: tl.constexpr, CENTER: tl.constexpr, ROUND_NORMED: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GRID_STRIDE: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """GRID_STRIDE: programs walk the row blocks with a grid stride; else
    there is one program per row block (no loop).  The launch sequence
    derives it from the grid, so no plan can leave rows unwritten."""
    inv_n = _inv_n(n_cols, COMPUTE)
    cols = tl.arange(0, BLOCK_N)
    scale, shift = _load_params(weight, bias, cols, cols < n_cols, OFFSET, HAS_WEIGHT, HAS_BIAS, COMPUTE)
    if GRID_STRIDE:
        for blk in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
            _fwd_tile(x, y, blk, scale, shift, stride_x_row, stride_x_col, stride_y_row, n_rows, n_cols, inv_n,
                      EPS, CENTER, ROUND_NORMED, BLOCK_M, BLOCK_N, COMPUTE)  # fmt: skip
    else:
        _fwd_tile(x, y, tl.program_id(0), scale, shift, stride_x_row, stride_x_col, stride_y_row, n_rows, n_cols,
                  inv_n, EPS, CENTER, ROUND_NORMED, BLOCK_M, BLOCK_N, COMPUTE)  # fmt: skip


@triton.jit
def _row_stats(x_row, stride_x_col, n_cols, inv_n, EPS: tl.constexpr, CENTER: tl.constexpr,
               BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """(mean, rstd) of one row read in column blocks: a pass for the mean
    (CENTER), then one for the centred squares (no E[x^2] - E[x]^2 cancellation)."""
    mean = tl.cast(0.0, COMPUTE)
    if CENTER:
        acc = tl.cast(0.0, COMPUTE)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            acc += tl.sum(tl.load(x_row + cols * stride_x_col, mask=cols < n_cols, other=0.0).to(COMPUTE))
        mean = acc * inv_n
    sum_sq = tl.cast(0.0, COMPUTE)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        xc = tl.where(mask, tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE) - mean, 0.0)
        sum_sq += tl.sum(xc * xc)
    return mean, _rstd(sum_sq, inv_n, EPS)


@triton.jit
def fwd_blocked_kernel(
    x, weight, bias, y, stride_x_row, stride_x_col, stride_y_row, n_rows, n_cols,
    EPS: tl.constexpr, OFFSET: tl.constexpr, CENTER: tl.constexpr, ROUND_NORMED: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    inv_n = _inv_n(n_cols, COMPUTE)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x_row = x + row64 * stride_x_row
        mean, rstd = _row_stats(x_row, stride_x_col, n_cols, inv_n, EPS, CENTER, BLOCK_N, COMPUTE)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            xv = tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE)
            scale, shift = _load_params(weight, bias, cols, mask, OFFSET, HAS_WEIGHT, HAS_BIAS, COMPUTE)
            xhat = _as_weighted((xv - mean) * rstd, y.dtype.element_ty, ROUND_NORMED)
            tl.store(y + row64 * stride_y_row + cols, (xhat * scale + shift).to(y.dtype.element_ty), mask=mask)


@triton.jit
def _store_partials(dweight_partials, dbias_partials, dweight, dbias, dw, db, cols, mask, HAS_WEIGHT: tl.constexpr,
                    HAS_BIAS: tl.constexpr, DIRECT_GRADS: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """This program's partial rows (BLOCK_N wide) at cols; or, when the grid
    is one program (DIRECT_GRADS), dweight and dbias themselves."""
    row = tl.cast(tl.program_id(0), tl.int64) * BLOCK_N
    if HAS_WEIGHT:
        if DIRECT_GRADS:
            tl.store(dweight + cols, _narrow(dw, dweight.dtype.element_ty), mask=mask)
        else:
            tl.store(dweight_partials + row + cols, dw, mask=mask)
    if HAS_BIAS:
        if DIRECT_GRADS:
            tl.store(dbias + cols, _narrow(db, dbias.dtype.element_ty), mask=mask)
        else:
            tl.store(dbias_partials + row + cols, db, mask=mask)


@triton.jit
def bwd_tile_kernel(
    grad_out, x, weight, dx, dweight_partials, dbias_partials, dweight, dbias,
    stride_dy_row, stride_dy_col, stride_x_row, stride_x_col, stride_dx_row, n_rows, n_cols,
    EPS: tl.constexpr, OFFSET: tl.constexpr, CENTER: tl.constexpr, ROUND_NORMED: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr, COMPUTE: tl.constexpr,
    DIRECT_GRADS: tl.constexpr,
):  # fmt: skip
    """Partials are BLOCK_N wide: the launch sizes them programs x BLOCK_N."""
    inv_n = _inv_n(n_cols, COMPUTE)
    cols1 = tl.arange(0, BLOCK_N)
    col_mask = cols1 < n_cols
    scale, _ = _load_params(weight, weight, cols1, col_mask, OFFSET, HAS_WEIGHT, False, COMPUTE)
    cols = cols1[None, :]
    dw = tl.zeros([BLOCK_N], COMPUTE)
    db = tl.zeros([BLOCK_N], COMPUTE)
    # LOOP_STAGES > 1 software-pipelines the loads of the next row block (CUDA).
    for blk in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0), num_stages=LOOP_STAGES):
        rows = tl.cast(blk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
        mask = (rows < n_rows) & (cols < n_cols)
        xv = tl.load(x + rows * stride_x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE)
        dy = tl.load(grad_out + rows * stride_dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(COMPUTE)
        xc, rstd = _tile_stats(xv, mask, inv_n, EPS, CENTER)
        # Masked: rows past n_rows would give 0 * rsqrt(EPS), NaN when EPS is 0.
        xhat = tl.where(mask, xc * rstd, 0.0)
        g = dy * scale[None, :]
        dxv = g - xhat * (tl.sum(g * xhat, axis=1)[:, None] * inv_n)
        if CENTER:
            dxv -= tl.sum(g, axis=1)[:, None] * inv_n
        tl.store(dx + rows * stride_dx_row + cols, (dxv * rstd).to(dx.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            dw += tl.sum(dy * _as_weighted(xhat, x.dtype.element_ty, ROUND_NORMED), axis=0)
        if HAS_BIAS:
            db += tl.sum(dy, axis=0)
    _store_partials(dweight_partials, dbias_partials, dweight, dbias, dw, db, cols1, col_mask,
                    HAS_WEIGHT, HAS_BIAS, DIRECT_GRADS, BLOCK_N)  # fmt: skip


@triton.jit
def bwd_blocked_kernel(
    grad_out, x, weight, dx, dweight_partials, dbias_partials,
    stride_dy_row, stride_dy_col, stride_x_row, stride_x_col, stride_dx_row, n_rows, n_cols,
    EPS: tl.constexpr, OFFSET: tl.constexpr, CENTER: tl.constexpr, ROUND_NORMED: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Partials are n_cols wide and zeroed by the launch: each program adds
    its rows' terms into its own row of them, in row order."""
    inv_n = _inv_n(n_cols, COMPUTE)
    own = tl.cast(tl.program_id(0), tl.int64) * n_cols
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x_row = x + row64 * stride_x_row
        dy_row = grad_out + row64 * stride_dy_row
        if CENTER:
            mean, rstd = _row_stats(x_row, stride_x_col, n_cols, inv_n, EPS, CENTER, BLOCK_N, COMPUTE)
        else:  # no mean: the squares come with the sums' pass below, one read of x fewer
            mean = tl.cast(0.0, COMPUTE)
            rstd = tl.cast(1.0, COMPUTE)
        sum_sq = tl.cast(0.0, COMPUTE)
        sum_gx = tl.cast(0.0, COMPUTE)
        sum_g = tl.cast(0.0, COMPUTE)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            xc = tl.where(mask, tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE) - mean, 0.0)
            scale, _ = _load_params(weight, weight, cols, mask, OFFSET, HAS_WEIGHT, False, COMPUTE)
            g = tl.load(dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(COMPUTE) * scale
            if not CENTER:
                sum_sq += tl.sum(xc * xc)
            sum_gx += tl.sum(g * xc)
            sum_g += tl.sum(g)
        if not CENTER:
            rstd = _rstd(sum_sq, inv_n, EPS)
        sum_gx *= rstd  # sum(g * xhat): xhat = xc * rstd
        c1 = sum_gx * inv_n
        c2 = sum_g * inv_n
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            xhat = tl.where(mask, (tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(COMPUTE) - mean)
                            * rstd, 0.0)  # fmt: skip
            scale, _ = _load_params(weight, weight, cols, mask, OFFSET, HAS_WEIGHT, False, COMPUTE)
            dy = tl.load(dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(COMPUTE)
            dxv = dy * scale - xhat * c1
            if CENTER:
                dxv -= c2
            tl.store(dx + row64 * stride_dx_row + cols, (dxv * rstd).to(dx.dtype.element_ty), mask=mask)
            if HAS_WEIGHT:
                term = dy * _as_weighted(xhat, x.dtype.element_ty, ROUND_NORMED)
                tl.store(dweight_partials + own + cols, tl.load(dweight_partials + own + cols, mask=mask) + term,
                         mask=mask)  # fmt: skip
            if HAS_BIAS:
                tl.store(dbias_partials + own + cols, tl.load(dbias_partials + own + cols, mask=mask) + dy, mask=mask)


@triton.jit
def reduce_param_grads_kernel(
    dweight_partials, dbias_partials, dweight, dbias, n_programs, n_cols, stride_partials,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """dweight and dbias (n_cols,) from the (programs, stride_partials)
    partials: each program sums BLOCK_C columns over the programs' rows in
    program order, in the partials' dtype."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < n_cols
    if HAS_WEIGHT:
        acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=dweight_partials.dtype.element_ty)
        for start in range(0, n_programs, BLOCK_P):
            rows = start + tl.arange(0, BLOCK_P)[:, None]
            m = (rows < n_programs) & col_mask[None, :]
            acc += tl.load(dweight_partials + rows * stride_partials + cols[None, :], mask=m, other=0.0)
        tl.store(dweight + cols, _narrow(tl.sum(acc, axis=0), dweight.dtype.element_ty), mask=col_mask)
    if HAS_BIAS:
        acc_b = tl.zeros([BLOCK_P, BLOCK_C], dtype=dbias_partials.dtype.element_ty)
        for start in range(0, n_programs, BLOCK_P):
            rows = start + tl.arange(0, BLOCK_P)[:, None]
            m = (rows < n_programs) & col_mask[None, :]
            acc_b += tl.load(dbias_partials + rows * stride_partials + cols[None, :], mask=m, other=0.0)
        tl.store(dbias + cols, _narrow(tl.sum(acc_b, axis=0), dbias.dtype.element_ty), mask=col_mask)
