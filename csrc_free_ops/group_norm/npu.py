"""GroupNorm launchers for Ascend NPUs (torch_npu's PrivateUse1 device).

The kernels are the ones the CUDA launchers run (``kernels.py``): they are
already 1-D grid-stride loops over work items with no atomics, so only the
launch policy differs:

* grid = min(vector cores, work items, 65535): one 1-D launch, every program
  walking items with a stride; no num_warps / num_stages;
* a group's statistics are split across programs until there are at least
  as many work items as vector cores;
* tile sizes come from the unified buffer (UB) of one vector core.

UB cost model: a kernel keeps ``bytes_per_element`` bytes live in UB for
each tile element, and the streaming kernels budget half of the UB, so
tile = largest power of two <= (UB / 2) / bytes_per_element: bishengir's UB
plan for the partials kernels, multi-buffering included, takes over twice
the bytes counted here (forward 44 per element, backward 84), and with the
half their tiles are the largest that fit (the Ascend compile check,
docs/npu.md).  Per element (s = x's element size):

    forward partials   x (s) + x, x - shift, two accumulators (4 x 4)  s + 16
    forward apply      x, y (2s) + x, y in float32 (2 x 4)             2s + 8
    backward partials  x, dy (2s) + x, dy, d, four accumulators (7 x 4) 2s + 28
    backward dx        x, dy, dx (3s) + four float32 temporaries         3s + 16
    group merge        five float32 partial vectors + two accumulators  28
                       (the finalize kernels, and the dx / apply kernels
                       that merge their groups themselves)
    reduce             two float32 loads + two accumulators              16
    whole group fwd    x, y (2s) + x, x - mean, y in float32 (3 x 4)     2s + 12
    whole group bwd    x, dy, dx (3s) + five float32 arrays              3s + 20

A group whose padded [channels, spatial] tile fits the whole-group budget is
normalized by one program (one launch forward, one plus the reduce backward).
That budget is the whole UB, not half: bishengir's UB plan for these kernels,
multi-buffering included, fits groups twice the size a half-UB budget gave
(the Ascend compile check, docs/npu.md).
Larger groups take the split path: CUDA's looped-group path relies on L2
serving its second walk, which has not been measured on an Ascend part.

A direction's streaming kernels share one tile, sized by the costlier one.
"""

from __future__ import annotations

import torch

from csrc_free_ops import device
from csrc_free_ops.group_norm import launch
from csrc_free_ops.group_norm.plan import Plan, make_plan, whole_group_plan
from csrc_free_ops.host_math import next_pow2

FINALIZE_BYTES_PER_ELEMENT = 28
REDUCE_BYTES_PER_ELEMENT = 16
# Channels of one reduce tile (at most).
REDUCE_BLOCK_C = 64


def group_bytes_per_element(itemsize: int, backward: bool) -> int:
    """UB bytes per element of a whole-group tile."""
    return 3 * itemsize + 20 if backward else 2 * itemsize + 12


def bytes_per_element(itemsize: int, backward: bool) -> int:
    if backward:
        return max(2 * itemsize + 28, 3 * itemsize + 16)
    return max(itemsize + 16, 2 * itemsize + 8)


def tile_elements(bytes_per_elem: int, ub_bytes: int | None = None) -> int:
    """Largest power of two of elements that fits half the UB (at least 1)."""
    fit = max(1, (ub_bytes or device.npu_ub_bytes()) // 2 // bytes_per_elem)
    return 1 << (fit.bit_length() - 1)


def whole_group_elements(itemsize: int, backward: bool, ub_bytes: int) -> int:
    """Largest power of two of whole-group tile elements that fits the whole UB (at least 1)."""
    fit = max(1, ub_bytes // group_bytes_per_element(itemsize, backward))
    return 1 << (fit.bit_length() - 1)


class NpuPolicy:
    """Reads the UB size and vector cores (environment overrides included)
    once, at construction; they make up its cache key."""

    def __init__(self) -> None:
        self._cores = device.npu_vector_cores()
        self._ub = device.npu_ub_bytes()
        self.key = ("npu", self._cores, self._ub)

    def plan_for(self, n: int, c: int, hw: int, groups: int, itemsize: int, backward: bool) -> Plan:
        whole_cap = whole_group_elements(itemsize, backward, self._ub)
        whole = whole_group_plan(n, c, hw, groups, whole_cap)
        if whole is not None:
            return whole
        tile = tile_elements(bytes_per_element(itemsize, backward), self._ub)
        return make_plan((n, c, hw), groups, tile=tile, max_block_hw=tile, target_items=self._cores)

    def grid(self, work: int) -> int:
        return max(1, min(work, self._cores, device.NPU_MAX_GRID))

    def options(self, elements: int) -> dict:
        return {}

    def whole_group_launch(self, rows: int, elements: int) -> tuple[int, dict]:
        return self.grid(rows), {}

    def loop_options(self, backward: bool, rows: int, group_elements: int, itemsize: int) -> dict:
        # One stage: triton-ascend (Triton 3.2) cannot lower a tl.range pipelining depth of None; no cache hints.
        if backward:
            return {"LOOP_STAGES": 1}
        return {"LOOP_STAGES": 1, "STATS_EVICT": "", "OUTPUT_EVICT": ""}

    def finalize_block(self, seg_per_group: int, block_c: int = 1) -> int:
        tile = tile_elements(FINALIZE_BYTES_PER_ELEMENT, self._ub)
        return min(next_pow2(seg_per_group), max(1, tile // block_c))

    def reduce_blocks(self, part_rows: int, c: int) -> launch.Blocks:
        tile = tile_elements(REDUCE_BYTES_PER_ELEMENT, self._ub)
        block_c = min(next_pow2(c), REDUCE_BLOCK_C, tile)
        return max(1, min(next_pow2(part_rows), tile // block_c)), block_c


def forward(
    x: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    return launch.forward(x, num_groups, weight, bias, eps, NpuPolicy())


def backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight or None, dbias or None)."""
    return launch.backward(grad_out, x, num_groups, weight, bias, eps, NpuPolicy())
