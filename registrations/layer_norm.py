"""torch.ops.liger.layer_norm and torch.ops.liger.layer_norm_backward.

layer_norm(x, weight=None, bias=None, eps=1e-5) -> y
    torch.nn.functional.layer_norm over the last dim (biased variance):
    x: (..., H), any strides, float32/bfloat16/float16/float64; weight and
    bias: (H,) or None each (GPT-NeoX, Phi, StableLM, Cohere), any float
    dtype, on x's device.  Math in float32 (float64 for float64 x), y
    rounded once to x's dtype (contiguous).  Gradients flow to x, weight
    and bias, each in its input's dtype; the backward op is differentiable
    too (second-order gradients through the reference).
layer_norm_backward(grad_out, x, weight, bias, eps) -> (dx, dweight, dbias)
    dweight / dbias have weight's / bias's shape and dtype (None where the
    parameter is), reduced deterministically.  The statistics are
    recomputed from x.
"""

from __future__ import annotations

from csrc_free_ops.layer_norm import launch, reference
from registrations import _checks
from registrations._library import (
    call_from_backward,
    define_op,
    launch_entries,
    register_autograd,
    register_autograd_by_reference,
)
from registrations.rms_norm import check_rows

_OP = "liger.layer_norm"


def _check(x, weight, bias, eps, op: str = _OP) -> None:
    check_rows(op, x, (("weight", weight), ("bias", bias)))
    _checks.check_eps(op, eps)


def _check_backward(grad_out, x, weight, bias, eps) -> None:
    op = _OP + "_backward"
    _check(x, weight, bias, eps, op)
    _checks.check_grad(op, "grad_out", grad_out, "x", x)


def _fake(x, weight, bias, eps):
    return x.new_empty(x.shape)


def _backward_fake(grad_out, x, weight, bias, eps):
    return (
        x.new_empty(x.shape),
        None if weight is None else weight.new_empty(weight.shape),
        None if bias is None else bias.new_empty(bias.shape),
    )


LAYER_NORM = define_op(
    "layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
    check=_check,
    fake=_fake,
    **launch_entries(launch, "forward", reference.forward),
)
LAYER_NORM_BACKWARD = define_op(
    "layer_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor? bias, float eps)"
    " -> (Tensor, Tensor?, Tensor?)",
    check=_check_backward,
    fake=_backward_fake,
    **launch_entries(launch, "backward", reference.backward),
)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.eps = eps


def _backward(ctx, grad_out):
    x, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = call_from_backward(LAYER_NORM_BACKWARD, grad_out, x, weight, bias, ctx.eps)
    need = ctx.needs_input_grad
    return dx if need[0] else None, dweight if need[1] else None, dbias if need[2] else None, None


register_autograd(LAYER_NORM, _backward, setup_context=_setup_context)
register_autograd_by_reference(LAYER_NORM_BACKWARD, reference.backward)
