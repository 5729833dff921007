"""torch.ops.liger.group_norm and torch.ops.liger.group_norm_backward.

group_norm(x, num_groups, weight=None, bias=None, eps=1e-5) -> y
    torch.nn.functional.group_norm: x is (N, C, *) of rank >= 2, any strides,
    float32/bfloat16/float16, with C divisible by num_groups.  weight and
    bias are optional (C,) tensors on x's device, each in x's dtype or in
    float32 (float32 parameters with half-precision activations are the
    usual mixed-precision set-up).  y is contiguous, with x's shape and dtype.
    Gradients flow to x, weight and bias.
group_norm_backward(grad_out, x, num_groups, weight, bias, eps) -> (dx, dweight, dbias)
    dweight / dbias are None where weight / bias are, else in their dtype;
    both are reduced deterministically.
"""

from __future__ import annotations

import torch

from csrc_free_ops.group_norm import cuda, npu, reference
from registrations import _checks
from registrations._library import Entries, call_from_backward, define_op, register_autograd

_OP = "liger.group_norm"


def _check_param(x: torch.Tensor, name: str, p: torch.Tensor | None) -> None:
    if p is None:
        return
    if p.dim() != 1 or p.shape[0] != x.shape[1]:
        raise ValueError(f"{_OP}: {name} must have shape ({x.shape[1]},) (one per channel), got {tuple(p.shape)}")
    if p.dtype not in (x.dtype, torch.float32):
        raise TypeError(f"{_OP}: {name} has dtype {p.dtype}; it must be float32 or x's dtype ({x.dtype})")
    if p.device != x.device:
        raise ValueError(f"{_OP}: {name} is on {p.device} but x is on {x.device}; they must match")


def _check(
    x: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> None:
    _checks.check_float_dtype(_OP, "x", x)
    if x.dim() < 2:
        raise ValueError(f"{_OP}: x must have shape (N, C, *) with rank >= 2, got shape {tuple(x.shape)}")
    if num_groups <= 0:
        raise ValueError(f"{_OP}: num_groups must be positive, got {num_groups}")
    if x.shape[1] % num_groups != 0:
        raise ValueError(f"{_OP}: the {x.shape[1]} channels of x are not divisible by num_groups={num_groups}")
    _check_param(x, "weight", weight)
    _check_param(x, "bias", bias)
    _checks.check_eps(_OP, eps)


def _check_backward(grad_out: torch.Tensor, x: torch.Tensor) -> None:
    if grad_out.shape != x.shape:
        raise ValueError(f"{_OP}_backward: grad_out shape {tuple(grad_out.shape)} != x shape {tuple(x.shape)}")
    _checks.check_all_like(_OP + "_backward", "x", x, (("grad_out", grad_out),))


def _check_both(grad_out, x, num_groups, weight, bias, eps) -> None:
    _check(x, num_groups, weight, bias, eps)
    _check_backward(grad_out, x)


def _fake(x, num_groups, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _backward_fake(grad_out, x, num_groups, weight, bias, eps):
    dweight = weight.new_empty(weight.shape) if weight is not None else None
    dbias = bias.new_empty(bias.shape) if bias is not None else None
    return torch.empty_like(x, memory_format=torch.contiguous_format), dweight, dbias


GROUP_NORM = define_op(
    "group_norm(Tensor x, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
    check=_check,
    fake=_fake,
    entries=Entries(cuda=cuda.forward, npu=npu.forward, interpreted=cuda.forward, reference=reference.forward),
)
GROUP_NORM_BACKWARD = define_op(
    "group_norm_backward(Tensor grad_out, Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps)"
    " -> (Tensor, Tensor?, Tensor?)",
    check=_check_both,
    fake=_backward_fake,
    entries=Entries(cuda=cuda.backward, npu=npu.backward, interpreted=cuda.backward, reference=reference.backward),
)


def _setup_context(ctx, inputs, output) -> None:
    x, num_groups, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.num_groups = num_groups
    ctx.eps = eps


def _backward(ctx, grad_out):
    x, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = call_from_backward(GROUP_NORM_BACKWARD, grad_out, x, ctx.num_groups, weight, bias, ctx.eps)
    need = ctx.needs_input_grad
    return dx if need[0] else None, None, dweight if need[2] else None, dbias if need[3] else None, None


register_autograd(GROUP_NORM, _backward, setup_context=_setup_context)
