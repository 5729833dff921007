"""How the gated linear units' kernels are launched: one ``Plan`` type, and
the CUDA and NPU planning as pure functions of the problem's sizes and the
device's facts.

The problem is (n_rows, n_cols) as the launch sequence sees the data:
contiguous gate, up (and grad_out) as one row of every element, else rows of
the last dim.  A tile holds BLOCK elements: the whole row width up to BLOCK
(BLOCK_N, a power of two) and as many rows as fill the rest (BLOCK_M).

CUDA (also the CPU interpreter path): one program per tile, no loop; the
tile is CUDA_BLOCK elements (16 per thread at CUDA_WARPS warps: two 16-byte
vectors of bf16 per input), a first guess; bench/lab/probe_glu_tiles.py
times the others.

NPU (triton-ascend): one program per vector core walking the tiles with a
grid stride (1-D grid, at most the vector-core count and 65535), tiles sized
from the unified buffer (UB), no num_warps / num_stages.

NPU UB cost model.  The whole UB is the budget (bishengir's multi-buffering
is inside its own UB plan, as for poly_norm, docs/npu.md).  A tile element
costs its inputs and outputs in their dtypes plus the compute-dtype
temporaries the kernel keeps live at once:
  forward:  gate, up, y      + 5 temporaries (g, u, the sigmoid, act, y)
  backward: dy, gate, up, dgate, dup + 8 temporaries (dy, g, u, s, act, act', dgate, dup)
Tile elements = budget // bytes-per-element, rounded down to a power of two.
A row narrower than NPU_MIN_BLOCK_N is budgeted as that wide: bishengir pads
each row of a 2-D tile to 32 bytes (rows of 3 elements, padded to 4, in
tiles of 1024 rows overflowed the UB by 17% in the Ascend compile check).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from csrc_free_ops.device import NPU_MAX_GRID
from csrc_free_ops.host_math import cdiv, next_pow2, prev_pow2

# --- CUDA policy
CUDA_BLOCK = 2048
CUDA_WARPS = 4

# --- NPU policy
NPU_FWD_TEMPS = 5
NPU_BWD_TEMPS = 8
# 32 bytes of the narrowest dtype (16-bit).
NPU_MIN_BLOCK_N = 16


@dataclass(frozen=True)
class Plan:
    """One launch of the forward or backward kernel."""

    block_m: int
    block_n: int
    programs: int
    num_warps: int | None = None  # None: no launch option (the NPU)

    def tiles(self, n_rows: int, n_cols: int) -> int:
        return cdiv(n_rows, self.block_m) * cdiv(n_cols, self.block_n)

    def walks_tiles(self, n_rows: int, n_cols: int) -> bool:
        """Whether programs must loop over tiles (fewer programs than tiles)."""
        return self.programs < self.tiles(n_rows, n_cols)


def tile_shape(n_rows: int, n_cols: int, block: int, min_block_n: int = 1) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of a tile of ``block`` elements (a power of two) over (n_rows, n_cols),
    rows counted as at least ``min_block_n`` wide."""
    block_n = min(next_pow2(n_cols), block)
    return max(1, min(block // max(block_n, min_block_n), next_pow2(n_rows))), block_n


@functools.lru_cache(maxsize=1024)
def cuda(n_rows: int, n_cols: int) -> Plan:
    block_m, block_n = tile_shape(n_rows, n_cols, CUDA_BLOCK)
    p = Plan(block_m, block_n, 1, CUDA_WARPS)
    return Plan(block_m, block_n, max(1, p.tiles(n_rows, n_cols)), CUDA_WARPS)


def npu_tile_elements(backward: bool, data_bytes: int, compute_itemsize: int, ub_bytes: int) -> int:
    """Largest power-of-two tile that fits the UB under the cost model;
    ``data_bytes``: the bytes of one element of every input and output together."""
    temps = NPU_BWD_TEMPS if backward else NPU_FWD_TEMPS
    return prev_pow2(ub_bytes // (data_bytes + compute_itemsize * temps))


@functools.lru_cache(maxsize=1024)
def npu(n_rows: int, n_cols: int, data_bytes: int, compute_itemsize: int, backward: bool, ub_bytes: int,
        vector_cores: int) -> Plan:  # fmt: skip
    tile = npu_tile_elements(backward, data_bytes, compute_itemsize, ub_bytes)
    block_m, block_n = tile_shape(n_rows, n_cols, tile, NPU_MIN_BLOCK_N)
    p = Plan(block_m, block_n, 1)
    return Plan(block_m, block_n, max(1, min(vector_cores, NPU_MAX_GRID, p.tiles(n_rows, n_cols))))
