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


def _from_diffusers(module: nn.Module) -> bool:
    """Whether the module's class is diffusers' or derives from one of diffusers' classes."""
    return any(cls.__module__.partition(".")[0] == "diffusers" for cls in type(module).__mro__)


def _under_diffusers(model: nn.Module) -> set[int]:
    """The ids of the modules inside a diffusers module of ``model`` (the model itself, or a part of
    a wrapper, such as the UNet beside a transformers text encoder)."""
    inside: set[int] = set()
    for module in model.modules():
        if id(module) not in inside and _from_diffusers(module):
            inside.update(id(m) for m in module.modules())
    return inside


def _left_in_diffusers(rule: ModuleRule, inside: set[int]) -> ModuleRule:
    def refusal(module: nn.Module) -> str | None:
        return DIFFUSERS_LAYER_NORM if id(module) in inside else rule.refusal(module)

    return dataclasses.replace(rule, refusal=refusal)


def _module_rules(model: nn.Module, kinds: dict[str, bool | None]) -> list[ModuleRule]:
    """The module swaps switched on; ``None`` for layer_norm: on, but every LayerNorm inside a
    diffusers module is reported as left alone."""
    rules = []
    for rule in MODULE_RULES:
        if kinds[rule.kind] is None and rule.kind == "layer_norm":
            rule = _left_in_diffusers(rule, _under_diffusers(model))
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

    ``layer_norm=None`` (the default) swaps every ``nn.LayerNorm`` except inside
    a diffusers module (one whose class is, or derives from, a diffusers
    class), where they are reported as left alone: their widths leave no GPU
    time to win and torch's own op costs less host time; ``True`` swaps them
    there too."""
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
