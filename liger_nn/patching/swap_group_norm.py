"""group_norm's module swap: every submodule whose class is exactly ``torch.nn.GroupNorm``
(subclasses are left alone: their forward may differ) becomes a ``liger_nn.GroupNorm``.
No numerical check: the class is exact."""

from __future__ import annotations

from torch import nn

from liger_nn.group_norm import GroupNorm
from liger_nn.patching.module_swaps import ModuleRule


def _is_candidate(module: nn.Module) -> bool:
    return isinstance(module, nn.GroupNorm)


def _refusal(module: nn.Module) -> str | None:
    if type(module) is not nn.GroupNorm:
        return f"{type(module).__qualname__} subclasses nn.GroupNorm"
    return None


def _build(old: nn.GroupNorm) -> GroupNorm:
    new = GroupNorm(old.num_groups, old.num_channels, old.eps, old.affine, device="meta", bias=old.bias is not None)
    # Hand over the Parameter objects themselves (None stays None).
    new.weight = old.weight
    new.bias = old.bias
    new.train(old.training)
    return new


def _describe(module: nn.Module) -> str:
    return f"nn.{module!r}"


RULE = ModuleRule("group_norm", GroupNorm, _is_candidate, _refusal, _build, _describe)
