"""torch.ops.liger.rms_norm and torch.ops.liger.rms_norm_backward.

rms_norm(x, weight=None, eps=1e-6, *, offset=0.0, casting_mode="llama") -> y
    RMSNorm over the last dim: y = norm(x) * (offset + weight), norm(x) =
    x * rsqrt(mean(x^2) + eps).  x: (..., H), any strides,
    float32/bfloat16/float16/float64; weight: (H,) or None (no scale; offset
    must then be 0), any float dtype, on x's device.  casting_mode "llama"
    (LlamaRMSNorm, Qwen3's per-head q/k norms over head_dim): norm(x) in
    float32, rounded to x's dtype, then times the weight; "gemma"
    (GemmaRMSNorm with offset=1.0, OLMo2's norms over the whole projection
    with offset=0.0): all in float32, y rounded once.  Statistics always run
    in float32 (float64 for float64 x).  y has x's shape and dtype
    (contiguous).  Gradients flow to x and weight, each in its input's dtype;
    the backward op is differentiable too (second-order gradients through
    the reference).
rms_norm_backward(grad_out, x, weight, eps, *, offset=0.0, casting_mode="llama") -> (dx, dweight)
    dweight has weight's shape and dtype (None without a weight), reduced
    deterministically.  The statistics are recomputed from x.
"""

from __future__ import annotations

import torch

from csrc_free_ops.rms_norm import launch, reference
from csrc_free_ops.rms_norm.options import CASTING_MODES
from registrations import _checks
from registrations._library import (
    call_from_backward,
    define_op,
    launch_entries,
    register_autograd,
    register_autograd_by_reference,
)

_OP = "liger.rms_norm"


def check_rows(op: str, x: torch.Tensor, params: tuple[tuple[str, torch.Tensor | None], ...]) -> None:
    """x has a non-empty last dim; each present parameter is a float (H,) on x's device."""
    _checks.check_float(op, "x", x)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{op}: x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    present = tuple((name, p) for name, p in params if p is not None)
    for name, p in present:
        if tuple(p.shape) != (x.shape[-1],):
            raise ValueError(
                f"{op}: {name} must have shape ({x.shape[-1]},) (x's last dimension), got {tuple(p.shape)}"
            )
    _checks.check_params(op, "x", x, present)


def _check(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    offset: float = 0.0,
    casting_mode: str = "llama",
    op: str = _OP,
) -> None:
    check_rows(op, x, (("weight", weight),))
    _checks.check_eps(op, eps)
    if offset != offset or offset in (float("inf"), float("-inf")):
        raise ValueError(f"{op}: offset must be a finite number, got {offset}")
    if weight is None and offset != 0.0:
        raise ValueError(f"{op}: offset={offset} scales the weight, but weight is None; pass a weight or offset=0")
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"{op}: casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}")


def _check_backward(grad_out, x, weight, eps, offset=0.0, casting_mode="llama") -> None:
    op = _OP + "_backward"
    _check(x, weight, eps, offset, casting_mode, op)
    _checks.check_grad(op, "grad_out", grad_out, "x", x)


def _fake(x, weight, eps, offset=0.0, casting_mode="llama"):
    return x.new_empty(x.shape)


def _backward_fake(grad_out, x, weight, eps, offset=0.0, casting_mode="llama"):
    return x.new_empty(x.shape), None if weight is None else weight.new_empty(weight.shape)


RMS_NORM = define_op(
    "rms_norm(Tensor x, Tensor? weight=None, float eps=1e-06, *, float offset=0.0, str casting_mode='llama') -> Tensor",
    check=_check,
    fake=_fake,
    **launch_entries(launch, "forward", reference.forward),
)
RMS_NORM_BACKWARD = define_op(
    "rms_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, float eps, *, float offset=0.0,"
    " str casting_mode='llama') -> (Tensor, Tensor?)",
    check=_check_backward,
    fake=_backward_fake,
    **launch_entries(launch, "backward", reference.backward),
)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, eps, offset, casting_mode = inputs
    ctx.save_for_backward(x, weight)
    ctx.options = (eps, offset, casting_mode)


def _backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    eps, offset, casting_mode = ctx.options
    dx, dweight = call_from_backward(RMS_NORM_BACKWARD, grad_out, x, weight, eps, offset, casting_mode)
    need = ctx.needs_input_grad
    return dx if need[0] else None, dweight if need[1] else None, None, None, None


register_autograd(RMS_NORM, _backward, setup_context=_setup_context)
register_autograd_by_reference(RMS_NORM_BACKWARD, reference.backward)
