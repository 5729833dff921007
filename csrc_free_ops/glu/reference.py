"""Pure-PyTorch gated linear units: the ground truth for tests and the CPU fallback.

y = act(gate) * up, act one of ACTIVATIONS:

* ``"silu"``: silu(g) = g * sigmoid(g) (SwiGLU);
* ``"gelu_tanh"``: gelu(g, approximate='tanh') = 0.5 * g * (1 + tanh(z)),
  z = sqrt(2/pi) * (g + 0.044715 * g^3) (GeGLU as Gemma has it);
* ``"gelu"``: gelu(g) = 0.5 * g * (1 + erf(g / sqrt(2))), torch's exact GELU
  (GeGLU as diffusers' UNets have it).

Math runs in float32, float64 when gate or up is float64 (the Python
constants then multiply float64 tensors, so they stay double); y takes
torch.promote_types(gate.dtype, up.dtype), as ``act(gate) * up`` does in
torch, and each gradient its input's dtype.
"""

from __future__ import annotations

import math

import torch

ACTIVATIONS = ("silu", "gelu_tanh", "gelu")
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715
INV_SQRT_2 = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def output_dtype(gate: torch.Tensor, up: torch.Tensor) -> torch.dtype:
    return torch.promote_types(gate.dtype, up.dtype)


def activate(g: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "silu":
        return g * torch.sigmoid(g)
    if activation == "gelu_tanh":
        return 0.5 * g * (1.0 + torch.tanh(SQRT_2_OVER_PI * (g + GELU_CUBIC * g * g * g)))
    if activation == "gelu":
        return 0.5 * g * (1.0 + torch.erf(g * INV_SQRT_2))
    raise ValueError(f"unknown activation {activation!r}; choose from {', '.join(ACTIVATIONS)}")


def activation_grad(g: torch.Tensor, activation: str) -> torch.Tensor:
    """d act / d g."""
    if activation == "silu":
        s = torch.sigmoid(g)
        return s * (1.0 + g * (1.0 - s))
    if activation == "gelu_tanh":
        t = torch.tanh(SQRT_2_OVER_PI * (g + GELU_CUBIC * g * g * g))
        dz = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * g * g)
        return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * dz
    if activation == "gelu":
        return 0.5 * (1.0 + torch.erf(g * INV_SQRT_2)) + g * INV_SQRT_2PI * torch.exp(-0.5 * g * g)
    raise ValueError(f"unknown activation {activation!r}; choose from {', '.join(ACTIVATIONS)}")


def forward(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    ct = compute_dtype(gate, up)
    # contiguous, as the kernels' outputs (elementwise ops on strided inputs keep the inputs' layout)
    return (activate(gate.to(ct), activation) * up.to(ct)).to(output_dtype(gate, up)).contiguous()


def backward(
    grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup) in gate's and up's dtypes, from the closed form."""
    ct = compute_dtype(gate, up)
    g, u, dy = gate.to(ct), up.to(ct), grad_out.to(ct)
    dgate = dy * activation_grad(g, activation) * u
    dup = dy * activate(g, activation)
    return dgate.to(gate.dtype).contiguous(), dup.to(up.dtype).contiguous()


def backward_(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str) -> None:
    """backward's dgate written over gate and dup over up."""
    dgate, dup = backward(grad_out, gate, up, activation)
    gate.copy_(dgate)
    up.copy_(dup)
