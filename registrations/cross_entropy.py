"""torch.ops.liger.cross_entropy and torch.ops.liger.cross_entropy_backward.

cross_entropy(logits, target, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean",
              lse_square_scale=0.0, softcap=None) -> (loss, z_loss, lse)
    logits: (BT, V), float32/bfloat16/float16/float64, any strides; target:
    (BT,) int64 or int32 class indices, ignore_index rows skipped; weight:
    optional (V,) class weights of any float dtype.  loss and z_loss in
    logits' dtype: () for mean and sum, (BT,) for none; loss includes the
    z-loss (lse_square_scale * lse^2).  lse: (BT,) in the compute dtype.
    Gradients flow to logits only through loss (z_loss and lse are not
    differentiable); a target outside [0, V) that is not ignore_index
    raises ValueError.  The backward op is differentiable (second order
    through the reference).
cross_entropy_backward(grad_loss, logits, target, lse, weight, ignore_index, label_smoothing, reduction,
                       lse_square_scale, softcap) -> grad_logits
    grad_loss has loss's shape; grad_logits logits' shape and dtype.
"""

from __future__ import annotations

import math

import torch

from csrc_free_ops.cross_entropy import launch
from csrc_free_ops.cross_entropy.reference import REDUCTIONS, Options
from registrations import _checks
from registrations._library import (
    Entries,
    call_from_backward,
    define_op,
    register_autograd,
    register_autograd_by_reference,
)

_OP = "liger.cross_entropy"
OPTIONS_SCHEMA = (
    "int ignore_index=-100, float label_smoothing=0.0, str reduction='mean', float lse_square_scale=0.0, "
    "float? softcap=None"
)
INDEX_DTYPES = (torch.int64, torch.int32)


def check_options(op: str, label_smoothing: float, reduction: str, lse_square_scale: float, softcap) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if not math.isfinite(lse_square_scale):
        raise ValueError(f"{op}: lse_square_scale must be finite, got {lse_square_scale}")
    if softcap is not None and not (softcap > 0.0 and math.isfinite(softcap)):
        raise ValueError(f"{op}: softcap must be None or a finite number > 0, got {softcap}")


def check_target(op: str, target: torch.Tensor, rows: int, ref_name: str, ref: torch.Tensor) -> None:
    if target.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: target must be int64 or int32 class indices, got {target.dtype}")
    if tuple(target.shape) != (rows,):
        raise ValueError(f"{op}: target must have shape ({rows},), one class per row of {ref_name}, "
                         f"got {tuple(target.shape)}")  # fmt: skip
    _checks.check_same_device(op, ref_name, ref, (("target", target),))


def check_class_weight(op: str, name: str, weight: torch.Tensor | None, n_classes: int, ref_name: str, ref) -> None:
    if weight is None:
        return
    _checks.check_float(op, name, weight)
    if tuple(weight.shape) != (n_classes,):
        raise ValueError(f"{op}: {name} must have shape ({n_classes},), one weight per class, got "
                         f"{tuple(weight.shape)}")  # fmt: skip
    _checks.check_same_device(op, ref_name, ref, ((name, weight),))


def _check_logits(op: str, logits: torch.Tensor) -> None:
    _checks.check_float(op, "logits", logits)
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"{op}: logits must have shape (rows, classes) with classes > 0, got {tuple(logits.shape)}")


def _check(logits, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap) -> None:
    _check_logits(_OP, logits)
    check_target(_OP, target, logits.shape[0], "logits", logits)
    check_class_weight(_OP, "weight", weight, logits.shape[1], "logits", logits)
    check_options(_OP, label_smoothing, reduction, lse_square_scale, softcap)


def _check_backward(
    grad_loss, logits, target, lse, weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap
) -> None:
    op = _OP + "_backward"
    _check_logits(op, logits)
    check_target(op, target, logits.shape[0], "logits", logits)
    check_class_weight(op, "weight", weight, logits.shape[1], "logits", logits)
    check_options(op, label_smoothing, reduction, lse_square_scale, softcap)
    _checks.check_float(op, "grad_loss", grad_loss)
    expected = (logits.shape[0],) if reduction == "none" else ()
    if tuple(grad_loss.shape) != expected:
        raise ValueError(f"{op}: grad_loss must have shape {expected} for reduction={reduction!r}, "
                         f"got {tuple(grad_loss.shape)}")  # fmt: skip
    _checks.check_float(op, "lse", lse)
    if tuple(lse.shape) != (logits.shape[0],):
        raise ValueError(f"{op}: lse must have shape ({logits.shape[0]},), got {tuple(lse.shape)}")
    _checks.check_same_device(op, "logits", logits, (("grad_loss", grad_loss), ("lse", lse)))


def loss_shape(rows: int, reduction: str) -> tuple[int, ...]:
    return (rows,) if reduction == "none" else ()


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _fake(logits, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap):
    shape = loss_shape(logits.shape[0], reduction)
    lse = logits.new_empty((logits.shape[0],), dtype=compute_dtype(logits))
    return logits.new_empty(shape), logits.new_empty(shape), lse


def _backward_fake(grad_loss, logits, *rest):
    return logits.new_empty(logits.shape)


CROSS_ENTROPY = define_op(
    f"cross_entropy(Tensor logits, Tensor target, Tensor? weight=None, {OPTIONS_SCHEMA}) -> (Tensor, Tensor, Tensor)",
    check=_check,
    fake=_fake,
    entries=Entries(
        cuda=launch.cuda_forward,
        npu=launch.npu_forward,
        interpreted=launch.cuda_forward,
        reference=launch.reference_forward,
    ),
)
CROSS_ENTROPY_BACKWARD = define_op(
    "cross_entropy_backward(Tensor grad_loss, Tensor logits, Tensor target, Tensor lse, Tensor? weight, "
    "int ignore_index, float label_smoothing, str reduction, float lse_square_scale, float? softcap) -> Tensor",
    check=_check_backward,
    fake=_backward_fake,
    entries=Entries(
        cuda=launch.cuda_backward,
        npu=launch.npu_backward,
        interpreted=launch.cuda_backward,
        reference=launch.reference_backward,
    ),
)


def _setup_context(ctx, inputs, output) -> None:
    logits, target, weight, *options = inputs
    _, z_loss, lse = output
    ctx.mark_non_differentiable(z_loss, lse)
    ctx.save_for_backward(logits, target, lse, weight)
    ctx.options = Options(*options)


def _backward(ctx, grad_loss, grad_z_loss, grad_lse):
    logits, target, lse, weight = ctx.saved_tensors
    if ctx.needs_input_grad[2]:
        raise RuntimeError(f"{_OP}: the gradient of the class weights is not implemented (as in F.cross_entropy)")
    grad = None
    if ctx.needs_input_grad[0]:
        grad = call_from_backward(CROSS_ENTROPY_BACKWARD, grad_loss, logits, target, lse, weight, *ctx.options)
    return grad, None, None, None, None, None, None, None


register_autograd(CROSS_ENTROPY, _backward, setup_context=_setup_context)


def _reference_backward_outputs(*args):
    # register_autograd_by_reference pairs the reference's outputs with the op's: a tuple, as for every op.
    return (launch.reference_backward(*args),)


register_autograd_by_reference(CROSS_ENTROPY_BACKWARD, _reference_backward_outputs)
