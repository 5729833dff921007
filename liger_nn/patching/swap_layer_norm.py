"""layer_norm's module swap: every submodule whose class is exactly ``torch.nn.LayerNorm``
(subclasses are left alone: their forward may differ) becomes a ``liger_nn.LayerNorm`` holding
the same Parameter objects.  No numerical check: the class is exact."""

from __future__ import annotations

from torch import nn

from liger_nn.layer_norm import LayerNorm
from liger_nn.patching.module_swaps import ModuleRule


def _is_candidate(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm)


def _refusal(module: nn.Module) -> str | None:
    if type(module) is not nn.LayerNorm:
        return f"{type(module).__qualname__} subclasses nn.LayerNorm"
    return None


def _build(old: nn.LayerNorm) -> LayerNorm:
    new = LayerNorm(old.normalized_shape, old.eps, old.elementwise_affine, bias=old.bias is not None, device="meta")
    # Hand over the Parameter objects themselves (None stays None).
    new.weight = old.weight
    new.bias = old.bias
    new.train(old.training)
    return new


def _describe(module: nn.Module) -> str:
    return f"nn.{module!r}"


RULE = ModuleRule("layer_norm", LayerNorm, _is_candidate, _refusal, _build, _describe)
