"""torch.ops.liger.fused_linear_cross_entropy and its backward op.

fused_linear_cross_entropy(x, weight, target, bias=None, ce_weight=None, ignore_index=-100, label_smoothing=0.0,
                           reduction="mean", lse_square_scale=0.0, softcap=None) -> (loss, z_loss, lse)
    cross_entropy(x @ weight.T + bias, target, ce_weight, ...) without holding
    the logits: x (BT, H), weight (V, H) (the LM head), bias optional (V,),
    target (BT,) int64/int32, ce_weight optional (V,) class weights; float
    tensors of any float dtype (weight and bias are cast to x's for the
    matmuls).  loss and z_loss in the compute dtype (float32, float64 for
    float64 x): () for mean and sum, (BT,) for none; lse (BT,).  Gradients
    flow to x, weight and bias through loss, each in its input's dtype; the
    backward recomputes the logits chunk by chunk.  Bad targets raise
    ValueError.  The backward op is differentiable (second order through the
    reference).
fused_linear_cross_entropy_backward(grad_loss, x, weight, target, lse, bias, ce_weight, ignore_index,
                                    label_smoothing, reduction, lse_square_scale, softcap, output_mask)
    -> (grad_x, grad_weight, grad_bias)
    output_mask: which of the three to compute; None for the others.
"""

from __future__ import annotations

from csrc_free_ops.cross_entropy.reference import Options
from csrc_free_ops.fused_linear_cross_entropy import launch
from registrations import _checks
from registrations._library import (
    Entries,
    call_from_backward,
    define_op,
    register_autograd,
    register_autograd_by_reference,
)
from registrations.cross_entropy import (
    OPTIONS_SCHEMA,
    check_class_weight,
    check_options,
    check_target,
    compute_dtype,
    loss_shape,
)

_OP = "liger.fused_linear_cross_entropy"


def _check_inputs(op, x, weight, target, bias, ce_weight, label_smoothing, reduction, lse_square_scale, softcap):
    _checks.check_float(op, "x", x)
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"{op}: x must have shape (rows, hidden) with hidden > 0, got {tuple(x.shape)}")
    _checks.check_float(op, "weight", weight)
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: weight must have shape (classes, {x.shape[1]}) with classes > 0, got "
                         f"{tuple(weight.shape)}")  # fmt: skip
    _checks.check_same_device(op, "x", x, (("weight", weight),))
    check_target(op, target, x.shape[0], "x", x)
    check_class_weight(op, "bias", bias, weight.shape[0], "x", x)
    check_class_weight(op, "ce_weight", ce_weight, weight.shape[0], "x", x)
    check_options(op, label_smoothing, reduction, lse_square_scale, softcap)


def _check(x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap):
    _check_inputs(_OP, x, weight, target, bias, ce_weight, label_smoothing, reduction, lse_square_scale, softcap)


def _check_backward(grad_loss, x, weight, target, lse, bias, ce_weight, ignore_index, label_smoothing, reduction,
                    lse_square_scale, softcap, output_mask):  # fmt: skip
    op = _OP + "_backward"
    _check_inputs(op, x, weight, target, bias, ce_weight, label_smoothing, reduction, lse_square_scale, softcap)
    _checks.check_float(op, "grad_loss", grad_loss)
    expected = loss_shape(x.shape[0], reduction)
    if tuple(grad_loss.shape) != expected:
        raise ValueError(f"{op}: grad_loss must have shape {expected} for reduction={reduction!r}, "
                         f"got {tuple(grad_loss.shape)}")  # fmt: skip
    _checks.check_float(op, "lse", lse)
    if tuple(lse.shape) != (x.shape[0],):
        raise ValueError(f"{op}: lse must have shape ({x.shape[0]},), got {tuple(lse.shape)}")
    _checks.check_same_device(op, "x", x, (("grad_loss", grad_loss), ("lse", lse)))
    if len(output_mask) != 3:
        raise ValueError(f"{op}: output_mask must have 3 entries (x, weight, bias), got {len(output_mask)}")


def _fake(x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap):
    ct = compute_dtype(x)
    shape = loss_shape(x.shape[0], reduction)
    return x.new_empty(shape, dtype=ct), x.new_empty(shape, dtype=ct), x.new_empty((x.shape[0],), dtype=ct)


def _backward_fake(grad_loss, x, weight, target, lse, bias, ce_weight, *options_and_mask):
    mask = options_and_mask[-1]
    return (
        x.new_empty(x.shape) if mask[0] else None,
        weight.new_empty(weight.shape) if mask[1] else None,
        bias.new_empty(bias.shape) if mask[2] and bias is not None else None,
    )


FUSED_LINEAR_CROSS_ENTROPY = define_op(
    "fused_linear_cross_entropy(Tensor x, Tensor weight, Tensor target, Tensor? bias=None, Tensor? ce_weight=None, "
    f"{OPTIONS_SCHEMA}) -> (Tensor, Tensor, Tensor)",
    check=_check,
    fake=_fake,
    entries=Entries(
        cuda=launch.cuda_forward,
        npu=launch.npu_forward,
        interpreted=launch.cuda_forward,
        reference=launch.reference_forward,
    ),
)
FUSED_LINEAR_CROSS_ENTROPY_BACKWARD = define_op(
    "fused_linear_cross_entropy_backward(Tensor grad_loss, Tensor x, Tensor weight, Tensor target, Tensor lse, "
    "Tensor? bias, Tensor? ce_weight, int ignore_index, float label_smoothing, str reduction, float lse_square_scale, "
    "float? softcap, bool[3] output_mask) -> (Tensor?, Tensor?, Tensor?)",
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
    x, weight, target, bias, ce_weight, *options = inputs
    _, z_loss, lse = output
    ctx.mark_non_differentiable(z_loss, lse)
    ctx.save_for_backward(x, weight, target, lse, bias, ce_weight)
    ctx.options = Options(*options)


def _backward(ctx, grad_loss, grad_z_loss, grad_lse):
    x, weight, target, lse, bias, ce_weight = ctx.saved_tensors
    if ctx.needs_input_grad[4]:
        raise RuntimeError(f"{_OP}: the gradient of the class weights (ce_weight) is not implemented")
    mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[3]]
    grads = (None, None, None)
    if any(mask):
        grads = call_from_backward(
            FUSED_LINEAR_CROSS_ENTROPY_BACKWARD, grad_loss, x, weight, target, lse, bias, ce_weight, *ctx.options, mask
        )
    grad_x, grad_weight, grad_bias = grads
    return grad_x, grad_weight, None, grad_bias, None, None, None, None, None, None


register_autograd(FUSED_LINEAR_CROSS_ENTROPY, _backward, setup_context=_setup_context)
register_autograd_by_reference(FUSED_LINEAR_CROSS_ENTROPY_BACKWARD, launch.reference_backward)
