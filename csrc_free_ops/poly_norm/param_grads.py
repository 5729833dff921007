"""The last step of the PolyNorm backward, shared by CUDA and NPU: sum the
per-program float32 partials of (dw_cubic, dw_square, dw_linear, dbias) in
program order and write dweight (3,) and dbias (1,) in the weight's dtype.

One program does it; the partials are a few hundred floats."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from csrc_free_ops.host_math import next_pow2
from csrc_free_ops.launcher import Launcher


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
    # dbias as a scalar: triton-ascend rejects the masked-off negative offsets of DB + idx - 3.
    tl.store(DB, tl.sum(tl.where(idx == 3, sums, 0.0)).to(DB.dtype.element_ty))


@functools.lru_cache(maxsize=64)
def _launcher(block_p: int, options: tuple) -> Launcher:
    return Launcher(_reduce_kernel, BLOCK_P=block_p, **dict(options))


def reduce(partial: torch.Tensor, dtype: torch.dtype, options: tuple = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(dweight (3,), dbias (1,)) from a (programs, 4) float32 partial buffer;
    options: extra launch options as (name, value) pairs."""
    dweight = torch.empty(3, dtype=dtype, device=partial.device)
    dbias = torch.empty(1, dtype=dtype, device=partial.device)
    n_programs = partial.shape[0]
    _launcher(min(next_pow2(n_programs), 1024), options)(1, partial, dweight, dbias, n_programs)
    return dweight, dbias
