"""Integer helpers for launch planning on the host.

Plain Python on purpose: ``triton.cdiv`` and ``triton.next_power_of_2`` are
Triton constexpr functions, several microseconds a call on the host, which
adds up on small, host-bound launches.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(v: int) -> int:
    """The smallest power of two >= v (1 for v <= 1)."""
    return 1 << max(0, v - 1).bit_length()


def prev_pow2(v: int) -> int:
    """The largest power of two <= v (1 for v <= 1)."""
    return 1 << (max(v, 1).bit_length() - 1)
