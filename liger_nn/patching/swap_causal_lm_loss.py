"""fused_linear_cross_entropy's swap: the causal-LM loss of every ``*ForCausalLM`` of an
architecture in ``LOSS_ARCHITECTURES`` (its ``model``, an ``nn.Linear`` ``lm_head`` and
transformers' own ``ForCausalLMLoss`` as its ``loss_function``) runs through the op in training
steps with labels: ``forward`` becomes an instance attribute (liger_nn.lm_head_loss) that
calls the base model, then the fused loss, and returns logits=None.  Per model."""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch import nn

from liger_nn.lm_head_loss import fused_causal_lm_forward
from liger_nn.patching.handle import LigerPatch
from liger_nn.patching.hf_modules import MODELS_PREFIX, arch_of
from liger_nn.patching.report import Replacement

KIND = "fused_linear_cross_entropy"


def _plain(model: nn.Module) -> dict:
    return {}


def _softcap(model: nn.Module) -> dict:
    return {"softcap": model.config.final_logit_softcapping}


def _cohere_scale(model: nn.Module) -> dict:
    return {"logit_scale": model.logit_scale}


def _granite_scale(model: nn.Module) -> dict:
    return {"logit_scale": 1.0 / model.config.logits_scaling}


# Architecture -> what its ForCausalLM.forward does to lm_head's output before the loss: nothing,
# Gemma 2's soft-capping, or a scale (Cohere's logit_scale, Granite's 1 / logits_scaling).  The
# MoE forwards (Mixtral, Qwen2/3-MoE, Qwen3-Next) add a router loss and are not listed.
LOSS_ARCHITECTURES: dict[str, Callable[[nn.Module], dict]] = {
    "llama": _plain,
    "mistral": _plain,
    "qwen2": _plain,
    "qwen3": _plain,
    "gemma": _plain,
    "gemma2": _softcap,
    "olmo2": _plain,
    "phi": _plain,
    "phi3": _plain,
    "stablelm": _plain,
    "glm4": _plain,
    "deepseek_v3": _plain,
    "cohere": _cohere_scale,
    "granite": _granite_scale,
}


def _is_candidate(module: nn.Module) -> bool:
    cls = type(module)
    return cls.__name__.endswith("ForCausalLM") and cls.__module__.startswith(MODELS_PREFIX)


def _refusal(module: nn.Module) -> str | None:
    name = type(module).__qualname__
    arch = arch_of(type(module).__module__)
    if arch not in LOSS_ARCHITECTURES:
        return f"{name}: architecture {arch!r} is not in the fused loss's table"
    if (
        not isinstance(getattr(module, "model", None), nn.Module)
        or type(getattr(module, "lm_head", None)) is not nn.Linear
    ):
        return f"{name}: no base model at .model and nn.Linear at .lm_head"
    from transformers.loss.loss_utils import ForCausalLMLoss

    loss_function = getattr(module, "loss_function", None)
    if loss_function is not ForCausalLMLoss:
        what = getattr(loss_function, "__name__", loss_function)
        return f"{name}: its loss_function {what!r} is not transformers' ForCausalLMLoss"
    if "forward" in vars(module):
        return f"{name}: its forward is already an instance attribute"
    return None


def _restore(module: nn.Module) -> None:
    vars(module).pop("forward", None)


def patch_causal_lm_loss(model: nn.Module, handle: LigerPatch) -> None:
    """Route the loss of every candidate in ``model`` (the model itself, usually); report the rest."""
    report = handle.report
    for qualname, module in model.named_modules():
        if not _is_candidate(module):
            continue
        reason = _refusal(module)
        if reason is not None:
            report.left_alone.append(Replacement(KIND, qualname, reason))
            continue
        options = LOSS_ARCHITECTURES[arch_of(type(module).__module__)]
        module.forward = fused_causal_lm_forward(module, options)
        handle.on_remove(functools.partial(_restore, module))
        detail = f"{type(module).__qualname__}: training steps with labels skip the logits"
        report.replaced.append(Replacement(KIND, qualname, detail))
