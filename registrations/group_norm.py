"""torch.ops.liger.group_norm and torch.ops.liger.group_norm_backward.

group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, *, activation="none") -> y
    torch.nn.functional.group_norm: x is (N, C, *) of rank >= 2, any strides,
    float32/bfloat16/float16/float64, with C divisible by num_groups.  weight
    and bias are optional (C,) tensors on x's device, each of any of those
    dtypes, independent of x (float32 parameters with half-precision
    activations are the usual mixed-precision set-up).  y has x's shape and
    dtype, and x's layout when x is channels-last (torch.channels_last,
    channels_last_3d, or dense with channels innermost), read in place;
    contiguous otherwise (csrc_free_ops/group_norm/layout.py).  Gradients flow to x, weight and bias, each in its
    input's dtype; the backward op is differentiable too (second-order
    gradients through the reference).  activation="silu" returns
    silu(group_norm(x)) from the same pass (diffusion models' norm -> SiLU
    pairs); its backward recomputes what the SiLU's derivative needs from x.
group_norm_backward(grad_out, x, num_groups, weight, bias, eps, *, activation="none") -> (dx, dweight, dbias)
    grad_out has x's shape and device (any float dtype).  dweight / dbias are
    None where weight / bias are, else in their dtype; both are reduced
    deterministically.  dx has y's layout; grad_out of another layout is
    copied to it.
"""

from __future__ import annotations

import torch

from csrc_free_ops.group_norm import launch, layout, reference
from registrations import _checks
from registrations._library import (
    call_from_backward,
    define_op,
    launch_entries,
    register_autograd,
    register_autograd_by_reference,
)

_OP = "liger.group_norm"


def _check(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    activation: str = "none",
    op: str = _OP,
) -> None:
    _checks.check_float(op, "x", x)
    if x.dim() < 2:
        raise ValueError(f"{op}: x must have shape (N, C, *) with rank >= 2, got shape {tuple(x.shape)}")
    if num_groups <= 0:
        raise ValueError(f"{op}: num_groups must be positive, got {num_groups}")
    if x.shape[1] % num_groups != 0:
        raise ValueError(f"{op}: the {x.shape[1]} channels of x are not divisible by num_groups={num_groups}")
    params = tuple((name, p) for name, p in (("weight", weight), ("bias", bias)) if p is not None)
    for name, p in params:
        if p.dim() != 1 or p.shape[0] != x.shape[1]:
            raise ValueError(f"{op}: {name} must have shape ({x.shape[1]},) (one per channel), got {tuple(p.shape)}")
    _checks.check_params(op, "x", x, params)
    _checks.check_eps(op, eps)
    if activation not in reference.ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {reference.ACTIVATIONS}, got {activation!r}")


def _check_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    activation: str = "none",
) -> None:
    op = _OP + "_backward"
    _check(x, num_groups, weight, bias, eps, activation, op)
    _checks.check_grad(op, "grad_out", grad_out, "x", x)


def _fake(x, num_groups, weight, bias, eps, activation="none"):
    return layout.empty_output(x)


def _backward_fake(grad_out, x, num_groups, weight, bias, eps, activation="none"):
    dweight = weight.new_empty(weight.shape) if weight is not None else None
    dbias = bias.new_empty(bias.shape) if bias is not None else None
    return layout.empty_output(x), dweight, dbias


GROUP_NORM = define_op(
    "group_norm(Tensor x, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, *,"
    " str activation='none') -> Tensor",
    check=_check,
    fake=_fake,
    **launch_entries(launch, "forward", reference.forward),
)
GROUP_NORM_BACKWARD = define_op(
    "group_norm_backward(Tensor grad_out, Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps, *,"
    " str activation='none') -> (Tensor, Tensor?, Tensor?)",
    check=_check_backward,
    fake=_backward_fake,
    **launch_entries(launch, "backward", reference.backward),
)


def _setup_context(ctx, inputs, output) -> None:
    x, num_groups, weight, bias, eps, activation = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.num_groups = num_groups
    ctx.eps = eps
    ctx.activation = activation


def _backward(ctx, grad_out):
    x, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = call_from_backward(
        GROUP_NORM_BACKWARD, grad_out, x, ctx.num_groups, weight, bias, ctx.eps, ctx.activation
    )
    need = ctx.needs_input_grad
    return dx if need[0] else None, None, dweight if need[2] else None, dbias if need[3] else None, None, None


register_autograd(GROUP_NORM, _backward, setup_context=_setup_context)
register_autograd_by_reference(GROUP_NORM_BACKWARD, reference.backward)
