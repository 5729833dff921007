"""Pure-PyTorch rotary embedding: the ground truth for tests and the CPU
fallback.

With h = R/2, x_lo = x[..., :h] and x_hi = x[..., h:R], HF's formula
x*cos + rotate_half(x)*sin reads

    y_lo = x_lo*cos_lo - x_hi*sin_lo
    y_hi = x_hi*cos_hi + x_lo*sin_hi

and the backward is its transpose (the inverse rotation when the two halves
of cos and sin repeat, as HF builds them):

    dx_lo = dy_lo*cos_lo + dy_hi*sin_hi
    dx_hi = dy_hi*cos_hi - dy_lo*sin_lo

Dims R..D pass through.  Math runs in float32, float64 when the data is
float64; outputs come back in each input's dtype and memory layout.
"""

from __future__ import annotations

import torch


def compute_dtype(*data: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in data) else torch.float32


def _broadcast(table: torch.Tensor, ct: torch.dtype) -> torch.Tensor:
    """(S, R), (1, S, R) or (B, S, R) -> (B or 1, 1, S, R) for (B, H, S, D) inputs."""
    if table.dim() == 2:
        table = table.unsqueeze(0)
    return table.unsqueeze(1).to(ct)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool, ct: torch.dtype) -> torch.Tensor:
    c = _broadcast(cos, ct)
    s = _broadcast(sin, ct)
    rot = c.shape[-1]
    h = rot // 2
    x1 = x.to(ct)
    lo, hi = x1[..., :h], x1[..., h:rot]
    if inverse:
        y_lo = lo * c[..., :h] + hi * s[..., h:]
        y_hi = hi * c[..., h:] - lo * s[..., :h]
    else:
        y_lo = lo * c[..., :h] - hi * s[..., :h]
        y_hi = hi * c[..., h:] + lo * s[..., h:]
    return torch.cat((y_lo, y_hi, x1[..., rot:]), dim=-1)


def _like(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """values in x's dtype and memory layout (what the Triton launches return)."""
    out = torch.empty_like(x)
    out.copy_(values)
    return out


def forward(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    ct = compute_dtype(q, k)
    return _like(q, _rotate(q, cos, sin, False, ct)), _like(k, _rotate(k, cos, sin, False, ct))


def backward(
    dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    ct = compute_dtype(dq, dk)
    return _like(dq, _rotate(dq, cos, sin, True, ct)), _like(dk, _rotate(dk, cos, sin, True, ct))


def forward_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    ct = compute_dtype(q, k)
    q.copy_(_rotate(q, cos, sin, False, ct))
    k.copy_(_rotate(k, cos, sin, False, ct))
