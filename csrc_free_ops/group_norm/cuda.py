"""GroupNorm launchers for NVIDIA GPUs (also run on CPU tensors under
TRITON_INTERPRET=1).

The kernels live in ``kernels.py`` (shared with the NPU launchers) and the
launch sequence in ``launch.py``; this module is the CUDA launch policy:
register-sized tiles, enough work items for a few waves per SM (a group's
statistics are split across programs when N * channel blocks falls short),
and a grid capped at a few programs per SM, walking the rest with a stride.
"""

from __future__ import annotations

import torch
import triton

from csrc_free_ops import device
from csrc_free_ops.group_norm import launch
from csrc_free_ops.group_norm.plan import Plan, make_plan

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
    def __init__(self, dev: torch.device, tile: int | None = None, target_items: int | None = None):
        self._sms = device.num_sms(dev)
        self._tile = tile
        self._target = target_items if target_items is not None else self._sms * ITEMS_PER_SM

    def plan(self, x: torch.Tensor, groups: int, backward: bool) -> Plan:
        tile = self._tile or (BWD_TILE if backward else FWD_TILE)
        return make_plan(tuple(x.shape), groups, tile=tile, max_block_hw=MAX_BLOCK_HW, target_items=self._target)

    def grid(self, work: int) -> int:
        return max(1, min(work, self._sms * PROGRAMS_PER_SM))

    def options(self, elements: int) -> dict:
        return {"num_warps": max(1, min(8, elements // 256))}

    def finalize_block(self, seg_per_group: int) -> int:
        return min(triton.next_power_of_2(seg_per_group), self._tile or FINALIZE_BLOCK)

    def reduce_blocks(self, part_rows: int, c: int) -> launch.Blocks:
        block_c = min(triton.next_power_of_2(c), REDUCE_BLOCK_C)
        tile = self._tile or REDUCE_TILE
        return max(1, min(triton.next_power_of_2(part_rows), tile // block_c)), block_c


def forward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    tile: int | None = None,
    target_items: int | None = None,
) -> torch.Tensor:
    """tile / target_items override the policy (tests use them to force the
    multi-block and split paths on small shapes)."""
    return launch.forward(x, num_groups, weight, bias, eps, CudaPolicy(x.device, tile, target_items))


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
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight or None, dbias or None)."""
    policy = CudaPolicy(x.device, tile, target_items)
    return launch.backward(grad_out, x, num_groups, weight, bias, eps, policy)
