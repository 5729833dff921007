"""group_norm_silu: every diffusers ``ResnetBlock2D`` whose norms are GroupNorms and whose
nonlinearity is SiLU runs each norm -> SiLU pair as one ``group_norm(..., activation="silu")``
call (``liger_nn.diffusers_blocks``: an instance ``forward``; norm2's pair only with the default
time embedding).  Each distinct kind of block is checked against its class's forward first."""

from __future__ import annotations

import functools

from torch import nn

from liger_nn import diffusers_blocks
from liger_nn.patching.checks import close
from liger_nn.patching.handle import LigerPatch
from liger_nn.patching.report import Replacement


def fuse_resnet_blocks(model: nn.Module, handle: LigerPatch) -> None:
    report = handle.report
    checked: dict[tuple, str | None] = {}  # kind of block -> why its check failed, or None
    for qualname, module in model.named_modules():
        if not diffusers_blocks.is_resnet_block(module):
            continue
        reason = diffusers_blocks.unfusable_reason(module)
        if reason is None:
            kind = diffusers_blocks.kind(module)
            if kind not in checked:
                checked[kind] = diffusers_blocks.check(module, close)
            reason = checked[kind]
        if reason is not None:
            report.left_alone.append(Replacement("group_norm_silu", qualname, f"ResnetBlock2D: {reason}"))
            continue
        diffusers_blocks.fuse(module)
        handle.on_remove(functools.partial(diffusers_blocks.unfuse, module))
        pairs = " and ".join(f"{name} -> SiLU" for name in diffusers_blocks.fused_pairs(module))
        report.replaced.append(Replacement("group_norm_silu", qualname, f"ResnetBlock2D: {pairs} fused"))
