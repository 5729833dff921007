"""GroupNorm launchers for NVIDIA GPUs (also run on CPU tensors under
TRITON_INTERPRET=1).

The kernels live in ``kernels.py`` (shared with the NPU launchers) and the
launch sequence in ``launch.py``; this module is the CUDA launch policy:
a group of up to FWD/BWD_GROUP_TILE elements held whole by one program
(one program per group, a warp or a few each); else,
with at least FWD/BWD_LOOP_ROWS_PER_SM (sample, group) rows per SM, one
program per row walking it twice in tiles (the second walk hits L2); else
register-sized tiles, enough work items for a few waves per SM (a group's
statistics are split across programs when N * channel blocks falls short),
and a grid capped at a few programs per SM, walking the rest with a stride.
"""

from __future__ import annotations

import functools

import torch

from csrc_free_ops import device
from csrc_free_ops.group_norm import launch
from csrc_free_ops.group_norm.plan import Plan, looped_group_plan, make_plan, whole_group_plan
from csrc_free_ops.host_math import next_pow2

# Largest group (channels x spatial, each padded to a power of two) one program
# holds whole in registers: the backward keeps about twice the forward's arrays.
FWD_GROUP_TILE = 8192
BWD_GROUP_TILE = 4096
# Whole groups: one program per (sample, group) and one warp per this many
# padded elements.  H200, groups of 256..8192 elements (bench/NOTES.md v7):
# against 8 warps and a grid of 8 programs per SM, 1.08-1.48x faster forward
# and 1.07-1.48x backward; within 9% of the best warp count at every size.
WHOLE_GROUP_ELEMENTS_PER_WARP = 4096
# Most warps any launch of this policy uses.
MAX_WARPS = 8
# CUDA's limit on a 1-D grid.
MAX_GRID = 2**31 - 1
# Looped groups need enough (sample, group) rows per SM, or too few programs
# stream.  H200, 65536-element groups, looped / split time by rows per SM
# (bench/NOTES.md, session 4): forward 0.24 -> 1.01-1.30, 0.48 -> 0.89-0.96;
# backward 0.73 -> 0.94-1.18, 0.97 -> 0.88.  Thresholds between.  Tile elements (by
# x's element size forward), warps and software-pipelining depth of the
# walks, from sweeps on (8 or 16, 512, 64, 64) bf16 / fp32: pipelining pays
# backward (x and dy in flight), not forward.
FWD_LOOP_ROWS_PER_SM, BWD_LOOP_ROWS_PER_SM = 0.36, 0.85
FWD_LOOP_TILE = {2: 8192, 4: 16384}
BWD_LOOP_TILE = 4096
FWD_LOOP_WARPS, BWD_LOOP_WARPS = 8, 4
FWD_LOOP_STAGES, BWD_LOOP_STAGES = 1, 3
# The looped forward's first walk loads x evict_last and its second walk loads
# x and stores y evict_first, so that x stays in L2 between the walks, while
# the groups in flight hold at most FWD_L2_HINT_BYTES.  Groups in flight per
# SM by x's element size: register use caps the forward's programs at about
# two per SM with bf16 tiles, one with the float32 ones.  H200, 60 MiB of L2
# (bench/NOTES.md v8): 3-10% faster forward with 32-50 MiB in flight, 0-2%
# slower with 64 MiB and more; the backward (x and dy) gained nothing.
FWD_LOOP_GROUPS_PER_SM = {2: 2, 4: 1}
FWD_L2_HINT_BYTES = 56 * 2**20
# Elements of one [block_c, block_hw] tile: the forward keeps two float32
# accumulators per element, the backward four, so it takes half the tile.
FWD_TILE = 4096
BWD_TILE = 2048
# Widest spatial block; narrower spatial sizes pack several channels per tile.
MAX_BLOCK_HW = 1024
# Work items per SM the split aims for, and the programs per SM a launch caps at.
ITEMS_PER_SM = 4
PROGRAMS_PER_SM = 8
# Partials per step of the finalize kernels; (rows, channels) of a reduce tile.
FINALIZE_BLOCK = 1024
REDUCE_TILE = 2048
REDUCE_BLOCK_C = 128


class CudaPolicy:
    def __init__(
        self,
        dev: torch.device | None,
        tile: int | None = None,
        target_items: int | None = None,
        whole_group_tile: int | None = None,
        looped_groups: bool | None = None,
        *,
        sms: int | None = None,
    ):
        """tile / target_items / whole_group_tile / looped_groups override the
        defaults (tests use them to force each path on small shapes):
        whole_group_tile=0 turns the whole-group path off, a given tile also
        caps it and sizes the looped tiles, and looped_groups=True / False
        takes / never takes the looped path where no whole-group plan fits
        (None: when there are enough rows)."""
        self._sms = sms if sms is not None else device.num_sms(dev)
        self._tile = tile
        self._target = target_items if target_items is not None else self._sms * ITEMS_PER_SM
        self._whole = whole_group_tile
        self._looped = looped_groups
        self.key = ("cuda", self._sms, tile, self._target, whole_group_tile, looped_groups)

    def plan_for(self, n: int, c: int, hw: int, groups: int, itemsize: int, backward: bool) -> Plan:
        whole_cap = self._whole if self._whole is not None else self._tile
        if whole_cap is None:
            whole_cap = BWD_GROUP_TILE if backward else FWD_GROUP_TILE
        whole = whole_group_plan(n, c, hw, groups, whole_cap) if whole_cap else None
        if whole is not None:
            return whole
        looped = self._looped
        if looped is None:
            looped = n * groups >= self._sms * (BWD_LOOP_ROWS_PER_SM if backward else FWD_LOOP_ROWS_PER_SM)
        if looped:
            tile = BWD_LOOP_TILE if backward else FWD_LOOP_TILE.get(itemsize, FWD_LOOP_TILE[2])
            return looped_group_plan(n, c, hw, groups, self._tile or tile)
        tile = self._tile or (BWD_TILE if backward else FWD_TILE)
        return make_plan((n, c, hw), groups, tile=tile, max_block_hw=MAX_BLOCK_HW, target_items=self._target)

    def grid(self, work: int) -> int:
        return max(1, min(work, self._sms * PROGRAMS_PER_SM))

    def whole_group_launch(self, rows: int, elements: int) -> tuple[int, dict]:
        warps = max(1, min(MAX_WARPS, elements // WHOLE_GROUP_ELEMENTS_PER_WARP))
        return max(1, min(rows, MAX_GRID)), {"num_warps": warps}

    def loop_options(self, backward: bool, rows: int, group_elements: int, itemsize: int) -> dict:
        if backward:
            return {"LOOP_STAGES": BWD_LOOP_STAGES, "num_warps": BWD_LOOP_WARPS}
        per_sm = FWD_LOOP_GROUPS_PER_SM.get(itemsize, FWD_LOOP_GROUPS_PER_SM[2])
        in_flight = min(rows, self._sms * per_sm) * group_elements * itemsize
        hints = ("evict_last", "evict_first") if in_flight <= FWD_L2_HINT_BYTES else ("", "")
        return {
            "LOOP_STAGES": FWD_LOOP_STAGES, "num_warps": FWD_LOOP_WARPS,
            "STATS_EVICT": hints[0], "OUTPUT_EVICT": hints[1],
        }  # fmt: skip

    def options(self, elements: int) -> dict:
        return {"num_warps": max(1, min(MAX_WARPS, elements // 256))}

    def finalize_block(self, seg_per_group: int, block_c: int = 1) -> int:
        return min(next_pow2(seg_per_group), max(1, (self._tile or FINALIZE_BLOCK) // block_c))

    def reduce_blocks(self, part_rows: int, c: int) -> launch.Blocks:
        block_c = min(next_pow2(c), REDUCE_BLOCK_C)
        tile = self._tile or REDUCE_TILE
        return max(1, min(next_pow2(part_rows), tile // block_c)), block_c


@functools.lru_cache(maxsize=64)
def _policy(
    sms: int, tile: int | None, target_items: int | None, whole_group_tile: int | None, looped_groups: bool | None
) -> CudaPolicy:
    return CudaPolicy(None, tile, target_items, whole_group_tile, looped_groups, sms=sms)


def forward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    tile: int | None = None,
    target_items: int | None = None,
    whole_group_tile: int | None = None,
    looped_groups: bool | None = None,
) -> torch.Tensor:
    """The keywords override the policy (see CudaPolicy)."""
    policy = _policy(device.num_sms(x.device), tile, target_items, whole_group_tile, looped_groups)
    return launch.forward(x, num_groups, weight, bias, eps, policy)


def backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    tile: int | None = None,
    target_items: int | None = None,
    whole_group_tile: int | None = None,
    looped_groups: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight or None, dbias or None); the keywords override the policy (see CudaPolicy)."""
    policy = _policy(device.num_sms(x.device), tile, target_items, whole_group_tile, looped_groups)
    return launch.backward(grad_out, x, num_groups, weight, bias, eps, policy)
