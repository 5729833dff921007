"""GroupNorm's kernels for channels-last x by teams of whole groups (the
"nhwc_team" and "nhwc_one_pass" paths; kernels.py holds the argument
contracts these share).

A team is (sample, channel block): the block holds ``groups per block =
BLOCK_C // cpg`` whole groups, so a group's statistics need only its own
team.  Its members are the spatial segments of ``chunk`` positions; a
member's tile is [BLOCK_HW positions, BLOCK_C channels], channels
innermost, so each load reads a run of whole groups of a pixel row.  A
member reduces its tile per channel, then per group (Chan's merge over the
group's lanes, through a [BLOCK_C, BLOCK_G] lane-to-group matrix), and
stores one partial per (sample, segment, group) in segment rows laid out
(N, splits, C) (the first num_groups slots of each).  The group's merge
reads its team's ``splits`` partials back, [BLOCK_G, BLOCK_S] at a time.

* nhwc_one_pass (CUDA): one launch; each member keeps its tile in
  registers across its team's barrier (kernels.py's ``_team_barrier``;
  residency.py says why it cannot deadlock), so x (and dy) are read once.
* nhwc_team: the same work in launches a barrier is not needed for
  (partials, then apply / dx, which merge the partials themselves); it
  runs where teams are not resident, and is how the CPU tests run
  multi-member teams (the interpreter runs programs one at a time).

Backward, with g = dz * w (dz: dy taken through the ACTIVATION), each
member stores per group sum(g) and sum(g * (x - its group mean)), merged
as sum(g * (x - mean)) = sum over segments of (that + (segment mean -
mean) * sum(g)); its channels' dweight terms rstd * sum(dz * (x - mean))
and dbias terms sum(dz) go to the C-wide rows DWEIGHT_ROW and SUM_DY_ROW
that ``reduce_param_grads_kernel`` sums in a fixed order.  With an
ACTIVATION the statistics come first: one-pass, the team meets twice per
row (one counter counts both arrivals); two-launch, a statistics-only
partials launch runs first.  Math runs in COMPUTE; the one-pass kernels
are planned for float32 only (plan.py), as kernels.py's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from csrc_free_ops.group_norm.kernels import (
    _activate,
    _activation_grad,
    _backward_coefficients,
    _channel_param,
    _group_size,
    _narrow,
    _rsqrt_eps,
    _segment_count,
    _team_barrier,
)


@triton.jit
def _team_dims(N, C, HW, num_groups, chunk, BLOCK_C: tl.constexpr):
    """(cpg, groups per channel block, channel blocks (int64), segments per
    sample (int64), team rows N * channel blocks, values per segment row)."""
    cpg = C // num_groups
    gpb = BLOCK_C // cpg
    c_blocks = tl.cast(tl.cdiv(num_groups, gpb), tl.int64)
    splits = tl.cast(tl.cdiv(HW, chunk), tl.int64)
    n = tl.cast(N, tl.int64)
    return cpg, gpb, c_blocks, splits, n * c_blocks, n * splits * C


@triton.jit
def _team_tile(row, s, c_blocks, cpg, gpb, C, HW, chunk, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """For team row ``row`` (int64) and segment s: the sample, channel block,
    the tile's place (an int64 sample base, and int32 offsets within the
    sample: the plan keeps a sample under 2**31 elements, and a one-pass
    member holds them across the barrier) and mask, and the lanes' channels
    and their mask."""
    n = row // c_blocks
    cb = (row % c_blocks).to(tl.int32)
    lane = tl.arange(0, BLOCK_C)
    cs = cb * gpb * cpg + lane
    c_mask = (lane < gpb * cpg) & (cs < C)
    ps = s.to(tl.int32) * chunk + tl.arange(0, BLOCK_HW)
    mask = (ps < HW)[:, None] & c_mask[None, :]
    return n, cb, n * HW * C, ps[:, None] * C + cs[None, :], mask, cs, c_mask


@triton.jit
def _lane_groups(c_mask, cpg, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr, COMPUTE: tl.constexpr):
    """[BLOCK_C, BLOCK_G]: 1 where lane c holds a channel of the block's group g, else 0."""
    same = (tl.arange(0, BLOCK_C) // cpg)[:, None] == tl.arange(0, BLOCK_G)[None, :]
    return tl.where(same & c_mask[:, None], 1.0, 0.0).to(COMPUTE)


@triton.jit
def _per_group(lanes, v):
    """[BLOCK_C] lane values summed per group: [BLOCK_G]."""
    return tl.sum(lanes * v[:, None], 0)


@triton.jit
def _per_lane(lanes, v):
    """[BLOCK_G] group values given to each of the group's lanes: [BLOCK_C]."""
    return tl.sum(lanes * v[None, :], 1)


@triton.jit
def _tile_moments(xv, mask, lanes, cnt, cpg):
    """A tile's per-lane mean and x - that mean (0 outside), and per group
    its mean and M2 over the group's lanes, and each lane's mean less its
    group's (Chan's merge of the lanes)."""
    mean_c = tl.sum(xv, 0) / cnt
    d = tl.where(mask, xv - mean_c[None, :], 0.0)
    m2_c = tl.sum(d * d, 0)
    mean_g = _per_group(lanes, mean_c) / cpg
    dev = mean_c - _per_lane(lanes, mean_g)
    return mean_c, d, mean_g, _per_group(lanes, m2_c + cnt * dev * dev), dev


@triton.jit
def _group_slots(n, cb, s, gpb, num_groups, C, splits, BLOCK_G: tl.constexpr):
    """Where the member at (n, cb, s) stores its groups' partials in a segment row, and their mask."""
    gl = tl.arange(0, BLOCK_G)
    g = cb * gpb + gl
    return (n * splits + s) * C + g, (gl < gpb) & (g < num_groups)


@triton.jit
def _merge_team(workspace, n, cb, cpg, gpb, num_groups, C, HW, chunk, splits, n_segments,
                MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr, SUM_G_ROW: tl.constexpr, SUM_GD_ROW: tl.constexpr,
                SUMS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
                COMPUTE: tl.constexpr):  # fmt: skip
    """Per group of the team's block, over its ``splits`` segments, BLOCK_S
    at a time (two walks: the mean, then the rest about it): mean, M2 and,
    with SUMS, sum(g) and sum(g * (x - mean))."""
    gl = tl.arange(0, BLOCK_G)
    g = cb * gpb + gl
    g_mask = ((gl < gpb) & (g < num_groups))[:, None]
    total = tl.zeros([BLOCK_G], COMPUTE)
    for s0 in range(0, tl.cdiv(HW, chunk), BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        m = g_mask & (ss < splits)[None, :]
        mean_p = tl.load(workspace + MEAN_ROW * n_segments + (n * splits + ss[None, :]) * C + g[:, None], mask=m,
                         other=0.0)  # fmt: skip
        total += tl.sum(tl.where(m, _segment_count(ss, HW, chunk)[None, :], 0).to(COMPUTE) * mean_p, 1)
    mean = total / HW
    m2 = tl.zeros([BLOCK_G], COMPUTE)
    sum_g = tl.zeros([BLOCK_G], COMPUTE)
    sum_gd = tl.zeros([BLOCK_G], COMPUTE)
    for s0 in range(0, tl.cdiv(HW, chunk), BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        m = g_mask & (ss < splits)[None, :]
        idx = (n * splits + ss[None, :]) * C + g[:, None]
        dm = tl.load(workspace + MEAN_ROW * n_segments + idx, mask=m, other=0.0) - mean[:, None]
        cnt_p = tl.where(m, _segment_count(ss, HW, chunk)[None, :] * cpg, 0).to(COMPUTE)
        m2 += tl.sum(tl.load(workspace + M2_ROW * n_segments + idx, mask=m, other=0.0) + cnt_p * dm * dm, 1)
        if SUMS:
            sg_p = tl.load(workspace + SUM_G_ROW * n_segments + idx, mask=m, other=0.0)
            sum_g += tl.sum(sg_p, 1)
            sum_gd += tl.sum(tl.load(workspace + SUM_GD_ROW * n_segments + idx, mask=m, other=0.0) + dm * sg_p, 1)
    return mean, m2, sum_g, sum_gd


@triton.jit
def _normalized(xv, mean, m2, lanes, cs, c_mask, weight, bias, size, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """act((x - mean) * rstd * w + b) of a tile, from its groups' mean and M2."""
    rstd = _per_lane(lanes, _rsqrt_eps(m2 / size, eps))
    scale = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE) * rstd
    shift = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE) - _per_lane(lanes, mean) * scale
    return _activate(xv * scale[None, :] + shift[None, :], ACTIVATION)


@triton.jit
def _dz(dy, xv, mean, m2, lanes, w, cs, c_mask, bias, size, eps, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr,
        BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """dy taken back through the ACTIVATION at z = xhat * w + b (0 outside the tile's mask, where dy is)."""
    if ACTIVATION != "none":
        b = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)
        rstd = _per_lane(lanes, _rsqrt_eps(m2 / size, eps))
        z = (xv - _per_lane(lanes, mean)[None, :]) * (rstd * w)[None, :] + b[None, :]
        dy = _activation_grad(dy, z, ACTIVATION)
    return dy


@triton.jit
def _store_sums(workspace, slots, g_mask, n_segments, dz, d, dev, lanes, w, SUM_G_ROW: tl.constexpr,
                SUM_GD_ROW: tl.constexpr):  # fmt: skip
    """Store the tile's per-group sum(g) and sum(g * (x - tile group mean)), g = dz * w; returns
    its lanes' sum(dz) and sum(dz * (x - lane mean))."""
    sum_dz = tl.sum(dz, 0)
    sum_dz_d = tl.sum(dz * d, 0)
    tl.store(workspace + SUM_G_ROW * n_segments + slots, _per_group(lanes, w * sum_dz), mask=g_mask)
    tl.store(workspace + SUM_GD_ROW * n_segments + slots, _per_group(lanes, w * (sum_dz_d + dev * sum_dz)), mask=g_mask)
    return sum_dz, sum_dz_d


@triton.jit
def _dx_and_terms(dz, xv, w, mean_c, sum_dz, sum_dz_d, mean, m2, sum_g, sum_gd, lanes, workspace, n, s, cs, c_mask,
                  C, splits, n_segments, size, eps, DWEIGHT_ROW: tl.constexpr, SUM_DY_ROW: tl.constexpr):  # fmt: skip
    """dx of the tile, after storing its lanes' dweight terms rstd * sum(dz * (x - mean)) and dbias terms sum(dz)."""
    rstd, mg, mgx = _backward_coefficients(mean, m2, sum_g, sum_gd, size, eps)
    mean_l = _per_lane(lanes, mean)
    rstd_l = _per_lane(lanes, rstd)
    seg = (n * splits + s) * C + cs
    tl.store(workspace + DWEIGHT_ROW * n_segments + seg, rstd_l * (sum_dz_d + (mean_c - mean_l) * sum_dz), mask=c_mask)
    tl.store(workspace + SUM_DY_ROW * n_segments + seg, sum_dz, mask=c_mask)
    xhat = (xv - mean_l[None, :]) * rstd_l[None, :]
    return rstd_l[None, :] * (dz * w[None, :] - _per_lane(lanes, mg)[None, :] - xhat * _per_lane(lanes, mgx)[None, :])


# --- nhwc_one_pass (CUDA): one launch, a team of resident members per (sample, channel block)


@triton.jit
def _member(n_rows, HW, chunk):
    """(segment, team, teams, rows it may take) of this program, int32 (a
    grid and its team rows are far below 2**31: residency.py): program p is
    member p % splits of team p // splits; team t takes rows t, t + teams, ..."""
    splits = tl.cdiv(HW, chunk)
    pid = tl.program_id(0)
    whole_teams = tl.num_programs(0) // splits
    team = pid // splits
    # A program past the last whole team (none in a planned grid) takes no row: its team would never fill.
    return pid % splits, team, tl.maximum(whole_teams, 1), tl.where(team < whole_teams, n_rows.to(tl.int32), 0)


@triton.jit
def nhwc_fwd_one_pass_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, MEAN_ROW: tl.constexpr,
    M2_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """y with x read once: each member keeps its tile across its team's barrier (chunk = BLOCK_HW)."""
    cpg, gpb, c_blocks, splits, n_rows, n_segments = _team_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    s, team, teams, last = _member(n_rows, HW, chunk)
    cnt = _segment_count(s, HW, chunk).to(COMPUTE)
    size = _group_size(cpg, HW, COMPUTE)
    for row in tl.range(team, last, teams):
        n, cb, base, offs, mask, cs, c_mask = _team_tile(row, s, c_blocks, cpg, gpb, C, HW, chunk, BLOCK_C, BLOCK_HW)
        xv = tl.load(x + base + offs, mask=mask, other=0.0).to(COMPUTE)
        lanes = _lane_groups(c_mask, cpg, BLOCK_C, BLOCK_G, COMPUTE)
        _, _, mean_g, m2_g, _ = _tile_moments(xv, mask, lanes, cnt, cpg)
        slots, g_mask = _group_slots(n, cb, s, gpb, num_groups, C, splits, BLOCK_G)
        tl.store(workspace + MEAN_ROW * n_segments + slots, mean_g, mask=g_mask)
        tl.store(workspace + M2_ROW * n_segments + slots, m2_g, mask=g_mask)
        _team_barrier(counters + row, splits)
        mean, m2, _, _ = _merge_team(
            workspace, n, cb, cpg, gpb, num_groups, C, HW, chunk, splits, n_segments,
            MEAN_ROW, M2_ROW, MEAN_ROW, MEAN_ROW, False, BLOCK_G, BLOCK_S, COMPUTE,
        )  # fmt: skip
        out = _normalized(xv, mean, m2, lanes, cs, c_mask, weight, bias, size, eps, HAS_W, HAS_B, ACTIVATION,
                          BLOCK_C, COMPUTE)  # fmt: skip
        tl.store(y + base + offs, _narrow(out, y.dtype.element_ty), mask=mask)


@triton.jit
def nhwc_bwd_one_pass_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, MEAN_ROW: tl.constexpr,
    M2_ROW: tl.constexpr, SUM_G_ROW: tl.constexpr, SUM_GD_ROW: tl.constexpr, DWEIGHT_ROW: tl.constexpr,
    SUM_DY_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """dx with x and dy read once, and the dweight / dbias terms; with an
    ACTIVATION the team meets twice per row (statistics, then the sums of dz)."""
    cpg, gpb, c_blocks, splits, n_rows, n_segments = _team_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    s, team, teams, last = _member(n_rows, HW, chunk)
    cnt = _segment_count(s, HW, chunk).to(COMPUTE)
    size = _group_size(cpg, HW, COMPUTE)
    for row in tl.range(team, last, teams):
        n, cb, base, offs, mask, cs, c_mask = _team_tile(row, s, c_blocks, cpg, gpb, C, HW, chunk, BLOCK_C, BLOCK_HW)
        xv = tl.load(x + base + offs, mask=mask, other=0.0).to(COMPUTE)
        dz = tl.load(grad_out + base + offs, mask=mask, other=0.0).to(COMPUTE)
        lanes = _lane_groups(c_mask, cpg, BLOCK_C, BLOCK_G, COMPUTE)
        mean_c, d, mean_g, m2_g, dev = _tile_moments(xv, mask, lanes, cnt, cpg)
        slots, g_mask = _group_slots(n, cb, s, gpb, num_groups, C, splits, BLOCK_G)
        tl.store(workspace + MEAN_ROW * n_segments + slots, mean_g, mask=g_mask)
        tl.store(workspace + M2_ROW * n_segments + slots, m2_g, mask=g_mask)
        w = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)
        if ACTIVATION != "none":
            _team_barrier(counters + row, splits)
            mean, m2, _, _ = _merge_team(
                workspace, n, cb, cpg, gpb, num_groups, C, HW, chunk, splits, n_segments,
                MEAN_ROW, M2_ROW, MEAN_ROW, MEAN_ROW, False, BLOCK_G, BLOCK_S, COMPUTE,
            )  # fmt: skip
            dz = _dz(dz, xv, mean, m2, lanes, w, cs, c_mask, bias, size, eps, HAS_B, ACTIVATION, BLOCK_C, COMPUTE)
        sum_dz, sum_dz_d = _store_sums(workspace, slots, g_mask, n_segments, dz, d, dev, lanes, w, SUM_G_ROW,
                                       SUM_GD_ROW)  # fmt: skip
        _team_barrier(counters + row, splits * (2 if ACTIVATION != "none" else 1))
        mean, m2, sum_g, sum_gd = _merge_team(
            workspace, n, cb, cpg, gpb, num_groups, C, HW, chunk, splits, n_segments,
            MEAN_ROW, M2_ROW, SUM_G_ROW, SUM_GD_ROW, True, BLOCK_G, BLOCK_S, COMPUTE,
        )  # fmt: skip
        dxv = _dx_and_terms(dz, xv, w, mean_c, sum_dz, sum_dz_d, mean, m2, sum_g, sum_gd, lanes, workspace, n, s,
                            cs, c_mask, C, splits, n_segments, size, eps, DWEIGHT_ROW, SUM_DY_ROW)  # fmt: skip
        tl.store(dx + base + offs, _narrow(dxv, dx.dtype.element_ty), mask=mask)


# --- nhwc_team: the same work over launches, each item (team row, segment) in a grid-stride loop


@triton.jit
def _item(item, splits):
    """(team row, segment) of a work item, int64."""
    item = tl.cast(item, tl.int64)
    return item // splits, item % splits


@triton.jit
def _item_backwards(i, n_items, splits, c_blocks, cpg, gpb, C, HW, chunk, BLOCK_C: tl.constexpr,
                    BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """The apply / dx kernels' i-th item, counted from the last (the partials launch has just
    streamed those, so they are likeliest still in L2): its segment, tile (``_team_tile``) and lanes."""
    row, s = _item(n_items - 1 - i, splits)
    n, cb, base, offs, mask, cs, c_mask = _team_tile(row, s, c_blocks, cpg, gpb, C, HW, chunk, BLOCK_C, BLOCK_HW)
    return s, n, cb, base, offs, mask, cs, c_mask, _lane_groups(c_mask, cpg, BLOCK_C, BLOCK_G, COMPUTE)


@triton.jit
def nhwc_fwd_team_partials_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps: tl.float64,
    MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
    BLOCK_G: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Each member's per-group mean and M2 (chunk = BLOCK_HW)."""
    cpg, gpb, c_blocks, splits, n_rows, n_segments = _team_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    for item in tl.range(tl.program_id(0), n_rows * splits, tl.num_programs(0)):
        row, s = _item(item, splits)
        n, cb, base, offs, mask, cs, c_mask = _team_tile(row, s, c_blocks, cpg, gpb, C, HW, chunk, BLOCK_C, BLOCK_HW)
        xv = tl.load(x + base + offs, mask=mask, other=0.0).to(COMPUTE)
        lanes = _lane_groups(c_mask, cpg, BLOCK_C, BLOCK_G, COMPUTE)
        _, _, mean_g, m2_g, _ = _tile_moments(xv, mask, lanes, _segment_count(s, HW, chunk).to(COMPUTE), cpg)
        slots, g_mask = _group_slots(n, cb, s, gpb, num_groups, C, splits, BLOCK_G)
        tl.store(workspace + MEAN_ROW * n_segments + slots, mean_g, mask=g_mask)
        tl.store(workspace + M2_ROW * n_segments + slots, m2_g, mask=g_mask)


@triton.jit
def nhwc_fwd_team_apply_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, MEAN_ROW: tl.constexpr,
    M2_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """y, each item merging its groups' partials itself."""
    cpg, gpb, c_blocks, splits, n_rows, n_segments = _team_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    size = _group_size(cpg, HW, COMPUTE)
    n_items = n_rows * splits
    for i in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        s, n, cb, base, offs, mask, cs, c_mask, lanes = _item_backwards(
            i, n_items, splits, c_blocks, cpg, gpb, C, HW, chunk, BLOCK_C, BLOCK_HW, BLOCK_G, COMPUTE
        )
        mean, m2, _, _ = _merge_team(
            workspace, n, cb, cpg, gpb, num_groups, C, HW, chunk, splits, n_segments,
            MEAN_ROW, M2_ROW, MEAN_ROW, MEAN_ROW, False, BLOCK_G, BLOCK_S, COMPUTE,
        )  # fmt: skip
        xv = tl.load(x + base + offs, mask=mask, other=0.0).to(COMPUTE)
        out = _normalized(xv, mean, m2, lanes, cs, c_mask, weight, bias, size, eps, HAS_W, HAS_B, ACTIVATION,
                          BLOCK_C, COMPUTE)  # fmt: skip
        tl.store(y + base + offs, _narrow(out, y.dtype.element_ty), mask=mask)


@triton.jit
def nhwc_bwd_team_partials_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, HAS_DY: tl.constexpr,
    MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr, SUM_G_ROW: tl.constexpr, SUM_GD_ROW: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """Each member's per-group mean and M2 (without HAS_DY, or without an
    ACTIVATION) and, with HAS_DY, sum(g) and sum(g * (x - its group mean));
    with an ACTIVATION, dz needs the statistics a run without HAS_DY stored."""
    cpg, gpb, c_blocks, splits, n_rows, n_segments = _team_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    size = _group_size(cpg, HW, COMPUTE)
    for item in tl.range(tl.program_id(0), n_rows * splits, tl.num_programs(0)):
        row, s = _item(item, splits)
        n, cb, base, offs, mask, cs, c_mask = _team_tile(row, s, c_blocks, cpg, gpb, C, HW, chunk, BLOCK_C, BLOCK_HW)
        xv = tl.load(x + base + offs, mask=mask, other=0.0).to(COMPUTE)
        lanes = _lane_groups(c_mask, cpg, BLOCK_C, BLOCK_G, COMPUTE)
        _, d, mean_g, m2_g, dev = _tile_moments(xv, mask, lanes, _segment_count(s, HW, chunk).to(COMPUTE), cpg)
        slots, g_mask = _group_slots(n, cb, s, gpb, num_groups, C, splits, BLOCK_G)
        if not HAS_DY or ACTIVATION == "none":
            tl.store(workspace + MEAN_ROW * n_segments + slots, mean_g, mask=g_mask)
            tl.store(workspace + M2_ROW * n_segments + slots, m2_g, mask=g_mask)
        if HAS_DY:
            dz = tl.load(grad_out + base + offs, mask=mask, other=0.0).to(COMPUTE)
            w = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)
            if ACTIVATION != "none":
                mean, m2, _, _ = _merge_team(
                    workspace, n, cb, cpg, gpb, num_groups, C, HW, chunk, splits, n_segments,
                    MEAN_ROW, M2_ROW, MEAN_ROW, MEAN_ROW, False, BLOCK_G, BLOCK_S, COMPUTE,
                )  # fmt: skip
                dz = _dz(dz, xv, mean, m2, lanes, w, cs, c_mask, bias, size, eps, HAS_B, ACTIVATION, BLOCK_C,
                         COMPUTE)  # fmt: skip
            _store_sums(workspace, slots, g_mask, n_segments, dz, d, dev, lanes, w, SUM_G_ROW, SUM_GD_ROW)


@triton.jit
def nhwc_bwd_team_dx_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, MEAN_ROW: tl.constexpr,
    M2_ROW: tl.constexpr, SUM_G_ROW: tl.constexpr, SUM_GD_ROW: tl.constexpr, DWEIGHT_ROW: tl.constexpr,
    SUM_DY_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """dx and the dweight / dbias terms, each item merging its groups' partials itself."""
    cpg, gpb, c_blocks, splits, n_rows, n_segments = _team_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    size = _group_size(cpg, HW, COMPUTE)
    n_items = n_rows * splits
    for i in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        s, n, cb, base, offs, mask, cs, c_mask, lanes = _item_backwards(
            i, n_items, splits, c_blocks, cpg, gpb, C, HW, chunk, BLOCK_C, BLOCK_HW, BLOCK_G, COMPUTE
        )
        mean, m2, sum_g, sum_gd = _merge_team(
            workspace, n, cb, cpg, gpb, num_groups, C, HW, chunk, splits, n_segments,
            MEAN_ROW, M2_ROW, SUM_G_ROW, SUM_GD_ROW, True, BLOCK_G, BLOCK_S, COMPUTE,
        )  # fmt: skip
        xv = tl.load(x + base + offs, mask=mask, other=0.0).to(COMPUTE)
        dz = tl.load(grad_out + base + offs, mask=mask, other=0.0).to(COMPUTE)
        mean_c, d, _, _, _ = _tile_moments(xv, mask, lanes, _segment_count(s, HW, chunk).to(COMPUTE), cpg)
        w = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)
        dz = _dz(dz, xv, mean, m2, lanes, w, cs, c_mask, bias, size, eps, HAS_B, ACTIVATION, BLOCK_C, COMPUTE)
        sum_dz = tl.sum(dz, 0)
        dxv = _dx_and_terms(dz, xv, w, mean_c, sum_dz, tl.sum(dz * d, 0), mean, m2, sum_g, sum_gd, lanes, workspace,
                            n, s, cs, c_mask, C, splits, n_segments, size, eps, DWEIGHT_ROW, SUM_DY_ROW)  # fmt: skip
        tl.store(dx + base + offs, _narrow(dxv, dx.dtype.element_ty), mask=mask)
