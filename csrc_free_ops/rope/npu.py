"""Rotary-embedding kernel and launchers for Ascend NPUs (triton-ascend).

Separate kernel from CUDA because an Ascend launch should not exceed the
physical vector cores: the grid is min(vector cores, B*S rows) and each
program walks its rows with a grid stride.  Per row, cos and sin are loaded
once and the q and k heads are rotated a block of heads at a time.  No
num_warps/num_stages: they mean nothing on Ascend.  head_dim and head counts
that are not powers of two are handled with masks on padded tiles.

UB cost model (bytes live per program; e = element size of q):

* cos/sin row: 4 half vectors, loaded in dtype and kept as float32:
  ``4 * BLOCK_HALF * (e + 4)``.
* per head of a rotate tile: both halves loaded (2e), upcast (2*4),
  rotated (2*4) and cast back for the store (2e): ``BLOCK_HALF * (4e + 16)``.
* per head of a pass-through tile (out-of-place partial rotary only): a load
  and a store buffer, ``BLOCK_PASS * 2e``.

The whole UB is budgeted: the multi-buffering bishengir adds is inside its
own UB plan, which fits head blocks twice those a half-UB budget gave and
overflows at the next power of two (the Ascend compile check, docs/npu.md).
The head block is the largest power of two whose tiles fit the UB next to
the cos/sin row, at least 1 and at most the padded head count.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from csrc_free_ops import device
from csrc_free_ops.host_math import next_pow2
from csrc_free_ops.launcher import on_device_of
from csrc_free_ops.rope import launch, row_math

FP32_BYTES = 4


class NpuPlan(NamedTuple):
    grid: int
    block_qh: int
    block_kh: int
    block_half: int
    block_pass: int


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN,
    seq_len, n_qh, n_kh, half, rot_dim, head_dim,
    sq_b, sq_h, sq_s, sq_d, sqo_b, sqo_h, sqo_s, sqo_d,
    sk_b, sk_h, sk_s, sk_d, sko_b, sko_h, sko_s, sko_d,
    sc_b, sc_s, sc_r, ss_b, ss_s, ss_r,
    n_rows,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BACKWARD: tl.constexpr, COPY_PASS: tl.constexpr, HEADS_FIT: tl.constexpr,
):  # fmt: skip
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row_math.rope_row(
            Q, K, QO, KO, COS, SIN, tl.cast(row, tl.int64),
            seq_len, n_qh, n_kh, half, rot_dim, head_dim,
            sq_b, sq_h, sq_s, sq_d, sqo_b, sqo_h, sqo_s, sqo_d,
            sk_b, sk_h, sk_s, sk_d, sko_b, sko_h, sko_s, sko_d,
            sc_b, sc_s, sc_r, ss_b, ss_s, ss_r,
            BLOCK_QH, BLOCK_KH, BLOCK_HALF, BLOCK_PASS, BACKWARD, COPY_PASS, HEADS_FIT,
        )  # fmt: skip


def cos_sin_bytes(block_half: int, element_size: int) -> int:
    return 4 * block_half * (element_size + FP32_BYTES)


def head_bytes(block_half: int, block_pass: int, element_size: int, copy_pass: bool) -> int:
    """UB bytes one head adds to a tile (the larger of its rotate and pass tiles)."""
    rotate = block_half * (4 * element_size + 4 * FP32_BYTES)
    return max(rotate, block_pass * 2 * element_size) if copy_pass else rotate


def head_block(n_heads: int, per_head: int, fixed: int, ub_bytes: int) -> int:
    budget = ub_bytes - fixed
    fit = max(1, budget // per_head)
    return max(1, min(next_pow2(max(1, n_heads)), 1 << (fit.bit_length() - 1)))


def plan(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, copy_pass: bool) -> NpuPlan:
    """Grid and tile sizes for these inputs under the current UB / core counts."""
    return _plan(launch.problem(q, k, cos), q.element_size(), copy_pass)


def _plan(p: launch.Problem, size: int, copy_pass: bool) -> NpuPlan:
    half_w = launch.block_half(p)
    pass_w = launch.block_pass(p)
    per_head = head_bytes(half_w, pass_w, size, copy_pass)
    fixed = cos_sin_bytes(half_w, size)
    ub = device.npu_ub_bytes()
    grid = max(1, min(device.npu_vector_cores(), p.rows, device.NPU_MAX_GRID))
    return NpuPlan(
        grid=grid,
        block_qh=head_block(p.n_qh, per_head, fixed, ub),
        block_kh=head_block(p.n_kh, per_head, fixed, ub),
        block_half=half_w,
        block_pass=pass_w,
    )


def _launch_rows(lay: launch.Layout, tensors: tuple, size: int, *, backward: bool, copy_pass: bool) -> None:
    p = lay.p
    cfg = _plan(p, size, copy_pass)
    with on_device_of(tensors[0]):
        _rope_kernel[(cfg.grid,)](
            *tensors, *lay.scalars, p.rows,
            BLOCK_QH=cfg.block_qh, BLOCK_KH=cfg.block_kh, BLOCK_HALF=cfg.block_half, BLOCK_PASS=cfg.block_pass,
            BACKWARD=backward, COPY_PASS=copy_pass,
            HEADS_FIT=row_math.heads_fit(p.n_qh, p.n_kh, cfg.block_qh, cfg.block_kh),
        )  # fmt: skip


rotate_into = launch.rotator(_launch_rows)
forward, backward, forward_ = launch.entry_points(rotate_into)
