"""apply_liger_ops: the patch kinds in the order they run, and the one call that runs them."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable

from torch import nn

from liger_nn.patching import (
    swap_diffusers_geglu,
    swap_glu,
    swap_group_norm,
    swap_layer_norm,
    swap_poly_norm,
    swap_rms_norm,
)
from liger_nn.patching.fuse_group_norm_silu import fuse_resnet_blocks
from liger_nn.patching.handle import LigerPatch
from liger_nn.patching.module_swaps import ModuleRule, swap_modules
from liger_nn.patching.report import LigerPatchWarning, PatchReport
from liger_nn.patching.rope_table import ROPE_ARCHITECTURES
from liger_nn.patching.swap_causal_lm_loss import patch_causal_lm_loss
from liger_nn.patching.swap_rope import patch_rope

# The module swaps, in the order a module is offered to them (the first that takes it as a
# candidate decides); a new module-swapped op adds its swap_<op>.RULE here.
MODULE_RULES: tuple[ModuleRule, ...] = (
    swap_group_norm.RULE,
    swap_poly_norm.RULE,
    swap_rms_norm.RULE,
    swap_layer_norm.RULE,
    swap_glu.RULE,
    swap_diffusers_geglu.RULE,
)

# Why layer_norm=None leaves a diffusers model's LayerNorms to torch: at their widths there is no GPU time
# to win, and torch's C++ op costs less host time per call than the drop-in's autograd path.
DIFFUSERS_LAYER_NORM = (
    "left to torch in a diffusers model: no GPU time to win at its widths (layer_norm=True routes it)"
)


def _is_diffusers_model(model: nn.Module) -> bool:
    return type(model).__module__.partition(".")[0] == "diffusers"


def _module_rules(model: nn.Module, kinds: dict[str, bool | None]) -> list[ModuleRule]:
    """The module swaps switched on; ``None`` for layer_norm: on, but in a diffusers model every
    LayerNorm is reported as left alone."""
    rules = []
    for rule in MODULE_RULES:
        if kinds[rule.kind] is None and rule.kind == "layer_norm" and _is_diffusers_model(model):
            rule = dataclasses.replace(rule, refusal=lambda module: DIFFUSERS_LAYER_NORM)
        if kinds[rule.kind] is None or kinds[rule.kind]:
            rules.append(rule)
    return rules


def apply_liger_ops(
    model: nn.Module,
    *,
    rope: bool = True,
    group_norm: bool = True,
    poly_norm: bool = True,
    glu: bool = True,
    rms_norm: bool = True,
    layer_norm: bool | None = None,
    fused_linear_cross_entropy: bool = True,
    rope_architectures: Iterable[str] = ROPE_ARCHITECTURES,
    group_norm_silu: bool = True,
) -> LigerPatch:
    """Swap torch.ops.liger into ``model`` (see ``liger_nn.patching`` for what and
    how).  Returns a LigerPatch whose ``report`` lists each replacement and each
    candidate left alone; ``remove()`` (or ``with apply_liger_ops(m):``) undoes it.

    Patch before ``torch.compile`` and before wrapping the model (DDP/FSDP):
    module swaps change the module tree.  The rotary swap covers every model of
    a patched architecture in the process (including copies made later).

    ``layer_norm=None`` (the default) swaps every ``nn.LayerNorm`` except in a
    diffusers model (one whose class comes from the diffusers package), where
    they are reported as left alone: their widths leave no GPU time to win and
    torch's own op costs less host time; ``True`` swaps them there too."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"apply_liger_ops expects an nn.Module, got {type(model).__name__}")
    handle = LigerPatch(model, PatchReport())
    module_kinds = {
        "group_norm": group_norm,
        "poly_norm": poly_norm,
        "glu": glu,
        "rms_norm": rms_norm,
        "layer_norm": layer_norm,
    }
    rules = _module_rules(model, module_kinds)
    try:
        if rope:
            patch_rope(model, frozenset(rope_architectures), handle)
        if rules:
            swap_modules(model, rules, handle)
        if fused_linear_cross_entropy:
            patch_causal_lm_loss(model, handle)
        if group_norm_silu:
            fuse_resnet_blocks(model, handle)
    except BaseException:
        handle.remove()
        raise
    for message in handle.report.warnings:
        warnings.warn(message, LigerPatchWarning, stacklevel=2)
    return handle
