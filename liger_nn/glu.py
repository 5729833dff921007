"""Gated MLPs backed by torch.ops.liger.swiglu / geglu / geglu_exact: the
projections stay nn.Linear (cuBLAS matmuls), the elementwise part is one fused op."""

from __future__ import annotations

import torch
from torch import nn

from registrations.eager import eager_call

# The ops, called without the dispatcher's crossing in plain eager calls (registrations/eager.py).
swiglu = eager_call(torch.ops.liger.swiglu)
geglu = eager_call(torch.ops.liger.geglu)
geglu_exact = eager_call(torch.ops.liger.geglu_exact)


class GatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)), transformers' LlamaMLP /
    GemmaMLP layout and state_dict keys."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, *, device=None,
                 dtype=None) -> None:  # fmt: skip
        super().__init__()
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        factory = {"device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)

    @classmethod
    def from_projections(cls, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear) -> GatedMLP:
        """The MLP holding these Linear modules themselves (their Parameters, dtypes and devices)."""
        mlp = cls.__new__(cls)
        nn.Module.__init__(mlp)
        mlp.hidden_size, mlp.intermediate_size = gate_proj.in_features, gate_proj.out_features
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = gate_proj, up_proj, down_proj
        return mlp


class SwiGLUMLP(GatedMLP):
    """silu(gate) * up between the projections (Llama, Mistral, Qwen2/3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class GeGLUMLP(GatedMLP):
    """gelu(gate, approximate='tanh') * up between the projections (Gemma)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(geglu(self.gate_proj(x), self.up_proj(x)))


class GEGLU(nn.Module):
    """diffusers' ``GEGLU`` (``diffusers.models.activations``, the feed-forward of SD 1.5's and SDXL's
    transformer blocks): ``proj`` one nn.Linear to ``2 * dim_out``, whose halves are ``[up | gate]``,
    then ``gelu(gate) * up`` with the exact GELU.  The halves are read in place (geglu_exact takes
    strided rows), so the projection is not copied.  Extra arguments are ignored, as diffusers'
    forward ignores its deprecated ``scale``."""

    def __init__(self, dim_in: int, dim_out: int, bias: bool = True, *, device=None, dtype=None) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2, bias=bias, device=device, dtype=dtype)

    @classmethod
    def from_projection(cls, proj: nn.Linear) -> GEGLU:
        """The module holding this Linear itself (its Parameters, dtype and device)."""
        if proj.out_features % 2:
            raise ValueError(f"GEGLU: proj.out_features must be even ([up | gate] halves), got {proj.out_features}")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.proj = proj
        return module

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        up, gate = self.proj(hidden_states).chunk(2, dim=-1)
        return geglu_exact(gate, up)
