"""Pure-PyTorch row norms (RMSNorm here, LayerNorm's reference builds on it):
the ground truth for tests and the CPU fallback.

Statistics run over the last dim in float32 (float64 for float64 x),
whatever the parameters' dtypes.  With ``center`` the mean is subtracted
(LayerNorm); ``round_normed`` rounds the normalized x to x's dtype before
the weight (transformers' Llama casting).  Outputs come back in x's dtype,
each parameter's gradient in its dtype.  Both functions are built from
differentiable torch ops, so autograd through ``backward`` gives exact
second-order gradients.
"""

from __future__ import annotations

import torch

from csrc_free_ops.rms_norm.options import Options


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def normalized(x: torch.Tensor, eps: float, center: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(xhat, rstd) of x's rows in the compute dtype; rstd has shape (..., 1)."""
    xc = x.to(compute_dtype(x))
    if center:
        xc = xc - xc.mean(-1, keepdim=True)
    rstd = torch.rsqrt(xc.square().mean(-1, keepdim=True) + eps)
    return xc * rstd, rstd


def _scale(xhat: torch.Tensor, x: torch.Tensor, round_normed: bool) -> torch.Tensor:
    """xhat as the weight sees it: rounded to x's dtype under Llama's casting."""
    return xhat.to(x.dtype).to(xhat.dtype) if round_normed else xhat


def row_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    offset: float,
    center: bool,
    round_normed: bool,
) -> torch.Tensor:
    ct = compute_dtype(x)
    xhat, _ = normalized(x, eps, center)
    y = _scale(xhat, x, round_normed)
    if weight is not None:
        y = y * (offset + weight.to(ct))
    if bias is not None:
        y = y + bias.to(ct)
    return y.to(x.dtype)


def _row_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum over every row, shape (H,) (a 1-D t is one row: sum over no dims would sum all)."""
    return t.reshape(-1, t.shape[-1]).sum(0)


def row_norm_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    offset: float,
    center: bool,
    round_normed: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight, dbias) in closed form; the rounding of Llama's casting passes gradients through."""
    ct = compute_dtype(x)
    n = x.shape[-1]
    dy = grad_out.to(ct)
    xhat, rstd = normalized(x, eps, center)
    g = dy * (offset + weight.to(ct)) if weight is not None else dy
    dx = g - xhat * (g * xhat).sum(-1, keepdim=True) / n
    if center:
        dx = dx - g.sum(-1, keepdim=True) / n
    dx = dx * rstd
    dweight = _row_sum(dy * _scale(xhat, x, round_normed)).to(weight.dtype) if weight is not None else None
    dbias = _row_sum(dy).to(bias.dtype) if bias is not None else None
    return dx.to(x.dtype), dweight, dbias


def forward(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float = 0.0, casting_mode: str = "llama"
) -> torch.Tensor:
    o = Options(eps, offset, casting_mode)
    return row_norm_forward(x, weight, None, o.eps, o.offset, False, o.round_normed)


def backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dx, dweight); dweight is None without a weight."""
    o = Options(eps, offset, casting_mode)
    dx, dweight, _ = row_norm_backward(grad_out, x, weight, None, o.eps, o.offset, False, o.round_normed)
    return dx, dweight
