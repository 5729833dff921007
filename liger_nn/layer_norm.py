"""LayerNorm as a drop-in for torch.nn.LayerNorm, backed by torch.ops.liger.layer_norm."""

from __future__ import annotations

import math

import torch
from torch import nn

from registrations.eager import eager_call

# torch.ops.liger.layer_norm, called without the dispatcher's crossing in plain eager calls (registrations/eager.py).
_LAYER_NORM = eager_call(torch.ops.liger.layer_norm)


class LayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm itself (signature, parameters, initialisation,
    state_dict keys and isinstance), with the forward on the liger op.  A
    multi-dimensional ``normalized_shape`` is normalised as one flattened
    last dim.  Parameters may stay float32 under half-precision activations;
    y takes x's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = self.normalized_shape
        if len(shape) == 1:
            return _LAYER_NORM(x, self.weight, self.bias, self.eps)
        if tuple(x.shape[x.dim() - len(shape) :]) != tuple(shape):
            raise ValueError(f"LayerNorm: x's trailing dims {tuple(x.shape)} do not match normalized_shape {shape}")
        flat = x.reshape(*x.shape[: x.dim() - len(shape)], math.prod(shape))
        weight = None if self.weight is None else self.weight.reshape(-1)
        bias = None if self.bias is None else self.bias.reshape(-1)
        return _LAYER_NORM(flat, weight, bias, self.eps).reshape(x.shape)
