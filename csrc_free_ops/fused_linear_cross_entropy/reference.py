"""Pure-PyTorch fused linear cross-entropy: the ground truth for tests and
the CPU fallback.  The logits x @ weight.T + bias are computed whole, in the
compute dtype (float32, float64 for float64 x); the loss is
cross_entropy's reference on them.  ``backward`` is built from
differentiable torch ops (second-order gradients through it are exact)."""

from __future__ import annotations

import torch

from csrc_free_ops.cross_entropy import reference as ce
from csrc_free_ops.cross_entropy.reference import Options


def logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    ct = ce.compute_dtype(x)
    out = x.to(ct) @ weight.to(ct).t()
    return out if bias is None else out + bias.to(ct)


def forward(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
    ce_weight: torch.Tensor | None, o: Options,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(loss, z_loss, lse), loss and z_loss in the compute dtype."""
    return ce.forward(logits(x, weight, bias), target, ce_weight, o)


def backward(
    grad_loss: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
    bias: torch.Tensor | None, ce_weight: torch.Tensor | None, o: Options, output_mask: tuple[bool, bool, bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    """(grad_x, grad_weight, grad_bias), None where output_mask says so."""
    ct = ce.compute_dtype(x)
    g = ce.backward(grad_loss, logits(x, weight, bias), target, lse, ce_weight, o)
    grad_x = (g @ weight.to(ct)).to(x.dtype) if output_mask[0] else None
    grad_weight = (g.t() @ x.to(ct)).to(weight.dtype) if output_mask[1] else None
    grad_bias = g.sum(0).to(bias.dtype) if output_mask[2] and bias is not None else None
    return grad_x, grad_weight, grad_bias


def forward_with_grads(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
    ce_weight: torch.Tensor | None, o: Options, output_mask: tuple[bool, bool, bool],
) -> tuple[torch.Tensor | None, ...]:  # fmt: skip
    """forward's three outputs, then backward's three for a grad_loss of ones."""
    loss, z_loss, lse = forward(x, weight, target, bias, ce_weight, o)
    grads = backward(torch.ones_like(loss), x, weight, target, lse, bias, ce_weight, o, output_mask)
    return (loss, z_loss, lse, *grads)
