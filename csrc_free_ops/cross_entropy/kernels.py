"""Every Triton kernel of cross-entropy, shared by CUDA and the NPU (which
differ only in their Plan) and by fused_linear_cross_entropy, which runs them
on each chunk of logits it computes.

Each program walks rows with a grid stride (CUDA: one program per row, so
the loop runs once; NPU: one program per vector core) and each row in
column blocks of BLOCK_N:

* ``forward_kernel``: one pass of online softmax (running max and sum of
  exponentials per block) gives lse; with the target's logit and, under
  label smoothing, the (weighted) sum of the logits it stores the row's loss,
  z-loss and lse in COMPUTE.  Rows whose target is ignore_index store 0.
  Logits row r is row ``first_row + r`` of target and the outputs: a chunk
  of fused_linear_cross_entropy writes into the whole buffers, never into
  a view of them (under torch.compile a kernel's write into a slice becomes
  a clone and a slice_scatter per chunk, a pattern Inductor has compiled
  into reads past a buffer's end).
* ``backward_kernel``: from the forward's lse, one pass writes the logits'
  gradient, scaled per row by ``ce_scale`` and ``z_scale`` (a stride of 0
  broadcasts a scalar).  IN_PLACE writes it over the logits (the chunk
  buffer of fused_linear_cross_entropy), else into ``grad_logits``.  Each
  block is loaded before it is stored, so in place is safe.

A target outside [0, V) that is not ignore_index never addresses memory: it
is clamped for the loads and its row's loss, z-loss and gradient are NaN
(the launch entries raise before launching where they can check).

The float options are constexprs (they are fixed for a training run; SOFTCAP
is 1.0 when HAS_SOFTCAP is off), materialized in COMPUTE with tl.full: a
float64 run gets them exactly, where a runtime float argument would arrive
as float32.
"""

import triton
import triton.language as tl


@triton.jit
def _tanh(v):
    """tanh from exp, for every backend (libdevice's is CUDA only)."""
    e = tl.exp(-2.0 * tl.abs(v))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(v < 0, -t, t)


@triton.jit
def _capped(v, softcap, HAS_SOFTCAP: tl.constexpr):
    if HAS_SOFTCAP:
        v = softcap * _tanh(v / softcap)
    return v


@triton.jit
def _row_target(target, row, n_cols, ignore_index):
    """(y clamped into [0, n_cols), whether the row counts, whether y is bad)."""
    y = tl.load(target + row).to(tl.int64)
    valid = y != ignore_index
    bad = valid & ((y < 0) | (y >= n_cols))
    return tl.where(bad, 0, y), valid, bad


@triton.jit
def forward_kernel(
    logits, target, weight, weight_sum, loss, z_loss, lse,
    stride_row, first_row, n_rows, n_cols, ignore_index,
    LABEL_SMOOTHING: tl.constexpr, LSE_SQUARE_SCALE: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    softcap = tl.full([], SOFTCAP, COMPUTE)
    ls = tl.full([], LABEL_SMOOTHING, COMPUTE)
    z_scale = tl.full([], LSE_SQUARE_SCALE, COMPUTE)
    cols0 = tl.arange(0, BLOCK_N)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        at = first_row + row64  # the row's place in target and the per-row outputs
        y, valid, bad = _row_target(target, at, n_cols, ignore_index)
        row_loss = tl.zeros([], COMPUTE)
        row_z = tl.zeros([], COMPUTE)
        row_lse = tl.zeros([], COMPUTE)
        if valid:
            x_row = logits + row64 * stride_row
            m = tl.full([], float("-inf"), COMPUTE)
            d = tl.zeros([], COMPUTE)
            s_sum = tl.zeros([], COMPUTE)
            for start in range(0, n_cols, BLOCK_N):
                cols = start + cols0
                mask = cols < n_cols
                # Masked lanes load 0 (softcapped 0): they add nothing to the smoothing sums.
                s = _capped(tl.load(x_row + cols, mask=mask, other=0.0).to(COMPUTE), softcap, HAS_SOFTCAP)
                if LABEL_SMOOTHING > 0:
                    if HAS_WEIGHT:
                        s_sum += tl.sum(s * tl.load(weight + cols, mask=mask, other=0.0).to(COMPUTE), axis=0)
                    else:
                        s_sum += tl.sum(s, axis=0)
                s = tl.where(mask, s, float("-inf"))
                m_new = tl.maximum(m, tl.max(s, axis=0))
                d = d * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new), axis=0)
                m = m_new
            row_lse = m + tl.log(d)
            s_y = _capped(tl.load(x_row + y).to(COMPUTE), softcap, HAS_SOFTCAP)
            w_y = tl.full([], 1.0, COMPUTE)
            if HAS_WEIGHT:
                w_y = tl.load(weight + y).to(COMPUTE)
            row_loss = (1.0 - ls) * w_y * (row_lse - s_y)
            if LABEL_SMOOTHING > 0:
                if HAS_WEIGHT:
                    w_all = tl.load(weight_sum).to(COMPUTE)
                else:
                    w_all = tl.cast(n_cols, COMPUTE)
                row_loss += ls / tl.cast(n_cols, COMPUTE) * (w_all * row_lse - s_sum)
            row_z = z_scale * row_lse * row_lse
            nan = tl.full([], float("nan"), COMPUTE)
            row_loss = tl.where(bad, nan, row_loss)
            row_z = tl.where(bad, nan, row_z)
        tl.store(loss + at, row_loss)
        tl.store(z_loss + at, row_z)
        tl.store(lse + at, row_lse)


@triton.jit
def backward_kernel(
    logits, target, weight, weight_sum, lse, ce_scale, z_scale, grad_logits,
    stride_row, stride_grad_row, stride_scale, n_rows, n_cols, class_offset, n_classes, ignore_index,
    LABEL_SMOOTHING: tl.constexpr, LSE_SQUARE_SCALE: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr, IN_PLACE: tl.constexpr, BLOCK_N: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """grad = a * ((1 - ls) * w[y] * (p - [c == y]) + ls / V * (W * p - w[c]))
            + b * 2 * lse_square_scale * lse * p,   times (1 - tanh^2) under softcap,
    with p = softmax(s), W = sum(w), a = ce_scale[row], b = z_scale[row].  The n_cols columns are
    the classes class_offset.. of n_classes (every term is elementwise given the row's lse)."""
    softcap = tl.full([], SOFTCAP, COMPUTE)
    ls = tl.full([], LABEL_SMOOTHING, COMPUTE)
    two_z = tl.full([], 2.0 * LSE_SQUARE_SCALE, COMPUTE)
    smooth_per_class = ls / tl.cast(n_classes, COMPUTE)
    w_all = tl.cast(n_classes, COMPUTE)
    if LABEL_SMOOTHING > 0:
        if HAS_WEIGHT:  # weight_sum is a placeholder (maybe empty) without label smoothing
            w_all = tl.load(weight_sum).to(COMPUTE)
    cols0 = tl.arange(0, BLOCK_N)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        y, valid, bad = _row_target(target, row64, n_classes, ignore_index)
        y_here = y - class_offset
        x_row = logits + row64 * stride_row
        g_row = x_row
        if not IN_PLACE:
            g_row = grad_logits + row64 * stride_grad_row
        if valid:
            row_lse = tl.load(lse + row64).to(COMPUTE)
            a = tl.load(ce_scale + row64 * stride_scale).to(COMPUTE)
            b = tl.load(z_scale + row64 * stride_scale).to(COMPUTE)
            w_y = tl.full([], 1.0, COMPUTE)
            if HAS_WEIGHT:
                w_y = tl.load(weight + y).to(COMPUTE)
            ce_coef = a * (1.0 - ls) * w_y
            p_coef = ce_coef + a * smooth_per_class * w_all + b * two_z * row_lse
            poison = tl.where(bad, tl.full([], float("nan"), COMPUTE), tl.zeros([], COMPUTE))
            for start in range(0, n_cols, BLOCK_N):
                cols = start + cols0
                mask = cols < n_cols
                raw = tl.load(x_row + cols, mask=mask, other=0.0).to(COMPUTE)
                s = _capped(raw, softcap, HAS_SOFTCAP)
                p = tl.exp(s - row_lse)
                g = p_coef * p - tl.where(cols == y_here, ce_coef, 0.0)
                if LABEL_SMOOTHING > 0:
                    if HAS_WEIGHT:
                        w = tl.load(weight + class_offset + cols, mask=mask, other=0.0).to(COMPUTE)
                        g -= a * smooth_per_class * w
                    else:
                        g -= a * smooth_per_class
                if HAS_SOFTCAP:
                    t = s / softcap
                    g = g * (1.0 - t * t)
                g += poison
                tl.store(g_row + cols, g.to(g_row.dtype.element_ty), mask=mask)
        else:
            for start in range(0, n_cols, BLOCK_N):
                cols = start + cols0
                tl.store(g_row + cols, tl.zeros([BLOCK_N], g_row.dtype.element_ty), mask=cols < n_cols)
