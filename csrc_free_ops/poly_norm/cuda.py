"""PolyNorm launch policy for NVIDIA GPUs (also used for CPU tensors under
TRITON_INTERPRET=1); the kernels are shared with the NPU (kernels.py).

Forward: one program per row, with no row loop.  A row of up to
``max_block`` elements is held in registers in one piece; longer rows are
column-blocked in two passes.
Backward: a persistent grid (a few programs per SM) walks the rows with a
grid stride, each program keeping its own dweight/dbias partials, with the
next row's loads software-pipelined (BWD_LOOP_STAGES).
"""

from __future__ import annotations

import functools

import torch

from csrc_free_ops import device
from csrc_free_ops.host_math import next_pow2
from csrc_free_ops.poly_norm import launch
from csrc_free_ops.poly_norm.launch import Plan

# Longest row processed in one piece; longer rows take the column-blocked path.
MAX_ROW_BLOCK = 8192
# Column block of the blocked path.
COL_BLOCK = 4096
# H200, bf16, 16384 rows, backward (graph replay; bench/NOTES.md has the sweeps): the row loop
# pipelined 3 deep beat the unpipelined loop at every width, e.g. H=2048 55.5 vs 79.3 us (1 warp,
# 8 programs/SM), H=4096 108.4 vs 142.4 us (4 warps, 8/SM), H=8192 202 vs 270 us (4 warps, 16/SM).
BWD_LOOP_STAGES = 3
# Backward programs per SM, the most the policy uses (enough rows in flight to hide latency).
BWD_PROGRAMS_PER_SM = 16


def _fwd_num_warps(block: int) -> int:
    # H200, bf16, loop-free row kernel (bench/NOTES.md v8): at 2048 rows 1 warp up to 1024 columns is
    # 0.2-0.7 us ahead of 2 (H=512: 6.59 vs 6.88 us), 2 warps lead at 2048; at 16384 rows 2 / 4 / 8
    # warps are within 1% of the best at 2048 / 4096 / 8192 (16 was 2x slower at 2048).
    return 1 if block <= 1024 else 2 if block <= 2048 else 4 if block <= 4096 else 8


def _bwd_num_warps(block: int) -> int:
    # The backward holds ~4 row-sized fp32 arrays: one warp per row while that fits, else 4.
    return 1 if block <= 2048 else 4


def _bwd_programs_per_sm(block: int) -> int:
    return BWD_PROGRAMS_PER_SM // 2 if block <= 4096 else BWD_PROGRAMS_PER_SM


@functools.lru_cache(maxsize=1024)
def plan(n_rows: int, n_cols: int, backward: bool, sms: int, max_block: int) -> Plan:
    block = next_pow2(n_cols)
    whole_rows = block <= max_block
    if not whole_rows:
        block = min(COL_BLOCK, max_block)
    warps = _bwd_num_warps(block) if backward else _fwd_num_warps(block)
    if not backward:
        return Plan(whole_rows, 1, block, n_rows, (("num_warps", warps),))
    programs = max(1, min(n_rows, sms * _bwd_programs_per_sm(block)))
    return Plan(whole_rows, 1, block, programs, (("num_warps", warps),), BWD_LOOP_STAGES)


def _planner(x: torch.Tensor, max_block: int) -> launch.Planner:
    sms = device.num_sms(x.device)
    return lambda n_rows, n_cols, _elem, backward: plan(n_rows, n_cols, backward, sms, max_block)


def forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, *, max_block: int = MAX_ROW_BLOCK
) -> torch.Tensor:
    return launch.forward(x, weight, bias, eps, _planner(x, max_block))


def backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, *, max_block: int = MAX_ROW_BLOCK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight (3,), dbias (1,)); dweight and dbias in weight's dtype."""
    return launch.backward(grad_out, x, weight, eps, _planner(x, max_block))
