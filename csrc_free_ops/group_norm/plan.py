"""How a GroupNorm launch splits its work; plain Python, shared by both backends.

x is viewed as (N, C, HW) with HW the product of the spatial sizes.  When a
whole group fits one tile (``whole_group_plan``), one program normalizes a
(sample, group) from registers.  When there are enough groups to fill the
device (``looped_group_plan``), one program still owns a (sample, group) but
walks it in [block_c, block_hw] tiles, twice.  Otherwise a work
item is a tile of ``block_c`` channels of one sample over one *segment* of
the spatial axis: ``chunk`` positions, a multiple of ``block_hw``.  Each item
walks its segment in [block_c, block_hw] tiles.  When N * ceil(C / block_c)
items cannot keep ``target_items`` programs busy, the spatial axis is cut into
``splits`` segments, so a group's statistics are reduced by several programs:
each writes per-(sample, channel, segment) partials, laid out as
(N, splits, C), which are merged into the group's statistics either by each
program of the next pass itself (``fused``: a group has few partials next to
the elements one item streams) or by a separate finalize kernel per (sample,
group).

All of it is plain-int arithmetic (``csrc_free_ops.host_math``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from csrc_free_ops.host_math import cdiv, next_pow2

# The next pass merges a group's partials itself when every item streams at least
# this many elements per channel for each partial of the group it reads.
FUSE_MIN_CHUNK_PER_PARTIAL = 8


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
    # One program holds a whole (sample, group) in a [block_c, block_hw] tile:
    # x is read once, and no partials, merge or finalize are needed.
    whole_groups: bool = False
    # One program walks a whole (sample, group) in [block_c, block_hw] tiles.
    looped_groups: bool = False

    @property
    def per_group(self) -> bool:
        """Whether one program owns each (sample, group) (whole or looped)."""
        return self.whole_groups or self.looped_groups

    @property
    def channels_per_group(self) -> int:
        return self.c // self.groups

    @property
    def c_blocks(self) -> int:
        return cdiv(self.c, self.block_c)

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

    @property
    def fused(self) -> bool:
        """Whether the pass after the partials merges each group's partials
        itself (no finalize launch): each item re-reads its channels' group
        partials, which is cheap only while they are few next to its chunk."""
        return self.segments_per_group * FUSE_MIN_CHUNK_PER_PARTIAL <= self.chunk


def spatial_size(x_shape: tuple[int, ...]) -> int:
    return math.prod(x_shape[2:])


def whole_group_plan(n: int, c: int, hw: int, groups: int, max_tile: int) -> Plan | None:
    """The whole-group plan when one group's [channels, spatial] tile, padded
    to powers of two, has at most max_tile elements; else None."""
    block_c, block_hw = next_pow2(c // groups), next_pow2(hw)
    if block_c * block_hw > max_tile:
        return None
    return Plan(n, c, hw, groups, block_c, block_hw, 1, hw, whole_groups=True)


def looped_group_plan(n: int, c: int, hw: int, groups: int, tile: int) -> Plan:
    """One program per (sample, group), walking it in tiles of at most tile
    elements: spatial positions first, then channels."""
    block_hw = min(next_pow2(hw), tile)
    block_c = min(next_pow2(c // groups), max(1, tile // block_hw))
    return Plan(n, c, hw, groups, block_c, block_hw, 1, hw, looped_groups=True)


def make_plan(x_shape: tuple[int, ...], groups: int, *, tile: int, max_block_hw: int, target_items: int) -> Plan:
    """tile: elements of one [block_c, block_hw] tile (a power of two).
    max_block_hw: the widest spatial block.  target_items: the number of
    work items that fills the device."""
    n, c, hw = x_shape[0], x_shape[1], spatial_size(x_shape)
    block_hw = min(next_pow2(hw), max_block_hw, tile)
    block_c = min(next_pow2(c), max(1, tile // block_hw))
    hw_blocks = cdiv(hw, block_hw)
    base_items = n * cdiv(c, block_c)
    splits = max(1, min(hw_blocks, cdiv(target_items, base_items)))
    chunk = cdiv(hw_blocks, splits) * block_hw
    return Plan(n, c, hw, groups, block_c, block_hw, cdiv(hw, chunk), chunk)
