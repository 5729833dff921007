"""torch.ops.liger.poly_norm and torch.ops.liger.poly_norm_backward.

poly_norm(x, weight, bias, eps=1e-6) -> y
    x: (..., H), any strides, float32/bfloat16/float16; weight: (3,); bias:
    (1,) or 0-dim; both in x's dtype and on x's device.  y has x's shape and
    dtype (contiguous).  Gradients flow to x, weight and bias.
poly_norm_backward(grad_out, x, weight, eps) -> (dx, dweight, dbias)
    dweight has shape (3,), dbias shape (1,); both reduced deterministically.
"""

from __future__ import annotations

import torch

from csrc_free_ops.poly_norm import cuda, npu, reference
from registrations import _checks
from registrations._library import Launchers, call_from_backward, define, pick, register_autograd

_LAUNCHERS = Launchers(cuda=cuda, npu=npu, reference=reference)
_OP = "liger.poly_norm"
# The dispatcher drops trailing arguments equal to their schema default, so
# the Python kernels must carry the same defaults.
DEFAULT_EPS = 1e-6


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> None:
    _checks.check_float_dtype(_OP, "x", x)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{_OP}: x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if tuple(weight.shape) != (3,):
        raise ValueError(f"{_OP}: weight must have shape (3,), got {tuple(weight.shape)}")
    if bias.dim() > 1 or bias.numel() != 1:
        raise ValueError(f"{_OP}: bias must have shape (1,) or (), got {tuple(bias.shape)}")
    _checks.check_all_like(_OP, "x", x, (("weight", weight), ("bias", bias)))
    _checks.check_eps(_OP, eps)


def _poly_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    _check(x, weight, bias, eps)
    return pick(x, _LAUNCHERS).forward(x, weight, bias, eps)


def _poly_norm_backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_backward(grad_out, x)
    return pick(x, _LAUNCHERS).backward(grad_out, x, weight, eps)


def _check_backward(grad_out: torch.Tensor, x: torch.Tensor) -> None:
    if tuple(grad_out.shape) != tuple(x.shape):
        raise ValueError(f"{_OP}_backward: grad_out shape {tuple(grad_out.shape)} != x shape {tuple(x.shape)}")
    _checks.check_all_like(_OP + "_backward", "x", x, (("grad_out", grad_out),))


POLY_NORM = define("poly_norm(Tensor x, Tensor weight, Tensor bias, float eps=1e-06) -> Tensor", _poly_norm)
POLY_NORM_BACKWARD = define(
    "poly_norm_backward(Tensor grad_out, Tensor x, Tensor weight, float eps) -> (Tensor, Tensor, Tensor)",
    _poly_norm_backward,
)


@torch.library.register_fake(POLY_NORM)
def _poly_norm_fake(x, weight, bias, eps=DEFAULT_EPS):
    _check(x, weight, bias, eps)
    return x.new_empty(x.shape)


@torch.library.register_fake(POLY_NORM_BACKWARD)
def _poly_norm_backward_fake(grad_out, x, weight, eps):
    _check_backward(grad_out, x)
    return x.new_empty(x.shape), weight.new_empty((3,)), weight.new_empty((1,))


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps
    ctx.bias_0d = bias.dim() == 0


def _backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    dx, dweight, dbias = call_from_backward(torch.ops.liger.poly_norm_backward.default, grad_out, x, weight, ctx.eps)
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    return (
        dx if need_x else None,
        dweight if need_w else None,
        (dbias.reshape(()) if ctx.bias_0d else dbias) if need_b else None,
        None,
    )


register_autograd(POLY_NORM, _backward, setup_context=_setup_context, defaults=(DEFAULT_EPS,))
