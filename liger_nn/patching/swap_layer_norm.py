"""layer_norm's module swap: every submodule whose class is exactly ``torch.nn.LayerNorm``
(subclasses are left alone: their forward may differ) becomes a ``liger_nn.LayerNorm`` holding
the same Parameter objects.  No numerical check: the class is exact."""

from __future__ import annotations

from torch import nn

from liger_nn.layer_norm import LayerNorm
from liger_nn.patching.module_swaps import exact_class_rule


def _build(old: nn.LayerNorm) -> LayerNorm:
    new = LayerNorm(old.normalized_shape, old.eps, old.elementwise_affine, bias=old.bias is not None, device="meta")
    # Hand over the Parameter objects themselves (None stays None).
    new.weight = old.weight
    new.bias = old.bias
    new.train(old.training)
    return new


RULE = exact_class_rule("layer_norm", nn.LayerNorm, LayerNorm, _build)
