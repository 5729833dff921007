"""Input validation shared by the op registrations.

Checks run in both the real and the fake kernels, so a bad call fails with
the same clear message eagerly and while torch.compile traces."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_float_dtype(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float32, bfloat16 or float16, got {t.dtype}")


def check_all_like(op: str, ref_name: str, ref: torch.Tensor, named: tuple[tuple[str, torch.Tensor], ...]) -> None:
    """Each (name, tensor) of ``named`` has ref's dtype and device."""
    dtype, device = ref.dtype, ref.device
    for name, t in named:
        if t.dtype != dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but {ref_name} has {dtype}; they must match")
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but {ref_name} is on {device}; they must match")


def check_eps(op: str, eps: float) -> None:
    if not eps >= 0.0 or eps == float("inf"):
        raise ValueError(f"{op}: eps must be a finite number >= 0, got {eps}")
