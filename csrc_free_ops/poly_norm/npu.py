"""PolyNorm launch policy for Ascend NPUs (triton-ascend); the kernels are
shared with CUDA (kernels.py).

An NPU has a few dozen vector cores, each computing out of a small unified
buffer (UB), so the grid is one program per vector core walking its share of
the rows (1-D, at most the vector-core count), and tiles are bounded by the
UB instead of by registers:

* Small rows (n_cols <= SMALL_ROW_MAX_COLS, and the row fits the tile): the
  tile kernel with 2-D tiles of BLOCK_M rows x the whole row.
* Large rows: the column-blocked kernel, one row at a time in column blocks
  of BLOCK_N, two passes, so the UB never overflows.

UB cost model.  The whole UB is the budget: the multi-buffering bishengir
adds is inside its own UB plan, which fits tiles twice the size a half-UB
budget gave and overflows at the next power of two (the Ascend compile
check, docs/npu.md).  A tile element costs its inputs in their dtype plus
the float32 temporaries the kernel keeps live at once:
  forward:  1 input  + 4 float32 (x, x^2, a product, y)
  backward: 2 inputs + 6 float32 (x, dy, x^2, x^3, a product, dx)
Tile elements = budget // bytes-per-element, rounded down to a power of two.

dweight/dbias: every program writes its own partials (one slot per program,
in both kernels), summed afterwards in a fixed order.  No num_warps /
num_stages: triton-ascend ignores them.
"""

from __future__ import annotations

import torch

from csrc_free_ops import device
from csrc_free_ops.host_math import cdiv, next_pow2
from csrc_free_ops.poly_norm import launch
from csrc_free_ops.poly_norm.launch import Plan

SMALL_ROW_MAX_COLS = 2048
MAX_BLOCK_M = 64
FWD_FP32_TEMPS = 4
BWD_FP32_TEMPS = 6
# The pipelining depth of the backward row loop (tl.range): triton-ascend (Triton 3.2)
# cannot lower None, the "compiler's default" a CUDA plan may pass.
LOOP_STAGES = 1


def _prev_power_of_2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def tile_elements(n_inputs: int, elem_bytes: int, fp32_temps: int) -> int:
    """Largest power-of-two tile that fits the UB under the cost model."""
    per_element = n_inputs * elem_bytes + 4 * fp32_temps
    return _prev_power_of_2(device.npu_ub_bytes() // per_element)


def plan(n_rows: int, n_cols: int, elem_bytes: int, backward: bool) -> Plan:
    n_inputs, temps = (2, BWD_FP32_TEMPS) if backward else (1, FWD_FP32_TEMPS)
    tile = tile_elements(n_inputs, elem_bytes, temps)
    cores = min(device.npu_vector_cores(), device.NPU_MAX_GRID)
    block_n = next_pow2(n_cols)
    if n_cols <= SMALL_ROW_MAX_COLS and block_n <= tile:
        block_m = min(MAX_BLOCK_M, tile // block_n, next_pow2(n_rows))
        return Plan(True, block_m, block_n, min(cores, cdiv(n_rows, block_m)), (), LOOP_STAGES)
    return Plan(False, 1, min(block_n, tile), min(cores, n_rows), (), LOOP_STAGES)


def _unit_column_stride(t: torch.Tensor) -> torch.Tensor:
    """t, copied when its last dim is not unit-stride: triton-ascend then compiles
    the row loads as gathers that need 2-5x the UB the plan budgets (bishengir:
    ub overflow at every planned tile), where a stride of 1 is specialized away."""
    return t if t.stride(-1) == 1 else t.contiguous()


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return launch.forward(_unit_column_stride(x), weight, bias, eps, plan)


def backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight (3,), dbias (1,)); dweight and dbias in weight's dtype."""
    return launch.backward(_unit_column_stride(grad_out), _unit_column_stride(x), weight, eps, plan)
