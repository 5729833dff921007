"""How cross-entropy's kernels are launched: one ``Plan`` type, and the CUDA
and NPU planning as pure functions of the problem's sizes and the device's
facts.

CUDA (also the CPU interpreter path): one program per row, each walking its
row in column blocks of up to MAX_BLOCK_N elements with many warps (a row is
one long reduction: upstream Liger-Kernel's shape, 32768-element blocks and
32 warps, the fastest it measured on Hopper).

NPU (triton-ascend): one program per vector core (1-D grid, at most
NPU_MAX_GRID) walking rows with a grid stride, column blocks bounded by the
unified buffer (UB): a block element costs its input in the logits' dtype
plus NPU_TEMPS compute-dtype temporaries, the class weights' block when
given; the largest power of two that fits, at most NPU_MAX_BLOCK_N.
bishengir's UB plans (the Ascend compile check at 8192 columns) took up to
30 bytes an element forward and 46 backward (fp16 in place, with softcap
and class weights: the loaded block, its float32 value, the softcapped
value, tanh's exponential and quotient, p, the gradient and its masks,
several buffered twice), so NPU_TEMPS covers the backward's worst case.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from csrc_free_ops.device import NPU_MAX_GRID
from csrc_free_ops.host_math import next_pow2, prev_pow2

# --- CUDA policy
MAX_BLOCK_N = 32768
CUDA_WARPS = 32
# Rows so short that a smaller block and fewer warps fit them whole.
SMALL_ROW_WARPS = 4
SMALL_ROW_MAX = 2048

# --- NPU policy
NPU_TEMPS = 10
NPU_MAX_BLOCK_N = 8192


@dataclass(frozen=True)
class Plan:
    """One launch of the forward or the backward kernel."""

    block_n: int  # columns per block of a row
    programs: int  # grid size; programs walk rows with a grid stride
    num_warps: int | None = None  # None: no launch option (the NPU)


@functools.lru_cache(maxsize=1024)
def cuda(n_rows: int, n_cols: int) -> Plan:
    block = min(next_pow2(n_cols), MAX_BLOCK_N)
    warps = SMALL_ROW_WARPS if block <= SMALL_ROW_MAX else CUDA_WARPS
    return Plan(block, max(1, n_rows), warps)


def npu_block_elements(itemsize: int, compute_itemsize: int, has_weight: bool, ub_bytes: int) -> int:
    """Largest power-of-two column block that fits the UB under the cost model."""
    per_element = itemsize + compute_itemsize * NPU_TEMPS + (compute_itemsize if has_weight else 0)
    return min(prev_pow2(ub_bytes // per_element), NPU_MAX_BLOCK_N)


@functools.lru_cache(maxsize=1024)
def npu(n_rows: int, n_cols: int, itemsize: int, has_weight: bool, ub_bytes: int, vector_cores: int) -> Plan:
    block = min(next_pow2(n_cols), npu_block_elements(itemsize, 8 if itemsize == 8 else 4, has_weight, ub_bytes))
    return Plan(block, max(1, min(vector_cores, NPU_MAX_GRID, n_rows)))
