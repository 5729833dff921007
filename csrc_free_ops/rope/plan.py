"""How rope's kernel is launched: one ``Plan`` type, and the CUDA and NPU
planning as pure functions of the problem's sizes (``Problem``) and the
device's facts.

Both launch the one kernel of kernels.py; a Plan picks its head blocks, grid,
warps, the cu_seqlens chunk and how interleaved pairs are read.  The launch
sequence derives the rest from the Plan and the sizes: tile widths, the
heads loop (dropped when both head blocks hold all heads) and the row loop
(dropped when there is a program per row).

CUDA (also the CPU interpreter path): one program per row, each a single
warp, with head blocks sized so a tile holds at most TILE_BYTES of input per
half: the fastest of a sweep of warps x tile bytes (bench/lab/NOTES.md,
"Where the code's tuning constants come from").  Interleaved
pairs are loaded as one contiguous tile and split in registers (vectorized
loads).  The tokens' sequence starts are found among up to MAX_SEQS_BLOCK
cu_seqlens entries per step.

CUDA, heads adjacent (HF's q and k: (B, S, H, D) memory viewed (B, H, S, D),
a token's heads one run of memory) with rows of under ADJACENT_ROW_BYTES of
q and k input: ADJACENT_WARPS warps a program, ADJACENT_ROWS rows.  A warp
holding a quarter of a small row's bytes keeps a quarter of the registers,
so four times the warps are resident and more loads are in flight;
`python -m bench.lab.probe_rope_layout` times warps x rows on the
model-layout shapes and says how to set the three.  Contiguous (B, H, S, D)
q and k (a head's rows far apart) keep the plan above.

NPU (triton-ascend): one program per vector core (1-D grid of at most
min(vector cores, rows, 65535)) walking the rows with a grid stride, tiles
bounded by the unified buffer (UB) instead of registers, no num_warps /
num_stages.  Interleaved pairs are read with stride-2 loads, not split
from a reshaped tile: that form of tl.reshape / tl.split has not been
compiled by triton-ascend here.  UB cost model (bytes live per program;
e = element size of the tensor, c = compute element size, 4 or 8 for
float64 data, i = 8 for the int64 index math):

* cos/sin row: 4 pair vectors, loaded in the table's dtype and kept in the
  compute dtype: ``4 * BLOCK_HALF * (e_table + c)``.
* looked-up positions: M-RoPE keeps per pair its stream, position and two
  row offsets, ``4 * BLOCK_HALF * i``; cu_seqlens a chunk of entries, its
  comparison and selection, ``3 * BLOCK_SEQS * i``.
* per head of a rotate tile: both halves loaded (2e), converted (2c),
  rotated (2c) and cast back for the store (2e): ``BLOCK_HALF * (4e + 4c)``;
  twice that with interleaved pairs on either side (``pairs`` other than
  "halves"), whose stride-2 loads and stores bishengir lowers through
  full-width buffers: its UB plan fits 2048 pairs a tile and overflows at
  4096, in every dtype (32 and 64 heads x 64 pairs, docs/npu.md).
* per head of a pass-through tile (out-of-place partial rotary only): a load
  and a store buffer, ``BLOCK_PASS * 2e``.

The whole UB is budgeted: the multi-buffering bishengir adds is inside its
own UB plan, which fits head blocks twice those a half-UB budget gave and
overflows at the next power of two (the Ascend compile check, docs/npu.md).
A head block is the largest power of two whose tiles fit the UB next to the
fixed part, at least 1 and at most the padded head count.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from csrc_free_ops.device import NPU_MAX_GRID
from csrc_free_ops.host_math import next_pow2, prev_pow2

# --- CUDA policy
# Input bytes per half tile (bounds registers per program) and warps per program: the fastest of a sweep of
# both, measured by `python -m bench.run --ops rope --sets seeds,large --timer graph` with them varied.
TILE_BYTES = 8 * 1024
MAX_WARPS = 1
# Bytes one thread loads per vectorized access, and accesses per thread we aim for.
VECTOR_BYTES = 16
VECTORS_PER_THREAD = 2
# Heads-adjacent layouts with small rows (see the docstring); `python -m bench.lab.probe_rope_layout` measures them.
ADJACENT_ROW_BYTES = 16 * 1024
ADJACENT_WARPS = 4
ADJACENT_ROWS = 1
# cu_seqlens entries one step of the sequence-start search loads (32 a lane in one warp).
MAX_SEQS_BLOCK = 1024

# --- NPU policy
NPU_MAX_SEQS_BLOCK = 256
INDEX_BYTES = 8


class Problem(NamedTuple):
    """What the planning functions read of a call: sizes and element sizes."""

    n_rows: int  # (batch, position) rows
    n_qh: int  # 0 when q is absent
    n_kh: int  # 0 when k is absent
    head_dim: int
    rot_dim: int
    q_itemsize: int
    k_itemsize: int
    table_itemsize: int  # the larger of cos's and sin's
    compute_itemsize: int  # 8 for float64 data, else 4
    copy_pass: bool  # out of place with rot_dim < head_dim: dims rot_dim.. are copied too
    n_cu_seqlens: int = 0  # entries of cu_seqlens (0: not given)
    mrope: bool = False
    interleaved: bool = False  # pairs other than "halves": stride-2 loads or stores on the NPU
    heads_adjacent: bool = False  # each token's heads one run of memory (HF's layout): q's and k's

    @property
    def block_half(self) -> int:
        return block_half(self.rot_dim)

    @property
    def block_pass(self) -> int:
        return block_pass(self.head_dim, self.rot_dim)


def block_half(rot_dim: int) -> int:
    """Tile width of rotation pairs."""
    return next_pow2(rot_dim // 2)


def block_pass(head_dim: int, rot_dim: int) -> int:
    """Tile width of the pass-through dims (1 when the whole head rotates)."""
    return next_pow2(max(1, head_dim - rot_dim))


@dataclass(frozen=True)
class Plan:
    """One launch of ``kernels.rope_kernel``.  Tile widths are not a choice:
    the launch sequence takes them from the sizes (``block_half``,
    ``block_pass``), so no plan can leave columns unwritten."""

    block_qh: int  # q heads per tile
    block_kh: int  # k heads per tile
    programs: int  # 1-D grid
    num_warps: int | None = None  # None: no launch option (the NPU)
    block_seqs: int = 1  # cu_seqlens entries per step of the sequence-start search
    split_pairs: bool = False  # interleaved pairs: one tile split in registers, else stride-2 loads
    rows_per_program: int = 1  # consecutive rows a program takes, without a grid stride

    def walks_rows(self, n_rows: int) -> bool:
        """Whether programs loop over rows with a grid stride (fewer rows taken than there are)."""
        return self.programs * self.rows_per_program < n_rows

    def heads_fit(self, n_qh: int, n_kh: int) -> bool:
        """Whether one tile holds every q head and one every k head (no heads loop)."""
        return self.block_qh >= n_qh and self.block_kh >= n_kh


def _pow2_at_most(n_heads: int, fit: int) -> int:
    """The largest power of two <= fit, at least 1 and at most the padded head count."""
    return max(1, min(next_pow2(max(1, n_heads)), prev_pow2(max(1, fit))))


def _seqs_block(n_cu_seqlens: int, cap: int) -> int:
    return min(next_pow2(max(1, n_cu_seqlens)), cap)


def cuda_head_block(n_heads: int, width: int, itemsize: int) -> int:
    """Heads per tile: all of them when a [heads, width] tile fits TILE_BYTES."""
    return _pow2_at_most(n_heads, TILE_BYTES // (width * itemsize))


def cuda_warps(block_h: int, width: int, itemsize: int) -> int:
    threads = block_h * width * itemsize // (VECTOR_BYTES * VECTORS_PER_THREAD)
    return max(1, min(MAX_WARPS, next_pow2(max(1, threads // 32))))


def row_bytes(p: Problem) -> int:
    """q and k input bytes of one (batch, position) row."""
    return p.head_dim * (p.n_qh * p.q_itemsize + p.n_kh * p.k_itemsize)


def cuda(p: Problem) -> Plan:
    half_w, pass_w = p.block_half, p.block_pass
    width = max(half_w, pass_w) if p.copy_pass else half_w
    block_qh = cuda_head_block(p.n_qh, width, p.q_itemsize)
    block_kh = cuda_head_block(p.n_kh, width, p.k_itemsize)
    warps = max(cuda_warps(block_qh, width, p.q_itemsize), cuda_warps(block_kh, width, p.k_itemsize))
    rows = 1
    if p.heads_adjacent and row_bytes(p) < ADJACENT_ROW_BYTES:
        warps, rows = ADJACENT_WARPS, ADJACENT_ROWS
    programs = max(1, -(-p.n_rows // rows))
    return Plan(block_qh, block_kh, programs, warps, _seqs_block(p.n_cu_seqlens, MAX_SEQS_BLOCK), True, rows)


def npu_cos_sin_bytes(block_half: int, table_itemsize: int, compute_itemsize: int) -> int:
    return 4 * block_half * (table_itemsize + compute_itemsize)


def npu_positions_bytes(block_half: int, block_seqs: int, n_cu_seqlens: int, mrope: bool) -> int:
    return (4 * block_half * INDEX_BYTES if mrope else 0) + (3 * block_seqs * INDEX_BYTES if n_cu_seqlens else 0)


def npu_head_bytes(block_half: int, block_pass: int, itemsize: int, compute_itemsize: int, copy_pass: bool,
                   interleaved: bool = False) -> int:  # fmt: skip
    """UB bytes one head adds to a tile (the larger of its rotate and pass tiles)."""
    rotate = block_half * (4 * itemsize + 4 * compute_itemsize) * (2 if interleaved else 1)
    return max(rotate, block_pass * 2 * itemsize) if copy_pass else rotate


def npu_head_block(n_heads: int, per_head: int, fixed: int, ub_bytes: int) -> int:
    budget = ub_bytes - fixed
    return _pow2_at_most(n_heads, budget // per_head)


@functools.lru_cache(maxsize=1024)
def npu(p: Problem, ub_bytes: int, vector_cores: int) -> Plan:
    half_w, pass_w = p.block_half, p.block_pass
    block_seqs = _seqs_block(p.n_cu_seqlens, NPU_MAX_SEQS_BLOCK)
    fixed = npu_cos_sin_bytes(half_w, p.table_itemsize, p.compute_itemsize)
    fixed += npu_positions_bytes(half_w, block_seqs, p.n_cu_seqlens, p.mrope)
    per_q = npu_head_bytes(half_w, pass_w, p.q_itemsize, p.compute_itemsize, p.copy_pass, p.interleaved)
    per_k = npu_head_bytes(half_w, pass_w, p.k_itemsize, p.compute_itemsize, p.copy_pass, p.interleaved)
    programs = max(1, min(vector_cores, p.n_rows, NPU_MAX_GRID))
    block_qh = npu_head_block(p.n_qh, per_q, fixed, ub_bytes)
    block_kh = npu_head_block(p.n_kh, per_k, fixed, ub_bytes)
    return Plan(block_qh, block_kh, programs, None, block_seqs, False)
