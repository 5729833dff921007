"""How a GroupNorm launch runs: one ``Plan`` type -- which kernels run in
which order, each one's grid, constexprs and launch options, and the
workspace rows -- and the planning functions ``cuda`` and ``npu``, pure
functions of the problem's sizes and the device's facts.

x is viewed as (N, C, HW), HW the product of the spatial sizes; a (sample,
group) is a *row* of cpg = C // num_groups channels x HW positions.  Paths
(kernels.py has the kernels):

* whole: a group whose padded [channels, spatial] tile fits one program is
  normalized from registers, one program per row (one launch forward, one
  plus the dweight / dbias reduce backward; a backward of at most
  ``WHOLE_ONE_PROGRAM_ELEMENTS`` runs as one program that writes dweight and
  dbias itself: one launch, no workspace);
* one-pass (CUDA only): a team of programs holds each group, one tile each,
  exchanging per-channel partials through the workspace across a barrier,
  so x (and dy) are read once (one launch, plus the reduce backward);
* looped: one program per row walks it twice (statistics, then output out
  of L2);
* split: work items are (row, channel block, spatial segment of ``chunk``
  positions); a partials launch, an optional finalize launch, then apply /
  dx, which merges its group's partials itself when they are few
  (``FUSE_MIN_CHUNK_PER_PARTIAL``).

* nhwc (CUDA, channels-last x): split's three launches over items that
  span groups, [positions, channels] tiles reading whole pixel rows.
* nhwc_team / nhwc_one_pass (CUDA, channels-last x; built, tested, not yet
  planned: NHWC_TEAM_MERGE's comment): teams of whole groups per (sample,
  channel block), their members the spatial segments; partials then apply
  / dx over launches, or all of it in one cooperative launch with each
  member's tile held in registers across the team's barrier.

CUDA picks nhwc for channels-last x with narrow group runs (``nhwc_wins``),
else, in order: whole (if the group fits and there are enough rows to
fill the SMs, or no one-pass plan is possible); looped (enough rows per SM
and x under ``ONE_PASS_MIN_BYTES``: measured faster than one-pass there); one-pass
(if the device allows it -- a real GPU, contiguous x, float32 math, not a
backward with an activation -- and it needs at most ONE_PASS_MAX_ROUNDS
rounds of resident teams); split.  The NPU: whole if it fits the unified buffer, else split (its
one-pass and looped paths are not used: see docs/npu.md).

Helpers, each a module of its own: ``workspace`` (the workspace's rows),
``tiles`` (tile shapes per path), ``residency`` (what a one-pass team
needs resident, and why its barrier cannot deadlock), ``npu_budget`` (the
unified buffer's cost model).  All of it is plain-int arithmetic
(``csrc_free_ops.host_math``).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton.language as tl
from triton.runtime.jit import JITFunction

from csrc_free_ops.device import NPU_MAX_GRID
from csrc_free_ops.group_norm import kernels, nhwc_kernels, nhwc_team_kernels, npu_budget, residency, tiles
from csrc_free_ops.group_norm.residency import CudaDevice
from csrc_free_ops.group_norm.workspace import (
    BWD_PARTIALS,
    BWD_STATS,
    FWD_PARTIALS,
    FWD_STATS,
    NHWC_TEAM_BWD,
    NO_WORKSPACE,
    PARAM_TERMS,
    Workspace,
)
from csrc_free_ops.host_math import cdiv, next_pow2

# ---------------------------------------------------------------- the types


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
    path: str  # "whole", "one_pass", "looped", "split" or "nhwc"
    steps: tuple[Step, ...]  # in launch order
    chunk: int  # positions per spatial segment: the kernels' `chunk` argument
    workspace: Workspace  # its rows
    workspace_size: int  # elements of the workspace (compute dtype; 0: none)
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


# ---------------------------------------------------------------- tuning
# Each constant is measured by ``python -m bench.lab.probe_group_norm`` on the GPU
# (bench/lab/NOTES.md holds the figures behind the current values).

# Largest padded group one program holds whole: the backward keeps about
# twice the forward's arrays.
FWD_GROUP_TILE, BWD_GROUP_TILE = 8192, 4096
# Whole groups: one warp per this many padded elements (near the best warp count at 256..8192).
WHOLE_GROUP_ELEMENTS_PER_WARP = 4096
# Whole groups give way to one-pass teams below this many rows per SM, where
# one program per row leaves SMs idle, once x holds SPLIT_MIN_BYTES (smaller
# calls are launch-bound either way).
WHOLE_MIN_ROWS_PER_SM = 1.0
SPLIT_MIN_BYTES = 2 * 2**20
MAX_WARPS = 8
MAX_GRID = 2**31 - 1

# One-pass: tile elements per member (largest first; a smaller tile when the
# larger would give the whole problem fewer than ONE_PASS_FILL members per
# SM) and warps.  The planner prefers PREFETCH where the estimated resident
# teams leave a team several rows, and gives up for a two-walk plan beyond
# ONE_PASS_MAX_ROUNDS rounds.
ONE_PASS_TILES = {False: (8192, 4096, 2048, 1024), True: (4096, 2048, 1024)}
ONE_PASS_WARPS = {False: 4, True: 4}
ONE_PASS_FILL = 4
ONE_PASS_MAX_ROUNDS = 32
ONE_PASS_PREFETCH = True
# Below this many bytes of x, where the looped path has enough rows it runs
# instead of one-pass: the one-pass launch's zeroed counters and cooperative
# launch cost more than its single read of x saves there.
ONE_PASS_MIN_BYTES = 16 * 2**20
# A whole-path backward of at most this many elements runs as one program (rms_norm's bound): on inputs
# this small the host's second launch and workspace cost more than the parallelism saves.
WHOLE_ONE_PROGRAM_ELEMENTS = 16 * 1024
# Looped groups need enough rows per SM to beat split.
FWD_LOOP_ROWS_PER_SM, BWD_LOOP_ROWS_PER_SM = 0.36, 0.85
FWD_LOOP_TILE = {2: 8192, 4: 16384, 8: 8192}
BWD_LOOP_TILE = {2: 4096, 4: 4096, 8: 2048}
FWD_LOOP_WARPS, BWD_LOOP_WARPS = 8, 4
FWD_LOOP_STAGES, BWD_LOOP_STAGES = 1, 3
# The looped forward keeps x in L2 between its walks while the groups in
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

# NHWC (channels-last x read by whole pixel rows, nhwc_kernels.py): taken
# for channels-last x whose group's run of a pixel row is under
# NHWC_MAX_GROUP_ROW_BYTES (a group's tile would read a sliver of each row)
# once x holds NHWC_MIN_BYTES (below, one whole-group launch beats three).
# Tiles hold at most NHWC_TILE_C channels and NHWC_TILE[backward] elements;
# items are aimed at NHWC_ITEMS_PER_SM[backward] per SM.  Each is read off
# ``python -m bench.lab.probe_group_norm_nhwc`` (its table's last lines say how).
NHWC_MAX_GROUP_ROW_BYTES = 256
NHWC_MIN_BYTES = 2**20
NHWC_TILE_C = 64
NHWC_TILE = {False: 2048, True: 1024}
NHWC_ITEMS_PER_SM = {False: 2, True: 4}
# nhwc team paths (nhwc_team_kernels.py): the most elements of a team's [groups, segments] merge step.
# Candidates of ``python -m bench.lab.probe_group_norm_nhwc``, not yet planned: plan.cuda takes them
# once that probe has measured them against nhwc at the diffusion shapes.
NHWC_TEAM_MERGE = 256
# Register cap of the one-pass backward with an activation: uncapped, its sm_90 compile at (16, 1280, 16, 16)
# took 128 registers and 8 bytes of stack (the CUDA compile check); capped at this, 136 and none, at every
# diffusion shape.
NHWC_ONE_PASS_ACTIVATION_BWD_MAXNREG = 136

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


def _reduce_step(pb: Problem, workspace: Workspace, part_rows: int, block_r: int, block_c: int, grid: int,
                 options: tuple) -> Step:  # fmt: skip
    """dweight / dbias from the workspace's dweight and sum_dy rows (unused names are 0)."""
    dweight = workspace.segment.index("dweight") if "dweight" in workspace.segment else 0
    return Step(
        kernels.reduce_param_grads_kernel, grid,
        (("HAS_W", pb.has_weight), ("HAS_B", pb.has_bias), ("DWEIGHT_ROW", dweight),
         ("DBIAS_ROW", workspace.segment.index("sum_dy")), ("BLOCK_R", block_r), ("BLOCK_C", block_c)),
        options,
    )  # fmt: skip


def _plan(pb: Problem, path: str, steps: list[Step], chunk: int, workspace: Workspace, **extra) -> Plan:
    splits = cdiv(pb.hw, chunk)
    size = workspace.elements(pb.n * splits * pb.c, pb.rows)
    return Plan(path, tuple(steps), chunk, workspace, size, **extra, channels_last=pb.channels_last)


def whole(pb: Problem, grid_cap: int, options: tuple, reduce: tuple[int, int, int, tuple]) -> Plan:
    """One program per row over a padded [cpg, hw] tile.  reduce: the
    (block_r, block_c, grid, options) of the dweight / dbias reduce."""
    block = (("BLOCK_C", next_pow2(pb.cpg)), ("BLOCK_HW", next_pow2(pb.hw)))
    grid = max(1, min(pb.rows, grid_cap))
    if not pb.backward:
        return _plan(pb, "whole", [Step(kernels.fwd_whole_kernel, grid, _flags(pb) + block + _common(pb), options)],
                     pb.hw, NO_WORKSPACE)  # fmt: skip
    if pb.n * pb.c * pb.hw <= WHOLE_ONE_PROGRAM_ELEMENTS:
        flags = _flags(pb) + (("PARAM_GRADS", False), ("DWEIGHT_ROW", 0), ("DBIAS_ROW", 0), ("DIRECT_GRADS", True))
        step = Step(kernels.bwd_whole_kernel, 1, flags + block + _common(pb), options)
        return _plan(pb, "whole", [step], pb.hw, NO_WORKSPACE)
    block += (("DIRECT_GRADS", False),)
    return _per_group_backward(pb, "whole", kernels.bwd_whole_kernel, grid, block, options, reduce)


def _per_group_backward(pb: Problem, path: str, kernel: JITFunction, grid: int, constexprs: tuple, options: tuple,
                        reduce: tuple[int, int, int, tuple]) -> Plan:  # fmt: skip
    param_grads = pb.has_weight or pb.has_bias
    workspace = PARAM_TERMS if param_grads else NO_WORKSPACE
    flags = _flags(pb) + (("PARAM_GRADS", param_grads),) + PARAM_TERMS.rows("dweight")
    flags += (("DBIAS_ROW", PARAM_TERMS.segment.index("sum_dy")),)
    steps = [Step(kernel, grid, flags + constexprs + _common(pb), options)]
    if param_grads:
        block_r, block_c, reduce_grid, reduce_options = reduce
        steps.append(_reduce_step(pb, PARAM_TERMS, pb.n, block_r, block_c, reduce_grid, reduce_options))
    return _plan(pb, path, steps, pb.hw, workspace)


def looped(pb: Problem, tile: int, grid: int, warps: int | None, stages: int | None, evict: tuple[str, str],
           reduce: tuple[int, int, int, tuple]) -> Plan:  # fmt: skip
    """One program per row walking it in tiles of at most ``tile`` elements.
    evict: the forward's (STATS_EVICT, OUTPUT_EVICT)."""
    block_c, block_hw = tiles.tile_shape(pb, tile, tile)
    block = (("BLOCK_C", block_c), ("BLOCK_HW", block_hw), ("LOOP_STAGES", stages))
    options = () if warps is None else (("num_warps", warps),)
    if not pb.backward:
        evicts = (("STATS_EVICT", evict[0]), ("OUTPUT_EVICT", evict[1]))
        step = Step(kernels.fwd_looped_kernel, grid, _flags(pb) + block + evicts + _common(pb), options)
        return _plan(pb, "looped", [step], pb.hw, NO_WORKSPACE)
    return _per_group_backward(pb, "looped", kernels.bwd_looped_kernel, grid, block, options, reduce)


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
    workspace = base if fused and not stats_first else Workspace(base.segment, BWD_STATS if pb.backward else FWD_STATS)
    block = (("BLOCK_C", block_c), ("BLOCK_HW", block_hw))
    merge = min(next_pow2(parts_per_group), merge_block)
    block_p = (("BLOCK_P", merge),)
    tile_options = _warps(block_c * block_hw) if warps else ()
    merge_options = _warps(merge) if warps else ()
    stats = (("STATS_ROW", len(workspace.segment)),)
    grid = max(1, min(items, grid_cap))
    partial_rows = workspace.rows("mean", "m2") + (workspace.rows("sum_dy", "sum_dy_d") if pb.backward else ())
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
    dweight = workspace.rows("dweight") if pb.backward else ()
    steps.append(Step(main, grid, (("FUSED", fused),) + _flags(pb) + partial_rows + dweight + stats + block
                      + block_p + _common(pb), tile_options))  # fmt: skip
    if pb.backward and (pb.has_weight or pb.has_bias):
        block_r, block_rc, reduce_grid, reduce_options = reduce
        steps.append(_reduce_step(pb, workspace, pb.n * splits, block_r, block_rc, reduce_grid, reduce_options))
    return _plan(pb, "split", steps, chunk, workspace)


def nhwc(pb: Problem, block_c: int, block_hw: int, chunk: int, grid_cap: int, merge_block: int, warps: bool,
         reduce: tuple[int, int, int, tuple]) -> Plan:  # fmt: skip
    """Channels-last x by whole pixel rows: partials, finalize, apply / dx
    [, reduce] over items of [block_hw, block_c] tiles (nhwc_kernels.py).
    A backward with an activation first runs the partials and finalize for
    the statistics alone, as split does."""
    if not pb.channels_last:
        raise ValueError("group_norm: nhwc plans read channels-last x only; plan contiguous x another path")
    splits = cdiv(pb.hw, chunk)
    items = pb.n * cdiv(pb.c, block_c) * splits
    base = BWD_PARTIALS if pb.backward else FWD_PARTIALS
    workspace = Workspace(base.segment, BWD_STATS if pb.backward else FWD_STATS)
    block = (("BLOCK_C", block_c), ("BLOCK_HW", block_hw))
    merge = min(next_pow2(pb.cpg * splits), merge_block)
    block_p = (("BLOCK_P", merge),)
    tile_options = _warps(block_c * block_hw) if warps else ()
    merge_options = _warps(merge) if warps else ()
    stats = (("STATS_ROW", len(workspace.segment)),)
    grid = max(1, min(items, grid_cap))
    finalize_grid = max(1, min(pb.rows, grid_cap))
    partial_rows = workspace.rows("mean", "m2") + (workspace.rows("sum_dy", "sum_dy_d") if pb.backward else ())
    if not pb.backward:
        steps = [
            Step(nhwc_kernels.nhwc_fwd_partials_kernel, grid, partial_rows + block + _common(pb), tile_options),
            Step(kernels.fwd_finalize_kernel, finalize_grid, partial_rows + stats + block_p + _common(pb),
                 merge_options),
            Step(nhwc_kernels.nhwc_fwd_apply_kernel, grid, _flags(pb) + stats + block + _common(pb), tile_options),
        ]  # fmt: skip
        return _plan(pb, "nhwc", steps, chunk, workspace)
    steps = []
    for has_dy in (False, True) if pb.activation != "none" else (True,):
        steps.append(Step(nhwc_kernels.nhwc_bwd_partials_kernel, grid, _flags(pb) + (("HAS_DY", has_dy),)
                          + partial_rows + stats + block + _common(pb), tile_options))  # fmt: skip
        steps.append(Step(kernels.bwd_finalize_kernel, finalize_grid, (("HAS_W", pb.has_weight), ("HAS_DY", has_dy))
                          + partial_rows + stats + block_p + _common(pb), merge_options))  # fmt: skip
    rows = workspace.rows("mean", "sum_dy", "sum_dy_d", "dweight")
    steps.append(Step(nhwc_kernels.nhwc_bwd_dx_kernel, grid, _flags(pb) + rows + stats + block + _common(pb),
                      tile_options))  # fmt: skip
    if pb.has_weight or pb.has_bias:
        block_r, block_rc, reduce_grid, reduce_options = reduce
        steps.append(_reduce_step(pb, workspace, pb.n * splits, block_r, block_rc, reduce_grid, reduce_options))
    return _plan(pb, "nhwc", steps, chunk, workspace)


def _team_blocks(pb: Problem, block_c: int, block_hw: int) -> tuple[tuple[str, object], ...]:
    """The constexprs of nhwc team tiles; ValueError where the problem has no such plan."""
    if not pb.channels_last:
        raise ValueError("group_norm: nhwc team plans read channels-last x only; plan contiguous x another path")
    if block_c < pb.cpg or block_c & (block_c - 1):
        raise ValueError(f"group_norm: nhwc team tiles hold whole groups: block_c {block_c} for {pb.cpg} channels")
    if pb.c * pb.hw >= 2**31:
        raise ValueError("group_norm: nhwc team tiles address a sample with int32 offsets; it has 2**31 elements")
    block_g = next_pow2(block_c // pb.cpg)
    block_s = max(1, min(next_pow2(cdiv(pb.hw, block_hw)), NHWC_TEAM_MERGE // block_g))
    return (("BLOCK_C", block_c), ("BLOCK_HW", block_hw), ("BLOCK_G", block_g), ("BLOCK_S", block_s))


def team_rows(pb: Problem, block_c: int) -> int:
    """The teams of an nhwc team plan: (sample, channel block of whole groups)."""
    return pb.n * cdiv(pb.num_groups, block_c // pb.cpg)


def nhwc_team(pb: Problem, block_c: int, block_hw: int, grid_cap: int, warps: bool,
              reduce: tuple[int, int, int, tuple]) -> Plan:  # fmt: skip
    """Channels-last x by teams of whole groups over launches
    (nhwc_team_kernels.py): partials, then apply / dx merging them
    [, reduce]; a backward with an activation first runs the partials for
    the statistics alone."""
    block = _team_blocks(pb, block_c, block_hw)
    splits = cdiv(pb.hw, block_hw)
    grid = max(1, min(team_rows(pb, block_c) * splits, grid_cap))
    options = _warps(block_c * block_hw) if warps else ()
    if not pb.backward:
        stats = FWD_PARTIALS.rows("mean", "m2")
        steps = [
            Step(nhwc_team_kernels.nhwc_fwd_team_partials_kernel, grid, stats + block[:3] + _common(pb), options),
            Step(nhwc_team_kernels.nhwc_fwd_team_apply_kernel, grid, _flags(pb) + stats + block + _common(pb), options),
        ]  # fmt: skip
        return _plan(pb, "nhwc_team", steps, block_hw, FWD_PARTIALS)
    sums = NHWC_TEAM_BWD.rows("mean", "m2", "sum_g", "sum_gd")
    steps = [
        Step(nhwc_team_kernels.nhwc_bwd_team_partials_kernel, grid,
             _flags(pb) + (("HAS_DY", has_dy),) + sums + block + _common(pb), options)
        for has_dy in ((False, True) if pb.activation != "none" else (True,))
    ]  # fmt: skip
    terms = NHWC_TEAM_BWD.rows("dweight", "sum_dy")
    steps.append(Step(nhwc_team_kernels.nhwc_bwd_team_dx_kernel, grid, _flags(pb) + sums + terms + block + _common(pb),
                      options))  # fmt: skip
    if pb.has_weight or pb.has_bias:
        steps.append(_reduce_step(pb, NHWC_TEAM_BWD, pb.n * splits, *reduce))
    return _plan(pb, "nhwc_team", steps, block_hw, NHWC_TEAM_BWD)


def _one_pass_math(pb: Problem, path: str) -> None:
    """The one-pass kernels compute in float32 and take eps as Triton types a
    Python float, fp32 (kernels.py says why): a float64 result would carry
    float32 eps, so float64 data gets another path."""
    if pb.compute != tl.float32:
        raise ValueError(f"group_norm: {path} plans compute in float32; plan float64 x another path")


def nhwc_one_pass(pb: Problem, block_c: int, block_hw: int, teams: int, warps: int | None, max_rounds: int,
                  fallback: Plan | None, reduce: tuple[int, int, int, tuple],
                  maxnreg: int | None = None) -> Plan:  # fmt: skip
    """nhwc_team's work in one launch: a team of cdiv(hw, block_hw) members
    per (sample, channel block), ``teams`` teams (at least one, at most one
    per team row), each member holding its tile across the team's barrier.
    warps / maxnreg None: no such launch option."""
    _one_pass_math(pb, "nhwc_one_pass")
    block = _team_blocks(pb, block_c, block_hw)
    splits = cdiv(pb.hw, block_hw)
    rows = team_rows(pb, block_c)
    teams = max(1, min(rows, teams))
    workspace = NHWC_TEAM_BWD if pb.backward else FWD_PARTIALS
    options = (("launch_cooperative_grid", True),) + ((("num_warps", warps),) if warps is not None else ())
    options += (("maxnreg", maxnreg),) if maxnreg is not None else ()
    kernel = nhwc_team_kernels.nhwc_bwd_one_pass_kernel if pb.backward else nhwc_team_kernels.nhwc_fwd_one_pass_kernel
    all_rows = workspace.rows(*workspace.segment)  # the kernel takes every row of its workspace
    steps = [Step(kernel, teams * splits, _flags(pb) + all_rows + block + _common(pb), options)]
    if pb.backward and (pb.has_weight or pb.has_bias):
        steps.append(_reduce_step(pb, workspace, pb.n * splits, *reduce))
    return _plan(pb, "nhwc_one_pass", steps, block_hw, workspace, counters=rows, team_size=splits,
                 max_rounds=max_rounds, fallback=fallback)  # fmt: skip


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
    _one_pass_math(pb, "one_pass")
    size = tiles.team_size(pb, block_c, block_hw)
    teams = max(1, min(pb.rows, teams))
    splits = cdiv(pb.hw, block_hw)
    workspace = BWD_PARTIALS if pb.backward else FWD_PARTIALS
    rows = workspace.rows("mean", "m2")
    if pb.backward:
        rows += workspace.rows("sum_dy", "sum_dy_d", "dweight")
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
        steps.append(_reduce_step(pb, workspace, pb.n * splits, block_r, block_rc, reduce_grid, reduce_options))
    return _plan(pb, "one_pass", steps, block_hw, workspace, counters=pb.rows, team_size=size, max_rounds=max_rounds,
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
    block_c, block_hw, chunk = tiles.split_geometry(pb, tile, MAX_BLOCK_HW, sms * ITEMS_PER_SM)
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
    block_c, block_hw = tiles.one_pass_geometry(pb, tile)
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
        # Not planned: sm_90 compiles of bwd_one_pass_kernel with an activation spill (a loop-invariant
        # scalar across its row loop, 8 bytes of stack, the CUDA compile check), and with PREFETCH the
        # tiles too.  The kernel is correct (the CPU tests run it); the two-walk plan runs instead.
        return None
    warps = ONE_PASS_WARPS[pb.backward]
    candidates = ONE_PASS_TILES[pb.backward]
    for tile in candidates:
        block_c, block_hw = tiles.one_pass_geometry(pb, tile)
        size = tiles.team_size(pb, block_c, block_hw)
        if pb.rows * size < ONE_PASS_FILL * dev.sms and tile != candidates[-1]:
            continue  # a smaller tile spreads the groups over more SMs
        even = pb.cpg % block_c == 0 and pb.hw % block_hw == 0
        for prefetch in (True, False) if ONE_PASS_PREFETCH else (False,):
            regs = residency.estimated_registers(pb, block_c * block_hw, warps, prefetch, even)
            teams = residency.resident_teams(dev, warps, regs, residency.ONE_PASS_SHARED_ESTIMATE, size, pb.rows)
            if teams == 0 or (prefetch and teams == pb.rows) or cdiv(pb.rows, teams) > ONE_PASS_MAX_ROUNDS:
                continue  # no team fits, nothing to prefetch, or too many rounds
            return cuda_one_pass(pb, dev.sms, tile, warps, prefetch, fallback)
    return None


def cuda_nhwc(pb: Problem, sms: int, tile_c: int = NHWC_TILE_C, tile: int | None = None,
              items_per_sm: int | None = None) -> Plan:  # fmt: skip
    """The nhwc plan with tiles of at most ``tile`` elements (NHWC_TILE;
    float64 accumulators: half) and ``tile_c`` channels."""
    if tile is None:
        tile = NHWC_TILE[pb.backward] // (2 if pb.itemsize == 8 else 1)
    if items_per_sm is None:
        items_per_sm = NHWC_ITEMS_PER_SM[pb.backward]
    block_c, block_hw, chunk = tiles.nhwc_geometry(pb, tile_c, tile, sms * items_per_sm)
    reduce = _cuda_reduce(pb, pb.n * cdiv(pb.hw, chunk), sms)
    return nhwc(pb, block_c, block_hw, chunk, sms * PROGRAMS_PER_SM, MERGE_BLOCK, True, reduce)


def cuda_nhwc_team(pb: Problem, sms: int, tile_c: int = NHWC_TILE_C, tile: int | None = None) -> Plan | None:
    """The nhwc_team plan with tiles of at most ``tile`` elements (NHWC_TILE) and about ``tile_c``
    channels, or None for a sample of 2**31 elements."""
    if pb.c * pb.hw >= 2**31:
        return None
    block_c, block_hw, splits = tiles.team_geometry(pb, tile_c, NHWC_TILE[pb.backward] if tile is None else tile)
    return nhwc_team(pb, block_c, block_hw, sms * PROGRAMS_PER_SM, True, _cuda_reduce(pb, pb.n * splits, sms))


def cuda_nhwc_one_pass(pb: Problem, dev: CudaDevice, fallback: Plan, tile_c: int = NHWC_TILE_C,
                       tile: int | None = None, warps: int | None = None) -> Plan | None:  # fmt: skip
    """The nhwc_one_pass plan, if the device allows it (as ``_cuda_one_pass``: a real GPU, float32
    math) and by the estimated registers its rounds of resident teams are at most
    ONE_PASS_MAX_ROUNDS; ``fallback`` runs where the compiled kernel's are not."""
    if not dev.cooperative or pb.compute != tl.float32 or pb.c * pb.hw >= 2**31:
        return None
    tile = NHWC_TILE[pb.backward] if tile is None else tile
    warps = ONE_PASS_WARPS[pb.backward] if warps is None else warps
    maxnreg = NHWC_ONE_PASS_ACTIVATION_BWD_MAXNREG if pb.backward and pb.activation != "none" else None
    block_c, block_hw, splits = tiles.team_geometry(pb, tile_c, tile)
    regs = residency.estimated_registers(pb, block_c * block_hw, warps, False, False)
    rows = team_rows(pb, block_c)
    teams = residency.resident_teams(dev, warps, regs, residency.ONE_PASS_SHARED_ESTIMATE, splits, rows)
    if teams == 0 or cdiv(rows, teams) > ONE_PASS_MAX_ROUNDS:
        return None
    reduce = _cuda_reduce(pb, pb.n * splits, dev.sms)
    return nhwc_one_pass(pb, block_c, block_hw, rows, warps, ONE_PASS_MAX_ROUNDS, fallback, reduce, maxnreg)


def nhwc_wins(pb: Problem) -> bool:
    """Channels-last x with narrow group runs per pixel row, large enough (NHWC_* above)."""
    narrow = pb.cpg * pb.itemsize < NHWC_MAX_GROUP_ROW_BYTES
    return pb.channels_last and narrow and pb.n * pb.c * pb.hw * pb.itemsize >= NHWC_MIN_BYTES


def cuda(pb: Problem, dev: CudaDevice) -> Plan:
    if nhwc_wins(pb):
        return cuda_nhwc(pb, dev.sms)
    if tiles.whole_fits(pb, BWD_GROUP_TILE if pb.backward else FWD_GROUP_TILE):
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


def npu(pb: Problem, ub_bytes: int, vector_cores: int) -> Plan:
    """Whole groups where the padded group fits the UB budget, else split
    with the grid at most the vector cores (no launch options: triton-ascend
    has no num_warps / num_stages).  float64 never gets here: triton-ascend
    compiles none, so launch.npu_* run the reference for it."""
    compute = 8 if pb.itemsize == 8 else 4
    cores = max(1, min(vector_cores, NPU_MAX_GRID))
    merge_block = npu_budget.npu_tile(7 * compute, ub_bytes)
    reduce_tile = npu_budget.npu_tile(4 * compute, ub_bytes)
    reduce_c = min(next_pow2(pb.c), NPU_REDUCE_BLOCK_C, reduce_tile)

    def reduce(part_rows: int) -> tuple[int, int, int, tuple]:
        block_r = max(1, min(next_pow2(part_rows), reduce_tile // reduce_c))
        return block_r, reduce_c, max(1, min(cdiv(pb.c, reduce_c), cores)), ()

    if tiles.whole_fits(pb, npu_budget.npu_whole_tile(pb.itemsize, compute, pb.backward, pb.activation, ub_bytes)):
        return whole(pb, cores, (), reduce(pb.n))
    tile = npu_budget.npu_tile(npu_budget.npu_split_bytes(pb.itemsize, compute, pb.backward, pb.activation), ub_bytes)
    block_c, block_hw, chunk = tiles.split_geometry(pb, tile, tile, cores)
    return split(pb, block_c, block_hw, chunk, cores, merge_block, False, reduce(pb.n * cdiv(pb.hw, chunk)))
