"""The gated MLPs' module swap: every submodule with ``gate_proj``, ``up_proj`` and
``down_proj`` nn.Linear children and an ``act_fn`` that is SiLU (Llama, Mistral, Qwen2/3, ...)
or GELU's tanh approximation (Gemma's gelu_pytorch_tanh) becomes a ``liger_nn.SwiGLUMLP`` /
``liger_nn.GeGLUMLP`` holding the *same* Linear modules, once its class passed the numerical
check (which also catches a forward other than down(act(gate(x)) * up(x)))."""

from __future__ import annotations

import copy

import torch
from torch import nn

from liger_nn.glu import GatedMLP, GeGLUMLP, SwiGLUMLP
from liger_nn.patching.checks import check_agreement
from liger_nn.patching.module_swaps import ModuleRule

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# transformers' ACT2FN classes by activation, besides torch's own modules.
SILU_CLASSES = ("SiLUActivation",)
GELU_TANH_CLASSES = ("GELUTanh", "PytorchGELUTanh")


def activation_kind(act: object) -> str | None:
    """ "silu", "gelu_tanh" or None for a module's ``act_fn``."""
    name = type(act).__name__
    if isinstance(act, nn.SiLU) or name in SILU_CLASSES:
        return "silu"
    if (isinstance(act, nn.GELU) and act.approximate == "tanh") or name in GELU_TANH_CLASSES:
        return "gelu_tanh"
    return None


def _is_candidate(module: nn.Module) -> bool:
    return all(hasattr(module, name) for name in PROJECTIONS) and hasattr(module, "act_fn")


def _refusal(module: nn.Module) -> str | None:
    if not all(type(getattr(module, name)) is nn.Linear for name in PROJECTIONS):
        return f"{type(module).__qualname__}: gate_proj, up_proj and down_proj are not all nn.Linear"
    if activation_kind(module.act_fn) is None:
        return f"{type(module).__qualname__}: act_fn {type(module.act_fn).__qualname__} is neither SiLU nor tanh GELU"
    return None


def _build(old: nn.Module) -> nn.Module:
    cls = SwiGLUMLP if activation_kind(old.act_fn) == "silu" else GeGLUMLP
    new = cls.from_projections(old.gate_proj, old.up_proj, old.down_proj)
    new.train(old.training)
    return new


def _check(old: nn.Module) -> None:
    """The original class and the drop-in agree on a float32 CPU input."""
    ref = copy.deepcopy(old).to("cpu", torch.float32)
    x = torch.randn(4, ref.gate_proj.in_features, generator=torch.Generator().manual_seed(0))
    check_agreement(ref, _build(ref), x, "the fused gated MLP")


def _describe(module: nn.Module) -> str:
    kind = "SwiGLUMLP" if activation_kind(module.act_fn) == "silu" else "GeGLUMLP"
    return f"{type(module).__qualname__} -> {kind}"


RULE = ModuleRule("glu", GatedMLP, _is_candidate, _refusal, _build, _describe, check=_check)
