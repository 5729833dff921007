"""Triton device functions shared by the ops' kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rsqrt(v):
    """1 / sqrt(v) in v's dtype.  Triton lowers tl.math.rsqrt of a float64 to
    PTX's rsqrt.approx.f64, an approximation a float64 result must not carry;
    float64 takes the correctly rounded sqrt.rn.f64 and div.rn.f64 instead."""
    if v.dtype == tl.float64:
        r = 1.0 / tl.sqrt(v)
    else:
        r = tl.math.rsqrt(v)
    return r


@triton.jit
def scalar_as(s, dtype: tl.constexpr):
    """The float scalar argument s as a dtype value, for a kernel to convert
    its float parameters to its math dtype on entry.  The kernels declare
    those parameters ``tl.float64`` (Triton types a Python float fp32
    otherwise), so float64 math gets s whole and float32 math rounds it
    once here, as Triton's launch did before; nothing computed from s is
    promoted to float64 (Inductor, launching the kernels from a compiled
    graph, passes a Python float as fp64 too)."""
    return tl.full((), s, dtype)
