"""What a group_norm tile costs of the Ascend unified buffer (UB): bytes per
tile element of each kernel, and the largest tile a budget holds."""

from __future__ import annotations

from csrc_free_ops.host_math import prev_pow2

# NPU UB cost model (bytes per tile element; s = x's element size, c = the
# compute dtype's).  Budgets (the Ascend compile check, docs/npu.md): the whole
# UB for whole groups, half of it for the rest (triton-ascend double-buffers):
#   whole forward    x, y (2s) + x, x - mean, y (3c)            2s + 3c
#   whole backward   x, dy, dx (3s) + five arrays (5c)           3s + 5c
#   split forward    max(partials s + 4c, apply 2s + 2c)
#   split backward   max(partials 2s + 7c, dx 3s + 4c)
#   merge            seven vectors (7c); reduce: four (4c)
# An activation adds one compute array (z, or its sigmoid) to each tile kernel.
# Whole groups get the whole UB because bishengir's UB plan (multi-buffering
# included) fits whole-group tiles twice the half budget's.


def npu_tile(bytes_per_element: int, ub_bytes: int) -> int:
    """Largest power-of-two element count that fits half the UB (at least 1)."""
    return prev_pow2(max(1, ub_bytes // 2 // bytes_per_element))


def npu_whole_tile(itemsize: int, compute: int, backward: bool, activation: str, ub_bytes: int) -> int:
    """Largest power-of-two element count of a whole-group tile: the whole UB (at least 1)."""
    return prev_pow2(max(1, ub_bytes // npu_whole_bytes(itemsize, compute, backward, activation)))


def npu_whole_bytes(itemsize: int, compute: int, backward: bool, activation: str = "none") -> int:
    extra = 0 if activation == "none" else compute
    return extra + (3 * itemsize + 5 * compute if backward else 2 * itemsize + 3 * compute)


def npu_split_bytes(itemsize: int, compute: int, backward: bool, activation: str = "none") -> int:
    extra = 0 if activation == "none" else compute
    if backward:
        return extra + max(2 * itemsize + 7 * compute, 3 * itemsize + 4 * compute)
    return extra + max(itemsize + 4 * compute, 2 * itemsize + 2 * compute)
