"""What each provider of `python -m bench.steps` does to a built model.

    native    the model as is
    upstream  upstream Liger-Kernel's equivalent: every exact nn.GroupNorm
              becomes a LigerGroupNorm holding the same Parameters (diffusion
              models, ResNet stack); for Llama and Qwen2 the modeling module's
              ``apply_rotary_pos_emb`` becomes ``liger_rotary_pos_emb``, which
              is what ``apply_liger_kernel_to_llama/qwen2(rope=True)`` does,
              and each LlamaMLP / Qwen2MLP runs LigerSwiGLUMLP's forward (an
              instance attribute, what ``swiglu=True`` binds on a built
              model), each LlamaRMSNorm / Qwen2RMSNorm runs LigerRMSNorm's
              (``rms_norm=True``), and the model's forward is upstream's
              ``lce_forward`` (``fused_linear_cross_entropy=True``): every op
              both libraries swap in these models
              (``--upstream-off`` leaves out those of its
              ``apply_liger_kernel_to_*`` keywords: rope, rms_norm, swiglu,
              fused_linear_cross_entropy)
    liger     ``liger_nn.apply_liger_ops(model)`` (``--liger-off`` turns keywords off,
              to see what each op routed adds to a step)

``apply(provider, model_name, net)`` patches and returns an undo callable;
it raises ``NotApplicable`` with the reason when the provider does not apply.
The rotary swaps (upstream's and ours) are process-wide (``per_instance`` is
False): bench.steps applies them around each of the provider's rounds in eager
mode and runs the compiled modes one provider after another.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import nn

from bench.step_models import CONV_MODELS, LLM_ARCH, LLM_MODELS

PROVIDERS = ("native", "upstream", "liger")

_LLM_MODULES = {
    "llama": "transformers.models.llama.modeling_llama",
    "qwen2": "transformers.models.qwen2.modeling_qwen2",
}


class NotApplicable(RuntimeError):
    """The provider has nothing to swap in this model, or cannot run here."""


def per_instance(model: str) -> bool:
    """True when every provider's patch touches only the model instance, so
    providers can be interleaved round by round."""
    return model in CONV_MODELS


def _upstream_group_norm(net: nn.Module) -> Callable[[], None]:
    try:
        from liger_kernel.transformers.group_norm import LigerGroupNorm
    except Exception as e:  # noqa: BLE001 - any import failure means the rival is absent
        raise NotApplicable(f"liger_kernel not importable: {type(e).__name__}: {e}") from None
    swaps = []
    for qualname, module in list(net.named_modules()):
        if type(module) is not nn.GroupNorm:
            continue
        if not module.affine:
            continue
        new = LigerGroupNorm(module.num_channels, module.num_groups, eps=module.eps)
        new.weight, new.bias = module.weight, module.bias
        new.variance_epsilon = module.eps
        new.train(module.training)
        parent_name, _, child = qualname.rpartition(".")
        parent = net.get_submodule(parent_name) if parent_name else net
        setattr(parent, child, new)
        swaps.append((parent, child, module))
    if not swaps:
        raise NotApplicable("no affine nn.GroupNorm to swap for LigerGroupNorm")

    def undo() -> None:
        for parent, child, module in reversed(swaps):
            setattr(parent, child, module)

    return undo


def _upstream_rope(model: str) -> Callable[[], None]:
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except Exception as e:  # noqa: BLE001
        raise NotApplicable(f"liger_kernel not importable: {type(e).__name__}: {e}") from None
    module = importlib.import_module(_LLM_MODULES[LLM_ARCH[model]])
    original = module.apply_rotary_pos_emb
    module.apply_rotary_pos_emb = liger_rotary_pos_emb

    def undo() -> None:
        module.apply_rotary_pos_emb = original

    return undo


def _upstream_swiglu(net: nn.Module) -> Callable[[], None]:
    """Every LlamaMLP / Qwen2MLP of ``net`` runs upstream's LigerSwiGLUMLP.forward."""
    import types

    try:
        from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
    except Exception as e:  # noqa: BLE001
        raise NotApplicable(f"liger_kernel not importable: {type(e).__name__}: {e}") from None
    mlps = [m for m in net.modules() if type(m).__name__ in ("LlamaMLP", "Qwen2MLP")]
    for m in mlps:
        m.forward = types.MethodType(LigerSwiGLUMLP.forward, m)

    def undo() -> None:
        for m in mlps:
            del m.forward

    return undo


def _upstream_rms_norm(net: nn.Module) -> Callable[[], None]:
    """Every LlamaRMSNorm / Qwen2RMSNorm of ``net`` runs upstream's LigerRMSNorm.forward, as
    ``apply_liger_kernel_to_llama/qwen2(rms_norm=True)`` patches a built model's norms."""
    try:
        from liger_kernel.transformers.monkey_patch import _patch_rms_norm_module
    except Exception as e:  # noqa: BLE001
        raise NotApplicable(f"liger_kernel not importable: {type(e).__name__}: {e}") from None
    norms = [m for m in net.modules() if type(m).__name__ in ("LlamaRMSNorm", "Qwen2RMSNorm")]
    saved = [dict(m.__dict__) for m in norms]
    for m in norms:
        _patch_rms_norm_module(m)

    def undo() -> None:
        for m, before in zip(norms, saved, strict=True):
            m.__dict__.clear()
            m.__dict__.update(before)

    return undo


def _upstream_fused_loss(model: str, net: nn.Module) -> Callable[[], None]:
    """The model's forward is upstream's ``lce_forward`` (an instance attribute), what
    ``apply_liger_kernel_to_llama/qwen2(fused_linear_cross_entropy=True)`` binds on a built model."""
    import types

    try:
        lce_forward = importlib.import_module(f"liger_kernel.transformers.model.{LLM_ARCH[model]}").lce_forward
    except Exception as e:  # noqa: BLE001
        raise NotApplicable(f"liger_kernel not importable: {type(e).__name__}: {e}") from None
    net.forward = types.MethodType(lce_forward, net)

    def undo() -> None:
        del net.forward

    return undo


def liger_keywords() -> tuple[str, ...]:
    """apply_liger_ops's on/off keywords, which --liger-off may turn off (bench.steps); read from its
    signature when asked, so importing the bench does not import liger_nn."""
    import inspect

    from liger_nn import apply_liger_ops

    params = inspect.signature(apply_liger_ops).parameters.values()
    # A None default is an on/off keyword whose default depends on the model (layer_norm).
    return tuple(
        p.name for p in params if p.kind is p.KEYWORD_ONLY and (p.default is None or isinstance(p.default, bool))
    )


def _liger(net: nn.Module, off: tuple[str, ...] = ()) -> Callable[[], None]:
    from liger_nn import apply_liger_ops

    handle = apply_liger_ops(net, **dict.fromkeys(off, False))
    if not handle.report.replaced:
        handle.remove()
        raise NotApplicable("apply_liger_ops replaced nothing in this model")
    return handle.remove


# upstream's apply_liger_kernel_to_llama / qwen2 keywords for what the upstream provider swaps in an LLM,
# in the order it applies them, each with what it binds
UPSTREAM_LLM_SWAPS = {
    "rope": "liger_rotary_pos_emb",
    "swiglu": "LigerSwiGLUMLP.forward",
    "rms_norm": "LigerRMSNorm.forward",
    "fused_linear_cross_entropy": "lce_forward",
}


def _upstream_llm_swap(keyword: str, model: str, net: nn.Module) -> Callable[[], None]:
    if keyword == "rope":
        return _upstream_rope(model)
    if keyword == "swiglu":
        return _upstream_swiglu(net)
    if keyword == "rms_norm":
        return _upstream_rms_norm(net)
    return _upstream_fused_loss(model, net)


def _upstream_llm(model: str, net: nn.Module, off: tuple[str, ...]) -> tuple[Callable[[], None], str]:
    """Upstream's swaps of an LLM but those in ``off``; what was swapped is undone if a later swap fails."""
    keywords = [k for k in UPSTREAM_LLM_SWAPS if k not in off]
    if not keywords:
        raise NotApplicable("--upstream-off leaves upstream nothing to swap")
    undos: list[Callable[[], None]] = []

    def undo() -> None:
        for each in reversed(undos):
            each()

    try:
        for keyword in keywords:
            undos.append(_upstream_llm_swap(keyword, model, net))
    except BaseException:
        undo()
        raise
    names = [UPSTREAM_LLM_SWAPS[k] for k in keywords]
    note = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return undo, note + "".join(f", {k}=False" for k in UPSTREAM_LLM_SWAPS if k in off)


def apply(
    provider: str, model: str, net: nn.Module, liger_off: tuple[str, ...] = (), upstream_off: tuple[str, ...] = ()
) -> tuple[Callable[[], None], str]:
    """Patch ``net`` for ``provider``; returns (undo, a note on what was swapped).
    ``liger_off``: apply_liger_ops keywords passed as False (the liger provider only);
    ``upstream_off``: keywords of UPSTREAM_LLM_SWAPS the upstream provider leaves out (LLMs only)."""
    if provider == "native":
        return (lambda: None), "as is"
    if provider == "upstream":
        if model in CONV_MODELS:
            undo = _upstream_group_norm(net)
            return undo, "LigerGroupNorm for every nn.GroupNorm"
        if model in LLM_MODELS:
            return _upstream_llm(model, net, upstream_off)
        raise NotApplicable(f"no upstream equivalent for {model}")
    if provider == "liger":
        undo = _liger(net, liger_off)
        return undo, "apply_liger_ops" + "".join(f", {k}=False" for k in liger_off)
    raise ValueError(f"unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")
