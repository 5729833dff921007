"""How fused_linear_cross_entropy walks its rows: the chunk size.

A chunk of ``rows`` rows holds a (rows, V) logits buffer in x's dtype (the
backward turns it into the logits' gradient in place).  The rows:

1. as many as make the buffer no larger than x itself (BT * H elements, so
   the loss at most doubles the memory of its input: upstream Liger-Kernel's
   rule), at least MIN_CHUNK_ROWS (tall enough for efficient matmuls), at
   most BT;
2. rounded down to a multiple of ROW_MULTIPLE (tensor-core tiles) where
   that leaves any;
3. at most what a 1 / FREE_MEMORY_SHARE share of the device's free memory
   holds (the backward adds grad_x and grad_weight beside it), never below
   one row.

The CUDA and NPU plans differ only in the cross_entropy plan each chunk's
kernels launch with.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from csrc_free_ops.cross_entropy import plan as ce_plan
from csrc_free_ops.host_math import cdiv

MIN_CHUNK_ROWS = 256
ROW_MULTIPLE = 64
FREE_MEMORY_SHARE = 4


@functools.lru_cache(maxsize=1024)
def chunk_rows(n_rows: int, hidden: int, n_classes: int, itemsize: int, free_bytes: int | None) -> int:
    rows = max((n_rows * hidden) // n_classes, MIN_CHUNK_ROWS)
    if rows >= ROW_MULTIPLE:
        rows -= rows % ROW_MULTIPLE
    if free_bytes is not None:
        rows = min(rows, free_bytes // (FREE_MEMORY_SHARE * n_classes * itemsize))
    return max(1, min(rows, n_rows))


def chunks(n_rows: int, rows: int) -> list[tuple[int, int]]:
    """(start, end) of each chunk, in order."""
    return [(i * rows, min((i + 1) * rows, n_rows)) for i in range(cdiv(n_rows, rows))]


@dataclass(frozen=True)
class Plan:
    """The chunk loop: rows per chunk, and the cross_entropy plan of a full
    chunk's kernels (a shorter last chunk leaves the surplus programs idle)."""

    chunk_rows: int
    ce: ce_plan.Plan


@functools.lru_cache(maxsize=1024)
def cuda(n_rows: int, hidden: int, n_classes: int, itemsize: int, free_bytes: int | None) -> Plan:
    rows = chunk_rows(n_rows, hidden, n_classes, itemsize, free_bytes)
    return Plan(rows, ce_plan.cuda(rows, n_classes))


@functools.lru_cache(maxsize=1024)
def npu(
    n_rows: int, hidden: int, n_classes: int, itemsize: int, free_bytes: int | None, has_weight: bool,
    ub_bytes: int, vector_cores: int,
) -> Plan:  # fmt: skip
    rows = chunk_rows(n_rows, hidden, n_classes, itemsize, free_bytes)
    return Plan(rows, ce_plan.npu(rows, n_classes, itemsize, has_weight, ub_bytes, vector_cores))
