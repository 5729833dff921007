"""GroupNorm's kernels for channels-last x read by whole pixel rows (the
"nhwc" path; kernels.py holds the rest and the argument contracts these
share).

A work item is (sample, channel block of BLOCK_C channels across groups,
spatial segment of ``chunk`` positions); its tiles are [BLOCK_HW positions,
BLOCK_C channels], channels innermost, so each load reads BLOCK_C adjacent
channels of a pixel row where a group's tile would read only its cpg.  The
partials kernels store each segment's per-channel (mean, M2) (and backward
sum(dz), sum(dz * (x - segment mean))) in the split path's workspace rows,
(N, splits, C); kernels.py's finalize kernels merge them per (sample,
group) in a fixed order; the apply / dx kernels read each channel's group
statistics back by the channel's group index.  dweight / dbias terms go
through ``reduce_param_grads_kernel``: no atomics.

CUDA only: on the NPU channels-last x goes through a contiguous copy
(docs/npu.md says why).  Store addresses come from plain ints (kernels.py's
``_whole_tile`` says why).
"""

from __future__ import annotations

import triton
import triton.language as tl

from csrc_free_ops.group_norm.kernels import (
    _activate,
    _activation_grad,
    _channel_param,
    _narrow,
    _segment_count,
)


@triton.jit
def _nhwc_dims(N, C, HW, chunk, BLOCK_C: tl.constexpr):
    """int64 (channel blocks, segments per sample, work items, values per segment row)."""
    c_blocks = tl.cast(tl.cdiv(C, BLOCK_C), tl.int64)
    splits = tl.cast(tl.cdiv(HW, chunk), tl.int64)
    n = tl.cast(N, tl.int64)
    return c_blocks, splits, n * c_blocks * splits, n * splits * C


@triton.jit
def _nhwc_item(item, c_blocks, splits, C, BLOCK_C: tl.constexpr):
    """(sample, channels, their mask, segment) of a work item, int64;
    neighbouring items are neighbouring segments."""
    item = tl.cast(item, tl.int64)
    n = item // (c_blocks * splits)
    rest = item % (c_blocks * splits)
    cs = (rest // splits) * BLOCK_C + tl.arange(0, BLOCK_C)
    return n, cs, cs < C, rest % splits


@triton.jit
def _nhwc_stats(workspace, stats, n, cs, c_mask, cpg, num_groups, n_rows, ROW: tl.constexpr, DEFAULT: tl.constexpr):
    """The statistic in stats row ROW (one value per (sample, group)) of each channel's group."""
    return tl.load(workspace + stats + ROW * n_rows + n * num_groups + cs // cpg, mask=c_mask, other=DEFAULT)


@triton.jit
def _nhwc_sums(x, grad_out, base, cs, c_mask, start, HW, stride_s, chunk, scale, shift, mean, HAS_DY: tl.constexpr,
               ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
               COMPUTE: tl.constexpr):  # fmt: skip
    """Over one segment, per channel: the shift k (the segment's first
    position), sum(d), sum(d^2), sum(dz), sum(dz * d) with d = x - k, each
    of shape [BLOCK_C]; dz = dy taken through the ACTIVATION at
    z = (x - mean) * scale + shift (per-channel vectors)."""
    k = tl.load(x + base + start * stride_s + cs, mask=c_mask, other=0.0).to(COMPUTE)
    acc_d = tl.zeros([BLOCK_HW, BLOCK_C], dtype=COMPUTE)
    acc_dd = tl.zeros([BLOCK_HW, BLOCK_C], dtype=COMPUTE)
    acc_g = tl.zeros([BLOCK_HW, BLOCK_C], dtype=COMPUTE)
    acc_gd = tl.zeros([BLOCK_HW, BLOCK_C], dtype=COMPUTE)
    for step in range(0, chunk, BLOCK_HW):
        ps = start + step + tl.arange(0, BLOCK_HW)
        mask = (ps < HW)[:, None] & c_mask[None, :]
        offs = base + ps[:, None] * stride_s + cs[None, :]
        xv = tl.load(x + offs, mask=mask, other=0.0).to(COMPUTE)
        d = tl.where(mask, xv - k[None, :], 0.0)
        acc_d += d
        acc_dd += d * d
        if HAS_DY:
            dy = tl.load(grad_out + offs, mask=mask, other=0.0).to(COMPUTE)
            if ACTIVATION != "none":
                dy = _activation_grad(dy, (xv - mean[None, :]) * scale[None, :] + shift[None, :], ACTIVATION)
            acc_g += dy
            acc_gd += dy * d
    return k, tl.sum(acc_d, 0), tl.sum(acc_dd, 0), tl.sum(acc_g, 0), tl.sum(acc_gd, 0)


@triton.jit
def nhwc_fwd_partials_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps: tl.float64,
    MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """Each segment's per-channel mean and M2."""
    c_blocks, splits, n_items, n_segments = _nhwc_dims(N, C, HW, chunk, BLOCK_C)
    ones = tl.full([BLOCK_C], 1.0, COMPUTE)
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        n, cs, c_mask, s = _nhwc_item(item, c_blocks, splits, C, BLOCK_C)
        k, s1, s2, _, _ = _nhwc_sums(
            x, x, n * HW * C, cs, c_mask, s * chunk, HW, stride_s, chunk, ones, ones, ones, False, "none", BLOCK_C,
            BLOCK_HW, COMPUTE,
        )  # fmt: skip
        cnt = _segment_count(s, HW, chunk).to(COMPUTE)
        seg = (n * splits + s) * C + cs
        tl.store(workspace + MEAN_ROW * n_segments + seg, k + s1 / cnt, mask=c_mask)
        tl.store(workspace + M2_ROW * n_segments + seg, tl.maximum(s2 - s1 * s1 / cnt, 0.0), mask=c_mask)


@triton.jit
def nhwc_fwd_apply_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, STATS_ROW: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """y = act((x - mean) * rstd * w + b), each channel's group statistics
    read from the finalize kernel's rows."""
    c_blocks, splits, n_items, n_segments = _nhwc_dims(N, C, HW, chunk, BLOCK_C)
    cpg = C // num_groups
    n_rows = tl.cast(N, tl.int64) * num_groups
    for i in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        # Last item first: the partials pass has just streamed those, so they are likeliest still in L2.
        n, cs, c_mask, s = _nhwc_item(n_items - 1 - i, c_blocks, splits, C, BLOCK_C)
        stats = STATS_ROW * n_segments
        mean = _nhwc_stats(workspace, stats, n, cs, c_mask, cpg, num_groups, n_rows, 0, 0.0)
        rstd = _nhwc_stats(workspace, stats, n, cs, c_mask, cpg, num_groups, n_rows, 1, 1.0)
        scale = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE) * rstd
        shift = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE) - mean * scale
        base = n * HW * C
        for step in range(0, chunk, BLOCK_HW):
            ps = s * chunk + step + tl.arange(0, BLOCK_HW)
            mask = (ps < HW)[:, None] & c_mask[None, :]
            offs = base + ps[:, None] * stride_s + cs[None, :]
            xv = tl.load(x + offs, mask=mask, other=0.0).to(COMPUTE)
            out = _activate(xv * scale[None, :] + shift[None, :], ACTIVATION)
            tl.store(y + offs, _narrow(out, y.dtype.element_ty), mask=mask)


@triton.jit
def nhwc_bwd_partials_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, HAS_DY: tl.constexpr,
    MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr, SUM_DY_ROW: tl.constexpr, SUM_DY_D_ROW: tl.constexpr,
    STATS_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Each segment's per-channel mean, M2 and, with HAS_DY, sum(dz) and
    sum(dz * (x - segment mean)).  With an ACTIVATION, dz = dy taken through
    it with each channel's group mean and rstd from the stats rows at
    STATS_ROW (a run without HAS_DY and bwd_finalize_kernel's stored them)."""
    c_blocks, splits, n_items, n_segments = _nhwc_dims(N, C, HW, chunk, BLOCK_C)
    cpg = C // num_groups
    n_rows = tl.cast(N, tl.int64) * num_groups
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        n, cs, c_mask, s = _nhwc_item(item, c_blocks, splits, C, BLOCK_C)
        mean = tl.zeros([BLOCK_C], COMPUTE)
        scale = tl.full([BLOCK_C], 1.0, COMPUTE)
        shift = tl.zeros([BLOCK_C], COMPUTE)
        if ACTIVATION != "none":
            stats = STATS_ROW * n_segments
            mean = _nhwc_stats(workspace, stats, n, cs, c_mask, cpg, num_groups, n_rows, 0, 0.0)
            rstd = _nhwc_stats(workspace, stats, n, cs, c_mask, cpg, num_groups, n_rows, 1, 1.0)
            scale = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE) * rstd
            shift = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)
        k, s1, s2, sg, sgd = _nhwc_sums(
            x, grad_out, n * HW * C, cs, c_mask, s * chunk, HW, stride_s, chunk, scale, shift, mean, HAS_DY,
            ACTIVATION, BLOCK_C, BLOCK_HW, COMPUTE,
        )  # fmt: skip
        cnt = _segment_count(s, HW, chunk).to(COMPUTE)
        d_mean = s1 / cnt
        seg = (n * splits + s) * C + cs
        tl.store(workspace + MEAN_ROW * n_segments + seg, k + d_mean, mask=c_mask)
        tl.store(workspace + M2_ROW * n_segments + seg, tl.maximum(s2 - s1 * d_mean, 0.0), mask=c_mask)
        if HAS_DY:
            tl.store(workspace + SUM_DY_ROW * n_segments + seg, sg, mask=c_mask)
            tl.store(workspace + SUM_DY_D_ROW * n_segments + seg, sgd - d_mean * sg, mask=c_mask)


@triton.jit
def nhwc_bwd_dx_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, MEAN_ROW: tl.constexpr,
    SUM_DY_ROW: tl.constexpr, SUM_DY_D_ROW: tl.constexpr, DWEIGHT_ROW: tl.constexpr, STATS_ROW: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """dx = rstd * (dz * w - mean(g) - xhat * mean(g * xhat)) with each
    channel's group statistics from bwd_finalize_kernel's rows; with HAS_W
    also each segment's dweight term rstd * sum(dz * (x - mean))."""
    c_blocks, splits, n_items, n_segments = _nhwc_dims(N, C, HW, chunk, BLOCK_C)
    cpg = C // num_groups
    n_rows = tl.cast(N, tl.int64) * num_groups
    for i in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        # Last item first: the partials pass has just streamed those, so they are likeliest still in L2.
        n, cs, c_mask, s = _nhwc_item(n_items - 1 - i, c_blocks, splits, C, BLOCK_C)
        stats = STATS_ROW * n_segments
        mean = _nhwc_stats(workspace, stats, n, cs, c_mask, cpg, num_groups, n_rows, 0, 0.0)
        rstd = _nhwc_stats(workspace, stats, n, cs, c_mask, cpg, num_groups, n_rows, 1, 1.0)
        mg = _nhwc_stats(workspace, stats, n, cs, c_mask, cpg, num_groups, n_rows, 2, 0.0)
        mgx = _nhwc_stats(workspace, stats, n, cs, c_mask, cpg, num_groups, n_rows, 3, 0.0)
        w = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)
        if ACTIVATION != "none":
            b = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)
        if HAS_W:
            # Only this item writes its segment's terms; every item reads the partial rows only.
            seg = (n * splits + s) * C + cs
            mean_c = tl.load(workspace + MEAN_ROW * n_segments + seg, mask=c_mask, other=0.0)
            sg = tl.load(workspace + SUM_DY_ROW * n_segments + seg, mask=c_mask, other=0.0)
            sgd = tl.load(workspace + SUM_DY_D_ROW * n_segments + seg, mask=c_mask, other=0.0)
            tl.store(workspace + DWEIGHT_ROW * n_segments + seg, rstd * (sgd + (mean_c - mean) * sg), mask=c_mask)
        base = n * HW * C
        for step in range(0, chunk, BLOCK_HW):
            ps = s * chunk + step + tl.arange(0, BLOCK_HW)
            mask = (ps < HW)[:, None] & c_mask[None, :]
            offs = base + ps[:, None] * stride_s + cs[None, :]
            xv = tl.load(x + offs, mask=mask, other=0.0).to(COMPUTE)
            dy = tl.load(grad_out + offs, mask=mask, other=0.0).to(COMPUTE)
            xhat = (xv - mean[None, :]) * rstd[None, :]
            if ACTIVATION != "none":
                dy = _activation_grad(dy, xhat * w[None, :] + b[None, :], ACTIVATION)
            dxv = rstd[None, :] * (dy * w[None, :] - mg[None, :] - xhat * mgx[None, :])
            tl.store(dx + offs, _narrow(dxv, dx.dtype.element_ty), mask=mask)
