"""PolyNorm as an nn.Module (PolyCom / Motif-2.6B), backed by torch.ops.liger.poly_norm."""

from __future__ import annotations

import torch
from torch import nn

from registrations.eager import eager_call

# torch.ops.liger.poly_norm, called without the dispatcher's crossing in plain eager calls (registrations/eager.py).
_POLY_NORM = eager_call(torch.ops.liger.poly_norm)


class PolyNorm(nn.Module):
    """y = w0*norm(x^3) + w1*norm(x^2) + w2*norm(x) + b, norm over the last dim.

    Parameters ``weight`` (3,), initialised to 1/3, and ``bias`` (1,), zeros.
    x may have any float dtype, independent of the parameters' (float32
    master weights under bfloat16 activations); y takes x's dtype.
    """

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3.0))
        self.bias = nn.Parameter(torch.zeros(1))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _POLY_NORM(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"
