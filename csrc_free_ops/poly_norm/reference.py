"""Pure-PyTorch PolyNorm: the ground truth for tests and the CPU fallback.

norm(u) = u * rsqrt(mean(u^2, -1) + eps); weight[0] scales the cubic term,
weight[1] the square and weight[2] the linear one.  Math runs in float32
(float64 when given float64) and results come back in x's dtype.
"""

from __future__ import annotations

import torch


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rstd(u: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    ct = _compute_dtype(x)
    x1 = x.to(ct)
    w = weight.to(ct)
    b = bias.to(ct).reshape(())
    x2 = x1 * x1
    x3 = x2 * x1
    y = w[0] * x3 * _rstd(x3, eps) + w[1] * x2 * _rstd(x2, eps) + w[2] * x1 * _rstd(x1, eps) + b
    return y.to(x.dtype)


def backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight of shape (3,), dbias of shape (1,)) from the closed form."""
    ct = _compute_dtype(x)
    x1 = x.to(ct)
    dy = grad_out.to(ct)
    w = weight.to(ct)
    n = x.shape[-1]
    powers = (x1 * x1 * x1, x1 * x1, x1)  # ordered like weight
    dx = torch.zeros_like(x1)
    dw = []
    for k, u in enumerate(powers):
        r = _rstd(u, eps)
        s = (dy * u).sum(-1, keepdim=True)
        du = w[k] * (r * dy - (r**3 / n) * s * u)
        order = 3 - k  # u = x**order, so du/dx = order * x**(order-1)
        dx = dx + du * order * x1 ** (order - 1)
        dw.append((r * s).sum())
    dweight = torch.stack(dw)
    dbias = dy.sum().reshape(1)
    return dx.to(x.dtype), dweight.to(weight.dtype), dbias.to(weight.dtype)
