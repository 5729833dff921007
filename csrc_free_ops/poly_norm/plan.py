"""How PolyNorm's kernels are launched: one ``Plan`` type, and the CUDA and
NPU planning as pure functions of the problem's sizes and the device's facts.

CUDA (also the CPU interpreter path, with ``device.CPU_PROGRAMS`` as SMs):
the forward runs one program per row with no row loop; a row of up to
MAX_ROW_BLOCK elements is held in registers in one piece, longer rows are
column-blocked in two passes.  The backward runs a persistent grid (a few
programs per SM) walking rows with a grid stride, each program keeping its
own dweight/dbias partials, the next row's loads software-pipelined.

NPU (triton-ascend): one program per vector core walking its share of the
rows (1-D grid, at most the vector-core count), tiles bounded by the
unified buffer (UB) instead of registers, no num_warps / num_stages:

* small rows (n_cols <= NPU_SMALL_ROW_MAX_COLS that fit the tile): the tile
  kernel with 2-D tiles of BLOCK_M rows x the whole row;
* large rows: the column-blocked kernel, so the UB never overflows.

NPU UB cost model.  The whole UB is the budget: the multi-buffering
bishengir adds is inside its own UB plan, which fits tiles twice the size a
half-UB budget gave and overflows at the next power of two (the Ascend
compile check, docs/npu.md).  A tile element costs its inputs in their dtype
plus the compute-dtype (float32, float64 for float64 x) temporaries the
kernel keeps live at once:
  forward:  1 input  + 4 temporaries (x, x^2, a product, y)
  backward: 2 inputs + 6 temporaries (x, dy, x^2, x^3, a product, dx)
Tile elements = budget // bytes-per-element, rounded down to a power of two.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from csrc_free_ops.device import NPU_MAX_GRID
from csrc_free_ops.host_math import cdiv, next_pow2, prev_pow2

# --- CUDA policy
# Each constant is measured by ``python -m bench.run --ops poly_norm --sets large`` on the GPU
# (bench/lab/NOTES.md holds the figures behind the current values).
# Longest row processed in one piece; longer rows take the column-blocked path.
MAX_ROW_BLOCK = 8192
# Column block of the blocked path.
COL_BLOCK = 4096
# The backward's row loop pipelined 3 deep: faster than unpipelined at every width.
BWD_LOOP_STAGES = 3
# Backward programs per SM, the most the policy uses (enough rows in flight to hide latency).
BWD_PROGRAMS_PER_SM = 16
# Backwards of at most this many (padded) elements run as one program, which then writes
# dweight/dbias itself: a second launch and an allocation cost more host time than one SM takes.
BWD_ONE_PROGRAM_ELEMENTS = 16 * 1024

# --- NPU policy
NPU_SMALL_ROW_MAX_COLS = 2048
NPU_MAX_BLOCK_M = 64
NPU_FWD_TEMPS = 4
NPU_BWD_TEMPS = 6
# The pipelining depth of the backward row loop (tl.range): triton-ascend (Triton 3.2)
# cannot lower None, the "compiler's default".
NPU_LOOP_STAGES = 1


@dataclass(frozen=True)
class Plan:
    """One launch of the forward or backward kernel (and, backward, the
    partials' reduction)."""

    whole_rows: bool  # tile kernel (BLOCK_M whole rows) or the column-blocked kernel
    block_m: int
    block_n: int
    programs: int
    num_warps: int | None = None  # None: no launch option (the NPU)
    loop_stages: int | None = None  # pipelining depth of the backward row loop (None: the compiler's default)

    def walks_row_blocks(self, n_rows: int) -> bool:
        """Whether the tile kernel's programs must loop over row blocks
        (fewer programs than blocks); with one program per block it runs
        loop-free."""
        return self.programs < cdiv(n_rows, self.block_m)


def _cuda_fwd_warps(block: int) -> int:
    # The loop-free row kernel: one warp up to 1024 columns, then one more power of two per doubling.
    return 1 if block <= 1024 else 2 if block <= 2048 else 4 if block <= 4096 else 8


def _cuda_bwd_warps(block: int) -> int:
    # The backward holds ~4 row-sized fp32 arrays: one warp per row while that fits, else 4.
    return 1 if block <= 2048 else 4


@functools.lru_cache(maxsize=1024)
def cuda(n_rows: int, n_cols: int, backward: bool, sms: int) -> Plan:
    block = next_pow2(n_cols)
    whole_rows = block <= MAX_ROW_BLOCK
    if not whole_rows:
        block = COL_BLOCK
    if not backward:
        return Plan(whole_rows, 1, block, n_rows, _cuda_fwd_warps(block))
    per_sm = BWD_PROGRAMS_PER_SM // 2 if block <= 4096 else BWD_PROGRAMS_PER_SM
    programs = 1 if n_rows * block <= BWD_ONE_PROGRAM_ELEMENTS else max(1, min(n_rows, sms * per_sm))
    return Plan(whole_rows, 1, block, programs, _cuda_bwd_warps(block), BWD_LOOP_STAGES)


def npu_tile_elements(backward: bool, itemsize: int, compute_itemsize: int, ub_bytes: int) -> int:
    """Largest power-of-two tile that fits the UB under the cost model."""
    n_inputs, temps = (2, NPU_BWD_TEMPS) if backward else (1, NPU_FWD_TEMPS)
    return prev_pow2(ub_bytes // (n_inputs * itemsize + compute_itemsize * temps))


@functools.lru_cache(maxsize=1024)
def npu(n_rows: int, n_cols: int, itemsize: int, backward: bool, ub_bytes: int, vector_cores: int) -> Plan:
    tile = npu_tile_elements(backward, itemsize, 8 if itemsize == 8 else 4, ub_bytes)
    cores = min(vector_cores, NPU_MAX_GRID)
    block_n = next_pow2(n_cols)
    if n_cols <= NPU_SMALL_ROW_MAX_COLS and block_n <= tile:
        block_m = min(NPU_MAX_BLOCK_M, tile // block_n, next_pow2(n_rows))
        return Plan(True, block_m, block_n, min(cores, cdiv(n_rows, block_m)), loop_stages=NPU_LOOP_STAGES)
    return Plan(False, 1, min(block_n, tile), min(cores, n_rows), loop_stages=NPU_LOOP_STAGES)
