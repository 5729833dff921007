"""Rotary-embedding kernel and launchers for NVIDIA GPUs (also run on CPU
tensors under TRITON_INTERPRET=1).

One program per (batch, position) row: B*S programs are plenty to fill the
GPU, and each loads its cos/sin row once and rotates all q and k heads of
that position.  Tiles are sized from (heads, head_dim, dtype): a block of
heads by the half width, capped at TILE_BYTES of input per half.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from csrc_free_ops.host_math import next_pow2
from csrc_free_ops.launcher import Launcher
from csrc_free_ops.rope import launch, row_math

# Input bytes per half tile; bounds registers per program.  One warp per
# program won on an H200 at every shape swept (bf16, 32/8 heads x 256, B*T
# 1k..64k rows; 8 KiB tiles 1-2% ahead of 4 KiB at 16k+ rows, within 1%
# below; 2 warps 1-8% and 4-8 warps up to 20% slower):
# bench/results/h200-2026-12-02-session5/rope_tile_sweep.txt.
TILE_BYTES = 8 * 1024
# Bytes one thread loads per vectorized access, and accesses per thread we aim for.
VECTOR_BYTES = 16
VECTORS_PER_THREAD = 2
MAX_WARPS = 1


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN,
    seq_len, n_qh, n_kh, half, rot_dim, head_dim,
    sq_b, sq_h, sq_s, sq_d, sqo_b, sqo_h, sqo_s, sqo_d,
    sk_b, sk_h, sk_s, sk_d, sko_b, sko_h, sko_s, sko_d,
    sc_b, sc_s, sc_r, ss_b, ss_s, ss_r,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BACKWARD: tl.constexpr, COPY_PASS: tl.constexpr, HEADS_FIT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    row_math.rope_row(
        Q, K, QO, KO, COS, SIN, row,
        seq_len, n_qh, n_kh, half, rot_dim, head_dim,
        sq_b, sq_h, sq_s, sq_d, sqo_b, sqo_h, sqo_s, sqo_d,
        sk_b, sk_h, sk_s, sk_d, sko_b, sko_h, sko_s, sko_d,
        sc_b, sc_s, sc_r, ss_b, ss_s, ss_r,
        BLOCK_QH, BLOCK_KH, BLOCK_HALF, BLOCK_PASS, BACKWARD, COPY_PASS, HEADS_FIT,
    )  # fmt: skip


def head_block(n_heads: int, width: int, element_size: int) -> int:
    """Heads per tile: all of them when a [heads, width] tile fits TILE_BYTES."""
    cap = max(1, TILE_BYTES // (width * element_size))
    return max(1, min(next_pow2(max(1, n_heads)), 1 << (cap.bit_length() - 1)))


def num_warps(block_h: int, width: int, element_size: int) -> int:
    threads = block_h * width * element_size // (VECTOR_BYTES * VECTORS_PER_THREAD)
    return max(1, min(MAX_WARPS, next_pow2(max(1, threads // 32))))


def _launch_rows(lay: launch.Layout, tensors: tuple, size: int, *, backward: bool, copy_pass: bool) -> None:
    p = lay.p
    run = _launcher(p.n_qh, p.n_kh, p.head_dim, p.rot_dim, size, backward, copy_pass)
    run.launch(p.rows, tensors, lay.scalars, lay.scalar_key)


@functools.lru_cache(maxsize=256)
def _launcher(
    n_qh: int, n_kh: int, head_dim: int, rot_dim: int, size: int, backward: bool, copy_pass: bool
) -> Launcher:
    """The kernel with its tiles and warps for one head layout and dtype size."""
    p = launch.Problem(1, 1, n_qh, n_kh, head_dim, rot_dim)
    half_w = launch.block_half(p)
    pass_w = launch.block_pass(p)
    width = max(half_w, pass_w) if copy_pass else half_w
    block_qh = head_block(n_qh, width, size)
    block_kh = head_block(n_kh, width, size)
    return Launcher(
        _rope_kernel, BLOCK_QH=block_qh, BLOCK_KH=block_kh, BLOCK_HALF=half_w, BLOCK_PASS=pass_w,
        BACKWARD=backward, COPY_PASS=copy_pass, HEADS_FIT=row_math.heads_fit(n_qh, n_kh, block_qh, block_kh),
        num_warps=num_warps(max(block_qh, block_kh), width, size),
    )  # fmt: skip


rotate_into = launch.rotator(_launch_rows)
forward, backward, forward_ = launch.entry_points(rotate_into)
