"""Triton kernels of GroupNorm, shared by the CUDA and NPU launchers.

The kernels differ between backends only in launch policy (grid, tile sizes,
warps), so both launchers run these.  Every kernel walks its work with a grid
stride, so a grid of any size (an SM multiple on CUDA, at most the vector
cores on an Ascend NPU) covers all of it.  Offsets are computed from the
item's base on every step; no pointer is advanced inside a loop.

Statistics, all in float32 (see ``plan.py`` for items and segments):

* a partial pass gives each (sample, channel, segment) its mean and M2 (sum
  of squared deviations).  Sums run on x minus the segment's first element,
  so a large mean does not cancel away the variance;
* a finalize pass per (sample, group) merges its segments with Chan's
  formula: mean = sum(cnt_i * mean_i) / L, M2 = sum(M2_i + cnt_i * (mean_i -
  mean)^2), rstd = rsqrt(M2 / L + eps).

Backward, with xhat = (x - mean) * rstd and g = dy * w:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   over the group,
    dweight[c] = sum over (n, spatial) of dy * xhat,  dbias[c] = sum of dy.
Its partial pass also keeps sum(dy) and sum(dy * (x - mean_i)) per segment;
the finalize turns them into the group means above and per-segment dweight
terms, and a reduce kernel sums those over samples and segments in a fixed
order.  No atomics anywhere: two runs give bitwise-equal results.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _item_coords(item, c_blocks, splits):
    """(sample, channel block, segment) of a work item, as int64."""
    item = tl.cast(item, tl.int64)
    s = item % splits
    rest = item // splits
    return rest // c_blocks, rest % c_blocks, s


@triton.jit
def _segment_count(s, hw, chunk):
    return tl.minimum(chunk, hw - s * chunk)


@triton.jit
def _shifted_sums(
    X, DY, rows, c_mask, start, hw, chunk, HAS_DY: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr
):
    """Over one segment of each channel row: the shift k (first element), and
    sum(d), sum(d^2), sum(dy), sum(dy * d) with d = x - k, each of shape [BLOCK_C]."""
    k = tl.load(X + rows + start, mask=c_mask, other=0.0).to(tl.float32)
    acc_d = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    acc_dd = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    acc_gd = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    for step in range(0, chunk, BLOCK_HW):
        cols = start + step + tl.arange(0, BLOCK_HW)
        mask = c_mask[:, None] & (cols < hw)[None, :]
        offs = rows[:, None] + cols[None, :]
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, x - k[:, None], 0.0)
        acc_d += d
        acc_dd += d * d
        if HAS_DY:
            dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
            acc_g += dy
            acc_gd += dy * d
    return k, tl.sum(acc_d, 1), tl.sum(acc_dd, 1), tl.sum(acc_g, 1), tl.sum(acc_gd, 1)


@triton.jit
def _segments(j0, row, groups, cpg, C, splits, seg_per_group, hw, chunk, BLOCK_P: tl.constexpr):
    """Partials j0 .. j0 + BLOCK_P of group row (n * G + g): their index in
    the (N, splits, C) partial layout, mask, channel, and element count."""
    j = j0 + tl.arange(0, BLOCK_P)
    s = j // cpg
    channel = (row % groups) * cpg + j % cpg
    idx = ((row // groups) * splits + s) * C + channel
    return idx, j < seg_per_group, channel, _segment_count(s, hw, chunk).to(tl.float32)


@triton.jit
def _group_mean_m2(PART, row, n_segments, groups, cpg, C, splits, seg_per_group, hw, chunk, group_size,
                   BLOCK_P: tl.constexpr):  # fmt: skip
    """Chan's merge of a group's segment (mean, M2) partials."""
    acc = tl.zeros([BLOCK_P], dtype=tl.float32)
    for j0 in range(0, seg_per_group, BLOCK_P):
        idx, mask, _, cnt = _segments(j0, row, groups, cpg, C, splits, seg_per_group, hw, chunk, BLOCK_P)
        acc += tl.where(mask, tl.load(PART + idx, mask=mask, other=0.0) * cnt, 0.0)
    mean = tl.sum(acc) / group_size
    acc = tl.zeros([BLOCK_P], dtype=tl.float32)
    for j0 in range(0, seg_per_group, BLOCK_P):
        idx, mask, _, cnt = _segments(j0, row, groups, cpg, C, splits, seg_per_group, hw, chunk, BLOCK_P)
        delta = tl.load(PART + idx, mask=mask, other=0.0) - mean
        m2 = tl.load(PART + n_segments + idx, mask=mask, other=0.0)
        acc += tl.where(mask, m2 + cnt * delta * delta, 0.0)
    return mean, tl.sum(acc)


@triton.jit
def _group_coords(cs, n, cpg, groups):
    """Row (n * G + g) of the group of each channel in cs."""
    return n * groups + cs // cpg


@triton.jit
def fwd_partials_kernel(
    X, PART, C, hw, c_blocks, splits, chunk, n_items, n_segments,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):  # fmt: skip
    """PART[0] = segment mean, PART[1] = segment M2, per (n, c, segment)."""
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        n, cb, s = _item_coords(item, c_blocks, splits)
        cs = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        c_mask = cs < C
        start = s * chunk
        k, s1, s2, _, _ = _shifted_sums(X, X, (n * C + cs) * hw, c_mask, start, hw, chunk, False, BLOCK_C, BLOCK_HW)
        cnt = _segment_count(s, hw, chunk).to(tl.float32)
        seg = (n * splits + s) * C + cs
        tl.store(PART + seg, k + s1 / cnt, mask=c_mask)
        tl.store(PART + n_segments + seg, tl.maximum(s2 - s1 * s1 / cnt, 0.0), mask=c_mask)


@triton.jit
def fwd_finalize_kernel(
    PART, STATS, n_rows, n_segments, groups, cpg, C, splits, seg_per_group, hw, chunk, group_size, eps,
    BLOCK_P: tl.constexpr,
):  # fmt: skip
    """STATS[0] = mean, STATS[1] = rstd, per (n, g) row."""
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        mean, m2 = _group_mean_m2(
            PART, row, n_segments, groups, cpg, C, splits, seg_per_group, hw, chunk, group_size, BLOCK_P
        )
        tl.store(STATS + row, mean)
        tl.store(STATS + n_rows + row, tl.math.rsqrt(m2 / group_size + eps))


@triton.jit
def fwd_apply_kernel(
    X, Y, W, B, STATS, C, hw, cpg, groups, n_rows, c_blocks, splits, chunk, n_items,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):  # fmt: skip
    """y = (x - mean) * rstd * w + b."""
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        n, cb, s = _item_coords(item, c_blocks, splits)
        cs = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        c_mask = cs < C
        grp = _group_coords(cs, n, cpg, groups)
        mean = tl.load(STATS + grp, mask=c_mask, other=0.0)
        scale = tl.load(STATS + n_rows + grp, mask=c_mask, other=0.0)
        if HAS_W:
            scale = scale * tl.load(W + cs, mask=c_mask, other=0.0).to(tl.float32)
        shift = tl.zeros([BLOCK_C], dtype=tl.float32)
        if HAS_B:
            shift = tl.load(B + cs, mask=c_mask, other=0.0).to(tl.float32)
        rows = (n * C + cs) * hw
        start = s * chunk
        for step in range(0, chunk, BLOCK_HW):
            cols = start + step + tl.arange(0, BLOCK_HW)
            mask = c_mask[:, None] & (cols < hw)[None, :]
            offs = rows[:, None] + cols[None, :]
            x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            y = (x - mean[:, None]) * scale[:, None] + shift[:, None]
            tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def bwd_partials_kernel(
    X, DY, PART, C, hw, c_blocks, splits, chunk, n_items, n_segments,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):  # fmt: skip
    """PART[0..3] = segment mean, M2, sum(dy), sum(dy * (x - segment mean))."""
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        n, cb, s = _item_coords(item, c_blocks, splits)
        cs = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        c_mask = cs < C
        start = s * chunk
        k, s1, s2, sg, sgd = _shifted_sums(X, DY, (n * C + cs) * hw, c_mask, start, hw, chunk, True, BLOCK_C, BLOCK_HW)
        cnt = _segment_count(s, hw, chunk).to(tl.float32)
        d_mean = s1 / cnt
        seg = (n * splits + s) * C + cs
        tl.store(PART + seg, k + d_mean, mask=c_mask)
        tl.store(PART + n_segments + seg, tl.maximum(s2 - s1 * d_mean, 0.0), mask=c_mask)
        tl.store(PART + 2 * n_segments + seg, sg, mask=c_mask)
        tl.store(PART + 3 * n_segments + seg, sgd - d_mean * sg, mask=c_mask)


@triton.jit
def bwd_finalize_kernel(
    PART, W, STATS, n_rows, n_segments, groups, cpg, C, splits, seg_per_group, hw, chunk, group_size, eps,
    HAS_W: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """STATS[0..3] = mean, rstd, mean(g), mean(g * xhat) per (n, g) row, and
    PART[3] overwritten by each segment's dweight term rstd * sum(dy * (x - mean))."""
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        mean, m2 = _group_mean_m2(
            PART, row, n_segments, groups, cpg, C, splits, seg_per_group, hw, chunk, group_size, BLOCK_P
        )
        rstd = tl.math.rsqrt(m2 / group_size + eps)
        acc_g = tl.zeros([BLOCK_P], dtype=tl.float32)
        acc_gx = tl.zeros([BLOCK_P], dtype=tl.float32)
        for j0 in range(0, seg_per_group, BLOCK_P):
            idx, mask, channel, _ = _segments(j0, row, groups, cpg, C, splits, seg_per_group, hw, chunk, BLOCK_P)
            mu = tl.load(PART + idx, mask=mask, other=0.0)
            sg = tl.load(PART + 2 * n_segments + idx, mask=mask, other=0.0)
            sgd = tl.load(PART + 3 * n_segments + idx, mask=mask, other=0.0)
            centered = sgd + (mu - mean) * sg  # sum(dy * (x - group mean)) over the segment
            w = 1.0
            if HAS_W:
                w = tl.load(W + channel, mask=mask, other=0.0).to(tl.float32)
                tl.store(PART + 3 * n_segments + idx, rstd * centered, mask=mask)
            acc_g += w * sg
            acc_gx += w * centered
        tl.store(STATS + row, mean)
        tl.store(STATS + n_rows + row, rstd)
        tl.store(STATS + 2 * n_rows + row, tl.sum(acc_g) / group_size)
        tl.store(STATS + 3 * n_rows + row, rstd * tl.sum(acc_gx) / group_size)


@triton.jit
def bwd_dx_kernel(
    X, DY, DX, W, STATS, C, hw, cpg, groups, n_rows, c_blocks, splits, chunk, n_items,
    HAS_W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):  # fmt: skip
    """dx = rstd * (dy * w - mean(g) - xhat * mean(g * xhat))."""
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        n, cb, s = _item_coords(item, c_blocks, splits)
        cs = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        c_mask = cs < C
        grp = _group_coords(cs, n, cpg, groups)
        mean = tl.load(STATS + grp, mask=c_mask, other=0.0)[:, None]
        rstd = tl.load(STATS + n_rows + grp, mask=c_mask, other=0.0)[:, None]
        mg = tl.load(STATS + 2 * n_rows + grp, mask=c_mask, other=0.0)[:, None]
        mgx = tl.load(STATS + 3 * n_rows + grp, mask=c_mask, other=0.0)[:, None]
        w = tl.full([BLOCK_C], 1.0, dtype=tl.float32)
        if HAS_W:
            w = tl.load(W + cs, mask=c_mask, other=0.0).to(tl.float32)
        rows = (n * C + cs) * hw
        start = s * chunk
        for step in range(0, chunk, BLOCK_HW):
            cols = start + step + tl.arange(0, BLOCK_HW)
            mask = c_mask[:, None] & (cols < hw)[None, :]
            offs = rows[:, None] + cols[None, :]
            x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
            xhat = (x - mean) * rstd
            dx = rstd * (dy * w[:, None] - mg - xhat * mgx)
            tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def channel_reduce_kernel(
    PART, DW, DB, n_part_rows, C, n_segments,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Column sums of the (N * splits, C) partials in a fixed order:
    dweight from PART[3], dbias from PART[2]."""
    for cb in tl.range(tl.program_id(0), tl.cdiv(C, BLOCK_C), tl.num_programs(0)):
        cs = tl.cast(cb, tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_mask = cs < C
        acc_w = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
        for r0 in range(0, n_part_rows, BLOCK_R):
            rs = tl.cast(r0, tl.int64) + tl.arange(0, BLOCK_R)
            mask = (rs < n_part_rows)[:, None] & c_mask[None, :]
            offs = rs[:, None] * C + cs[None, :]
            if HAS_W:
                acc_w += tl.load(PART + 3 * n_segments + offs, mask=mask, other=0.0)
            if HAS_B:
                acc_b += tl.load(PART + 2 * n_segments + offs, mask=mask, other=0.0)
        if HAS_W:
            tl.store(DW + cs, tl.sum(acc_w, 0).to(DW.dtype.element_ty), mask=c_mask)
        if HAS_B:
            tl.store(DB + cs, tl.sum(acc_b, 0).to(DB.dtype.element_ty), mask=c_mask)
