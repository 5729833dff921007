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
