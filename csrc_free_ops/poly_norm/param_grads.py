"""The last step of the PolyNorm backward, shared by CUDA and NPU: sum the
per-program float32 partials of (dw_cubic, dw_square, dw_linear, dbias) in
program order and write dweight (3,) and dbias (1,) in the weight's dtype.

One program does it; the partials are a few hundred floats."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reduce_kernel(PARTIAL, DW, DB, n_programs, BLOCK_P: tl.constexpr):
    acc = tl.zeros([BLOCK_P, 4], dtype=tl.float32)
    cols = tl.arange(0, 4)[None, :]
    for start in range(0, n_programs, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)[:, None]
        acc += tl.load(PARTIAL + rows * 4 + cols, mask=rows < n_programs, other=0.0)
    sums = tl.sum(acc, axis=0)
    idx = tl.arange(0, 4)
    tl.store(DW + idx, sums.to(DW.dtype.element_ty), mask=idx < 3)
    tl.store(DB + idx - 3, sums.to(DB.dtype.element_ty), mask=idx == 3)


def reduce(partial: torch.Tensor, dtype: torch.dtype, **launch_options) -> tuple[torch.Tensor, torch.Tensor]:
    """(dweight (3,), dbias (1,)) from a (programs, 4) float32 partial buffer."""
    dweight = torch.empty(3, dtype=dtype, device=partial.device)
    dbias = torch.empty(1, dtype=dtype, device=partial.device)
    n_programs = partial.shape[0]
    block_p = min(triton.next_power_of_2(n_programs), 1024)
    _reduce_kernel[(1,)](partial, dweight, dbias, n_programs, BLOCK_P=block_p, **launch_options)
    return dweight, dbias
