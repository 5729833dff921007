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
* the segments of each (sample, group) are merged with Chan's formula:
  mean = sum(cnt_i * mean_i) / L, M2 = sum(M2_i + cnt_i * (mean_i - mean)^2),
  rstd = rsqrt(M2 / L + eps).  Either each program of the next pass merges
  the groups of its own channels (``FUSED``: the partials are few and sit in
  L2), or a finalize kernel per (sample, group) stores them in STATS.

Backward, with xhat = (x - mean) * rstd and g = dy * w:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   over the group,
    dweight[c] = sum over (n, spatial) of dy * xhat,  dbias[c] = sum of dy.
Its partial pass also keeps sum(dy) and sum(dy * (x - mean_i)) per segment;
the merge turns them into the group means above, the dx kernel writes each
of its segments' dweight term, and a reduce kernel sums those over samples
and segments in a fixed order.  No atomics anywhere: two runs give
bitwise-equal results.

Kernels take only (N, C, HW, channels per group, chunk) as sizes and derive
the rest (channel blocks, splits, items, partial counts) in int64: a launch's
host cost grows with its argument count.  PART is one float32 buffer: NP rows
of N * splits * C partials (NP = 2 forward, 5 backward), then, when a finalize
kernel runs, the (N * G)-long STATS rows.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dims(N, C, hw, chunk, BLOCK_C: tl.constexpr):
    """int64 channel blocks, splits, work items and partials per PART row."""
    c_blocks = tl.cast(tl.cdiv(C, BLOCK_C), tl.int64)
    splits = tl.cast(tl.cdiv(hw, chunk), tl.int64)
    n_segments = tl.cast(N, tl.int64) * C * splits
    return c_blocks, splits, tl.cast(N, tl.int64) * c_blocks * splits, n_segments


@triton.jit
def _group_size(cpg, hw):
    """Elements of one group, as float32."""
    return (tl.cast(cpg, tl.int64) * hw).to(tl.float32)


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
def _group_stats(PART, W, n, cs, c_mask, C, hw, cpg, chunk, splits, n_segments,
                 BWD: tl.constexpr, HAS_W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):  # fmt: skip
    """Chan's merge, for each channel cs of sample n (int64), of the
    cpg * splits segment partials of the channel's group, read as a
    [BLOCK_C, BLOCK_P] tile per step at offsets from the group's first
    partial.  Returns the group's mean and M2 and, with BWD, sum(w * sum(dy))
    and sum(w * sum(dy * (x - mean))), each of shape [BLOCK_C]."""
    seg_per_group = cpg * splits
    first = (cs // cpg) * cpg  # the group's first channel
    base = n * splits * C + first
    size = _group_size(cpg, hw)
    acc = tl.zeros([BLOCK_C, BLOCK_P], dtype=tl.float32)
    for j0 in range(0, seg_per_group, BLOCK_P):
        j = j0 + tl.arange(0, BLOCK_P)
        s = tl.cast(j // cpg, tl.int64)
        idx = base[:, None] + (s * C + j % cpg)[None, :]
        mask = c_mask[:, None] & (j < seg_per_group)[None, :]
        cnt = _segment_count(s, hw, chunk).to(tl.float32)[None, :]
        acc += tl.where(mask, tl.load(PART + idx, mask=mask, other=0.0) * cnt, 0.0)
    mean = tl.sum(acc, 1) / size
    acc = tl.zeros([BLOCK_C, BLOCK_P], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_C, BLOCK_P], dtype=tl.float32)
    acc_gx = tl.zeros([BLOCK_C, BLOCK_P], dtype=tl.float32)
    for j0 in range(0, seg_per_group, BLOCK_P):
        j = j0 + tl.arange(0, BLOCK_P)
        s = tl.cast(j // cpg, tl.int64)
        idx = base[:, None] + (s * C + j % cpg)[None, :]
        mask = c_mask[:, None] & (j < seg_per_group)[None, :]
        cnt = _segment_count(s, hw, chunk).to(tl.float32)[None, :]
        delta = tl.load(PART + idx, mask=mask, other=0.0) - mean[:, None]
        m2 = tl.load(PART + n_segments + idx, mask=mask, other=0.0)
        acc += tl.where(mask, m2 + cnt * delta * delta, 0.0)
        if BWD:
            sg = tl.load(PART + 2 * n_segments + idx, mask=mask, other=0.0)
            sgd = tl.load(PART + 3 * n_segments + idx, mask=mask, other=0.0)
            w = 1.0
            if HAS_W:
                w = tl.load(W + first[:, None] + (j % cpg)[None, :], mask=mask, other=0.0).to(tl.float32)
            acc_g += w * sg
            acc_gx += w * (sgd + delta * sg)  # sum(dy * (x - group mean)) over the segment
    return mean, tl.sum(acc, 1), tl.sum(acc_g, 1), tl.sum(acc_gx, 1)


@triton.jit
def fwd_partials_kernel(X, PART, N, C, hw, chunk, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """PART[0] = segment mean, PART[1] = segment M2, per (n, c, segment)."""
    c_blocks, splits, n_items, n_segments = _dims(N, C, hw, chunk, BLOCK_C)
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
def fwd_finalize_kernel(PART, N, C, hw, cpg, chunk, eps, BLOCK_P: tl.constexpr):
    """STATS = PART[2:] = mean, rstd per (n, g) row (the unfused path)."""
    splits = tl.cast(tl.cdiv(hw, chunk), tl.int64)
    groups = C // cpg
    n_rows = tl.cast(N, tl.int64) * groups
    n_segments = n_rows * cpg * splits
    STATS = PART + 2 * n_segments
    one = tl.arange(0, 1)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        cs = (row % groups) * cpg + one
        mean, m2, _, _ = _group_stats(
            PART, PART, row // groups, cs, cs < C, C, hw, cpg, chunk, splits, n_segments, False, False, 1, BLOCK_P
        )
        tl.store(STATS + row + one, mean)
        tl.store(STATS + n_rows + row + one, tl.math.rsqrt(m2 / _group_size(cpg, hw) + eps))


@triton.jit
def fwd_apply_kernel(
    X, Y, W, B, PART, N, C, hw, cpg, chunk, eps,
    FUSED: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """y = (x - mean) * rstd * w + b; the statistics merged here (FUSED) or read from STATS."""
    c_blocks, splits, n_items, n_segments = _dims(N, C, hw, chunk, BLOCK_C)
    for i in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        # Last item first: the partials pass has just streamed those, so they are likeliest still in L2.
        n, cb, s = _item_coords(n_items - 1 - i, c_blocks, splits)
        cs = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        c_mask = cs < C
        if FUSED:
            mean, m2, _, _ = _group_stats(
                PART, W, n, cs, c_mask, C, hw, cpg, chunk, splits, n_segments, False, False, BLOCK_C, BLOCK_P
            )
            scale = tl.math.rsqrt(m2 / _group_size(cpg, hw) + eps)
        else:
            n_rows = tl.cast(N, tl.int64) * (C // cpg)
            grp = n * (C // cpg) + cs // cpg
            mean = tl.load(PART + 2 * n_segments + grp, mask=c_mask, other=0.0)
            scale = tl.load(PART + 2 * n_segments + n_rows + grp, mask=c_mask, other=0.0)
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
def bwd_partials_kernel(X, DY, PART, N, C, hw, chunk, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """PART[0..3] = segment mean, M2, sum(dy), sum(dy * (x - segment mean))."""
    c_blocks, splits, n_items, n_segments = _dims(N, C, hw, chunk, BLOCK_C)
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
def bwd_finalize_kernel(PART, W, N, C, hw, cpg, chunk, eps, HAS_W: tl.constexpr, BLOCK_P: tl.constexpr):
    """STATS = PART[5:] = mean, rstd, mean(g), mean(g * xhat) per (n, g) row (the unfused path)."""
    splits = tl.cast(tl.cdiv(hw, chunk), tl.int64)
    groups = C // cpg
    n_rows = tl.cast(N, tl.int64) * groups
    n_segments = n_rows * cpg * splits
    STATS = PART + 5 * n_segments
    size = _group_size(cpg, hw)
    one = tl.arange(0, 1)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        cs = (row % groups) * cpg + one
        mean, m2, sum_g, sum_gx = _group_stats(
            PART, W, row // groups, cs, cs < C, C, hw, cpg, chunk, splits, n_segments, True, HAS_W, 1, BLOCK_P
        )
        rstd = tl.math.rsqrt(m2 / size + eps)
        tl.store(STATS + row + one, mean)
        tl.store(STATS + n_rows + row + one, rstd)
        tl.store(STATS + 2 * n_rows + row + one, sum_g / size)
        tl.store(STATS + 3 * n_rows + row + one, rstd * sum_gx / size)


@triton.jit
def bwd_dx_kernel(
    X, DY, DX, W, PART, N, C, hw, cpg, chunk, eps,
    FUSED: tl.constexpr, HAS_W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """dx = rstd * (dy * w - mean(g) - xhat * mean(g * xhat)), the statistics
    merged here (FUSED) or read from STATS; with HAS_W also PART[4] = each
    segment's dweight term rstd * sum(dy * (x - mean))."""
    c_blocks, splits, n_items, n_segments = _dims(N, C, hw, chunk, BLOCK_C)
    for i in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        # Last item first: the partials pass has just streamed those, so they are likeliest still in L2.
        n, cb, s = _item_coords(n_items - 1 - i, c_blocks, splits)
        cs = cb * BLOCK_C + tl.arange(0, BLOCK_C)
        c_mask = cs < C
        if FUSED:
            size = _group_size(cpg, hw)
            mean, m2, sum_g, sum_gx = _group_stats(
                PART, W, n, cs, c_mask, C, hw, cpg, chunk, splits, n_segments, True, HAS_W, BLOCK_C, BLOCK_P
            )
            rstd = tl.math.rsqrt(m2 / size + eps)
            mg = sum_g / size
            mgx = rstd * sum_gx / size
        else:
            n_rows = tl.cast(N, tl.int64) * (C // cpg)
            grp = 5 * n_segments + n * (C // cpg) + cs // cpg
            mean = tl.load(PART + grp, mask=c_mask, other=0.0)
            rstd = tl.load(PART + n_rows + grp, mask=c_mask, other=0.0)
            mg = tl.load(PART + 2 * n_rows + grp, mask=c_mask, other=0.0)
            mgx = tl.load(PART + 3 * n_rows + grp, mask=c_mask, other=0.0)
        w = tl.full([BLOCK_C], 1.0, dtype=tl.float32)
        if HAS_W:
            w = tl.load(W + cs, mask=c_mask, other=0.0).to(tl.float32)
            # Only this item writes its segments' terms; every item reads PART[0..3] only.
            seg = (n * splits + s) * C + cs
            mu = tl.load(PART + seg, mask=c_mask, other=0.0)
            sg = tl.load(PART + 2 * n_segments + seg, mask=c_mask, other=0.0)
            sgd = tl.load(PART + 3 * n_segments + seg, mask=c_mask, other=0.0)
            tl.store(PART + 4 * n_segments + seg, rstd * (sgd + (mu - mean) * sg), mask=c_mask)
        mean = mean[:, None]
        rstd = rstd[:, None]
        mg = mg[:, None]
        mgx = mgx[:, None]
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
    PART, DW, DB, n_part_rows, C,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, W_ROW: tl.constexpr, B_ROW: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Column sums of the (N * splits, C) partials in a fixed order:
    dweight from PART[W_ROW], dbias from PART[B_ROW]."""
    n_segments = tl.cast(n_part_rows, tl.int64) * C
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
                acc_w += tl.load(PART + W_ROW * n_segments + offs, mask=mask, other=0.0)
            if HAS_B:
                acc_b += tl.load(PART + B_ROW * n_segments + offs, mask=mask, other=0.0)
        if HAS_W:
            tl.store(DW + cs, tl.sum(acc_w, 0).to(DW.dtype.element_ty), mask=c_mask)
        if HAS_B:
            tl.store(DB + cs, tl.sum(acc_b, 0).to(DB.dtype.element_ty), mask=c_mask)
