"""RMSNorm as a drop-in for transformers' RMSNorm modules (LlamaRMSNorm,
Qwen3's q/k norms, GemmaRMSNorm, OLMo2's), backed by torch.ops.liger.rms_norm."""

from __future__ import annotations

import torch
from torch import nn

from csrc_free_ops.rms_norm.options import CASTING_MODES
from registrations.eager import eager_call

# torch.ops.liger.rms_norm, called without the dispatcher's crossing in plain eager calls (registrations/eager.py).
_RMS_NORM = eager_call(torch.ops.liger.rms_norm)


class RMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2) + eps) * (offset + weight) over the last dim.

    * ``RMSNorm(hidden, eps)``: LlamaRMSNorm (also Qwen2/3, Mistral; Qwen3's
      q_norm/k_norm with ``hidden`` = head_dim): the normalized x rounded to
      x's dtype, then times the weight;
    * ``RMSNorm(hidden, eps, offset=1.0, casting_mode="gemma", init=0.0)``:
      GemmaRMSNorm, ``(1 + weight)`` with everything in float32;
    * ``RMSNorm(hidden, eps, casting_mode="gemma")``: OLMo2's, the weight
      applied in float32 before the cast.

    ``weight`` (hidden,) starts at ``init``; ``elementwise_affine=False``
    has no weight (offset must be 0).  Parameters may stay float32 under
    half-precision activations; y takes x's dtype.  State dict: ``weight``.
    """

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        *,
        offset: float = 0.0,
        casting_mode: str = "llama",
        init: float = 1.0,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if casting_mode not in CASTING_MODES:
            raise ValueError(f"casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}")
        if not elementwise_affine and offset != 0.0:
            raise ValueError(f"offset={offset} scales the weight, but elementwise_affine=False has none")
        self.hidden_size = hidden_size
        self.eps = eps
        self.offset = offset
        self.casting_mode = casting_mode
        self.init = init
        if elementwise_affine:
            self.weight = nn.Parameter(torch.full((hidden_size,), float(init), device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.constant_(self.weight, self.init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset == 0.0 and self.casting_mode == "llama":
            return _RMS_NORM(x, self.weight, self.eps)
        return _RMS_NORM(x, self.weight, self.eps, offset=self.offset, casting_mode=self.casting_mode)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, offset={self.offset}, casting_mode={self.casting_mode!r}"
