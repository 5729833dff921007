"""How a GroupNorm launch runs: one ``Plan`` type -- which kernels run in
which order, each one's grid, constexprs and launch options, and the
workspace layout -- and the planning functions ``cuda`` and ``npu``, pure
functions of the problem's sizes and the device's facts.

x is viewed as (N, C, HW), HW the product of the spatial sizes; a (sample,
group) is a *row* of cpg = C // num_groups channels x HW positions.  Paths
(kernels.py has the kernels):

* whole: a group whose padded [channels, spatial] tile fits one program is
  normalized from registers, one program per row (one launch forward, one
  plus the dweight / dbias reduce backward);
* one-pass (CUDA only): a team of programs holds each group, one tile each,
  exchanging per-channel partials through the workspace across a barrier,
  so x (and dy) are read once (one launch, plus the reduce backward);
* looped: one program per row walks it twice (statistics, then output out
  of L2);
* split: work items are (row, channel block, spatial segment of ``chunk``
  positions); a partials launch, an optional finalize launch, then apply /
  dx, which merges its group's partials itself when they are few
  (``FUSE_MIN_CHUNK_PER_PARTIAL``).

CUDA picks, in order: whole (if the group fits and there are enough rows to
fill the SMs, or no one-pass plan is possible); looped (enough rows per SM
and x under ``ONE_PASS_MIN_BYTES``: measured faster than one-pass there); one-pass
(if the device allows it -- a real GPU, contiguous x, float32 math, not a
backward with an activation -- and it needs at most ONE_PASS_MAX_ROUNDS
rounds of resident teams); split.  The NPU: whole if it fits the unified buffer, else split (its
one-pass and looped paths are not used: see docs/npu.md).

One-pass residency, and why its barrier cannot deadlock.  A team's
programs wait for each other, so every program of the grid must be
resident at once.  A one-pass plan's grid is an upper bound (one team per
row); before the first launch of each compiled one-pass kernel the launch
sequence caps it at whole teams of what that kernel keeps resident -- its
registers per thread, warps and shared memory against the SM's limits
(``resident_ctas``) times the SM count -- and runs ``Plan.fallback`` (a
two-walk plan) instead when not one team fits or the rows would take more
than ``Plan.max_rounds`` rounds.  Each team takes rows t, t + teams, ...
and its members wait only for each other, at the same row, so once all
are resident every barrier completes.  The launch is also a cooperative
one (``launch_cooperative_grid``): the driver refuses a grid that cannot be
co-resident rather than starting it, so a wrong count fails loudly instead
of hanging.  Barrier counters are one int32 per row, zeroed for every call
and reached only by that call's launch: repeated launches, CUDA-graph
replays (the zeroing is captured too) and launches on other streams (the
caching allocator does not hand one stream's live block to another) never
share one.  The Triton interpreter runs programs one after another, so a
team of more than one program would wait forever there:
``CudaDevice.cooperative`` is False off a real GPU, and the CPU tests run
one-program teams.  The planner picks tiles with ``estimated_registers``;
only the compiled kernel's count sizes the grid.

All of it is plain-int arithmetic (``csrc_free_ops.host_math``).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton.language as tl
from triton.runtime.jit import JITFunction

from csrc_free_ops.device import NPU_MAX_GRID
from csrc_free_ops.group_norm import kernels
from csrc_free_ops.host_math import cdiv, next_pow2, prev_pow2

# ---------------------------------------------------------------- the types


@dataclass(frozen=True)
class Layout:
    """The float workspace, in the compute dtype: one row per name of
    ``segment``, each holding one value per segment (sample, spatial segment,
    channel) laid out (N, splits, C), then one row per name of ``stats``,
    each holding one value per (sample, group).  Kernels take a segment row's
    index as the constexpr NAME_ROW (``rows``) and the first stats row's
    as STATS_ROW."""

    segment: tuple[str, ...] = ()
    stats: tuple[str, ...] = ()

    def rows(self, *names: str) -> tuple[tuple[str, int], ...]:
        return tuple((f"{name.upper()}_ROW", self.segment.index(name)) for name in names)

    def elements(self, segments: int, groups: int) -> int:
        return len(self.segment) * segments + len(self.stats) * groups


NO_WORKSPACE = Layout()
# Per-segment partials of the split and one-pass paths: a segment's
# per-channel mean and M2, and backward sum(dy) (also the dbias term),
# sum(dy * (x - segment mean)) and the dweight term sum(dy * xhat).
FWD_PARTIALS = Layout(("mean", "m2"))
BWD_PARTIALS = Layout(("mean", "m2", "sum_dy", "sum_dy_d", "dweight"))
# The finalize kernels' per-(sample, group) statistics.
FWD_STATS = ("mean", "rstd")
BWD_STATS = ("mean", "rstd", "mean_g", "mean_gxhat")
# Whole and looped backward: each (sample, channel)'s dweight and dbias terms.
PARAM_TERMS = Layout(("dweight", "sum_dy"))


@dataclass(frozen=True)
class Step:
    """One kernel launch: ``kernel`` (of kernels.py) runs on ``grid``
    programs (1-D) with these constexprs and launch options."""

    kernel: JITFunction
    grid: int
    constexprs: tuple[tuple[str, object], ...]
    options: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class Plan:
    path: str  # "whole", "one_pass", "looped" or "split"
    steps: tuple[Step, ...]  # in launch order
    chunk: int  # positions per spatial segment: the kernels' `chunk` argument
    layout: Layout
    workspace: int  # elements of the workspace (compute dtype; 0: none)
    counters: int = 0  # int32 barrier counters, zeroed per call (one-pass: one per row)
    # One-pass plans: programs per team (the first step's grid is whole
    # teams, capped at launch to what is resident), the most rounds of teams
    # over the rows, and the two-walk plan that runs when they do not fit.
    team_size: int = 0
    max_rounds: int = 0
    fallback: Plan | None = None
    channels_last: bool = False  # the layout it reads (layout.py), its problem's


@dataclass(frozen=True)
class Problem:
    """A call's sizes: x as (n, c, hw) in num_groups groups, x's element size,
    which parameters are given, the direction, the activation applied
    after the normalization ("none" or "silu"), and whether x is read
    channels-last (layout.py)."""

    n: int
    c: int
    hw: int
    num_groups: int
    itemsize: int
    has_weight: bool
    has_bias: bool
    backward: bool
    activation: str = "none"
    channels_last: bool = False

    @property
    def cpg(self) -> int:
        return self.c // self.num_groups

    @property
    def rows(self) -> int:
        return self.n * self.num_groups

    @property
    def compute(self) -> tl.dtype:
        return tl.float64 if self.itemsize == 8 else tl.float32


@dataclass(frozen=True)
class CudaDevice:
    """What CUDA planning needs of the GPU.  ``cooperative``: one-pass plans
    may run (a real GPU; False under the interpreter, which runs programs
    one at a time)."""

    sms: int
    cooperative: bool = False
    regs_per_sm: int = 65536
    shared_per_sm: int = 233472
    threads_per_sm: int = 2048
    ctas_per_sm: int = 32


# ---------------------------------------------------------------- tuning
# (H200 figures from bench/NOTES.md; ``python -m bench.probe_group_norm`` prints
# the table to retune the one-pass and split constants from.)

# Largest padded group one program holds whole: the backward keeps about
# twice the forward's arrays.
FWD_GROUP_TILE, BWD_GROUP_TILE = 8192, 4096
# Whole groups: one warp per this many padded elements (v7: within 9% of the
# best warp count at 256..8192 elements).
WHOLE_GROUP_ELEMENTS_PER_WARP = 4096
# Whole groups give way to one-pass teams below this many rows per SM, where
# one program per row leaves SMs idle, once x holds SPLIT_MIN_BYTES (smaller
# calls are launch-bound either way; issue 19 item 3; not yet measured).
WHOLE_MIN_ROWS_PER_SM = 1.0
SPLIT_MIN_BYTES = 2 * 2**20
MAX_WARPS = 8
MAX_GRID = 2**31 - 1

# One-pass: tile elements per member (largest first; a smaller tile when the
# larger would give the whole problem fewer than ONE_PASS_FILL members per
# SM) and warps.  The planner prefers PREFETCH where the estimated resident
# teams leave a team several rows, and gives up for a two-walk plan beyond
# ONE_PASS_MAX_ROUNDS rounds.  First guesses, to be set from the probe
# (bench/NOTES.md says what to read off it).
ONE_PASS_TILES = {False: (8192, 4096, 2048, 1024), True: (4096, 2048, 1024)}
ONE_PASS_WARPS = {False: 4, True: 4}
ONE_PASS_FILL = 4
ONE_PASS_MAX_ROUNDS = 32
ONE_PASS_PREFETCH = True
# Below this many bytes of x, where the looped path has enough rows it runs
# instead of one-pass: the one shape measured, (2, 320, 64, 64) bf16 forward
# (2.6 MB) on the H200, took 12.4 us looped against 15.0 one-pass in graph
# replay and 11.5 against 43.9 eager (the one-pass launch costs more host
# time: a zeroed counter buffer and a cooperative launch), per
# bench/results/2026-12-04-bab4732/probe_group_norm_partial.log.
# Larger x keeps one-pass (x read once), unmeasured: a first guess, to be
# set from `python -m bench.probe_group_norm`.
ONE_PASS_MIN_BYTES = 16 * 2**20
# Registers per thread of a one-pass member, for planning only: a fit to
# sm_90 compiles of the kernels (cuobjdump -res-usage; 4 warps, tiles that
# stay in their group): about 64 plus 1 per fp32 value it holds forward, 3
# backward (x and dy), twice that with PREFETCH, more for masked tiles.
ONE_PASS_BASE_REGS = 64
ONE_PASS_MASKED_REGS = 64
# Shared memory of a one-pass kernel for planning (reduction scratch; sm_90
# compiles use 16-256 bytes); the launch uses the compiled kernel's figure.
ONE_PASS_SHARED_ESTIMATE = 1024
# Shared memory the driver reserves per CTA (sm_80 and later).
SHARED_RESERVED_PER_CTA = 1024

# Looped groups need enough rows per SM (v5: forward 0.36, backward 0.85).
FWD_LOOP_ROWS_PER_SM, BWD_LOOP_ROWS_PER_SM = 0.36, 0.85
FWD_LOOP_TILE = {2: 8192, 4: 16384, 8: 8192}
BWD_LOOP_TILE = {2: 4096, 4: 4096, 8: 2048}
FWD_LOOP_WARPS, BWD_LOOP_WARPS = 8, 4
FWD_LOOP_STAGES, BWD_LOOP_STAGES = 1, 3
# The looped forward keeps x in L2 between its walks (v8) while the groups in
# flight (per SM by element size) hold at most FWD_L2_HINT_BYTES.
FWD_LOOP_GROUPS_PER_SM = {2: 2, 4: 1, 8: 1}
FWD_L2_HINT_BYTES = 56 * 2**20

# Split: tile elements (the backward keeps twice the accumulators), the
# widest spatial block, work items per SM aimed for and programs per SM
# a launch caps at.
FWD_TILE, BWD_TILE = 4096, 2048
MAX_BLOCK_HW = 1024
ITEMS_PER_SM = 4
PROGRAMS_PER_SM = 8
# The apply / dx kernels merge a group's partials themselves while every
# item streams at least this many positions per partial it reads.
FUSE_MIN_CHUNK_PER_PARTIAL = 8
# Partials per merge step; (rows, channels) of a reduce tile.
MERGE_BLOCK = 1024
REDUCE_TILE, REDUCE_BLOCK_C = 2048, 128

# NPU UB cost model (bytes per tile element; s = x's element size, c = the
# compute dtype's).  Budgets (the Ascend compile check, docs/npu.md): the whole
# UB for whole groups, half of it for the rest (triton-ascend double-buffers):
#   whole forward    x, y (2s) + x, x - mean, y (3c)            2s + 3c
#   whole backward   x, dy, dx (3s) + five arrays (5c)           3s + 5c
#   split forward    max(partials s + 4c, apply 2s + 2c)
#   split backward   max(partials 2s + 7c, dx 3s + 4c)
#   merge            seven vectors (7c); reduce: four (4c)
# An activation adds one compute array (z, or its sigmoid) to each tile kernel.
NPU_REDUCE_BLOCK_C = 64


# ---------------------------------------------------------------- building blocks


def _common(pb: Problem) -> tuple[tuple[str, object], ...]:
    return (("COMPUTE", pb.compute),)


def _flags(pb: Problem) -> tuple[tuple[str, object], ...]:
    """Both directions take bias: backward, for the activation's derivative."""
    return (("HAS_W", pb.has_weight), ("HAS_B", pb.has_bias), ("ACTIVATION", pb.activation))


def _warps(elements: int) -> tuple[tuple[str, object], ...]:
    """CUDA: one warp per 256 tile elements, at most MAX_WARPS."""
    return (("num_warps", max(1, min(MAX_WARPS, elements // 256))),)


def _reduce_step(pb: Problem, layout: Layout, part_rows: int, block_r: int, block_c: int, grid: int,
                 options: tuple) -> Step:  # fmt: skip
    """dweight / dbias from the layout's dweight and sum_dy rows (unused names are 0)."""
    dweight = layout.segment.index("dweight") if "dweight" in layout.segment else 0
    return Step(
        kernels.reduce_param_grads_kernel, grid,
        (("HAS_W", pb.has_weight), ("HAS_B", pb.has_bias), ("DWEIGHT_ROW", dweight),
         ("DBIAS_ROW", layout.segment.index("sum_dy")), ("BLOCK_R", block_r), ("BLOCK_C", block_c)),
        options,
    )  # fmt: skip


def _plan(pb: Problem, path: str, steps: list[Step], chunk: int, layout: Layout, **extra) -> Plan:
    splits = cdiv(pb.hw, chunk)
    workspace = layout.elements(pb.n * splits * pb.c, pb.rows)
    return Plan(path, tuple(steps), chunk, layout, workspace, **extra, channels_last=pb.channels_last)


def tile_shape(pb: Problem, tile: int, max_block_hw: int) -> tuple[int, int]:
    """(block_c, block_hw) of a [channels, positions] tile of at most
    ``tile`` elements within a group, filled along x's unit-stride axis
    first: positions of one channel contiguous, the group's channels of
    one position channels-last (so that its loads stay coalesced)."""
    if pb.channels_last:
        block_c = min(next_pow2(pb.cpg), tile)
        return block_c, min(next_pow2(pb.hw), max_block_hw, max(1, tile // block_c))
    block_hw = min(next_pow2(pb.hw), max_block_hw, tile)
    return min(next_pow2(pb.cpg), max(1, tile // block_hw)), block_hw


def whole_fits(pb: Problem, max_tile: int) -> bool:
    return next_pow2(pb.cpg) * next_pow2(pb.hw) <= max_tile


def whole(pb: Problem, grid_cap: int, options: tuple, reduce: tuple[int, int, int, tuple]) -> Plan:
    """One program per row over a padded [cpg, hw] tile.  reduce: the
    (block_r, block_c, grid, options) of the dweight / dbias reduce."""
    block = (("BLOCK_C", next_pow2(pb.cpg)), ("BLOCK_HW", next_pow2(pb.hw)))
    grid = max(1, min(pb.rows, grid_cap))
    if not pb.backward:
        return _plan(pb, "whole", [Step(kernels.fwd_whole_kernel, grid, _flags(pb) + block + _common(pb), options)],
                     pb.hw, NO_WORKSPACE)  # fmt: skip
    return _per_group_backward(pb, "whole", kernels.bwd_whole_kernel, grid, block, options, reduce)


def _per_group_backward(pb: Problem, path: str, kernel: JITFunction, grid: int, constexprs: tuple, options: tuple,
                        reduce: tuple[int, int, int, tuple]) -> Plan:  # fmt: skip
    param_grads = pb.has_weight or pb.has_bias
    layout = PARAM_TERMS if param_grads else NO_WORKSPACE
    flags = _flags(pb) + (("PARAM_GRADS", param_grads),) + PARAM_TERMS.rows("dweight")
    flags += (("DBIAS_ROW", PARAM_TERMS.segment.index("sum_dy")),)
    steps = [Step(kernel, grid, flags + constexprs + _common(pb), options)]
    if param_grads:
        block_r, block_c, reduce_grid, reduce_options = reduce
        steps.append(_reduce_step(pb, PARAM_TERMS, pb.n, block_r, block_c, reduce_grid, reduce_options))
    return _plan(pb, path, steps, pb.hw, layout)


def looped(pb: Problem, tile: int, grid: int, warps: int | None, stages: int | None, evict: tuple[str, str],
           reduce: tuple[int, int, int, tuple]) -> Plan:  # fmt: skip
    """One program per row walking it in tiles of at most ``tile`` elements.
    evict: the forward's (STATS_EVICT, OUTPUT_EVICT)."""
    block_c, block_hw = tile_shape(pb, tile, tile)
    block = (("BLOCK_C", block_c), ("BLOCK_HW", block_hw), ("LOOP_STAGES", stages))
    options = () if warps is None else (("num_warps", warps),)
    if not pb.backward:
        evicts = (("STATS_EVICT", evict[0]), ("OUTPUT_EVICT", evict[1]))
        step = Step(kernels.fwd_looped_kernel, grid, _flags(pb) + block + evicts + _common(pb), options)
        return _plan(pb, "looped", [step], pb.hw, NO_WORKSPACE)
    return _per_group_backward(pb, "looped", kernels.bwd_looped_kernel, grid, block, options, reduce)


def split_geometry(pb: Problem, tile: int, max_block_hw: int, target_items: int) -> tuple[int, int, int]:
    """(block_c, block_hw, chunk) of split items: [block_c, block_hw] tiles
    of at most ``tile`` elements within a group, and the spatial axis cut
    into segments until there are about ``target_items`` items."""
    block_c, block_hw = tile_shape(pb, tile, max_block_hw)
    hw_blocks = cdiv(pb.hw, block_hw)
    base_items = pb.rows * cdiv(pb.cpg, block_c)
    splits = max(1, min(hw_blocks, cdiv(target_items, base_items)))
    return block_c, block_hw, cdiv(hw_blocks, splits) * block_hw


def split(pb: Problem, block_c: int, block_hw: int, chunk: int, grid_cap: int, merge_block: int, warps: bool,
          reduce: tuple[int, int, int, tuple]) -> Plan:  # fmt: skip
    """Partials, [finalize,] apply / dx [, reduce].  merge_block: most
    partials per step of a group's merge; warps: launch with num_warps by
    tile size (CUDA) or no launch options (NPU).  A backward with an
    activation first runs the partials and finalize for the statistics
    alone, which its second partials launch and its dx launch read."""
    splits = cdiv(pb.hw, chunk)
    items = pb.rows * cdiv(pb.cpg, block_c) * splits
    parts_per_group = pb.cpg * splits
    fused = parts_per_group * FUSE_MIN_CHUNK_PER_PARTIAL <= chunk
    base = FWD_PARTIALS if not pb.backward else BWD_PARTIALS
    stats_first = pb.backward and pb.activation != "none"
    layout = base if fused and not stats_first else Layout(base.segment, BWD_STATS if pb.backward else FWD_STATS)
    block = (("BLOCK_C", block_c), ("BLOCK_HW", block_hw))
    merge = min(next_pow2(parts_per_group), merge_block)
    block_p = (("BLOCK_P", merge),)
    tile_options = _warps(block_c * block_hw) if warps else ()
    merge_options = _warps(merge) if warps else ()
    stats = (("STATS_ROW", len(layout.segment)),)
    grid = max(1, min(items, grid_cap))
    partial_rows = layout.rows("mean", "m2") + (layout.rows("sum_dy", "sum_dy_d") if pb.backward else ())
    finalize_grid = max(1, min(pb.rows, grid_cap))
    if pb.backward:
        steps = []
        for has_dy in (False, True) if stats_first else (True,):
            steps.append(Step(kernels.bwd_partials_kernel, grid, _flags(pb) + (("HAS_DY", has_dy),) + partial_rows
                              + stats + block + _common(pb), tile_options))  # fmt: skip
            if not has_dy:
                steps.append(Step(kernels.bwd_finalize_kernel, finalize_grid, (("HAS_W", pb.has_weight),
                                  ("HAS_DY", False)) + partial_rows + stats + block_p + _common(pb),
                                  merge_options))  # fmt: skip
    else:
        steps = [Step(kernels.fwd_partials_kernel, grid, partial_rows + block + _common(pb), tile_options)]
    if not fused:
        flags = (("HAS_W", pb.has_weight), ("HAS_DY", True)) if pb.backward else ()
        finalize = kernels.bwd_finalize_kernel if pb.backward else kernels.fwd_finalize_kernel
        steps.append(Step(finalize, finalize_grid,
                          flags + partial_rows + stats + block_p + _common(pb), merge_options))  # fmt: skip
    main = kernels.bwd_dx_kernel if pb.backward else kernels.fwd_apply_kernel
    dweight = layout.rows("dweight") if pb.backward else ()
    steps.append(Step(main, grid, (("FUSED", fused),) + _flags(pb) + partial_rows + dweight + stats + block
                      + block_p + _common(pb), tile_options))  # fmt: skip
    if pb.backward and (pb.has_weight or pb.has_bias):
        block_r, block_rc, reduce_grid, reduce_options = reduce
        steps.append(_reduce_step(pb, layout, pb.n * splits, block_r, block_rc, reduce_grid, reduce_options))
    return _plan(pb, "split", steps, chunk, layout)


def one_pass_geometry(pb: Problem, tile: int) -> tuple[int, int]:
    """(block_c, block_hw) of a one-pass member's tile of at most ``tile``
    elements: whole spatial rows where they fit, else segments; channel
    blocks divide the group's channels (a masked tile costs about twice the
    registers: plan.ONE_PASS_MASKED_REGS)."""
    block_hw = min(next_pow2(pb.hw), tile)
    block_c = min(pb.cpg & -pb.cpg, tile // block_hw)  # the largest power of two dividing cpg
    return block_c, block_hw


def team_size(pb: Problem, block_c: int, block_hw: int) -> int:
    return cdiv(pb.cpg, block_c) * cdiv(pb.hw, block_hw)


def resident_ctas(dev: CudaDevice, warps: int, regs_per_thread: int, shared: int) -> int:
    """Programs an SM holds at once, from their registers per thread, warps
    and shared memory (the occupancy calculator's limits; registers are
    allocated per warp in units of 256)."""
    regs_per_warp = cdiv(regs_per_thread * 32, 256) * 256
    return min(
        dev.regs_per_sm // (regs_per_warp * warps),
        dev.threads_per_sm // (32 * warps),
        dev.ctas_per_sm,
        dev.shared_per_sm // (shared + SHARED_RESERVED_PER_CTA),
    )


def resident_teams(dev: CudaDevice, warps: int, regs_per_thread: int, shared: int, team: int, most: int) -> int:
    """Whole teams of ``team`` programs the device holds at once (at most ``most``)."""
    return min(most, resident_ctas(dev, warps, regs_per_thread, shared) * dev.sms // team)


def estimated_registers(pb: Problem, tile: int, warps: int, prefetch: bool, even: bool) -> int:
    values = tile // (32 * warps) * (3 if pb.backward else 1) * (2 if prefetch else 1)
    return min(255, ONE_PASS_BASE_REGS + values + (0 if even else ONE_PASS_MASKED_REGS))


def one_pass(pb: Problem, block_c: int, block_hw: int, teams: int, warps: int | None, prefetch: bool,
             merge_block: int, max_rounds: int = 1 << 30, fallback: Plan | None = None,
             reduce: tuple[int, int, int, tuple] = (1, 1, 1, ()), maxnreg: int | None = None) -> Plan:  # fmt: skip
    """A team of cdiv(cpg, block_c) * cdiv(hw, block_hw) programs per row,
    ``teams`` teams (at least one, at most one per row).  warps / maxnreg
    None: no such launch option.  Contiguous x only: the one-pass kernels
    address a group as one run (two more stride registers made the masked
    backward spill on sm_90, the CUDA compile check)."""
    if pb.channels_last:
        raise ValueError("group_norm: one-pass plans read contiguous x only; plan channels-last x another path")
    size = team_size(pb, block_c, block_hw)
    teams = max(1, min(pb.rows, teams))
    splits = cdiv(pb.hw, block_hw)
    layout = BWD_PARTIALS if pb.backward else FWD_PARTIALS
    rows = layout.rows("mean", "m2")
    if pb.backward:
        rows += layout.rows("sum_dy", "sum_dy_d", "dweight")
    even = pb.cpg % block_c == 0 and pb.hw % block_hw == 0
    parts = (("BLOCK_P", min(next_pow2(pb.cpg * splits), merge_block)), ("EVEN", even), ("PREFETCH", prefetch))
    options = (("launch_cooperative_grid", True),)
    if warps is not None:
        options += (("num_warps", warps),)
    if maxnreg is not None:
        options += (("maxnreg", maxnreg),)
    constexprs = _flags(pb) + rows + (("BLOCK_C", block_c), ("BLOCK_HW", block_hw)) + parts + _common(pb)
    kernel = kernels.bwd_one_pass_kernel if pb.backward else kernels.fwd_one_pass_kernel
    steps = [Step(kernel, teams * size, constexprs, options)]
    if pb.backward and (pb.has_weight or pb.has_bias):
        block_r, block_rc, reduce_grid, reduce_options = reduce
        steps.append(_reduce_step(pb, layout, pb.n * splits, block_r, block_rc, reduce_grid, reduce_options))
    return _plan(pb, "one_pass", steps, block_hw, layout, counters=pb.rows, team_size=size, max_rounds=max_rounds,
                 fallback=fallback)  # fmt: skip


# ---------------------------------------------------------------- CUDA


def _cuda_reduce(pb: Problem, part_rows: int, sms: int) -> tuple[int, int, int, tuple]:
    block_c = min(next_pow2(pb.c), REDUCE_BLOCK_C)
    block_r = max(1, min(next_pow2(part_rows), REDUCE_TILE // block_c))
    return block_r, block_c, max(1, min(cdiv(pb.c, block_c), sms * PROGRAMS_PER_SM)), _warps(block_r * block_c)


def cuda_looped(pb: Problem, sms: int) -> Plan:
    grid = max(1, min(pb.rows, sms * PROGRAMS_PER_SM))
    if pb.backward:
        return looped(pb, BWD_LOOP_TILE[pb.itemsize], grid, BWD_LOOP_WARPS, BWD_LOOP_STAGES, ("", ""),
                      _cuda_reduce(pb, pb.n, sms))  # fmt: skip
    in_flight = min(pb.rows, sms * FWD_LOOP_GROUPS_PER_SM[pb.itemsize]) * pb.cpg * pb.hw * pb.itemsize
    evict = ("evict_last", "evict_first") if in_flight <= FWD_L2_HINT_BYTES else ("", "")
    return looped(pb, FWD_LOOP_TILE[pb.itemsize], grid, FWD_LOOP_WARPS, FWD_LOOP_STAGES, evict, ())


def cuda_split(pb: Problem, sms: int) -> Plan:
    tile = (BWD_TILE if pb.backward else FWD_TILE) // (2 if pb.itemsize == 8 else 1)  # float64 accumulators: half
    block_c, block_hw, chunk = split_geometry(pb, tile, MAX_BLOCK_HW, sms * ITEMS_PER_SM)
    reduce = _cuda_reduce(pb, pb.n * cdiv(pb.hw, chunk), sms)
    return split(pb, block_c, block_hw, chunk, sms * PROGRAMS_PER_SM, MERGE_BLOCK, True, reduce)


def cuda_two_walk(pb: Problem, sms: int) -> Plan:
    """Looped with enough rows per SM, else split."""
    per_sm = BWD_LOOP_ROWS_PER_SM if pb.backward else FWD_LOOP_ROWS_PER_SM
    return cuda_looped(pb, sms) if pb.rows >= sms * per_sm else cuda_split(pb, sms)


def cuda_one_pass(pb: Problem, sms: int, tile: int, warps: int, prefetch: bool, fallback: Plan,
                  max_rounds: int = ONE_PASS_MAX_ROUNDS) -> Plan:  # fmt: skip
    """The one-pass plan with members of at most ``tile`` elements, one team
    per row (the launch caps the teams at what is resident)."""
    block_c, block_hw = one_pass_geometry(pb, tile)
    reduce = _cuda_reduce(pb, pb.n * cdiv(pb.hw, block_hw), sms)
    return one_pass(pb, block_c, block_hw, pb.rows, warps, prefetch, MERGE_BLOCK, max_rounds, fallback, reduce)


def _cuda_one_pass(pb: Problem, dev: CudaDevice, fallback: Plan) -> Plan | None:
    """The one-pass plan with the largest tile (ONE_PASS_TILES) that still
    gives the problem ONE_PASS_FILL members per SM (else the smallest tile),
    with PREFETCH where teams have several rows, if by the estimated
    registers its rounds of resident teams are at most ONE_PASS_MAX_ROUNDS."""
    if not dev.cooperative or pb.compute != tl.float32 or pb.cpg * pb.hw >= 2**31 or pb.channels_last:
        return None  # in-tile offsets are int32; one_pass says why not channels-last
    if pb.backward and pb.activation != "none":
        # Not planned yet: sm_90 compiles of bwd_one_pass_kernel with an activation spill (a loop-invariant
        # scalar across its row loop, 8 bytes of stack, the CUDA compile check), and with PREFETCH the
        # tiles too.  The kernel is correct (the CPU tests run it); the two-walk plan runs instead.
        return None
    warps = ONE_PASS_WARPS[pb.backward]
    tiles = ONE_PASS_TILES[pb.backward]
    for tile in tiles:
        block_c, block_hw = one_pass_geometry(pb, tile)
        size = team_size(pb, block_c, block_hw)
        if pb.rows * size < ONE_PASS_FILL * dev.sms and tile != tiles[-1]:
            continue  # a smaller tile spreads the groups over more SMs
        even = pb.cpg % block_c == 0 and pb.hw % block_hw == 0
        for prefetch in (True, False) if ONE_PASS_PREFETCH else (False,):
            regs = estimated_registers(pb, block_c * block_hw, warps, prefetch, even)
            teams = resident_teams(dev, warps, regs, ONE_PASS_SHARED_ESTIMATE, size, pb.rows)
            if teams == 0 or (prefetch and teams == pb.rows) or cdiv(pb.rows, teams) > ONE_PASS_MAX_ROUNDS:
                continue  # no team fits, nothing to prefetch, or too many rounds
            return cuda_one_pass(pb, dev.sms, tile, warps, prefetch, fallback)
    return None


def cuda(pb: Problem, dev: CudaDevice) -> Plan:
    if whole_fits(pb, BWD_GROUP_TILE if pb.backward else FWD_GROUP_TILE):
        padded = next_pow2(pb.cpg) * next_pow2(pb.hw)
        warps = (("num_warps", max(1, min(MAX_WARPS, padded // WHOLE_GROUP_ELEMENTS_PER_WARP))),)
        plan = whole(pb, MAX_GRID, warps, _cuda_reduce(pb, pb.n, dev.sms))
        if pb.rows >= WHOLE_MIN_ROWS_PER_SM * dev.sms or pb.n * pb.c * pb.hw * pb.itemsize < SPLIT_MIN_BYTES:
            return plan
        return _cuda_one_pass(pb, dev, plan) or plan
    two_walk = cuda_two_walk(pb, dev.sms)
    if two_walk.path == "looped" and pb.n * pb.c * pb.hw * pb.itemsize < ONE_PASS_MIN_BYTES:
        return two_walk
    return _cuda_one_pass(pb, dev, two_walk) or two_walk


# ---------------------------------------------------------------- NPU


def npu_tile(bytes_per_element: int, ub_bytes: int) -> int:
    """Largest power-of-two element count that fits half the UB (at least 1)."""
    return prev_pow2(max(1, ub_bytes // 2 // bytes_per_element))


def npu_whole_bytes(itemsize: int, compute: int, backward: bool, activation: str = "none") -> int:
    extra = 0 if activation == "none" else compute
    return extra + (3 * itemsize + 5 * compute if backward else 2 * itemsize + 3 * compute)


def npu_split_bytes(itemsize: int, compute: int, backward: bool, activation: str = "none") -> int:
    extra = 0 if activation == "none" else compute
    if backward:
        return extra + max(2 * itemsize + 7 * compute, 3 * itemsize + 4 * compute)
    return extra + max(itemsize + 4 * compute, 2 * itemsize + 2 * compute)


def npu(pb: Problem, ub_bytes: int, vector_cores: int) -> Plan:
    """Whole groups where the padded group fits the UB budget, else split
    with the grid at most the vector cores (no launch options: triton-ascend
    has no num_warps / num_stages).  float64 never gets here: triton-ascend
    compiles none, so launch.npu_* run the reference for it."""
    compute = 8 if pb.itemsize == 8 else 4
    cores = max(1, min(vector_cores, NPU_MAX_GRID))
    merge_block = npu_tile(7 * compute, ub_bytes)
    reduce_tile = npu_tile(4 * compute, ub_bytes)
    reduce_c = min(next_pow2(pb.c), NPU_REDUCE_BLOCK_C, reduce_tile)

    def reduce(part_rows: int) -> tuple[int, int, int, tuple]:
        block_r = max(1, min(next_pow2(part_rows), reduce_tile // reduce_c))
        return block_r, reduce_c, max(1, min(cdiv(pb.c, reduce_c), cores)), ()

    # Whole groups budget the whole UB, the streaming kernels half: bishengir's UB plan (multi-buffering
    # included) fits whole-group tiles twice the half budget's, and takes 44-84 bytes per partials element.
    if whole_fits(pb, prev_pow2(max(1, ub_bytes // npu_whole_bytes(pb.itemsize, compute, pb.backward, pb.activation)))):
        return whole(pb, cores, (), reduce(pb.n))
    tile = npu_tile(npu_split_bytes(pb.itemsize, compute, pb.backward, pb.activation), ub_bytes)
    block_c, block_hw, chunk = split_geometry(pb, tile, tile, cores)
    return split(pb, block_c, block_hw, chunk, cores, merge_block, False, reduce(pb.n * cdiv(pb.hw, chunk)))
