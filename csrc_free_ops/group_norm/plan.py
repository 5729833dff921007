"""How a GroupNorm launch splits its work; plain Python, shared by both backends.

x is viewed as (N, C, HW) with HW the product of the spatial sizes.  A work
item is a tile of ``block_c`` channels of one sample over one *segment* of
the spatial axis: ``chunk`` positions, a multiple of ``block_hw``.  Each item
walks its segment in [block_c, block_hw] tiles.  When N * ceil(C / block_c)
items cannot keep ``target_items`` programs busy, the spatial axis is cut into
``splits`` segments, so a group's statistics are reduced by several programs:
each writes per-(sample, channel, segment) partials, laid out as
(N, splits, C), and a finalize kernel per (sample, group) combines them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import triton


@dataclass(frozen=True)
class Plan:
    n: int
    c: int
    hw: int
    groups: int
    block_c: int
    block_hw: int
    splits: int
    chunk: int

    @property
    def channels_per_group(self) -> int:
        return self.c // self.groups

    @property
    def c_blocks(self) -> int:
        return triton.cdiv(self.c, self.block_c)

    @property
    def items(self) -> int:
        return self.n * self.c_blocks * self.splits

    @property
    def rows(self) -> int:
        """(sample, group) pairs."""
        return self.n * self.groups

    @property
    def segments(self) -> int:
        """Partials: one per (sample, channel, segment)."""
        return self.n * self.c * self.splits

    @property
    def part_rows(self) -> int:
        """Rows of the (N * splits, C) partial matrix."""
        return self.n * self.splits

    @property
    def segments_per_group(self) -> int:
        return self.channels_per_group * self.splits


def spatial_size(x_shape: tuple[int, ...]) -> int:
    return math.prod(x_shape[2:])


def make_plan(x_shape: tuple[int, ...], groups: int, *, tile: int, max_block_hw: int, target_items: int) -> Plan:
    """tile: elements of one [block_c, block_hw] tile (a power of two).
    max_block_hw: the widest spatial block.  target_items: the number of
    work items that fills the device."""
    n, c, hw = x_shape[0], x_shape[1], spatial_size(x_shape)
    block_hw = min(triton.next_power_of_2(hw), max_block_hw, tile)
    block_c = min(triton.next_power_of_2(c), max(1, tile // block_hw))
    hw_blocks = triton.cdiv(hw, block_hw)
    base_items = n * triton.cdiv(c, block_c)
    splits = max(1, min(hw_blocks, triton.cdiv(target_items, base_items)))
    chunk = triton.cdiv(hw_blocks, splits) * block_hw
    return Plan(n, c, hw, groups, block_c, block_hw, triton.cdiv(hw, chunk), chunk)
