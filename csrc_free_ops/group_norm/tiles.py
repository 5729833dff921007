"""The shapes of group_norm's tiles: how a [channels, positions] tile sits in
a group for each path, and how many programs a one-pass team takes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from csrc_free_ops.host_math import cdiv, next_pow2

if TYPE_CHECKING:
    from csrc_free_ops.group_norm.plan import Problem


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


def split_geometry(pb: Problem, tile: int, max_block_hw: int, target_items: int) -> tuple[int, int, int]:
    """(block_c, block_hw, chunk) of split items: [block_c, block_hw] tiles
    of at most ``tile`` elements within a group, and the spatial axis cut
    into segments until there are about ``target_items`` items."""
    block_c, block_hw = tile_shape(pb, tile, max_block_hw)
    hw_blocks = cdiv(pb.hw, block_hw)
    base_items = pb.rows * cdiv(pb.cpg, block_c)
    splits = max(1, min(hw_blocks, cdiv(target_items, base_items)))
    return block_c, block_hw, cdiv(hw_blocks, splits) * block_hw


def one_pass_geometry(pb: Problem, tile: int) -> tuple[int, int]:
    """(block_c, block_hw) of a one-pass member's tile of at most ``tile``
    elements: whole spatial rows where they fit, else segments; channel
    blocks divide the group's channels (a masked tile costs about twice the
    registers: residency.ONE_PASS_MASKED_REGS)."""
    block_hw = min(next_pow2(pb.hw), tile)
    block_c = min(pb.cpg & -pb.cpg, tile // block_hw)  # the largest power of two dividing cpg
    return block_c, block_hw


def team_size(pb: Problem, block_c: int, block_hw: int) -> int:
    return cdiv(pb.cpg, block_c) * cdiv(pb.hw, block_hw)


def nhwc_geometry(pb: Problem, tile_c: int, tile: int, target_items: int) -> tuple[int, int, int]:
    """(block_c, block_hw, chunk) of nhwc items: [block_hw, block_c] tiles
    of at most ``tile`` elements, block_c at most ``tile_c`` channels across
    groups, and the spatial axis cut into segments until there are about
    ``target_items`` items."""
    block_c = min(next_pow2(pb.c), tile_c)
    block_hw = max(1, min(next_pow2(pb.hw), tile // block_c))
    hw_blocks = cdiv(pb.hw, block_hw)
    splits = max(1, min(hw_blocks, cdiv(target_items, pb.n * cdiv(pb.c, block_c))))
    return block_c, block_hw, cdiv(hw_blocks, splits) * block_hw


def team_channels(pb: Problem, most: int) -> int:
    """block_c of an nhwc team: a power of two of at least cpg and at most
    ``most`` (or next_pow2(cpg) if that is more) channels, holding the most
    channels of whole groups per lane (the least masked lanes), the wider
    on a tie (longer runs of each pixel row per load)."""
    narrowest = next_pow2(pb.cpg)
    candidates = [narrowest]
    while candidates[-1] < min(most, next_pow2(pb.c)):
        candidates.append(candidates[-1] * 2)
    return max(candidates, key=lambda b: (min(b // pb.cpg, pb.num_groups) * pb.cpg / b, b))


def team_geometry(pb: Problem, most_c: int, tile: int) -> tuple[int, int, int]:
    """(block_c, block_hw, splits) of nhwc team members: [block_hw, block_c]
    tiles of at most ``tile`` elements (at least one position), one per
    spatial segment."""
    block_c = team_channels(pb, most_c)
    block_hw = max(1, min(next_pow2(pb.hw), tile // block_c))
    return block_c, block_hw, cdiv(pb.hw, block_hw)
