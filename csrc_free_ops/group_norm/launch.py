"""The launch sequence of GroupNorm, shared by the CUDA and NPU launchers.

Both backends run the same kernels (``kernels.py``) in the same order and
differ only in launch policy: tile sizes, how many work items fill the
device, the grid cap and per-launch options.  A ``Policy`` carries those.

x and grad_out are made contiguous and viewed as (N, C, HW); outputs are
contiguous with x's shape.
"""

from __future__ import annotations

from typing import Protocol

import torch
import triton

from csrc_free_ops.group_norm import kernels
from csrc_free_ops.group_norm.plan import Plan

# Partials per (N, G) row of every finalize step; (rows, channels) of a
# reduce tile.
Blocks = tuple[int, int]


class Policy(Protocol):
    def plan(self, x: torch.Tensor, groups: int, backward: bool) -> Plan: ...

    def grid(self, work: int) -> int:
        """Programs for a kernel with ``work`` independent items (>= 1)."""
        ...

    def options(self, elements: int) -> dict:
        """Extra launch options for a kernel whose tile has ``elements``."""
        ...

    def finalize_block(self, seg_per_group: int) -> int: ...

    def reduce_blocks(self, part_rows: int, c: int) -> Blocks: ...


def forward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    policy: Policy,
) -> torch.Tensor:
    x, weight, bias = _contiguous(x, weight, bias)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel() == 0:
        return y
    p = policy.plan(x, num_groups, backward=False)
    part = torch.empty((2, p.segments), dtype=torch.float32, device=x.device)
    stats = torch.empty((2, p.rows), dtype=torch.float32, device=x.device)
    tile = p.block_c * p.block_hw
    kernels.fwd_partials_kernel[(policy.grid(p.items),)](
        x, part, p.c, p.hw, p.c_blocks, p.splits, p.chunk, p.items, p.segments,
        BLOCK_C=p.block_c, BLOCK_HW=p.block_hw, **policy.options(tile),
    )  # fmt: skip
    block_p = policy.finalize_block(p.segments_per_group)
    kernels.fwd_finalize_kernel[(policy.grid(p.rows),)](
        part, stats, p.rows, p.segments, p.groups, p.channels_per_group, p.c, p.splits, p.segments_per_group,
        p.hw, p.chunk, p.channels_per_group * p.hw, eps,
        BLOCK_P=block_p, **policy.options(block_p),
    )  # fmt: skip
    kernels.fwd_apply_kernel[(policy.grid(p.items),)](
        x, y, _or(weight, x), _or(bias, x), stats,
        p.c, p.hw, p.channels_per_group, p.groups, p.rows, p.c_blocks, p.splits, p.chunk, p.items,
        HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_C=p.block_c, BLOCK_HW=p.block_hw,
        **policy.options(tile),
    )  # fmt: skip
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
    x, weight, bias = _contiguous(x, weight, bias)
    dy = grad_out.contiguous()
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    c = x.shape[1]
    dweight = torch.zeros(c, dtype=weight.dtype, device=x.device) if weight is not None else None
    dbias = torch.zeros(c, dtype=bias.dtype, device=x.device) if bias is not None else None
    if x.numel() == 0:
        return dx, dweight, dbias
    p = policy.plan(x, num_groups, backward=True)
    part = torch.empty((4, p.segments), dtype=torch.float32, device=x.device)
    stats = torch.empty((4, p.rows), dtype=torch.float32, device=x.device)
    tile = p.block_c * p.block_hw
    kernels.bwd_partials_kernel[(policy.grid(p.items),)](
        x, dy, part, p.c, p.hw, p.c_blocks, p.splits, p.chunk, p.items, p.segments,
        BLOCK_C=p.block_c, BLOCK_HW=p.block_hw, **policy.options(tile),
    )  # fmt: skip
    block_p = policy.finalize_block(p.segments_per_group)
    kernels.bwd_finalize_kernel[(policy.grid(p.rows),)](
        part, _or(weight, x), stats, p.rows, p.segments, p.groups, p.channels_per_group, p.c, p.splits,
        p.segments_per_group, p.hw, p.chunk, p.channels_per_group * p.hw, eps,
        HAS_W=weight is not None, BLOCK_P=block_p, **policy.options(block_p),
    )  # fmt: skip
    kernels.bwd_dx_kernel[(policy.grid(p.items),)](
        x, dy, dx, _or(weight, x), stats,
        p.c, p.hw, p.channels_per_group, p.groups, p.rows, p.c_blocks, p.splits, p.chunk, p.items,
        HAS_W=weight is not None, BLOCK_C=p.block_c, BLOCK_HW=p.block_hw, **policy.options(tile),
    )  # fmt: skip
    if weight is not None or bias is not None:
        block_r, block_c = policy.reduce_blocks(p.part_rows, p.c)
        kernels.channel_reduce_kernel[(policy.grid(triton.cdiv(p.c, block_c)),)](
            part, _or(dweight, part), _or(dbias, part), p.part_rows, p.c, p.segments,
            HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_R=block_r, BLOCK_C=block_c,
            **policy.options(block_r * block_c),
        )  # fmt: skip
    return dx, dweight, dbias


def _or(t: torch.Tensor | None, fallback: torch.Tensor) -> torch.Tensor:
    """t, or a placeholder pointer for a kernel argument its constexpr flag leaves unused."""
    return t if t is not None else fallback


def _contiguous(*ts: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    return tuple(t.contiguous() if t is not None else None for t in ts)
