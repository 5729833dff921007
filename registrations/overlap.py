"""Exact memory-overlap tests for the in-place ops' checks.

A tensor's elements sit at ``storage_offset + sum(i_d * stride_d)`` with
``0 <= i_d < size_d``.  Two tensors on one storage overlap when the
difference of their offsets is a sum ``sum(c_g * g)`` over the strides g of
both, each coefficient in a bounded range; a tensor overlaps itself when
zero is such a sum with some coefficient non-zero.  The search below walks
the strides from the largest down, keeping only the coefficients that leave
a remainder the smaller strides can still reach, so on the layouts tensors
have in practice (each stride past the span of the smaller ones: views of
one buffer, slices, transposes, fused QKV projections) it takes one step per
stride.  Layouts whose strides interleave are searched exhaustively up to
MAX_STEPS, past which they count as overlapping.

Sizes may be symbolic (torch.compile traces the checks on fake tensors): they
are read through their hints, adding no guards.  Dynamo guards on which
inputs share a storage and overlap, so a graph traced for disjoint views is
not reused for overlapping ones.
"""

from __future__ import annotations

import functools

import torch

try:  # torch >= 2.12
    from torch.fx.experimental.symbolic_shapes import optimization_hint as _size_hint
except ImportError:  # torch 2.11
    from torch.fx.experimental.symbolic_shapes import hint_int as _size_hint

MAX_STEPS = 100_000


class _Budget:
    def __init__(self) -> None:
        self.steps = 0

    def spend(self) -> bool:
        """False once MAX_STEPS are spent."""
        self.steps += 1
        return self.steps <= MAX_STEPS


def _int(v) -> int:
    return _size_hint(v) if isinstance(v, torch.SymInt) else int(v)


def _layout(t: torch.Tensor) -> tuple[int, list[tuple[int, int]]]:
    """(storage offset, [(stride, size - 1) for dims of size > 1])."""
    dims = [(_int(st), _int(sz) - 1) for st, sz in zip(t.stride(), t.shape, strict=True) if _int(sz) > 1]
    return _int(t.storage_offset()), dims


def _reachable(target: int, gens: list[tuple[int, int, int]], budget: _Budget) -> bool:
    """Whether target == sum(c * g) over gens (g > 0, lo <= c <= hi), gens sorted by g descending."""
    n = len(gens)
    lo_rest = [0] * (n + 1)
    hi_rest = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        g, lo, hi = gens[i]
        lo_rest[i] = lo_rest[i + 1] + lo * g
        hi_rest[i] = hi_rest[i + 1] + hi * g

    def search(i: int, r: int) -> bool:
        if not budget.spend():
            return True
        if i == n:
            return r == 0
        if r < lo_rest[i] or r > hi_rest[i]:
            return False
        g, lo, hi = gens[i]
        first = max(lo, -((hi_rest[i + 1] - r) // g))  # c >= (r - hi_rest) / g
        last = min(hi, (r - lo_rest[i + 1]) // g)  # c <= (r - lo_rest) / g
        return any(search(i + 1, r - c * g) for c in range(first, last + 1))

    return search(0, target)


def _merged(gens: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Generators with equal strides merged (their ranges add), sorted by stride descending."""
    by_stride: dict[int, tuple[int, int]] = {}
    for g, lo, hi in gens:
        a, b = by_stride.get(g, (0, 0))
        by_stride[g] = (a + lo, b + hi)
    return [(g, lo, hi) for g, (lo, hi) in sorted(by_stride.items(), reverse=True)]


def _dense(t: torch.Tensor) -> bool:
    """Whether t's sizes and strides are plain ints laying its elements out
    as a permutation of a contiguous tensor's (one block, each element once):
    the common case, decided without the search (and remembered by layout)."""
    try:
        return _dense_layout(t.shape, t.stride())
    except TypeError:  # symbolic sizes (torch.compile tracing): unhashable
        return False


@functools.lru_cache(maxsize=1024)
def _dense_layout(shape: torch.Size, stride: tuple[int, ...]) -> bool:
    if not all(type(v) is int for v in (*shape, *stride)):
        return False
    expected = 1
    for st, sz in sorted((st, sz) for st, sz in zip(stride, shape, strict=True) if sz != 1):
        if st != expected:
            return False
        expected *= sz
    return True


def self_overlapping(t: torch.Tensor) -> bool:
    """Whether two distinct indices of t address the same element."""
    if _dense(t):
        return False
    if any(_int(size) == 0 for size in t.shape):  # no elements (torch's in-place ops accept these too)
        return False
    _, dims = _layout(t)
    if any(stride == 0 for stride, _ in dims):
        return True
    dims.sort(reverse=True)
    budget = _Budget()
    # The first non-zero coefficient (largest stride first) may be taken positive.
    for i, (stride, top) in enumerate(dims):
        rest = _merged([(g, -m, m) for g, m in dims[i + 1 :]])
        reach = sum(g * m for g, _, m in rest)  # the smaller strides span [-reach, reach]
        if any(_reachable(-c * stride, rest, budget) for c in range(1, min(top, reach // stride) + 1)):
            return True
    return False


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except (NotImplementedError, RuntimeError):  # a backend without Python-visible storage
        return False


def overlapping(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b share at least one element of memory."""
    if a.numel() == 0 or b.numel() == 0 or not _same_storage(a, b):
        return False
    offset_a, dims_a = _layout(a)
    offset_b, dims_b = _layout(b)
    a_bytes, b_bytes = a.element_size(), b.element_size()
    if a_bytes != b_bytes:  # compare in bytes, widening each element to its byte range
        gens = [(s * a_bytes, 0, m) for s, m in dims_a] + [(s * b_bytes, -m, 0) for s, m in dims_b]
        gens += [(1, 0, a_bytes - 1), (1, -(b_bytes - 1), 0)]
        target = offset_b * b_bytes - offset_a * a_bytes
    else:
        gens = [(s, 0, m) for s, m in dims_a] + [(s, -m, 0) for s, m in dims_b]
        target = offset_b - offset_a
    gens = _merged([(g, lo, hi) for g, lo, hi in gens if g > 0])
    return _reachable(target, gens, _Budget())
