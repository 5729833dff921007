"""poly_norm's module swap: every submodule whose class name contains ``PolyNorm`` and that has
``weight`` of shape (3,), a one-element ``bias`` and a float ``eps`` becomes a
``liger_nn.PolyNorm`` sharing those parameters, once its class passed the numerical check."""

from __future__ import annotations

import copy

import torch
from torch import nn

from liger_nn.patching.checks import Skip, close
from liger_nn.patching.module_swaps import ModuleRule
from liger_nn.poly_norm import PolyNorm


def _is_candidate(module: nn.Module) -> bool:
    return "PolyNorm" in type(module).__name__


def _refusal(module: nn.Module) -> str | None:
    weight, bias, eps = (getattr(module, name, None) for name in ("weight", "bias", "eps"))
    if (
        isinstance(weight, torch.Tensor)
        and tuple(weight.shape) == (3,)
        and isinstance(bias, torch.Tensor)
        and bias.numel() == 1
        and bias.dim() <= 1
        and isinstance(eps, float)
    ):
        return None
    return f"{type(module).__qualname__}: no weight (3,), one-element bias and float eps"


def _build(old: nn.Module) -> PolyNorm:
    new = PolyNorm(eps=old.eps)
    new.weight = old.weight
    new.bias = old.bias
    new.train(old.training)
    return new


def _check(old: nn.Module) -> None:
    """The original class and liger's PolyNorm agree on a float32 CPU input."""
    ref = copy.deepcopy(old).to("cpu", torch.float32)
    new = _build(ref)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        try:
            expected = ref(x)
        except Exception as exc:
            raise Skip(f"patch-time check raised {type(exc).__name__}: {exc}") from None
        if not close(new(x), expected):
            raise Skip("patch-time check: liger PolyNorm's output differs from this class's")


def _describe(module: nn.Module) -> str:
    return type(module).__qualname__


RULE = ModuleRule("poly_norm", PolyNorm, _is_candidate, _refusal, _build, _describe, check=_check)
