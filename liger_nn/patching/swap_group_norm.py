"""group_norm's module swap: every submodule whose class is exactly ``torch.nn.GroupNorm``
(subclasses are left alone: their forward may differ) becomes a ``liger_nn.GroupNorm``.
No numerical check: the class is exact."""

from __future__ import annotations

from torch import nn

from liger_nn.group_norm import GroupNorm
from liger_nn.patching.module_swaps import exact_class_rule


def _build(old: nn.GroupNorm) -> GroupNorm:
    new = GroupNorm(old.num_groups, old.num_channels, old.eps, old.affine, device="meta", bias=old.bias is not None)
    # Hand over the Parameter objects themselves (None stays None).
    new.weight = old.weight
    new.bias = old.bias
    new.train(old.training)
    return new


RULE = exact_class_rule("group_norm", nn.GroupNorm, GroupNorm, _build)
