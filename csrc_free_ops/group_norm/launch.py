"""The launch sequence of GroupNorm, shared by the CUDA and NPU launchers.

Both backends run the same kernels (``kernels.py``) in the same order and
differ only in launch policy: tile sizes, how many work items fill the
device, the grid cap and per-launch options.  A ``Policy`` carries those.

x and grad_out are made contiguous and viewed as (N, C, HW); outputs are
contiguous with x's shape.

The op is host-bound on typical shapes, so a call does as little Python as
it can: everything that depends only on (policy, shape, groups, dtype size,
which parameters are given) -- the plan, the grids and the kernel launchers
(``csrc_free_ops.launcher``) -- is built once and kept in ``_STEPS`` under a key
of plain ints; a call then allocates its outputs and one float32 workspace
and launches.  Whole- and looped-group plans take 1 launch forward and 1
backward (plus the dweight / dbias reduce); split plans 2 forward and 3 backward, plus one
finalize launch when the plan is not ``fused``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch

from csrc_free_ops.group_norm import group_kernels, kernels
from csrc_free_ops.group_norm.plan import Plan, spatial_size
from csrc_free_ops.host_math import cdiv
from csrc_free_ops.launcher import Launcher

# Partials per (N, G) row of every finalize step; (rows, channels) of a
# reduce tile.
Blocks = tuple[int, int]
# Float32 partial rows per (sample, channel, segment), and statistics per
# (sample, group) row when a finalize kernel runs.
FWD_PARTS, FWD_STATS = 2, 2
BWD_PARTS, BWD_STATS = 5, 4
# Cached step sets kept before the cache is dropped (a bound on its memory).
MAX_CACHED = 1024


class Policy(Protocol):
    # Plain, hashable description of the policy (its part of the cache key).
    key: tuple

    def plan_for(self, n: int, c: int, hw: int, groups: int, itemsize: int, backward: bool) -> Plan: ...

    def grid(self, work: int) -> int:
        """Programs for a kernel with ``work`` independent items (>= 1)."""
        ...

    def options(self, elements: int) -> dict:
        """Extra launch options for a kernel whose tile has ``elements``."""
        ...

    def finalize_block(self, seg_per_group: int, block_c: int = 1) -> int:
        """Partials per step of a group merge over a [block_c, partials] tile."""
        ...

    def reduce_blocks(self, part_rows: int, c: int) -> Blocks: ...

    def whole_group_launch(self, rows: int, elements: int) -> tuple[int, dict]:
        """Grid and launch options of a whole-group kernel over ``rows``
        (sample, group) rows of ``elements`` padded elements each."""
        ...

    def loop_options(self, backward: bool, rows: int, group_elements: int, itemsize: int) -> dict:
        """Constexprs and launch options of a looped-group kernel over ``rows``
        (sample, group) rows of ``group_elements`` elements of ``itemsize``
        bytes: at least LOOP_STAGES, the software-pipelining depth of its
        tile loops (None: the compiler's default), and forward STATS_EVICT and
        OUTPUT_EVICT, the L2 eviction policies of its two walks ("" for the
        default)."""
        ...


class _Launch(NamedTuple):
    """A kernel's launcher (constexprs and options bound) and its grid."""

    launcher: Launcher
    grid: int

    def run(self, *args: Any) -> None:
        self.launcher(self.grid, *args)


class _Steps(NamedTuple):
    plan: Plan
    workspace: int  # float32 elements of PART (+ STATS)
    stream_sizes: tuple[int, int, int, int]  # (N, C, HW, chunk): the partials kernels' size arguments
    sizes: tuple[int, int, int, int, int]  # (N, C, HW, channels per group, chunk): everyone else's
    partials: _Launch | None  # None for whole- and looped-group plans
    finalize: _Launch | None
    main: _Launch  # apply (forward) or dx (backward)
    reduce: _Launch | None  # dweight / dbias column sums (backward)


_STEPS: dict[tuple, _Steps] = {}
# (looped, backward) -> the per-group kernel.
_GROUP_KERNELS = {
    (False, False): group_kernels.fwd_group_kernel,
    (False, True): group_kernels.bwd_group_kernel,
    (True, False): group_kernels.fwd_group_loop_kernel,
    (True, True): group_kernels.bwd_group_loop_kernel,
}


def _launch(kernel, grid: int, **meta) -> _Launch:
    return _Launch(Launcher(kernel, **meta), grid)


def _split_steps(policy: Policy, p: Plan, has_w: bool, has_b: bool, backward: bool) -> tuple:
    """(partials, finalize or None, main, workspace) of a plan whose groups are split into items."""
    tile = p.block_c * p.block_hw
    blocks = {"BLOCK_C": p.block_c, "BLOCK_HW": p.block_hw}
    parts, stats = (BWD_PARTS, BWD_STATS) if backward else (FWD_PARTS, FWD_STATS)
    workspace = parts * p.segments + (0 if p.fused else stats * p.rows)
    partials = _launch(
        kernels.bwd_partials_kernel if backward else kernels.fwd_partials_kernel,
        policy.grid(p.items), **blocks, **policy.options(tile),
    )  # fmt: skip
    finalize = None
    if not p.fused:
        block_p = policy.finalize_block(p.segments_per_group)
        kernel, flags = kernels.fwd_finalize_kernel, {}
        if backward:
            kernel, flags = kernels.bwd_finalize_kernel, {"HAS_W": has_w}
        finalize = _launch(kernel, policy.grid(p.rows), **flags, BLOCK_P=block_p, **policy.options(block_p))
    block_p = policy.finalize_block(p.segments_per_group, p.block_c) if p.fused else 1
    flags = {"FUSED": p.fused, "HAS_W": has_w}
    if not backward:
        flags["HAS_B"] = has_b
    main = _launch(
        kernels.bwd_dx_kernel if backward else kernels.fwd_apply_kernel,
        policy.grid(p.items), **flags, **blocks, BLOCK_P=block_p, **policy.options(tile),
    )  # fmt: skip
    return partials, finalize, main, workspace


def _build(policy: Policy, n: int, c: int, hw: int, groups: int, itemsize: int, has_w: bool, has_b: bool,
           backward: bool) -> _Steps:  # fmt: skip
    p = policy.plan_for(n, c, hw, groups, itemsize, backward)
    if p.per_group:
        partials = finalize = None
        param_grads = backward and (has_w or has_b)
        workspace = group_kernels.GRAD_ROWS * p.segments if param_grads else 0
        flags = {"HAS_W": has_w, "PARAM_GRADS": param_grads} if backward else {"HAS_W": has_w, "HAS_B": has_b}
        if p.looped_groups:
            options = policy.loop_options(backward, p.rows, p.channels_per_group * p.hw, itemsize)
            grid = policy.grid(p.rows)
        else:
            grid, options = policy.whole_group_launch(p.rows, p.block_c * p.block_hw)
        main = _launch(
            _GROUP_KERNELS[p.looped_groups, backward], grid, **flags, BLOCK_C=p.block_c, BLOCK_HW=p.block_hw, **options
        )
    else:
        partials, finalize, main, workspace = _split_steps(policy, p, has_w, has_b, backward)
    reduce = None
    if backward and (has_w or has_b):
        block_r, block_c = policy.reduce_blocks(p.part_rows, c)
        # Per-group kernels fill a two-row workspace; the split path's dx kernel
        # and partials fill rows 4 (dweight) and 2 (dbias) of its five.
        rows = (group_kernels.GRAD_W_ROW.value, group_kernels.GRAD_B_ROW.value) if p.per_group else (4, 2)
        reduce = _launch(
            kernels.channel_reduce_kernel, policy.grid(cdiv(c, block_c)), HAS_W=has_w, HAS_B=has_b,
            W_ROW=rows[0], B_ROW=rows[1], BLOCK_R=block_r, BLOCK_C=block_c, **policy.options(block_r * block_c),
        )  # fmt: skip
    stream_sizes = (p.n, p.c, p.hw, p.chunk)
    sizes = (p.n, p.c, p.hw, p.channels_per_group, p.chunk)
    return _Steps(p, workspace, stream_sizes, sizes, partials, finalize, main, reduce)


def plan(policy: Policy, x: torch.Tensor, groups: int, backward: bool) -> Plan:
    """The plan ``policy`` makes for x (as (N, C, *spatial)) split into ``groups``."""
    return policy.plan_for(x.shape[0], x.shape[1], spatial_size(tuple(x.shape)), groups, x.element_size(), backward)


def _steps(policy: Policy, x: torch.Tensor, groups: int, has_w: bool, has_b: bool, backward: bool) -> _Steps:
    shape = x.shape
    n, c = shape[0], shape[1]
    hw = x.numel() // (n * c)
    key = (policy.key, n, c, hw, groups, x.element_size(), has_w, has_b, backward)
    steps = _STEPS.get(key)
    if steps is None:
        if len(_STEPS) >= MAX_CACHED:
            _STEPS.clear()
        steps = _STEPS[key] = _build(policy, n, c, hw, groups, x.element_size(), has_w, has_b, backward)
    return steps


def forward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    policy: Policy,
) -> torch.Tensor:
    x = _contiguous(x)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel() == 0:
        return y
    has_w, has_b = weight is not None, bias is not None
    weight = _contiguous(weight) if has_w else x
    bias = _contiguous(bias) if has_b else x
    s = _steps(policy, x, num_groups, has_w, has_b, False)
    part = _workspace(s, x)
    if s.partials is not None:
        s.partials.run(x, part, *s.stream_sizes)
    if s.finalize is not None:
        s.finalize.run(part, *s.sizes, eps)
    s.main.run(x, y, weight, bias, part, *s.sizes, eps)
    return y


def backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    policy: Policy,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight or None, dbias or None); dweight / dbias in their parameter's dtype."""
    x = _contiguous(x)
    dy = _contiguous(grad_out)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    has_w, has_b = weight is not None, bias is not None
    if x.numel() == 0:
        dweight = torch.zeros_like(weight) if has_w else None
        dbias = torch.zeros_like(bias) if has_b else None
        return dx, dweight, dbias
    c = x.shape[1]
    # Every element is written by channel_reduce_kernel, which covers all C channels.
    dweight = torch.empty(c, dtype=weight.dtype, device=x.device) if has_w else None
    dbias = torch.empty(c, dtype=bias.dtype, device=x.device) if has_b else None
    w = _contiguous(weight) if has_w else x
    s = _steps(policy, x, num_groups, has_w, has_b, True)
    part = _workspace(s, x)
    if s.partials is not None:
        s.partials.run(x, dy, part, *s.stream_sizes)
    if s.finalize is not None:
        s.finalize.run(part, w, *s.sizes, eps)
    s.main.run(x, dy, dx, w, part, *s.sizes, eps)
    if s.reduce is not None:
        s.reduce.run(part, dweight if has_w else part, dbias if has_b else part, s.plan.part_rows, c)
    return dx, dweight, dbias


def _workspace(s: _Steps, x: torch.Tensor) -> torch.Tensor:
    """The float32 workspace of these steps; x stands in for the PART argument of plans that need none."""
    return torch.empty(s.workspace, dtype=torch.float32, device=x.device) if s.workspace else x


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()
