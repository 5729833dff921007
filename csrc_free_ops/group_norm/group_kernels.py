"""GroupNorm kernels in which one program owns a whole (sample, group).

x is contiguous (N, C, HW), so a group's cpg * hw elements are one
contiguous run starting at row * cpg * hw.  Two kinds, shared by the CUDA
and NPU launchers:

* whole: the group, padded to a [BLOCK_C, BLOCK_HW] tile, sits in registers
  (or UB); x is read once and the variance is an exact two-pass one;
* looped: the group is walked in [BLOCK_C, BLOCK_HW] tiles twice -- once for
  the statistics (float32 sums of x minus the mean of the group's first
  tile, so that a large mean does not cancel the variance), once to write
  the output.  The second pass walks the tiles last-first, so it re-reads
  what the first pass just streamed while it is still in L2 (the forward's
  launcher can add eviction hints that keep it there): HBM sees x about
  once, and no partials, merge or second launch are needed.

Backward needs the group sums of g = dy * w and g * (x - mean); the looped
kernel gathers them with the statistics in its first pass.  Both kinds
write the per-(sample, channel) dweight / dbias terms that
``kernels.channel_reduce_kernel`` sums, as sum(dy * xhat) and sum(dy) in
two (N, C) rows of PART (GRAD_W_ROW, GRAD_B_ROW).  Each takes the runtime
arguments of the split path's apply / dx kernel (PART unused forward, chunk
unused), so the launch sequence passes the same arguments to any plan.
"""

from __future__ import annotations

import triton
import triton.language as tl

from csrc_free_ops.group_norm.kernels import _group_size

# The float32 (N, C) rows of PART a backward kernel here fills with PARAM_GRADS.
GRAD_W_ROW = tl.constexpr(0)
GRAD_B_ROW = tl.constexpr(1)
GRAD_ROWS = 2


@triton.jit
def _whole_group(X, row, groups, cpg, hw, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """For the (sample, group) ``row`` (int64) of a contiguous (N, C, HW) x,
    whose cpg * hw elements are contiguous: the tile's offsets and mask, the
    group's channel indices and their mask, x - mean (zero outside the group)
    and the variance."""
    ch = tl.arange(0, BLOCK_C)
    c_mask = ch < cpg
    cols = tl.arange(0, BLOCK_HW)
    mask = c_mask[:, None] & (cols < hw)[None, :]
    offs = row * cpg * hw + ch[:, None] * hw + cols[None, :]
    size = _group_size(cpg, hw)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(tl.sum(x, 1), 0) / size
    d = tl.where(mask, x - mean, 0.0)
    cs = (row % groups) * cpg + ch
    return offs, mask, cs, c_mask, d, tl.sum(tl.sum(d * d, 1), 0) / size


@triton.jit
def fwd_group_kernel(
    X, Y, W, B, PART, N, C, hw, cpg, chunk, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):  # fmt: skip
    """y = (x - mean) * rstd * w + b with each (sample, group) held whole by one
    program (exact two-pass variance in registers).  Takes fwd_apply_kernel's
    runtime arguments; PART and chunk are unused."""
    groups = C // cpg
    n_rows = tl.cast(N, tl.int64) * groups
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        offs, mask, cs, c_mask, d, var = _whole_group(X, row, groups, cpg, hw, BLOCK_C, BLOCK_HW)
        scale = tl.full([BLOCK_C], 1.0, dtype=tl.float32) * tl.math.rsqrt(var + eps)
        if HAS_W:
            scale = scale * tl.load(W + cs, mask=c_mask, other=0.0).to(tl.float32)
        shift = tl.zeros([BLOCK_C], dtype=tl.float32)
        if HAS_B:
            shift = tl.load(B + cs, mask=c_mask, other=0.0).to(tl.float32)
        y = d * scale[:, None] + shift[:, None]
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def bwd_group_kernel(
    X, DY, DX, W, PART, N, C, hw, cpg, chunk, eps,
    HAS_W: tl.constexpr, PARAM_GRADS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):  # fmt: skip
    """dx for each (sample, group) held whole by one program, and with
    PARAM_GRADS the per-(sample, channel) partials that channel_reduce_kernel
    sums: sum(dy * xhat) and sum(dy) per (N, C) PART row.  Takes bwd_dx_kernel's runtime arguments (chunk
    unused)."""
    groups = C // cpg
    n_rows = tl.cast(N, tl.int64) * groups
    n_segments = tl.cast(N, tl.int64) * C
    size = _group_size(cpg, hw)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        offs, mask, cs, c_mask, d, var = _whole_group(X, row, groups, cpg, hw, BLOCK_C, BLOCK_HW)
        rstd = tl.math.rsqrt(var + eps)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        xhat = d * rstd
        g = dy
        if HAS_W:
            g = dy * tl.load(W + cs, mask=c_mask, other=0.0).to(tl.float32)[:, None]
        mg = tl.sum(tl.sum(g, 1), 0) / size
        mgx = tl.sum(tl.sum(g * xhat, 1), 0) / size
        dx = rstd * (g - mg - xhat * mgx)
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        if PARAM_GRADS:
            seg = (row // groups) * C + cs
            tl.store(PART + GRAD_W_ROW * n_segments + seg, tl.sum(dy * xhat, 1), mask=c_mask)
            tl.store(PART + GRAD_B_ROW * n_segments + seg, tl.sum(dy, 1), mask=c_mask)


@triton.jit
def _group_tile(base, step, h_steps, cpg, hw, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """The step-th [BLOCK_C, BLOCK_HW] tile of the group starting at base
    (int64), walking positions within a channel block first: its offsets and
    mask, and its channels within the group and their mask."""
    ch = tl.cast(step // h_steps, tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    cols = (step % h_steps) * BLOCK_HW + tl.arange(0, BLOCK_HW)
    c_mask = ch < cpg
    mask = c_mask[:, None] & (cols < hw)[None, :]
    return base + ch[:, None] * hw + cols[None, :], mask, ch, c_mask


@triton.jit
def _channel_weights(W, first, ch, c_mask, HAS_W: tl.constexpr, BLOCK_C: tl.constexpr):
    if HAS_W:
        return tl.load(W + first + ch, mask=c_mask, other=0.0).to(tl.float32)
    return tl.full([BLOCK_C], 1.0, dtype=tl.float32)


@triton.jit
def _group_sums(X, DY, W, base, first, cpg, hw, h_steps, steps,
                HAS_DY: tl.constexpr, HAS_W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
                LOOP_STAGES: tl.constexpr, X_EVICT: tl.constexpr):  # fmt: skip
    """One pass over the group at base whose first channel is first: with
    d = x - k (k the mean of the group's first tile, so that the sums of d
    do not cancel) and g = dy * w, returns k and sum(d), sum(d^2), sum(g),
    sum(g * d) as float32 scalars; X_EVICT is the L2 eviction policy of the
    x loads."""
    offs, mask, _ch, _c_mask = _group_tile(base, 0, h_steps, cpg, hw, BLOCK_C, BLOCK_HW)
    first_tile = tl.load(X + offs, mask=mask, other=0.0, eviction_policy=X_EVICT).to(tl.float32)
    k = tl.sum(tl.sum(first_tile, 1), 0) / tl.sum(tl.sum(mask.to(tl.float32), 1), 0)
    acc_d = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    acc_dd = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    acc_gd = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    for step in tl.range(0, steps, num_stages=LOOP_STAGES):
        offs, mask, ch, c_mask = _group_tile(base, step, h_steps, cpg, hw, BLOCK_C, BLOCK_HW)
        x = tl.load(X + offs, mask=mask, other=0.0, eviction_policy=X_EVICT).to(tl.float32)
        d = tl.where(mask, x - k, 0.0)
        acc_d += d
        acc_dd += d * d
        if HAS_DY:
            w = _channel_weights(W, first, ch, c_mask, HAS_W, BLOCK_C)
            g = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32) * w[:, None]
            acc_g += g
            acc_gd += g * d
    s1 = tl.sum(tl.sum(acc_d, 1), 0)
    s2 = tl.sum(tl.sum(acc_dd, 1), 0)
    return k, s1, s2, tl.sum(tl.sum(acc_g, 1), 0), tl.sum(tl.sum(acc_gd, 1), 0)


@triton.jit
def _looped_group_stats(X, DY, W, row, groups, cpg, hw, h_steps, steps, eps,
                        HAS_DY: tl.constexpr, HAS_W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
                        LOOP_STAGES: tl.constexpr, X_EVICT: tl.constexpr):  # fmt: skip
    """One walk over the (sample, group) row (int64): its first element's
    offset, its first channel, mean and rstd, and with HAS_DY mean(g) and
    mean(g * xhat)."""
    base = row * cpg * hw
    first = (row % groups) * cpg
    size = _group_size(cpg, hw)
    k, s1, s2, sg, sgd = _group_sums(
        X, DY, W, base, first, cpg, hw, h_steps, steps, HAS_DY, HAS_W, BLOCK_C, BLOCK_HW, LOOP_STAGES, X_EVICT
    )
    mean_d = s1 / size  # mean - k
    rstd = tl.math.rsqrt(tl.maximum(s2 - s1 * mean_d, 0.0) / size + eps)
    return base, first, k + mean_d, rstd, sg / size, rstd * (sgd - mean_d * sg) / size


@triton.jit
def fwd_group_loop_kernel(
    X, Y, W, B, PART, N, C, hw, cpg, chunk, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
    LOOP_STAGES: tl.constexpr, STATS_EVICT: tl.constexpr, OUTPUT_EVICT: tl.constexpr,
):  # fmt: skip
    """y = (x - mean) * rstd * w + b, one program per (sample, group) walking
    it in tiles: statistics first, then the output last tile first.
    STATS_EVICT / OUTPUT_EVICT: L2 eviction policies of the first walk's x
    loads and of the second walk's loads and stores ("" for the default;
    evict_last / evict_first keep x in L2 for the second walk)."""
    groups = C // cpg
    h_steps = tl.cdiv(hw, BLOCK_HW)
    steps = tl.cdiv(cpg, BLOCK_C) * h_steps
    for row in tl.range(tl.program_id(0), tl.cast(N, tl.int64) * groups, tl.num_programs(0)):
        base, first, mean, rstd, _mg, _mgx = _looped_group_stats(
            X, X, W, tl.cast(row, tl.int64), groups, cpg, hw, h_steps, steps, eps,
            False, False, BLOCK_C, BLOCK_HW, LOOP_STAGES, STATS_EVICT,
        )  # fmt: skip
        for i in tl.range(0, steps, num_stages=LOOP_STAGES):
            offs, mask, ch, c_mask = _group_tile(base, steps - 1 - i, h_steps, cpg, hw, BLOCK_C, BLOCK_HW)
            scale = _channel_weights(W, first, ch, c_mask, HAS_W, BLOCK_C) * rstd
            shift = tl.zeros([BLOCK_C], dtype=tl.float32)
            if HAS_B:
                shift = tl.load(B + first + ch, mask=c_mask, other=0.0).to(tl.float32)
            x = tl.load(X + offs, mask=mask, other=0.0, eviction_policy=OUTPUT_EVICT).to(tl.float32)
            y = (x - mean) * scale[:, None] + shift[:, None]
            tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask, eviction_policy=OUTPUT_EVICT)


@triton.jit
def bwd_group_loop_kernel(
    X, DY, DX, W, PART, N, C, hw, cpg, chunk, eps,
    HAS_W: tl.constexpr, PARAM_GRADS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    """dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), one program per
    (sample, group) walking it in tiles: the group sums first, then dx last
    tile first, with PARAM_GRADS summing each channel's sum(dy * xhat) and
    sum(dy) on the way (as bwd_group_kernel), stored when its block's last
    tile in this order is done."""
    groups = C // cpg
    n_segments = tl.cast(N, tl.int64) * C
    h_steps = tl.cdiv(hw, BLOCK_HW)
    steps = tl.cdiv(cpg, BLOCK_C) * h_steps
    for row in tl.range(tl.program_id(0), tl.cast(N, tl.int64) * groups, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        base, first, mean, rstd, mg, mgx = _looped_group_stats(
            X, DY, W, row, groups, cpg, hw, h_steps, steps, eps, True, HAS_W, BLOCK_C, BLOCK_HW, LOOP_STAGES, ""
        )
        acc_w = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
        for i in tl.range(0, steps, num_stages=LOOP_STAGES):
            step = steps - 1 - i
            offs, mask, ch, c_mask = _group_tile(base, step, h_steps, cpg, hw, BLOCK_C, BLOCK_HW)
            w = _channel_weights(W, first, ch, c_mask, HAS_W, BLOCK_C)
            x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
            dx = rstd * (dy * w[:, None] - mg - xhat * mgx)
            tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
            if PARAM_GRADS:
                acc_w += dy * xhat
                acc_b += dy
                if step % h_steps == 0:  # the channel block's last tile in this order
                    seg = (row // groups) * C + first + ch
                    tl.store(PART + GRAD_W_ROW * n_segments + seg, tl.sum(acc_w, 1), mask=c_mask)
                    tl.store(PART + GRAD_B_ROW * n_segments + seg, tl.sum(acc_b, 1), mask=c_mask)
                    acc_w = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
                    acc_b = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
