"""diffusers' GEGLU module swap: every submodule whose class is exactly
``diffusers.models.activations.GEGLU`` with an nn.Linear ``proj`` becomes a ``liger_nn.GEGLU``
holding the same Linear, once its class passed the numerical check (which also catches a forward
other than ``up * gelu(gate)``, such as diffusers' torch_npu branch, whose GELU is the tanh one).
Nothing of diffusers is imported: the class is recognized by its module and name."""

from __future__ import annotations

import copy

import torch
from torch import nn

from liger_nn.glu import GEGLU
from liger_nn.patching.checks import check_agreement
from liger_nn.patching.module_swaps import ModuleRule

GEGLU_CLASS = ("diffusers.models.activations", "GEGLU")


def _is_candidate(module: nn.Module) -> bool:
    cls = type(module)
    return (cls.__module__, cls.__name__) == GEGLU_CLASS


def _refusal(module: nn.Module) -> str | None:
    proj = getattr(module, "proj", None)
    if type(proj) is not nn.Linear:
        return "GEGLU: proj is not an nn.Linear"
    if proj.out_features % 2:
        return f"GEGLU: proj.out_features {proj.out_features} is odd"
    return None


def _build(old: nn.Module) -> nn.Module:
    new = GEGLU.from_projection(old.proj)
    new.train(old.training)
    return new


def _check(old: nn.Module) -> None:
    """The original class and the drop-in agree on a float32 CPU input."""
    ref = copy.deepcopy(old).to("cpu", torch.float32)
    x = torch.randn(2, 3, ref.proj.in_features, generator=torch.Generator().manual_seed(0))
    check_agreement(ref, _build(ref), x, "the fused GEGLU")


def _describe(module: nn.Module) -> str:
    return f"GEGLU(proj {module.proj.in_features} -> 2 x {module.proj.out_features // 2}) -> liger_nn.GEGLU"


RULE = ModuleRule("glu", GEGLU, _is_candidate, _refusal, _build, _describe, check=_check)
