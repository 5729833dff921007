"""torch.ops.liger.poly_norm and torch.ops.liger.poly_norm_backward.

poly_norm(x, weight, bias, eps=1e-6) -> y
    x: (..., H), any strides, float32/bfloat16/float16/float64; weight: (3,);
    bias: (1,) or 0-dim; weight and bias of any float dtype, on x's device.
    y has x's shape and dtype (contiguous).  Gradients flow to x, weight and
    bias, each in its input's dtype; the backward op is differentiable too
    (second-order gradients through the reference).
poly_norm_backward(grad_out, x, weight, eps) -> (dx, dweight, dbias)
    dweight has shape (3,), dbias shape (1,), both in weight's dtype and
    reduced deterministically.
"""

from __future__ import annotations

import torch

from csrc_free_ops.poly_norm import launch, reference
from registrations import _checks
from registrations._library import (
    call_from_backward,
    define_op,
    launch_entries,
    register_autograd,
    register_autograd_by_reference,
)

_OP = "liger.poly_norm"


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> None:
    _checks.check_float(_OP, "x", x)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{_OP}: x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if tuple(weight.shape) != (3,):
        raise ValueError(f"{_OP}: weight must have shape (3,), got {tuple(weight.shape)}")
    if bias.dim() > 1 or bias.numel() != 1:
        raise ValueError(f"{_OP}: bias must have shape (1,) or (), got {tuple(bias.shape)}")
    _checks.check_params(_OP, "x", x, (("weight", weight), ("bias", bias)))
    _checks.check_eps(_OP, eps)


def _check_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    op = _OP + "_backward"
    _checks.check_float(op, "x", x)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{op}: x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if tuple(weight.shape) != (3,):
        raise ValueError(f"{op}: weight must have shape (3,), got {tuple(weight.shape)}")
    _checks.check_params(op, "x", x, (("weight", weight),))
    _checks.check_grad(op, "grad_out", grad_out, "x", x)
    _checks.check_eps(op, eps)


def _fake(x, weight, bias, eps):
    return x.new_empty(x.shape)


def _backward_fake(grad_out, x, weight, eps):
    return x.new_empty(x.shape), weight.new_empty((3,)), weight.new_empty((1,))


POLY_NORM = define_op(
    "poly_norm(Tensor x, Tensor weight, Tensor bias, float eps=1e-06) -> Tensor",
    check=_check,
    fake=_fake,
    **launch_entries(launch, "forward", reference.forward),
)
POLY_NORM_BACKWARD = define_op(
    "poly_norm_backward(Tensor grad_out, Tensor x, Tensor weight, float eps) -> (Tensor, Tensor, Tensor)",
    check=_check_backward,
    fake=_backward_fake,
    **launch_entries(launch, "backward", reference.backward),
)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps
    ctx.bias_shape = bias.shape
    ctx.bias_dtype = bias.dtype


def _backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    dx, dweight, dbias = call_from_backward(POLY_NORM_BACKWARD, grad_out, x, weight, ctx.eps)
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    if need_b and ctx.bias_dtype != weight.dtype:
        # The op returns dbias in weight's dtype: a float32 bias beside a bf16 weight would get a bf16-rounded
        # gradient.  dbias = sum(grad_out), summed here in the compute dtype (deterministic, no atomics).
        dbias = grad_out.sum(dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    if need_b and (dbias.shape != ctx.bias_shape or dbias.dtype != ctx.bias_dtype):
        dbias = dbias.reshape(ctx.bias_shape).to(ctx.bias_dtype)
    return dx if need_x else None, dweight if need_w else None, dbias if need_b else None, None


register_autograd(POLY_NORM, _backward, setup_context=_setup_context)
register_autograd_by_reference(POLY_NORM_BACKWARD, reference.backward)
