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

The backward walks the classes instead (``class_slice``) where the chunks
are shorter than CLASS_WALK_BELOW_ROWS rows and there is more than one: for
each slice of the classes, the logits of every row, their gradient,
grad_weight[slice] written once and grad_x accumulated.  A row walk adds
each chunk's g.T @ x_chunk into all of grad_weight, a matmul whose inner
dimension is the chunk's rows: at short chunks it moves V x H elements per
chunk and is memory-bound, which costs more than the class walk's extra
logits matmul (bench/lab/NOTES.md has the H100 figures that set the
threshold).  The slice's logits, all rows by ``class_slice`` classes, take
at most a chunk's memory; a slice narrower than CLASS_MULTIPLE keeps the
row walk.

The CUDA and NPU plans differ only in the cross_entropy plans the kernels
launch with.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from csrc_free_ops.cross_entropy import plan as ce_plan
from csrc_free_ops.host_math import cdiv

MIN_CHUNK_ROWS = 256
ROW_MULTIPLE = 64
FREE_MEMORY_SHARE = 4
CLASS_WALK_BELOW_ROWS = 512
CLASS_MULTIPLE = 64


@functools.lru_cache(maxsize=1024)
def chunk_rows(n_rows: int, hidden: int, n_classes: int, itemsize: int, free_bytes: int | None) -> int:
    rows = max((n_rows * hidden) // n_classes, MIN_CHUNK_ROWS)
    if rows >= ROW_MULTIPLE:
        rows -= rows % ROW_MULTIPLE
    if free_bytes is not None:
        rows = min(rows, free_bytes // (FREE_MEMORY_SHARE * n_classes * itemsize))
    return max(1, min(rows, n_rows))


def class_slice(n_rows: int, rows: int, n_classes: int) -> int:
    """Classes per slice of the backward's class walk, or 0 where it walks the rows (chunks of ``rows``)."""
    if rows >= CLASS_WALK_BELOW_ROWS or rows >= n_rows:
        return 0
    return min(rows * n_classes // n_rows // CLASS_MULTIPLE * CLASS_MULTIPLE, n_classes)


def chunks(n_rows: int, rows: int) -> list[tuple[int, int]]:
    """(start, end) of each chunk, in order."""
    return [(i * rows, min((i + 1) * rows, n_rows)) for i in range(cdiv(n_rows, rows))]


@dataclass(frozen=True)
class Plan:
    """The chunk loop: rows per chunk, and the cross_entropy plan of a full
    chunk's kernels (a shorter last chunk leaves the surplus programs idle);
    the backward's class walk, if any: classes per slice, and the plan of a
    full slice's kernels."""

    chunk_rows: int
    ce: ce_plan.Plan
    class_slice: int = 0  # 0: the backward walks the rows
    class_ce: ce_plan.Plan | None = None


@functools.lru_cache(maxsize=1024)
def cuda(n_rows: int, hidden: int, n_classes: int, itemsize: int, free_bytes: int | None) -> Plan:
    rows = chunk_rows(n_rows, hidden, n_classes, itemsize, free_bytes)
    width = class_slice(n_rows, rows, n_classes)
    return Plan(rows, ce_plan.cuda(rows, n_classes), width, ce_plan.cuda(n_rows, width) if width else None)


@functools.lru_cache(maxsize=1024)
def npu(
    n_rows: int, hidden: int, n_classes: int, itemsize: int, free_bytes: int | None, has_weight: bool,
    ub_bytes: int, vector_cores: int,
) -> Plan:  # fmt: skip
    rows = chunk_rows(n_rows, hidden, n_classes, itemsize, free_bytes)
    width = class_slice(n_rows, rows, n_classes)
    return Plan(
        rows, ce_plan.npu(rows, n_classes, itemsize, has_weight, ub_bytes, vector_cores), width,
        ce_plan.npu(n_rows, width, itemsize, has_weight, ub_bytes, vector_cores) if width else None,
    )  # fmt: skip
