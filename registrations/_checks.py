"""Input validation shared by the op registrations, and the dtype policy.

Dtype policy (docs/ops.md, "Dtypes"): data tensors (x, q, k and incoming
gradients) may be float32, bfloat16, float16 or float64; parameters (weight,
bias) and rope's cos/sin may each be any of those, independent of the data.
Math runs in float32, or float64 when the data is float64.

Checks run in the real kernels of every dispatch key and in the fake
kernels, so a bad call fails with the same clear message eagerly and while
torch.compile traces.  They read shapes, dtypes and devices only: they work
on fake and meta tensors too.
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_NAMES = "float32, bfloat16, float16 or float64"


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    """t has one of the dtypes the ops take (data or parameter)."""
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be {_NAMES}, got {t.dtype}")


def check_same_device(op: str, ref_name: str, ref: torch.Tensor, named: tuple[tuple[str, torch.Tensor], ...]) -> None:
    """Each (name, tensor) of ``named`` is on ref's device."""
    device = ref.device
    for name, t in named:
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but {ref_name} is on {device}; they must match")


def check_params(op: str, ref_name: str, ref: torch.Tensor, named: tuple[tuple[str, torch.Tensor], ...]) -> None:
    """Each (name, tensor) of ``named`` is a float tensor on ref's device (any float dtype)."""
    for name, t in named:
        check_float(op, name, t)
    check_same_device(op, ref_name, ref, named)


def check_grad(op: str, name: str, grad: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """An incoming gradient: a float tensor with ref's shape, on ref's device."""
    check_float(op, name, grad)
    if grad.shape != ref.shape:
        raise ValueError(f"{op}: {name} shape {tuple(grad.shape)} != {ref_name} shape {tuple(ref.shape)}")
    check_same_device(op, ref_name, ref, ((name, grad),))


def check_eps(op: str, eps: float) -> None:
    if not eps >= 0.0 or eps == float("inf"):
        raise ValueError(f"{op}: eps must be a finite number >= 0, got {eps}")
