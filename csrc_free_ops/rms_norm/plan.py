"""How the row-norm kernels (RMSNorm, LayerNorm) are launched: one ``Plan``
type, and the CUDA and NPU planning as pure functions of the problem's sizes
and the device's facts.

CUDA (also the CPU interpreter path, with ``device.CPU_PROGRAMS`` as SMs):
rows of up to MAX_ROW_BLOCK[backward] elements are held whole; narrow rows (Qwen3's
per-head q/k norms: 128 columns) are stacked BLOCK_M to a tile of about
TILE_ELEMENTS, so a program has work enough for its warps.  The forward
runs one program per row block with no loop.  The backward runs a
persistent grid of a few programs per SM walking row blocks with a grid
stride, each program keeping its own dweight/dbias partial row (so the
partials stay a few MB at most), the next block's loads
software-pipelined.  Longer rows are column-blocked.

NPU (triton-ascend): one program per vector core walking its share of the
rows (1-D grid, at most the vector-core count), tiles bounded by the
unified buffer (UB) instead of registers, no num_warps / num_stages:

* rows of up to NPU_SMALL_ROW_MAX_COLS that fit the tile: the tile kernels
  with BLOCK_M rows x the whole row;
* longer rows: the column-blocked kernels, so the UB never overflows.

NPU UB cost model (poly_norm's, docs/npu.md): a tile element costs its
inputs in their dtype plus the compute-dtype temporaries the kernel keeps
live at once; the parameter rows (weight, bias, and the backward's dweight
and dbias sums) are one tile row each, counted as temporaries too:
  forward:  1 input  + 4 temporaries (x, x - mean, y, the parameters)
  backward: 2 inputs + 7 temporaries (x, dy, xhat, g, dx, the two sums)
The column-blocked forward loads a weight and a bias chunk as long as its x
chunk, so it counts 6 temporaries (the Ascend compile check: with 4, its
fp32 and bf16 chunks of 8192 with weight and bias fit only without
multi-buffering).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from csrc_free_ops.device import NPU_MAX_GRID
from csrc_free_ops.host_math import cdiv, next_pow2, prev_pow2

# --- CUDA policy (the wide-row figures: ``python -m bench.lab.probe_rms_norm_wide``, bench/lab/NOTES.md)
# Longest row processed in one piece, per direction (backward: True); longer rows take the
# column-blocked path, which reads x twice.  Whole backward rows of 32768 ran out of resources.
MAX_ROW_BLOCK = {False: 32768, True: 16384}
# Column block of the blocked path, and the warps of that path and of whole backward rows this wide.
COL_BLOCK = 8192
WIDE_WARPS = 16
# Elements of a tile of narrow rows (BLOCK_M rows stacked up to this).
TILE_ELEMENTS = 2048
BWD_TILE_ELEMENTS = 4096
# The backward's row loop pipelined 3 deep, as poly_norm's (measured there).
BWD_LOOP_STAGES = 3
# Backward programs per SM: each writes a partial row as wide as x's rows, so few.
BWD_PROGRAMS_PER_SM = 2
# Backwards of at most this many (padded) elements run as one program, which writes dweight/dbias itself.
BWD_ONE_PROGRAM_ELEMENTS = 16 * 1024
# Shared memory the pipelined backward loop may stage: it holds (stages - 1) tiles of x and of dy, and a
# kernel asking more than a block may have (227 KiB on the H100) fails to launch; beyond it the loop runs
# unpipelined.
BWD_PIPELINE_BYTES = 200 * 1024

# --- NPU policy
NPU_SMALL_ROW_MAX_COLS = 4096
NPU_MAX_BLOCK_M = 64
NPU_FWD_TEMPS = 4
NPU_FWD_BLOCKED_TEMPS = 6
NPU_BWD_TEMPS = 7
# triton-ascend (Triton 3.2) cannot lower None, the "compiler's default" pipelining depth.
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
    loop_stages: int | None = None  # pipelining depth of the backward row loop

    def walks_row_blocks(self, n_rows: int) -> bool:
        """Whether the forward tile kernel's programs must loop over row blocks
        (fewer programs than blocks); with one program per block it runs loop-free."""
        return self.programs < cdiv(n_rows, self.block_m)


def _cuda_warps(tile: int, backward: bool) -> int:
    # One warp per 1024 elements of a tile, 1 to 16: poly_norm's forward measured 1 warp best up to 1024.
    # Whole backward rows of 8192 and more run best with WIDE_WARPS.
    if backward and tile >= 8192:
        return WIDE_WARPS
    return max(1, min(16, tile // 1024))


def _bwd_loop_stages(tile: int, itemsize: int) -> int:
    """BWD_LOOP_STAGES where its staged tiles of x and dy fit BWD_PIPELINE_BYTES, else 1 (no staging)."""
    return BWD_LOOP_STAGES if 2 * (BWD_LOOP_STAGES - 1) * tile * itemsize <= BWD_PIPELINE_BYTES else 1


@functools.lru_cache(maxsize=1024)
def cuda(n_rows: int, n_cols: int, backward: bool, sms: int, itemsize: int) -> Plan:
    """The CUDA plan for ``n_rows`` rows of ``n_cols`` elements of ``itemsize`` bytes."""
    block = next_pow2(n_cols)
    if block > MAX_ROW_BLOCK[backward]:
        programs = max(1, min(n_rows, sms * BWD_PROGRAMS_PER_SM)) if backward else n_rows
        return Plan(False, 1, COL_BLOCK, programs, WIDE_WARPS)
    target = BWD_TILE_ELEMENTS if backward else TILE_ELEMENTS
    block_m = max(1, min(target // block, next_pow2(n_rows)))
    warps = _cuda_warps(block_m * block, backward)
    blocks = cdiv(n_rows, block_m)
    if not backward:
        return Plan(True, block_m, block, blocks, warps)
    programs = 1 if blocks * block_m * block <= BWD_ONE_PROGRAM_ELEMENTS else min(blocks, sms * BWD_PROGRAMS_PER_SM)
    return Plan(True, block_m, block, programs, warps, _bwd_loop_stages(block_m * block, itemsize))


def npu_tile_elements(
    backward: bool, itemsize: int, compute_itemsize: int, ub_bytes: int, blocked: bool = False
) -> int:
    """Largest power-of-two tile that fits the UB under the cost model."""
    n_inputs, temps = (2, NPU_BWD_TEMPS) if backward else (1, NPU_FWD_BLOCKED_TEMPS if blocked else NPU_FWD_TEMPS)
    return prev_pow2(ub_bytes // (n_inputs * itemsize + compute_itemsize * temps))


@functools.lru_cache(maxsize=1024)
def npu(n_rows: int, n_cols: int, itemsize: int, backward: bool, ub_bytes: int, vector_cores: int) -> Plan:
    tile = npu_tile_elements(backward, itemsize, 8 if itemsize == 8 else 4, ub_bytes)
    cores = min(vector_cores, NPU_MAX_GRID)
    block_n = next_pow2(n_cols)
    if n_cols <= NPU_SMALL_ROW_MAX_COLS and block_n <= tile:
        block_m = min(NPU_MAX_BLOCK_M, tile // block_n, next_pow2(n_rows))
        return Plan(True, block_m, block_n, min(cores, cdiv(n_rows, block_m)), loop_stages=NPU_LOOP_STAGES)
    chunk = npu_tile_elements(backward, itemsize, 8 if itemsize == 8 else 4, ub_bytes, blocked=True)
    return Plan(False, 1, min(block_n, chunk), min(cores, n_rows), loop_stages=NPU_LOOP_STAGES)
