"""Every Triton kernel of GroupNorm.  CUDA and the NPU share each kernel
they both run; the one-pass kernels are CUDA-only (they need every program
of a team resident at once, which only a cooperative CUDA launch
guarantees, residency.py).

x is dense (N, C, HW) (HW: the product of the spatial sizes) in one of two
layouts, and y, grad_out and dx share it: contiguous (stride_c = HW,
stride_s = 1) or channels-last (stride_c = 1, stride_s = C: a position's C
channels adjacent).  Channel c, position s of the (sample, group) ``row``
(row = n * num_groups + g, cpg = C // num_groups) lies at ``_row_base(row)
+ c * stride_c + s * stride_s``; contiguous, a row is one run of cpg * HW
elements.  Triton specializes a stride of 1, so each layout compiles to its
own unit-stride loads.

The arguments are one contract per direction, the same for every kernel of
it, so the launch sequence hands each step of a plan the same tuple:

    forward:  (x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps)
    backward: (grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
               num_groups, chunk, eps)

A kernel ignores what it does not need.  ``bias`` reaches the backward
kernels for the activation's derivative, which needs the normalized and
affine value z = xhat * w + b.  ``workspace`` holds rows of one
value per segment (sample, spatial segment of ``chunk`` positions, channel),
laid out (N, splits, C), then rows of one value per (sample, group); which
row holds what is the plan's ``Workspace`` (workspace.py), passed in as the
``*_ROW`` constexprs.  ``counters`` are the one-pass kernels' barrier
counters (int32, zeroed per call).

Paths (plan.py says which runs when):

* whole: one program holds a (sample, group) in a [BLOCK_C, BLOCK_HW] tile
  and reads x once (exact two-pass variance in registers);
* one-pass (CUDA): a team of programs holds a group, each one tile of it;
  each stores its channels' (mean, M2) partials, waits at the team's
  barrier, merges the group's partials and normalizes from registers;
* looped: one program walks a (sample, group) twice, statistics then
  output, the second walk last tile first (out of L2);
* split: a work item is (row, channel block of the group, spatial
  segment); a partials kernel writes each segment's per-channel (mean, M2),
  then the apply / dx kernel merges its group's partials itself (FUSED) or
  reads the (mean, rstd, ...) a finalize kernel stored per row.

Partials are merged with Chan's formula: mean = sum(cnt_i * mean_i) / L,
M2 = sum(M2_i + cnt_i * (mean_i - mean)^2).  Backward, with
xhat = (x - mean) * rstd and g = dy * w:

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
    dweight[c] = sum over (n, spatial) of dy * xhat,  dbias[c] = sum of dy.

Every backward path writes per-(sample, segment, channel) dweight / dbias
terms (DWEIGHT_ROW, DBIAS_ROW) that ``reduce_param_grads_kernel`` sums in a
fixed order: no atomics on data, so two runs give bitwise-equal results.

ACTIVATION (a constexpr, "none" or "silu") is applied to z before the
store forward; backward, dy is first taken through it, dz = dy * act'(z),
with z recomputed from x and the group's statistics (nothing is saved), and
everything above runs on dz in dy's place (dbias = sum(dz), ...).  The
statistics come first, so a backward with an activation walks x once more
than one without: looped walks it for the statistics, split runs its
partials twice (statistics, then the sums of dz), one-pass waits at the
team's barrier twice.

Math runs in COMPUTE (float32, float64 for float64 x), and so does the
workspace; every load is converted to it, so weight and bias may have any
float dtype.  eps is a float64 parameter (``eps: tl.float64``; Triton types
a Python float fp32 otherwise), added to the statistic in float64 and the
sum rounded to COMPUTE (``_rsqrt_eps``): float64 math keeps all of eps, and
float32 kernels hold no converted copy of it in a register (a copy converted
on entry took up to 18 more registers in the sm_90 looped forward).  The
one-pass kernels, float32 only (plan._one_pass_math refuses float64), take
eps as Triton types a Python float, fp32.  Stores narrow through ``_narrow``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from csrc_free_ops.kernel_math import rsqrt

# --- shared helpers


@triton.jit
def _narrow(v, dtype: tl.constexpr):
    """v as dtype; float64 reaches narrower types through float32 (the
    interpreter's direct float64 -> bfloat16 cast gives garbage)."""
    if dtype != tl.float64:
        v = v.to(tl.float32)
    return v.to(dtype)


@triton.jit
def _activate(z, ACTIVATION: tl.constexpr):
    """The activation of z."""
    if ACTIVATION == "silu":
        z = z / (1.0 + tl.exp(-z))
    return z


@triton.jit
def _activation_grad(dy, z, ACTIVATION: tl.constexpr):
    """dy taken back through the activation at z."""
    if ACTIVATION == "silu":
        s = 1.0 / (1.0 + tl.exp(-z))
        dy = dy * (s * (1.0 + z * (1.0 - s)))
    return dy


@triton.jit
def _channel_param(p, cs, c_mask, HAS: tl.constexpr, DEFAULT: tl.constexpr, BLOCK_C: tl.constexpr,
                   COMPUTE: tl.constexpr):  # fmt: skip
    """The per-channel parameter p at channels cs, or DEFAULT where there is none."""
    if HAS:
        return tl.load(p + cs, mask=c_mask, other=0.0).to(COMPUTE)
    return tl.full([BLOCK_C], DEFAULT, COMPUTE)


@triton.jit
def _group_size(cpg, HW, COMPUTE: tl.constexpr):
    """Elements of one group, in COMPUTE."""
    return (tl.cast(cpg, tl.int64) * HW).to(COMPUTE)


@triton.jit
def _segment_count(s, HW, chunk):
    """Spatial positions of segment s."""
    return tl.minimum(chunk, HW - s * chunk)


@triton.jit
def _split_dims(N, C, HW, num_groups, chunk, BLOCK_C: tl.constexpr):
    """int64 (channels per group, channel blocks per group, segments per
    channel, (sample, group) rows, work items, values per segment row)."""
    cpg = C // num_groups
    c_blocks = tl.cast(tl.cdiv(cpg, BLOCK_C), tl.int64)
    splits = tl.cast(tl.cdiv(HW, chunk), tl.int64)
    n_rows = tl.cast(N, tl.int64) * num_groups
    return cpg, c_blocks, splits, n_rows, n_rows * c_blocks * splits, tl.cast(N, tl.int64) * splits * C


@triton.jit
def _item_coords(item, c_blocks, splits):
    """(row, channel block within the group, segment) of a work item, int64."""
    item = tl.cast(item, tl.int64)
    rest = item // splits
    return rest // c_blocks, rest % c_blocks, item % splits


@triton.jit
def _segment_index(row, num_groups, cpg, C, splits, s):
    """Index of (sample, segment s, the group's first channel) in a segment row."""
    n = row // num_groups
    return (n * splits + s) * C + (row % num_groups) * cpg


@triton.jit
def _row_base(row, num_groups, cpg, C, HW, stride_c):
    """Offset of the first element of the (sample, group) ``row`` (int64)."""
    return (row // num_groups) * C * HW + (row % num_groups) * cpg * stride_c


@triton.jit
def _merge_group(workspace, weight, row, num_groups, cpg, C, HW, chunk, splits, n_segments,
                 MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr, SUM_DY_ROW: tl.constexpr,
                 SUM_DY_D_ROW: tl.constexpr, BWD: tl.constexpr, HAS_W: tl.constexpr, BLOCK_P: tl.constexpr,
                 COMPUTE: tl.constexpr):  # fmt: skip
    """Chan's merge of the cpg * splits segment partials of the (sample,
    group) ``row``: its mean and M2 and, with BWD, sum(w * dy) and
    sum(w * dy * (x - mean)) over the group."""
    base = _segment_index(row, num_groups, cpg, C, splits, 0)
    first = (row % num_groups) * cpg
    n_parts = cpg * splits
    acc = tl.zeros([BLOCK_P], dtype=COMPUTE)
    for j0 in range(0, n_parts, BLOCK_P):
        j = j0 + tl.arange(0, BLOCK_P)
        mask = j < n_parts
        s = tl.cast(j // cpg, tl.int64)
        idx = base + s * C + j % cpg
        cnt = _segment_count(s, HW, chunk).to(COMPUTE)
        acc += tl.where(mask, tl.load(workspace + MEAN_ROW * n_segments + idx, mask=mask, other=0.0) * cnt, 0.0)
    mean = tl.sum(acc, 0) / _group_size(cpg, HW, COMPUTE)
    acc = tl.zeros([BLOCK_P], dtype=COMPUTE)
    acc_g = tl.zeros([BLOCK_P], dtype=COMPUTE)
    acc_gd = tl.zeros([BLOCK_P], dtype=COMPUTE)
    for j0 in range(0, n_parts, BLOCK_P):
        j = j0 + tl.arange(0, BLOCK_P)
        mask = j < n_parts
        s = tl.cast(j // cpg, tl.int64)
        idx = base + s * C + j % cpg
        cnt = _segment_count(s, HW, chunk).to(COMPUTE)
        delta = tl.load(workspace + MEAN_ROW * n_segments + idx, mask=mask, other=0.0) - mean
        m2 = tl.load(workspace + M2_ROW * n_segments + idx, mask=mask, other=0.0)
        acc += tl.where(mask, m2 + cnt * delta * delta, 0.0)
        if BWD:
            sg = tl.load(workspace + SUM_DY_ROW * n_segments + idx, mask=mask, other=0.0)
            sgd = tl.load(workspace + SUM_DY_D_ROW * n_segments + idx, mask=mask, other=0.0)
            w = _channel_param(weight, first + j % cpg, mask, HAS_W, 1.0, BLOCK_P, COMPUTE)
            acc_g += w * sg
            acc_gd += w * (sgd + delta * sg)  # sum(dy * (x - group mean)) over the segment
    return mean, tl.sum(acc, 0), tl.sum(acc_g, 0), tl.sum(acc_gd, 0)


@triton.jit
def _rsqrt_eps(v, eps):
    """1 / sqrt(v + eps) in v's dtype.  eps is a float64 parameter (the
    one-pass kernels': fp32, or fp64 from Inductor): the sum is rounded, not
    eps, so float64 v keeps all of it."""
    return rsqrt((v + eps).to(v.dtype))


@triton.jit
def _backward_coefficients(mean, m2, sum_g, sum_gd, size, eps):
    """(rstd, mean(g), mean(g * xhat)) of a group from its merged sums."""
    rstd = _rsqrt_eps(m2 / size, eps)
    return rstd, sum_g / size, rstd * sum_gd / size


# --- whole: one program holds a (sample, group)


@triton.jit
def _whole_tile(row, num_groups, cpg, C, HW, stride_c, stride_s, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """For the (sample, group) ``row`` (int64): the tile's offsets and mask,
    the channel indices within the group and their mask.  Offsets come from
    plain ints, never from a helper that takes a tensor: torch's analysis of
    which tensors a kernel writes (wrap_triton, under torch.compile) counts
    every tensor a stored-to address depends on, helpers' arguments included,
    and a graph input it counts as written keeps CUDA graphs off."""
    ch = tl.arange(0, BLOCK_C)
    c_mask = ch < cpg
    cols = tl.arange(0, BLOCK_HW)
    mask = c_mask[:, None] & (cols < HW)[None, :]
    offs = _row_base(row, num_groups, cpg, C, HW, stride_c) + ch[:, None] * stride_c + cols[None, :] * stride_s
    return offs, mask, ch, c_mask


@triton.jit
def _whole_group(x, offs, mask, cpg, HW, COMPUTE: tl.constexpr):
    """x - mean over the tile (zero outside the group) and the variance."""
    size = _group_size(cpg, HW, COMPUTE)
    xv = tl.load(x + offs, mask=mask, other=0.0).to(COMPUTE)
    mean = tl.sum(tl.sum(xv, 1), 0) / size
    d = tl.where(mask, xv - mean, 0.0)
    return d, tl.sum(tl.sum(d * d, 1), 0) / size


@triton.jit
def fwd_whole_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    cpg = C // num_groups
    for row in tl.range(tl.program_id(0), tl.cast(N, tl.int64) * num_groups, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        offs, mask, ch, c_mask = _whole_tile(row, num_groups, cpg, C, HW, stride_c, stride_s, BLOCK_C, BLOCK_HW)
        d, var = _whole_group(x, offs, mask, cpg, HW, COMPUTE)
        cs = (row % num_groups) * cpg + ch
        scale = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE) * _rsqrt_eps(var, eps)
        shift = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)
        out = _activate(d * scale[:, None] + shift[:, None], ACTIVATION)
        tl.store(y + offs, _narrow(out, y.dtype.element_ty), mask=mask)


@triton.jit
def _whole_row_backward(grad_out, x, weight, bias, dx, row, num_groups, cpg, C, HW, stride_c, stride_s, size, eps,
                        HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr,
                        BLOCK_HW: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """dx of the (sample, group) ``row``; its channels' sum(dy * xhat) and sum(dy), and their mask."""
    offs, mask, ch, c_mask = _whole_tile(row, num_groups, cpg, C, HW, stride_c, stride_s, BLOCK_C, BLOCK_HW)
    d, var = _whole_group(x, offs, mask, cpg, HW, COMPUTE)
    rstd = _rsqrt_eps(var, eps)
    dy = tl.load(grad_out + offs, mask=mask, other=0.0).to(COMPUTE)
    xhat = d * rstd
    cs = (row % num_groups) * cpg + ch
    w = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)
    if ACTIVATION != "none":
        z = xhat * w[:, None] + _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)[:, None]
        dy = _activation_grad(dy, z, ACTIVATION)
    g = dy * w[:, None]
    mg = tl.sum(tl.sum(g, 1), 0) / size
    mgx = tl.sum(tl.sum(g * xhat, 1), 0) / size
    tl.store(dx + offs, _narrow(rstd * (g - mg - xhat * mgx), dx.dtype.element_ty), mask=mask)
    return tl.sum(dy * xhat, 1), tl.sum(dy, 1), c_mask


@triton.jit
def bwd_whole_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, PARAM_GRADS: tl.constexpr,
    DWEIGHT_ROW: tl.constexpr, DBIAS_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
    COMPUTE: tl.constexpr, DIRECT_GRADS: tl.constexpr,
):  # fmt: skip
    """dx, and with PARAM_GRADS each (sample, channel)'s sum(dy * xhat) and
    sum(dy) (the plan's segments are whole channels: chunk = HW).  With
    DIRECT_GRADS (one program) it walks each group's samples in turn and
    writes dweight and dbias itself: no workspace, no reduce launch."""
    cpg = C // num_groups
    size = _group_size(cpg, HW, COMPUTE)
    if DIRECT_GRADS:
        for g in range(num_groups):
            cs = g * cpg + tl.arange(0, BLOCK_C)
            acc_w = tl.zeros([BLOCK_C], dtype=COMPUTE)
            acc_b = tl.zeros([BLOCK_C], dtype=COMPUTE)
            for n in range(N):
                row = tl.cast(n, tl.int64) * num_groups + g
                sum_w, sum_b, c_mask = _whole_row_backward(
                    grad_out, x, weight, bias, dx, row, num_groups, cpg, C, HW, stride_c, stride_s, size, eps,
                    HAS_W, HAS_B, ACTIVATION, BLOCK_C, BLOCK_HW, COMPUTE)  # fmt: skip
                acc_w += sum_w
                acc_b += sum_b
            c_mask = tl.arange(0, BLOCK_C) < cpg
            if HAS_W:
                tl.store(dweight + cs, _narrow(acc_w, dweight.dtype.element_ty), mask=c_mask)
            if HAS_B:
                tl.store(dbias + cs, _narrow(acc_b, dbias.dtype.element_ty), mask=c_mask)
    else:
        n_segments = tl.cast(N, tl.int64) * C
        for row in tl.range(tl.program_id(0), tl.cast(N, tl.int64) * num_groups, tl.num_programs(0)):
            row = tl.cast(row, tl.int64)
            sum_w, sum_b, c_mask = _whole_row_backward(
                grad_out, x, weight, bias, dx, row, num_groups, cpg, C, HW, stride_c, stride_s, size, eps,
                HAS_W, HAS_B, ACTIVATION, BLOCK_C, BLOCK_HW, COMPUTE)  # fmt: skip
            if PARAM_GRADS:
                seg = row * cpg + tl.arange(0, BLOCK_C)  # n * C + channel
                tl.store(workspace + DWEIGHT_ROW * n_segments + seg, sum_w, mask=c_mask)
                tl.store(workspace + DBIAS_ROW * n_segments + seg, sum_b, mask=c_mask)


# --- one-pass (CUDA): a team of resident programs per group, partials through the workspace


@triton.jit
def _team_barrier(counter, team_size):
    """Returns once all ``team_size`` programs of the team have arrived at
    ``counter`` (int32, zero before the team's first arrival); every store a
    program made before arriving is visible to the others after.  Safe only
    if the whole team is resident at once (residency.py says why it is)."""
    tl.debug_barrier()  # this program's threads have all stored their partials
    tl.atomic_add(counter, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
    while arrived < team_size:
        arrived = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # no thread reads the team's partials before the acquire


@triton.jit
def _team_member(N, C, HW, num_groups, chunk, BLOCK_C: tl.constexpr):
    """(team, channel block, segment, team size, teams, cpg, splits, rows it
    may take, values per segment row) of this program: program p is member
    p % team_size of team p // team_size, and team t takes rows t, t + teams, ..."""
    cpg, c_blocks, splits, n_rows, _n_items, n_segments = _split_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    team_size = c_blocks * splits
    pid = tl.cast(tl.program_id(0), tl.int64)
    rank = pid % team_size
    team = pid // team_size
    teams = tl.maximum(tl.num_programs(0) // team_size, 1)
    # A program past the last whole team (none in a planned grid) takes no row: its team would never fill.
    last = tl.where(team < tl.num_programs(0) // team_size, n_rows, 0)
    return team, rank // splits, rank % splits, team_size, teams, cpg, splits, last, n_segments


@triton.jit
def _tile_offsets(HW, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, EVEN: tl.constexpr):
    """int32 offsets of a [BLOCK_C, BLOCK_HW] tile from its first element.
    Kept small on purpose: the one-pass kernels hold a tile across the
    barrier, and 64-bit offsets and masks held beside it would cost more
    registers than its values.  EVEN with HW == BLOCK_HW (the plan's only
    EVEN tiles of several channels): the tile is one contiguous run, which
    the compiler sees when the row stride is the constant BLOCK_HW."""
    if EVEN:
        return tl.arange(0, BLOCK_C)[:, None] * BLOCK_HW + tl.arange(0, BLOCK_HW)[None, :]
    return tl.arange(0, BLOCK_C)[:, None] * HW + tl.arange(0, BLOCK_HW)[None, :]


@triton.jit
def _tile_mask(cpg, HW, c0, s0, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """Which elements of the tile at channel c0 (within the group) and position s0 lie in the group."""
    return (tl.arange(0, BLOCK_C) < cpg - c0)[:, None] & (tl.arange(0, BLOCK_HW) < HW - s0)[None, :]


@triton.jit
def _team_tile(t, row, valid, cpg, HW, cb, s, EVEN: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
               COMPUTE: tl.constexpr):  # fmt: skip
    """This member's tile of t at row (zeros unless valid: past the last row).
    EVEN: tiles never leave their group, so only ``valid`` masks."""
    # Tile-shaped: Triton 3.9's interpreter gives a scalar comparison int32 data, which tl.load refuses as a mask.
    valid = (tl.zeros([BLOCK_C, BLOCK_HW], tl.int32) + valid) != 0
    c0 = cb * BLOCK_C
    s0 = s * BLOCK_HW
    ptrs = t + (row * cpg + c0) * HW + s0 + _tile_offsets(HW, BLOCK_C, BLOCK_HW, EVEN)
    if EVEN:
        return tl.load(ptrs, mask=valid, other=0.0).to(COMPUTE)
    mask = _tile_mask(cpg, HW, c0, s0, BLOCK_C, BLOCK_HW) & valid
    return tl.load(ptrs, mask=mask, other=0.0).to(COMPUTE)


@triton.jit
def _store_team_tile(t, v, row, cpg, HW, cb, s, EVEN: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    c0 = cb * BLOCK_C
    s0 = s * BLOCK_HW
    ptrs = t + (row * cpg + c0) * HW + s0 + _tile_offsets(HW, BLOCK_C, BLOCK_HW, EVEN)
    if EVEN:
        tl.store(ptrs, _narrow(v, t.dtype.element_ty))
    else:
        tl.store(ptrs, _narrow(v, t.dtype.element_ty), mask=_tile_mask(cpg, HW, c0, s0, BLOCK_C, BLOCK_HW))


@triton.jit
def _channel_moments(xv, cpg, HW, cb, s, cnt, EVEN: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """Per channel of a member's tile: the mean over its cnt positions, M2,
    and x - mean (0 outside the group)."""
    mean = tl.sum(xv, 1) / cnt
    d = xv - mean[:, None]
    if not EVEN:
        d = tl.where(_tile_mask(cpg, HW, cb * BLOCK_C, s * BLOCK_HW, BLOCK_C, BLOCK_HW), d, 0.0)
    return mean, tl.sum(d * d, 1), d


@triton.jit
def _member_channels(row, num_groups, cpg, C, splits, cb, s, BLOCK_C: tl.constexpr):
    """The member's channels within the group, their mask, their index in a
    segment row, and their index among all C channels."""
    ch = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    return ch, ch < cpg, _segment_index(row, num_groups, cpg, C, splits, s) + ch, (row % num_groups) * cpg + ch


@triton.jit
def fwd_one_pass_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, MEAN_ROW: tl.constexpr,
    M2_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_P: tl.constexpr, EVEN: tl.constexpr,
    PREFETCH: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """y with x read once: each member keeps its tile in registers across the
    team's barrier (chunk = BLOCK_HW: one tile per member).  EVEN: tiles never
    leave their group (cpg % BLOCK_C == 0 and HW % BLOCK_HW == 0), so no
    masks.  PREFETCH loads the team's next row before waiting, so the wait
    overlaps those loads.  Contiguous x only (the strides are not read: plan.one_pass)."""
    member = _team_member(N, C, HW, num_groups, chunk, BLOCK_C)
    team, cb, s, team_size, teams, cpg, splits, n_rows, n_segments = member
    cnt = _segment_count(s, HW, chunk).to(COMPUTE)
    size = _group_size(cpg, HW, COMPUTE)
    if PREFETCH:
        xv = _team_tile(x, team, team < n_rows, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW, COMPUTE)
    for row in tl.range(team, n_rows, teams):
        if not PREFETCH:
            xv = _team_tile(x, row, True, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW, COMPUTE)
        mean_c, m2_c, _d = _channel_moments(xv, cpg, HW, cb, s, cnt, EVEN, BLOCK_C, BLOCK_HW)
        ch, c_mask, seg, cs = _member_channels(row, num_groups, cpg, C, splits, cb, s, BLOCK_C)
        tl.store(workspace + MEAN_ROW * n_segments + seg, mean_c, mask=c_mask)
        tl.store(workspace + M2_ROW * n_segments + seg, m2_c, mask=c_mask)
        if PREFETCH:
            x_next = _team_tile(x, row + teams, row + teams < n_rows, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW, COMPUTE)
        _team_barrier(counters + row, team_size)
        mean, m2, _, _ = _merge_group(
            workspace, weight, row, num_groups, cpg, C, HW, chunk, splits, n_segments,
            MEAN_ROW, M2_ROW, MEAN_ROW, MEAN_ROW, False, False, BLOCK_P, COMPUTE,
        )  # fmt: skip
        scale = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE) * _rsqrt_eps(m2 / size, eps)
        shift = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE) - mean * scale
        out = _activate(xv * scale[:, None] + shift[:, None], ACTIVATION)
        _store_team_tile(y, out, row, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW)
        if PREFETCH:
            xv = x_next


@triton.jit
def bwd_one_pass_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, MEAN_ROW: tl.constexpr,
    M2_ROW: tl.constexpr, SUM_DY_ROW: tl.constexpr, SUM_DY_D_ROW: tl.constexpr, DWEIGHT_ROW: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_P: tl.constexpr, EVEN: tl.constexpr,
    PREFETCH: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """dx with x and dy read once (as fwd_one_pass_kernel); with HAS_W each
    member also writes its channels' dweight term (DWEIGHT_ROW); the sum(dy)
    of its partials (SUM_DY_ROW) is the dbias term.  With an ACTIVATION the
    team meets twice per row: the statistics first, then (dy turned into dz
    with them) the sums of dz; the row's one counter counts both arrivals."""
    member = _team_member(N, C, HW, num_groups, chunk, BLOCK_C)
    team, cb, s, team_size, teams, cpg, splits, n_rows, n_segments = member
    cnt = _segment_count(s, HW, chunk).to(COMPUTE)
    size = _group_size(cpg, HW, COMPUTE)
    if PREFETCH:
        xv = _team_tile(x, team, team < n_rows, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW, COMPUTE)
        dy = _team_tile(grad_out, team, team < n_rows, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW, COMPUTE)
    for row in tl.range(team, n_rows, teams):
        if not PREFETCH:
            xv = _team_tile(x, row, True, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW, COMPUTE)
            dy = _team_tile(grad_out, row, True, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW, COMPUTE)
        mean_c, m2_c, d = _channel_moments(xv, cpg, HW, cb, s, cnt, EVEN, BLOCK_C, BLOCK_HW)
        if ACTIVATION == "none":
            sum_dy_c = tl.sum(dy, 1)
            sum_dy_d_c = tl.sum(dy * d, 1)
        ch, c_mask, seg, cs = _member_channels(row, num_groups, cpg, C, splits, cb, s, BLOCK_C)
        tl.store(workspace + MEAN_ROW * n_segments + seg, mean_c, mask=c_mask)
        tl.store(workspace + M2_ROW * n_segments + seg, m2_c, mask=c_mask)
        if ACTIVATION == "none":
            tl.store(workspace + SUM_DY_ROW * n_segments + seg, sum_dy_c, mask=c_mask)
            tl.store(workspace + SUM_DY_D_ROW * n_segments + seg, sum_dy_d_c, mask=c_mask)
        if PREFETCH:
            valid = row + teams < n_rows
            x_next = _team_tile(x, row + teams, valid, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW, COMPUTE)
            dy_next = _team_tile(grad_out, row + teams, valid, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW, COMPUTE)
        _team_barrier(counters + row, team_size)
        if ACTIVATION != "none":
            mean, m2, _, _ = _merge_group(
                workspace, weight, row, num_groups, cpg, C, HW, chunk, splits, n_segments,
                MEAN_ROW, M2_ROW, MEAN_ROW, MEAN_ROW, False, False, BLOCK_P, COMPUTE,
            )  # fmt: skip
            w = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)
            b = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)
            z = (xv - mean) * (_rsqrt_eps(m2 / size, eps) * w)[:, None] + b[:, None]
            dy = _activation_grad(dy, z, ACTIVATION)  # 0 outside the group, where dy is
            sum_dy_c = tl.sum(dy, 1)
            sum_dy_d_c = tl.sum(dy * d, 1)
            tl.store(workspace + SUM_DY_ROW * n_segments + seg, sum_dy_c, mask=c_mask)
            tl.store(workspace + SUM_DY_D_ROW * n_segments + seg, sum_dy_d_c, mask=c_mask)
            _team_barrier(counters + row, 2 * team_size)
        mean, m2, sum_g, sum_gd = _merge_group(
            workspace, weight, row, num_groups, cpg, C, HW, chunk, splits, n_segments,
            MEAN_ROW, M2_ROW, SUM_DY_ROW, SUM_DY_D_ROW, True, HAS_W, BLOCK_P, COMPUTE,
        )  # fmt: skip
        rstd, mg, mgx = _backward_coefficients(mean, m2, sum_g, sum_gd, size, eps)
        w = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)  # loaded late: fewer live registers
        # dx = rstd * (dy * w - mg - (x - mean) * rstd * mgx), as a * dy + b * x + c per channel.
        a = rstd * w
        b = -rstd * rstd * mgx
        dxv = dy * a[:, None] + xv * b + (rstd * (mean * rstd * mgx - mg))
        _store_team_tile(dx, dxv, row, cpg, HW, cb, s, EVEN, BLOCK_C, BLOCK_HW)
        if HAS_W:  # sum(dy * xhat) per channel: rstd * (sum(dy * (x - mean_c)) + (mean_c - mean) * sum(dy))
            dweight_term = rstd * (sum_dy_d_c + (mean_c - mean) * sum_dy_c)
            tl.store(workspace + DWEIGHT_ROW * n_segments + seg, dweight_term, mask=c_mask)
        if PREFETCH:
            xv = x_next
            dy = dy_next


# --- looped: one program walks a (sample, group) twice


@triton.jit
def _group_tile(base, step, h_steps, cpg, HW, stride_c, stride_s, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """The step-th [BLOCK_C, BLOCK_HW] tile of the group starting at base
    (int64), walking positions within a channel block first: its offsets and
    mask, and its channels within the group and their mask."""
    ch = tl.cast(step // h_steps, tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    cols = (step % h_steps) * BLOCK_HW + tl.arange(0, BLOCK_HW)
    c_mask = ch < cpg
    mask = c_mask[:, None] & (cols < HW)[None, :]
    return base + ch[:, None] * stride_c + cols[None, :] * stride_s, mask, ch, c_mask


@triton.jit
def _looped_sums(x, grad_out, weight, base, first, cpg, HW, stride_c, stride_s, h_steps, steps,
                 HAS_DY: tl.constexpr, HAS_W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
                 LOOP_STAGES: tl.constexpr, X_EVICT: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """One walk over the group at base whose first channel is first: with
    d = x - k (k the mean of the group's first tile, so that the sums of d
    do not cancel) and g = dy * w, returns k and sum(d), sum(d^2), sum(g),
    sum(g * d); X_EVICT is the L2 eviction policy of the x loads."""
    offs, mask, _ch, _c_mask = _group_tile(base, 0, h_steps, cpg, HW, stride_c, stride_s, BLOCK_C, BLOCK_HW)
    first_tile = tl.load(x + offs, mask=mask, other=0.0, eviction_policy=X_EVICT).to(COMPUTE)
    k = tl.sum(tl.sum(first_tile, 1), 0) / tl.sum(tl.sum(mask.to(COMPUTE), 1), 0)
    acc_d = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
    acc_dd = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
    acc_g = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
    acc_gd = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
    for step in tl.range(0, steps, num_stages=LOOP_STAGES):
        offs, mask, ch, c_mask = _group_tile(base, step, h_steps, cpg, HW, stride_c, stride_s, BLOCK_C, BLOCK_HW)
        xv = tl.load(x + offs, mask=mask, other=0.0, eviction_policy=X_EVICT).to(COMPUTE)
        d = tl.where(mask, xv - k, 0.0)
        acc_d += d
        acc_dd += d * d
        if HAS_DY:
            w = _channel_param(weight, first + ch, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)
            g = tl.load(grad_out + offs, mask=mask, other=0.0).to(COMPUTE) * w[:, None]
            acc_g += g
            acc_gd += g * d
    s1 = tl.sum(tl.sum(acc_d, 1), 0)
    s2 = tl.sum(tl.sum(acc_dd, 1), 0)
    return k, s1, s2, tl.sum(tl.sum(acc_g, 1), 0), tl.sum(tl.sum(acc_gd, 1), 0)


@triton.jit
def _looped_dz_sums(x, grad_out, weight, bias, base, first, mean, rstd, cpg, HW, stride_c, stride_s, h_steps,
                    steps,
                    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr,
                    BLOCK_HW: tl.constexpr, LOOP_STAGES: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """One walk over the group at base, its statistics known: with dz = dy
    taken through the activation at z = xhat * w + b and g = dz * w, returns
    sum(g) and sum(g * (x - mean))."""
    acc_g = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
    acc_gd = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
    for step in tl.range(0, steps, num_stages=LOOP_STAGES):
        offs, mask, ch, c_mask = _group_tile(base, step, h_steps, cpg, HW, stride_c, stride_s, BLOCK_C, BLOCK_HW)
        d = tl.where(mask, tl.load(x + offs, mask=mask, other=0.0).to(COMPUTE) - mean, 0.0)
        w = _channel_param(weight, first + ch, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)[:, None]
        b = _channel_param(bias, first + ch, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)[:, None]
        dy = tl.load(grad_out + offs, mask=mask, other=0.0).to(COMPUTE)
        g = _activation_grad(dy, d * rstd * w + b, ACTIVATION) * w
        acc_g += g
        acc_gd += g * d
    return tl.sum(tl.sum(acc_g, 1), 0), tl.sum(tl.sum(acc_gd, 1), 0)


@triton.jit
def _looped_stats(x, grad_out, weight, bias, base, first, cpg, HW, stride_c, stride_s, h_steps, steps, eps,
                  HAS_DY: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr,
                  BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, LOOP_STAGES: tl.constexpr, X_EVICT: tl.constexpr,
                  COMPUTE: tl.constexpr):  # fmt: skip
    """One walk over the (sample, group) row whose first element is at
    ``base`` and first channel is ``first`` (the callers compute both from
    ints: _whole_tile says why): mean and rstd, and with HAS_DY mean(g) and
    mean(g * xhat) (with an ACTIVATION, g from dz, in a second walk)."""
    size = _group_size(cpg, HW, COMPUTE)
    one_walk = HAS_DY and ACTIVATION == "none"
    k, s1, s2, sg, sgd = _looped_sums(
        x, grad_out, weight, base, first, cpg, HW, stride_c, stride_s, h_steps, steps,
        one_walk, HAS_W, BLOCK_C, BLOCK_HW, LOOP_STAGES, X_EVICT, COMPUTE,
    )  # fmt: skip
    mean_d = s1 / size  # mean - k
    rstd = _rsqrt_eps(tl.maximum(s2 - s1 * mean_d, 0.0) / size, eps)
    if HAS_DY and ACTIVATION != "none":
        sg, sgd = _looped_dz_sums(
            x, grad_out, weight, bias, base, first, k + mean_d, rstd, cpg, HW, stride_c, stride_s, h_steps, steps,
            HAS_W, HAS_B, ACTIVATION, BLOCK_C, BLOCK_HW, LOOP_STAGES, COMPUTE,
        )  # fmt: skip
        return k + mean_d, rstd, sg / size, rstd * sgd / size
    return k + mean_d, rstd, sg / size, rstd * (sgd - mean_d * sg) / size


@triton.jit
def fwd_looped_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_HW: tl.constexpr, LOOP_STAGES: tl.constexpr, STATS_EVICT: tl.constexpr, OUTPUT_EVICT: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """One program per (sample, group): statistics first, then the output
    last tile first.  STATS_EVICT / OUTPUT_EVICT: L2 eviction policies of the
    first walk's x loads and of the second walk's loads and stores ("" for
    the default; evict_last / evict_first keep x in L2 for the second walk)."""
    cpg = C // num_groups
    h_steps = tl.cdiv(HW, BLOCK_HW)
    steps = tl.cdiv(cpg, BLOCK_C) * h_steps
    for row in tl.range(tl.program_id(0), tl.cast(N, tl.int64) * num_groups, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        base = _row_base(row, num_groups, cpg, C, HW, stride_c)
        first = (row % num_groups) * cpg
        mean, rstd, _mg, _mgx = _looped_stats(
            x, x, weight, bias, base, first, cpg, HW, stride_c, stride_s, h_steps, steps, eps,
            False, False, False, "none", BLOCK_C, BLOCK_HW, LOOP_STAGES, STATS_EVICT, COMPUTE,
        )  # fmt: skip
        for i in tl.range(0, steps, num_stages=LOOP_STAGES):
            offs, mask, ch, c_mask = _group_tile(
                base, steps - 1 - i, h_steps, cpg, HW, stride_c, stride_s, BLOCK_C, BLOCK_HW
            )
            scale = _channel_param(weight, first + ch, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE) * rstd
            shift = _channel_param(bias, first + ch, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)
            xv = tl.load(x + offs, mask=mask, other=0.0, eviction_policy=OUTPUT_EVICT).to(COMPUTE)
            out = _activate((xv - mean) * scale[:, None] + shift[:, None], ACTIVATION)
            tl.store(y + offs, _narrow(out, y.dtype.element_ty), mask=mask, eviction_policy=OUTPUT_EVICT)


@triton.jit
def bwd_looped_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, PARAM_GRADS: tl.constexpr,
    DWEIGHT_ROW: tl.constexpr, DBIAS_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
    LOOP_STAGES: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """One program per (sample, group): the group sums first, then dx last
    tile first, with PARAM_GRADS summing each channel's sum(dy * xhat) and
    sum(dy) on the way, stored when its block's last tile in this order is
    done (segments are whole channels: chunk = HW)."""
    cpg = C // num_groups
    n_segments = tl.cast(N, tl.int64) * C
    h_steps = tl.cdiv(HW, BLOCK_HW)
    steps = tl.cdiv(cpg, BLOCK_C) * h_steps
    for row in tl.range(tl.program_id(0), tl.cast(N, tl.int64) * num_groups, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        base = _row_base(row, num_groups, cpg, C, HW, stride_c)
        first = (row % num_groups) * cpg
        mean, rstd, mg, mgx = _looped_stats(
            x, grad_out, weight, bias, base, first, cpg, HW, stride_c, stride_s, h_steps, steps, eps,
            True, HAS_W, HAS_B, ACTIVATION, BLOCK_C, BLOCK_HW, LOOP_STAGES, "", COMPUTE,
        )  # fmt: skip
        acc_w = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
        acc_b = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
        for i in tl.range(0, steps, num_stages=LOOP_STAGES):
            step = steps - 1 - i
            offs, mask, ch, c_mask = _group_tile(base, step, h_steps, cpg, HW, stride_c, stride_s, BLOCK_C, BLOCK_HW)
            w = _channel_param(weight, first + ch, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)
            xv = tl.load(x + offs, mask=mask, other=0.0).to(COMPUTE)
            dy = tl.load(grad_out + offs, mask=mask, other=0.0).to(COMPUTE)
            xhat = tl.where(mask, (xv - mean) * rstd, 0.0)
            if ACTIVATION != "none":
                b = _channel_param(bias, first + ch, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)
                dy = _activation_grad(dy, xhat * w[:, None] + b[:, None], ACTIVATION)
            tl.store(dx + offs, _narrow(rstd * (dy * w[:, None] - mg - xhat * mgx), dx.dtype.element_ty), mask=mask)
            if PARAM_GRADS:
                acc_w += dy * xhat
                acc_b += dy
                if step % h_steps == 0:  # the channel block's last tile in this order
                    seg = row * cpg + ch  # n * C + channel
                    tl.store(workspace + DWEIGHT_ROW * n_segments + seg, tl.sum(acc_w, 1), mask=c_mask)
                    tl.store(workspace + DBIAS_ROW * n_segments + seg, tl.sum(acc_b, 1), mask=c_mask)
                    acc_w = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
                    acc_b = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)


# --- split: partials of (row, channel block, segment) items, then apply / dx


@triton.jit
def _shifted_sums(x, grad_out, rows, c_mask, start, HW, stride_s, chunk, w, b, mean, rstd, HAS_DY: tl.constexpr,
                  ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
                  COMPUTE: tl.constexpr):  # fmt: skip
    """Over one segment of each channel row (rows: offsets of the channels'
    first elements): the shift k (the segment's first element), and sum(d),
    sum(d^2), sum(dy), sum(dy * d) with d = x - k, each of shape [BLOCK_C].
    With an ACTIVATION, dy is first taken through it at z = (x - mean) *
    rstd * w + b (the group's statistics, the channels' w and b)."""
    k = tl.load(x + rows + start * stride_s, mask=c_mask, other=0.0).to(COMPUTE)
    acc_d = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
    acc_dd = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
    acc_g = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
    acc_gd = tl.zeros([BLOCK_C, BLOCK_HW], dtype=COMPUTE)
    for step in range(0, chunk, BLOCK_HW):
        cols = start + step + tl.arange(0, BLOCK_HW)
        mask = c_mask[:, None] & (cols < HW)[None, :]
        offs = rows[:, None] + cols[None, :] * stride_s
        xv = tl.load(x + offs, mask=mask, other=0.0).to(COMPUTE)
        d = tl.where(mask, xv - k[:, None], 0.0)
        acc_d += d
        acc_dd += d * d
        if HAS_DY:
            dy = tl.load(grad_out + offs, mask=mask, other=0.0).to(COMPUTE)
            if ACTIVATION != "none":
                dy = _activation_grad(dy, (xv - mean) * (rstd * w)[:, None] + b[:, None], ACTIVATION)
            acc_g += dy
            acc_gd += dy * d
    return k, tl.sum(acc_d, 1), tl.sum(acc_dd, 1), tl.sum(acc_g, 1), tl.sum(acc_gd, 1)


@triton.jit
def _split_item(item, num_groups, cpg, C, HW, stride_c, c_blocks, splits, chunk, BLOCK_C: tl.constexpr):
    """Of a work item: its row, the channel offsets' of its block within the
    group and their mask, the offsets of those channels' first elements, its
    segment, the segment's first position and its index in a segment row."""
    row, cb, s = _item_coords(item, c_blocks, splits)
    ch = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = ch < cpg
    return row, ch, c_mask, _row_base(row, num_groups, cpg, C, HW, stride_c) + ch * stride_c, s, s * chunk


@triton.jit
def fwd_partials_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps: tl.float64,
    MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """Each segment's per-channel mean and M2."""
    cpg, c_blocks, splits, _n_rows, n_items, n_segments = _split_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        row, ch, c_mask, rows, s, start = _split_item(
            item, num_groups, cpg, C, HW, stride_c, c_blocks, splits, chunk, BLOCK_C
        )
        k, s1, s2, _, _ = _shifted_sums(
            x,
            x,
            rows,
            c_mask,
            start,
            HW,
            stride_s,
            chunk,
            1.0,
            0.0,
            0.0,
            1.0,
            False,
            "none",
            BLOCK_C,
            BLOCK_HW,
            COMPUTE,
        )
        cnt = _segment_count(s, HW, chunk).to(COMPUTE)
        seg = _segment_index(row, num_groups, cpg, C, splits, s) + ch
        tl.store(workspace + MEAN_ROW * n_segments + seg, k + s1 / cnt, mask=c_mask)
        tl.store(workspace + M2_ROW * n_segments + seg, tl.maximum(s2 - s1 * s1 / cnt, 0.0), mask=c_mask)


@triton.jit
def bwd_partials_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, HAS_DY: tl.constexpr,
    MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr, SUM_DY_ROW: tl.constexpr, SUM_DY_D_ROW: tl.constexpr,
    STATS_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Each segment's per-channel mean, M2 and, with HAS_DY, sum(dy) and
    sum(dy * (x - segment mean)).  With an ACTIVATION, dy is taken through it
    with the group's mean and rstd read from the stats rows at STATS_ROW (a
    run without HAS_DY and bwd_finalize_kernel's have stored them)."""
    cpg, c_blocks, splits, n_rows, n_items, n_segments = _split_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        row, ch, c_mask, rows, s, start = _split_item(
            item, num_groups, cpg, C, HW, stride_c, c_blocks, splits, chunk, BLOCK_C
        )
        w = 1.0
        b = 0.0
        mean = 0.0
        rstd = 1.0
        if ACTIVATION != "none":
            cs = (row % num_groups) * cpg + ch
            w = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)
            b = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)
            mean = tl.load(workspace + STATS_ROW * n_segments + row)
            rstd = tl.load(workspace + STATS_ROW * n_segments + n_rows + row)
        k, s1, s2, sg, sgd = _shifted_sums(
            x, grad_out, rows, c_mask, start, HW, stride_s, chunk, w, b, mean, rstd, HAS_DY, ACTIVATION, BLOCK_C,
            BLOCK_HW, COMPUTE,
        )  # fmt: skip
        cnt = _segment_count(s, HW, chunk).to(COMPUTE)
        d_mean = s1 / cnt
        seg = _segment_index(row, num_groups, cpg, C, splits, s) + ch
        tl.store(workspace + MEAN_ROW * n_segments + seg, k + d_mean, mask=c_mask)
        tl.store(workspace + M2_ROW * n_segments + seg, tl.maximum(s2 - s1 * d_mean, 0.0), mask=c_mask)
        if HAS_DY:
            tl.store(workspace + SUM_DY_ROW * n_segments + seg, sg, mask=c_mask)
            tl.store(workspace + SUM_DY_D_ROW * n_segments + seg, sgd - d_mean * sg, mask=c_mask)


@triton.jit
def fwd_finalize_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps: tl.float64,
    MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr, STATS_ROW: tl.constexpr, BLOCK_P: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """Each (sample, group)'s mean and rstd, in the two rows of one value per
    row that start at segment row STATS_ROW (the unfused split path)."""
    cpg, _c_blocks, splits, n_rows, _n_items, n_segments = _split_dims(N, C, HW, num_groups, chunk, 1)
    stats = workspace + STATS_ROW * n_segments
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        mean, m2, _, _ = _merge_group(
            workspace, weight, row, num_groups, cpg, C, HW, chunk, splits, n_segments,
            MEAN_ROW, M2_ROW, MEAN_ROW, MEAN_ROW, False, False, BLOCK_P, COMPUTE,
        )  # fmt: skip
        tl.store(stats + row, mean)
        tl.store(stats + n_rows + row, _rsqrt_eps(m2 / _group_size(cpg, HW, COMPUTE), eps))


@triton.jit
def bwd_finalize_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_DY: tl.constexpr, MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr,
    SUM_DY_ROW: tl.constexpr, SUM_DY_D_ROW: tl.constexpr, STATS_ROW: tl.constexpr, BLOCK_P: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """Each (sample, group)'s mean, rstd and, with HAS_DY, mean(g) and
    mean(g * xhat), in the four rows of one value per row from segment row
    STATS_ROW (the unfused path, and the statistics an activation's
    derivative needs)."""
    cpg, _c_blocks, splits, n_rows, _n_items, n_segments = _split_dims(N, C, HW, num_groups, chunk, 1)
    stats = workspace + STATS_ROW * n_segments
    size = _group_size(cpg, HW, COMPUTE)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(row, tl.int64)
        mean, m2, sum_g, sum_gd = _merge_group(
            workspace, weight, row, num_groups, cpg, C, HW, chunk, splits, n_segments,
            MEAN_ROW, M2_ROW, SUM_DY_ROW, SUM_DY_D_ROW, HAS_DY, HAS_W, BLOCK_P, COMPUTE,
        )  # fmt: skip
        rstd, mg, mgx = _backward_coefficients(mean, m2, sum_g, sum_gd, size, eps)
        tl.store(stats + row, mean)
        tl.store(stats + n_rows + row, rstd)
        if HAS_DY:
            tl.store(stats + 2 * n_rows + row, mg)
            tl.store(stats + 3 * n_rows + row, mgx)


@triton.jit
def fwd_apply_kernel(
    x, weight, bias, y, workspace, counters, N, C, HW, stride_c, stride_s, num_groups, chunk, eps: tl.float64,
    FUSED: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr, MEAN_ROW: tl.constexpr,
    M2_ROW: tl.constexpr,
    STATS_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_P: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """y = (x - mean) * rstd * w + b; the group's statistics merged here
    (FUSED) or read from the finalize kernel's rows."""
    cpg, c_blocks, splits, n_rows, n_items, n_segments = _split_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    size = _group_size(cpg, HW, COMPUTE)
    for i in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        # Last item first: the partials pass has just streamed those, so they are likeliest still in L2.
        row, ch, c_mask, rows, s, start = _split_item(
            n_items - 1 - i, num_groups, cpg, C, HW, stride_c, c_blocks, splits, chunk, BLOCK_C
        )
        if FUSED:
            mean, m2, _, _ = _merge_group(
                workspace, weight, row, num_groups, cpg, C, HW, chunk, splits, n_segments,
                MEAN_ROW, M2_ROW, MEAN_ROW, MEAN_ROW, False, False, BLOCK_P, COMPUTE,
            )  # fmt: skip
            rstd = _rsqrt_eps(m2 / size, eps)
        else:
            mean = tl.load(workspace + STATS_ROW * n_segments + row)
            rstd = tl.load(workspace + STATS_ROW * n_segments + n_rows + row)
        cs = (row % num_groups) * cpg + ch
        scale = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE) * rstd
        shift = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE) - mean * scale
        for step in range(0, chunk, BLOCK_HW):
            cols = start + step + tl.arange(0, BLOCK_HW)
            mask = c_mask[:, None] & (cols < HW)[None, :]
            offs = rows[:, None] + cols[None, :] * stride_s
            xv = tl.load(x + offs, mask=mask, other=0.0).to(COMPUTE)
            out = _activate(xv * scale[:, None] + shift[:, None], ACTIVATION)
            tl.store(y + offs, _narrow(out, y.dtype.element_ty), mask=mask)


@triton.jit
def bwd_dx_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps: tl.float64,
    FUSED: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ACTIVATION: tl.constexpr,
    MEAN_ROW: tl.constexpr, M2_ROW: tl.constexpr,
    SUM_DY_ROW: tl.constexpr, SUM_DY_D_ROW: tl.constexpr, DWEIGHT_ROW: tl.constexpr,
    STATS_ROW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_P: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """dx = rstd * (dy * w - mean(g) - xhat * mean(g * xhat)), the statistics
    merged here (FUSED) or read from the finalize kernel's rows; with
    HAS_W also each segment's dweight term rstd * sum(dy * (x - mean)) (its
    dbias term is the partials' sum(dy))."""
    cpg, c_blocks, splits, n_rows, n_items, n_segments = _split_dims(N, C, HW, num_groups, chunk, BLOCK_C)
    size = _group_size(cpg, HW, COMPUTE)
    for i in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        # Last item first: the partials pass has just streamed those, so they are likeliest still in L2.
        row, ch, c_mask, rows, s, start = _split_item(
            n_items - 1 - i, num_groups, cpg, C, HW, stride_c, c_blocks, splits, chunk, BLOCK_C
        )
        if FUSED:
            mean, m2, sum_g, sum_gd = _merge_group(
                workspace, weight, row, num_groups, cpg, C, HW, chunk, splits, n_segments,
                MEAN_ROW, M2_ROW, SUM_DY_ROW, SUM_DY_D_ROW, True, HAS_W, BLOCK_P, COMPUTE,
            )  # fmt: skip
            rstd, mg, mgx = _backward_coefficients(mean, m2, sum_g, sum_gd, size, eps)
        else:
            stats = workspace + STATS_ROW * n_segments + row
            mean = tl.load(stats)
            rstd = tl.load(stats + n_rows)
            mg = tl.load(stats + 2 * n_rows)
            mgx = tl.load(stats + 3 * n_rows)
        cs = (row % num_groups) * cpg + ch
        w = _channel_param(weight, cs, c_mask, HAS_W, 1.0, BLOCK_C, COMPUTE)
        if ACTIVATION != "none":
            b = _channel_param(bias, cs, c_mask, HAS_B, 0.0, BLOCK_C, COMPUTE)
        if HAS_W:
            # Only this item writes its segments' terms; every item reads the partial rows only.
            seg = _segment_index(row, num_groups, cpg, C, splits, s) + ch
            mean_c = tl.load(workspace + MEAN_ROW * n_segments + seg, mask=c_mask, other=0.0)
            sg = tl.load(workspace + SUM_DY_ROW * n_segments + seg, mask=c_mask, other=0.0)
            sgd = tl.load(workspace + SUM_DY_D_ROW * n_segments + seg, mask=c_mask, other=0.0)
            tl.store(workspace + DWEIGHT_ROW * n_segments + seg, rstd * (sgd + (mean_c - mean) * sg), mask=c_mask)
        for step in range(0, chunk, BLOCK_HW):
            cols = start + step + tl.arange(0, BLOCK_HW)
            mask = c_mask[:, None] & (cols < HW)[None, :]
            offs = rows[:, None] + cols[None, :] * stride_s
            xv = tl.load(x + offs, mask=mask, other=0.0).to(COMPUTE)
            dy = tl.load(grad_out + offs, mask=mask, other=0.0).to(COMPUTE)
            if ACTIVATION != "none":
                dy = _activation_grad(dy, (xv - mean) * (rstd * w)[:, None] + b[:, None], ACTIVATION)
            dxv = rstd * (dy * w[:, None] - mg - (xv - mean) * rstd * mgx)
            tl.store(dx + offs, _narrow(dxv, dx.dtype.element_ty), mask=mask)


# --- dweight / dbias


@triton.jit
def reduce_param_grads_kernel(
    grad_out, x, weight, bias, dx, dweight, dbias, workspace, counters, N, C, HW, stride_c, stride_s,
    num_groups, chunk, eps: tl.float64,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, DWEIGHT_ROW: tl.constexpr, DBIAS_ROW: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """dweight and dbias: the column sums of the (N * splits, C) rows
    DWEIGHT_ROW and DBIAS_ROW, in a fixed order, in the workspace's dtype."""
    n_part_rows = tl.cast(N, tl.int64) * tl.cdiv(HW, chunk)
    n_segments = n_part_rows * C
    for cb in tl.range(tl.program_id(0), tl.cdiv(C, BLOCK_C), tl.num_programs(0)):
        cs = tl.cast(cb, tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_mask = cs < C
        acc_w = tl.zeros([BLOCK_R, BLOCK_C], dtype=workspace.dtype.element_ty)
        acc_b = tl.zeros([BLOCK_R, BLOCK_C], dtype=workspace.dtype.element_ty)
        for r0 in range(0, n_part_rows, BLOCK_R):
            rs = r0 + tl.arange(0, BLOCK_R)
            mask = (rs < n_part_rows)[:, None] & c_mask[None, :]
            offs = rs[:, None] * C + cs[None, :]
            if HAS_W:
                acc_w += tl.load(workspace + DWEIGHT_ROW * n_segments + offs, mask=mask, other=0.0)
            if HAS_B:
                acc_b += tl.load(workspace + DBIAS_ROW * n_segments + offs, mask=mask, other=0.0)
        if HAS_W:
            tl.store(dweight + cs, _narrow(tl.sum(acc_w, 0), dweight.dtype.element_ty), mask=c_mask)
        if HAS_B:
            tl.store(dbias + cs, _narrow(tl.sum(acc_b, 0), dbias.dtype.element_ty), mask=c_mask)
