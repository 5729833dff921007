"""Pure-PyTorch LayerNorm: the ground truth for tests and the CPU fallback.

Statistics over the last dim (biased variance) in float32 (float64 for
float64 x), whatever the parameters' dtypes; y rounded once to x's dtype,
dx in x's dtype, dweight / dbias in weight's / bias's.  Built from
differentiable torch ops (second-order gradients through ``backward``).
"""

from __future__ import annotations

import torch

from csrc_free_ops.rms_norm.reference import row_norm_backward, row_norm_forward


def forward(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return row_norm_forward(x, weight, bias, eps, 0.0, True, False)


def backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight, dbias); None where the parameter is."""
    return row_norm_backward(grad_out, x, weight, bias, eps, 0.0, True, False)
