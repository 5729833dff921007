"""A causal LM's loss from its last hidden states and its LM head, through
torch.ops.liger.fused_linear_cross_entropy: the logits are never held.

``causal_lm_loss`` is transformers' ``ForCausalLMLoss`` (labels shifted by one
and padded with ``ignore_index``, or ``shift_labels`` as given; the mean over
the counted tokens, or the sum over ``num_items_in_batch`` under gradient
accumulation) with the logits computed chunk by chunk inside the op.
``fused_causal_lm_forward`` builds a ``*ForCausalLM.forward`` that routes
training steps with labels through it (liger_nn/patching/swap_causal_lm_loss.py
installs it).
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from registrations.eager import eager_call

_FLCE = eager_call(torch.ops.liger.fused_linear_cross_entropy)


def causal_lm_loss(
    hidden_states: torch.Tensor,
    lm_head: nn.Linear,
    labels: torch.Tensor | None = None,
    *,
    shift_labels: torch.Tensor | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
    softcap: float | None = None,
    logit_scale: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """The next-token loss of ``lm_head(hidden_states) * logit_scale``,
    soft-capped at ``softcap`` (Gemma 2), against ``labels`` (B, T) shifted
    by one, or ``shift_labels`` as given.  ``logit_scale`` scales the hidden
    states instead of the logits (the same product; Cohere, Granite)."""
    if shift_labels is None:
        if labels is None:
            raise ValueError("causal_lm_loss: pass labels or shift_labels")
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    if logit_scale is not None:
        x = x * logit_scale
    target = shift_labels.reshape(-1).to(x.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = _FLCE(x, lm_head.weight, target, lm_head.bias, None, ignore_index, 0.0, reduction, 0.0, softcap)[0]
    if num_items_in_batch is None:
        return loss
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def _is_dtensor(t: torch.Tensor) -> bool:
    """A tensor-parallel head: the op's DTensor rule would gather a vocabulary-sharded head, a
    larger buffer than the logits the fusion saves, so such a model keeps its own forward."""
    dtensor = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor exists
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def _by_name(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    """A method call's arguments by name (``self`` left out), its ``**kwargs`` folded in."""
    named: dict = {}
    for name, value in list(signature.bind(*args, **kwargs).arguments.items())[1:]:
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


def _fused(model: nn.Module, kwargs: dict, logits_options: Callable[[nn.Module], dict], output_class: type):
    """The base model, then causal_lm_loss; kwargs: the forward's arguments by name."""
    labels = kwargs.pop("labels", None)
    keep = kwargs.pop("logits_to_keep", 0)
    return_dict = kwargs.pop("return_dict", None)
    loss_kwargs = {k: kwargs.pop(k) for k in ("num_items_in_batch", "ignore_index", "shift_labels") if k in kwargs}
    if labels is None and "shift_labels" not in loss_kwargs:
        raise ValueError(f"{type(model).__name__}: skip_logits=True needs labels or shift_labels")
    outputs = model.model(**kwargs)
    hidden = outputs.last_hidden_state[:, slice(-keep, None) if isinstance(keep, int) else keep, :]
    loss = causal_lm_loss(hidden, model.lm_head, labels, **loss_kwargs, **logits_options(model))
    out = output_class(
        loss=loss,
        logits=None,
        past_key_values=outputs.past_key_values,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )
    return out.to_tuple() if return_dict is False else out


def fused_causal_lm_forward(model: nn.Module, logits_options: Callable[[nn.Module], dict]) -> Callable:
    """``model.forward`` (a method bound to ``model``) that, in training with
    labels (or with ``skip_logits=True``), runs the base model and
    ``causal_lm_loss`` and returns logits=None; otherwise, or with
    ``skip_logits=False``, or with a DTensor head (tensor parallel), the
    class's forward.  ``logits_options(model)``:
    the softcap and logit scale the class's forward applies to the head's
    output.  A bound method, so a deepcopy of the model binds its copy."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    original = type(model).forward
    signature = inspect.signature(original)

    @functools.wraps(original)
    def forward(self, *args, skip_logits: bool | None = None, **kwargs):
        named = _by_name(signature, (self, *args), kwargs) if args else kwargs
        if skip_logits is None:
            skip_logits = self.training and named.get("labels") is not None
        if not skip_logits or _is_dtensor(self.lm_head.weight):
            return original(self, *args, **kwargs)
        return _fused(self, dict(named), logits_options, CausalLMOutputWithPast)

    return types.MethodType(forward, model)
