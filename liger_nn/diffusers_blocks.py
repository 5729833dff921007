"""diffusers' ResNet blocks with their GroupNorm -> SiLU pairs fused into
``torch.ops.liger.group_norm(..., activation="silu")``.

diffusers' ``ResnetBlock2D.forward`` (0.30.0 to 0.42.1 alike) runs ``norm1 ->
nonlinearity`` and ``norm2 -> nonlinearity``, with the time embedding added
before norm2 (``time_embedding_norm="default"``), a scale and shift applied
after it (``"scale_shift"``), or neither (VAEs' ``"group"``).  Its ``nonlinearity`` module is also applied to
the time embedding, so it cannot simply become an identity; instead the
block's instance gets ``fused_resnet_forward`` as its ``forward``: the same
steps, each ``norm -> SiLU`` pair one fused call reading the norm module's own
parameters (so ``state_dict``, parameters and the norm modules are
unchanged).  With ``"scale_shift"`` the modulation sits between norm2 and
SiLU, so only norm1's pair is fused there.  Nothing of diffusers is imported:
a block is recognized by its class (``diffusers.models.resnet.ResnetBlock2D``
exactly) and its attributes, and each distinct kind of block is checked
against the class's own forward at patch time (``check``).
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable

import torch
from torch import nn

from liger_nn.group_norm import GroupNorm
from registrations.eager import eager_call

RESNET_CLASS = ("diffusers.models.resnet", "ResnetBlock2D")
# The diffusers releases the tests ran on (tests/test_patching_diffusers.py; both ends of the
# `diffusion` extra by `nox -s diffusers`).  0.30.0's forward differs from 0.42.1's only in making
# the shortcut's input contiguous in training, which leaves the values as they are.
TESTED_DIFFUSERS_VERSIONS: tuple[str, ...] = ("0.30.0", "0.42.1")


def is_resnet_block(module: nn.Module) -> bool:
    cls = type(module)
    return (cls.__module__, cls.__name__) == RESNET_CLASS


def _fusable_norm(norm: nn.Module) -> bool:
    if type(norm) is nn.GroupNorm:
        return True
    return type(norm) is GroupNorm and norm.activation == "none"


def unfusable_reason(block: nn.Module) -> str | None:
    """Why the block's norm -> SiLU pairs cannot be fused, or None."""
    if type(block.nonlinearity) is not nn.SiLU:
        return f"nonlinearity is {type(block.nonlinearity).__name__}, not SiLU"
    for name in ("norm1", "norm2"):
        if not _fusable_norm(getattr(block, name)):
            return f"{name} is a {type(getattr(block, name)).__qualname__}, not a GroupNorm"
    return None


def fused_pairs(block: nn.Module) -> tuple[str, ...]:
    """The norm modules whose SiLU the fused forward folds in."""
    return ("norm1",) if block.time_embedding_norm == "scale_shift" else ("norm1", "norm2")


def kind(block: nn.Module) -> tuple:
    """What decides which code path the block's forward takes."""
    return (type(block), block.time_embedding_norm, block.upsample is None, block.downsample is None,
            block.time_emb_proj is None, block.skip_time_act, block.conv_shortcut is None)  # fmt: skip


# torch.ops.liger.group_norm, called without the dispatcher's crossing in plain eager calls (registrations/eager.py).
_GROUP_NORM = eager_call(torch.ops.liger.group_norm)


def _norm_silu(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return _GROUP_NORM(x, norm.num_groups, norm.weight, norm.bias, norm.eps, activation="silu")


def fused_resnet_forward(self: nn.Module, input_tensor: torch.Tensor, temb: torch.Tensor | None, *args,
                         **kwargs) -> torch.Tensor:  # fmt: skip
    """diffusers' ResnetBlock2D.forward with each norm -> SiLU pair fused."""
    if args or kwargs.get("scale") is not None:  # the deprecated `scale`: the class's own forward warns
        return type(self).forward(self, input_tensor, temb, *args, **kwargs)
    hidden_states = _norm_silu(self.norm1, input_tensor)
    if self.upsample is not None:
        if hidden_states.shape[0] >= 64:  # as diffusers: upsample_nearest_nhwc fails with large batches
            input_tensor = input_tensor.contiguous()
            hidden_states = hidden_states.contiguous()
        input_tensor = self.upsample(input_tensor)
        hidden_states = self.upsample(hidden_states)
    elif self.downsample is not None:
        input_tensor = self.downsample(input_tensor)
        hidden_states = self.downsample(hidden_states)
    hidden_states = self.conv1(hidden_states)
    if self.time_emb_proj is not None:
        if not self.skip_time_act:
            temb = self.nonlinearity(temb)
        temb = self.time_emb_proj(temb)[:, :, None, None]
    if self.time_embedding_norm == "scale_shift":  # the modulation sits between the norm and the SiLU
        if temb is None:
            raise ValueError(f" `temb` should not be None when `time_embedding_norm` is {self.time_embedding_norm}")
        time_scale, time_shift = torch.chunk(temb, 2, dim=1)
        hidden_states = self.norm2(hidden_states)
        hidden_states = self.nonlinearity(hidden_states * (1 + time_scale) + time_shift)
    else:
        if self.time_embedding_norm == "default" and temb is not None:
            hidden_states = hidden_states + temb
        hidden_states = _norm_silu(self.norm2, hidden_states)
    hidden_states = self.dropout(hidden_states)
    hidden_states = self.conv2(hidden_states)
    if self.conv_shortcut is not None:
        if self.training:
            input_tensor = input_tensor.contiguous()
        input_tensor = self.conv_shortcut(input_tensor)
    return (input_tensor + hidden_states) / self.output_scale_factor


def check(block: nn.Module, close: Callable[[torch.Tensor, torch.Tensor], bool]) -> str | None:
    """Run a float32 CPU copy of the block through its class's forward and
    through fused_resnet_forward on a small random input: None if ``close``
    holds, else why not."""
    ref = copy.deepcopy(block).to("cpu", torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, ref.in_channels, 4, 4, generator=gen)
    temb = None
    if ref.time_emb_proj is not None:
        temb = torch.randn(2, ref.time_emb_proj.in_features, generator=gen)
    with torch.no_grad():
        try:
            expected = type(ref).forward(ref, x, temb)
            got = fused_resnet_forward(ref, x, temb)
        except Exception as exc:
            return f"patch-time check raised {type(exc).__name__}: {exc}"
    return None if close(got, expected) else "patch-time check: the fused forward's output differs from the block's"


def fuse(block: nn.Module) -> None:
    block.forward = types.MethodType(fused_resnet_forward, block)


def unfuse(block: nn.Module) -> None:
    if "forward" in block.__dict__:
        del block.forward
