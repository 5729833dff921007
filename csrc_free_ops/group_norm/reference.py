"""Pure-PyTorch GroupNorm: the ground truth for tests and the CPU fallback.

x has shape (N, C, *); the statistics of each (sample, group) pair run over
C // G channels and every spatial position, with the biased variance.  Math
runs in float32 (float64 when x is float64), whatever the parameters'
dtypes; y and dx come back in x's dtype and layout (layout.py) and dweight /
dbias in the dtype of weight / bias.  Both functions are built from differentiable torch ops, so
autograd through ``backward`` gives exact second-order gradients
(registrations/group_norm.py makes the backward op differentiable that way).

``activation`` ("none" or "silu") is applied to the affine output z: y =
silu(z); the backward takes grad_out through it first, dz = grad_out *
silu'(z), with z recomputed from x.
"""

from __future__ import annotations

import math

import torch

from csrc_free_ops.group_norm import layout

ACTIVATIONS = ("none", "silu")


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _grouped(t: torch.Tensor, num_groups: int, ct: torch.dtype) -> torch.Tensor:
    """t as (N, G, elements of one group) in dtype ct."""
    n, c = t.shape[:2]
    return t.to(ct).reshape(n, num_groups, (c // num_groups) * math.prod(t.shape[2:]))


def _channel_view(p: torch.Tensor, x: torch.Tensor, ct: torch.dtype) -> torch.Tensor:
    """A (C,) parameter shaped to broadcast against x."""
    return p.to(ct).reshape((1, -1) + (1,) * (x.dim() - 2))


def _normalized(x: torch.Tensor, num_groups: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(xhat grouped as (N, G, L), rstd of shape (N, G, 1))."""
    xg = _grouped(x, num_groups, _compute_dtype(x))
    mean = xg.mean(-1, keepdim=True)
    var = (xg - mean).square().mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    return (xg - mean) * rstd, rstd


def _affine(xhat: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
            ct: torch.dtype) -> torch.Tensor:  # fmt: skip
    """z = xhat * weight + bias, shaped as x."""
    z = xhat.reshape(x.shape)
    if weight is not None:
        z = z * _channel_view(weight, x, ct)
    if bias is not None:
        z = z + _channel_view(bias, x, ct)
    return z


def forward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    activation: str = "none",
) -> torch.Tensor:
    ct = _compute_dtype(x)
    xhat, _ = _normalized(x, num_groups, eps)
    z = _affine(xhat, x, weight, bias, ct)
    if activation == "silu":
        z = z * torch.sigmoid(z)
    return layout.like(z.to(x.dtype), layout.channels_last(x))


def backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    activation: str = "none",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight or None, dbias or None) from the closed form."""
    ct = _compute_dtype(x)
    xhat, rstd = _normalized(x, num_groups, eps)
    dy = grad_out.to(ct)
    if activation == "silu":
        z = _affine(xhat, x, weight, bias, ct)
        s = torch.sigmoid(z)
        dy = dy * (s * (1 + z * (1 - s)))
    dxhat = dy * _channel_view(weight, x, ct) if weight is not None else dy
    dxhat = _grouped(dxhat, num_groups, ct)
    m1 = dxhat.mean(-1, keepdim=True)
    m2 = (dxhat * xhat).mean(-1, keepdim=True)
    dx = layout.like((rstd * (dxhat - m1 - xhat * m2)).reshape(x.shape).to(x.dtype), layout.channels_last(x))
    per_channel = tuple(d for d in range(x.dim()) if d != 1)
    dweight = None
    if weight is not None:
        dweight = (dy * xhat.reshape(x.shape)).sum(per_channel).to(weight.dtype)
    dbias = dy.sum(per_channel).to(bias.dtype) if bias is not None else None
    return dx, dweight, dbias
