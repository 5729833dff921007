"""GroupNorm as a drop-in for torch.nn.GroupNorm, backed by torch.ops.liger.group_norm."""

from __future__ import annotations

import torch
from torch import nn

from csrc_free_ops.group_norm.reference import ACTIVATIONS
from registrations.eager import eager_call

# torch.ops.liger.group_norm, called without the dispatcher's crossing in plain eager calls (registrations/eager.py).
_GROUP_NORM = eager_call(torch.ops.liger.group_norm)


class GroupNorm(nn.Module):
    """torch.nn.GroupNorm's signature (with its keyword-only ``bias``),
    parameters (``weight`` ones, ``bias`` zeros, both (num_channels,)) and state_dict keys, so its checkpoints load
    unchanged.  Parameters may stay float32 under half-precision activations.  ``activation="silu"`` (keyword-only)
    returns silu(group_norm(x)) from one fused op, forward and backward."""

    __constants__ = ["num_groups", "num_channels", "eps", "affine", "activation"]

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
        activation: str = "none",
    ) -> None:
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups != 0:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.empty(num_channels, device=device, dtype=dtype))
            if bias:
                self.bias = nn.Parameter(torch.empty(num_channels, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.affine:
            nn.init.ones_(self.weight)
            if self.bias is not None:
                nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation == "none":
            return _GROUP_NORM(x, self.num_groups, self.weight, self.bias, self.eps)
        return _GROUP_NORM(x, self.num_groups, self.weight, self.bias, self.eps, activation=self.activation)

    def extra_repr(self) -> str:
        # The installed torch's own format, so reprs match across torch versions.
        base = nn.GroupNorm.extra_repr(self)
        return base if self.activation == "none" else f"{base}, activation={self.activation!r}"
