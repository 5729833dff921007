"""Triton device functions shared by the CUDA and NPU PolyNorm kernels.

They are elementwise with broadcasting, so the same code serves a 1-D row
(scalar statistics) and a 2-D tile of rows (statistics of shape [M, 1]).
With r_k = rsqrt(mean(x^(2k)) + eps) and a_k = w_k * r_k:

    y  = x*(a1 + x*(a2 + x*a3)) + b
    dx = dy*(a1 + 2*a2*x + 3*a3*x^2) - x*(c1 + 2*c2*x^2 + 3*c3*x^4)
    c_k = a_k * r_k^2 * S_k / n,  S_k = sum(dy * x^k)
"""

import triton
import triton.language as tl


@triton.jit
def load_params(W, B):
    """(w_cubic, w_square, w_linear, bias) as float32 scalars."""
    w3 = tl.load(W).to(tl.float32)
    w2 = tl.load(W + 1).to(tl.float32)
    w1 = tl.load(W + 2).to(tl.float32)
    b = tl.load(B).to(tl.float32)
    return w3, w2, w1, b


@triton.jit
def rstds(s2, s4, s6, inv_n, eps):
    """rsqrt(mean(x^2k) + eps) for k = 1, 2, 3 from the sums of x^2, x^4, x^6."""
    r1 = tl.math.rsqrt(s2 * inv_n + eps)
    r2 = tl.math.rsqrt(s4 * inv_n + eps)
    r3 = tl.math.rsqrt(s6 * inv_n + eps)
    return r1, r2, r3


@triton.jit
def backward_coefficients(w1, w2, w3, r1, r2, r3, s1, s2, s3, inv_n):
    """(a1, a2, a3, c1, c2, c3) of ``backward_values``: a_k = w_k * r_k and
    c_k = a_k * r_k^2 * S_k / n."""
    a1 = w1 * r1
    a2 = w2 * r2
    a3 = w3 * r3
    return a1, a2, a3, a1 * r1 * r1 * s1 * inv_n, a2 * r2 * r2 * s2 * inv_n, a3 * r3 * r3 * s3 * inv_n


@triton.jit
def forward_values(x, a1, a2, a3, b):
    return x * (a1 + x * (a2 + x * a3)) + b


@triton.jit
def backward_values(x, dy, a1, a2, a3, c1, c2, c3):
    x2 = x * x
    return dy * (a1 + x * (2.0 * a2 + 3.0 * a3 * x)) - x * (c1 + x2 * (2.0 * c2 + 3.0 * c3 * x2))
