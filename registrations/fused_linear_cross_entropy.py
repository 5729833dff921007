"""torch.ops.liger.fused_linear_cross_entropy and its backward op.

fused_linear_cross_entropy(x, weight, target, bias=None, ce_weight=None, ignore_index=-100, label_smoothing=0.0,
                           reduction="mean", lse_square_scale=0.0, softcap=None) -> (loss, z_loss, lse)
    cross_entropy(x @ weight.T + bias, target, ce_weight, ...) without holding
    the logits: x (BT, H), weight (V, H) (the LM head), bias optional (V,),
    target (BT,) int64/int32, ce_weight optional (V,) class weights; float
    tensors of any float dtype (weight and bias are cast to x's for the
    matmuls).  loss and z_loss in the compute dtype (float32, float64 for
    float64 x): () for mean and sum, (BT,) for none; lse (BT,).  Gradients
    flow to x, weight and bias through loss, each in its input's dtype.  Bad
    targets raise ValueError.  The backward op is differentiable (second
    order through the reference).
fused_linear_cross_entropy_backward(grad_loss, x, weight, target, lse, bias, ce_weight, ignore_index,
                                    label_smoothing, reduction, lse_square_scale, softcap, output_mask)
    -> (grad_x, grad_weight, grad_bias)
    output_mask: which of the three to compute; None for the others, and an
    empty tensor for grad_x (DTensor dispatches only an op whose first output
    is a Tensor).
fused_linear_cross_entropy_with_grads(x, weight, target, bias, ce_weight, ignore_index, label_smoothing,
                                      reduction, lse_square_scale, softcap, output_mask)
    -> (loss, z_loss, lse, grad_x, grad_weight, grad_bias)
    The forward's outputs and the backward op's gradients for a grad_loss of
    ones, each chunk's logits computed once (three matmuls a chunk, not four).

Where the gradients are computed.  A recorded forward of a scalar loss
(reduction mean or sum) on plain tensors, outside torch.func transforms and
forward-mode AD, whose backward would walk the rows (chunks of at least 512
rows, or one chunk: csrc_free_ops/fused_linear_cross_entropy/plan.py) runs
fused_linear_cross_entropy_with_grads, as upstream Liger-Kernel does: the
gradients are held from the forward to the backward, which scales them by
grad_loss, in place (the formula takes them off its node first, so nothing
else holds them).  Everything else records the op and computes the logits
again in the backward op: shorter chunks (there the backward op walks the
classes, which beats the one walk), reduction none (each row's grad_loss is
known only then), DTensor and other subclasses, torch.func, a forward-mode
tangent, and a backward that is itself differentiated (create_graph) or run
a second time (retain_graph: the first took the gradients).  A forward
without a recorded graph (no_grad, or no input that requires grad) computes
no gradient.

Under torch.compile the three ops stay opaque nodes (registrations/decompose.py
decomposes the others into their kernels): a chunk walk sums grad_weight or
grad_x in place chunk after chunk and writes each chunk's rows into a larger
buffer, which functionalization turns into a copy of the whole buffer per
chunk in Inductor's code (a grad_weight-sized device copy a chunk, and more
memory held).  Opaque, the compiled graph runs the walk as eager does.
"""

from __future__ import annotations

import torch

from csrc_free_ops.cross_entropy.reference import Options
from csrc_free_ops.fused_linear_cross_entropy import launch, reference
from registrations import _checks
from registrations._library import (
    Entries,
    call_from_backward,
    define_op,
    launch_entries,
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
from registrations.eager import below_autograd

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


def _check_with_grads(x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
                      lse_square_scale, softcap, output_mask):  # fmt: skip
    op = _OP + "_with_grads"
    _check_inputs(op, x, weight, target, bias, ce_weight, label_smoothing, reduction, lse_square_scale, softcap)
    if len(output_mask) != 3:
        raise ValueError(f"{op}: output_mask must have 3 entries (x, weight, bias), got {len(output_mask)}")


def _fake(x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap):
    ct = compute_dtype(x)
    shape = loss_shape(x.shape[0], reduction)
    return x.new_empty(shape, dtype=ct), x.new_empty(shape, dtype=ct), x.new_empty((x.shape[0],), dtype=ct)


def _grads_fake(x, weight, bias, mask) -> tuple:
    return (
        x.new_empty(x.shape) if mask[0] else None,
        weight.new_empty(weight.shape) if mask[1] else None,
        bias.new_empty(bias.shape) if mask[2] and bias is not None else None,
    )


def _backward_fake(grad_loss, x, weight, target, lse, bias, ce_weight, *options_and_mask):
    grad_x, grad_weight, grad_bias = _grads_fake(x, weight, bias, options_and_mask[-1])
    return x.new_empty(0) if grad_x is None else grad_x, grad_weight, grad_bias


def _with_grads_fake(x, weight, target, bias, ce_weight, *options_and_mask):
    loss_outputs = _fake(x, weight, target, bias, ce_weight, *options_and_mask[:-1])
    return (*loss_outputs, *_grads_fake(x, weight, bias, options_and_mask[-1]))


FUSED_LINEAR_CROSS_ENTROPY = define_op(
    "fused_linear_cross_entropy(Tensor x, Tensor weight, Tensor target, Tensor? bias=None, Tensor? ce_weight=None, "
    f"{OPTIONS_SCHEMA}) -> (Tensor, Tensor, Tensor)",
    check=_check,
    fake=_fake,
    traceable=False,  # opaque under compile: functionalized, each chunk's in-place sum copies the whole buffer
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
    "float? softcap, bool[3] output_mask) -> (Tensor, Tensor?, Tensor?)",
    check=_check_backward,
    fake=_backward_fake,
    traceable=False,  # opaque under compile: functionalized, each chunk's in-place sum copies the whole buffer
    entries=Entries(
        cuda=launch.cuda_backward,
        npu=launch.npu_backward,
        interpreted=launch.cuda_backward,
        reference=launch.reference_backward,
    ),
)

FUSED_LINEAR_CROSS_ENTROPY_WITH_GRADS = define_op(
    "fused_linear_cross_entropy_with_grads(Tensor x, Tensor weight, Tensor target, Tensor? bias, Tensor? ce_weight, "
    "int ignore_index, float label_smoothing, str reduction, float lse_square_scale, float? softcap, "
    "bool[3] output_mask) -> (Tensor, Tensor, Tensor, Tensor?, Tensor?, Tensor?)",
    check=_check_with_grads,
    fake=_with_grads_fake,
    traceable=False,  # opaque under compile: functionalized, each chunk's in-place sum copies the whole buffer
    **launch_entries(launch, "forward_with_grads", launch.reference_forward_with_grads),
)


def _traced_types() -> tuple[type, ...]:
    """The tensor types of a plain call (a module's head is a Parameter), and of torch.compile's tracing."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return torch.Tensor, torch.nn.Parameter, FakeTensor, FunctionalTensor


def _forward_with_grads(args: tuple) -> tuple | None:
    """The with-grads op's outputs for a recorded forward that can use them (the module's doc says which)."""
    x, weight, target, bias, ce_weight, *options = args
    if options[2] == "none" or torch._C._are_functorch_transforms_active():
        return None
    plain = _traced_types()
    if any(t is not None and type(t) not in plain for t in (x, weight, target, bias, ce_weight)):
        return None
    if ce_weight is not None and ce_weight.requires_grad:  # the backward op raises for it
        return None
    if not launch.gradients_in_forward(x, weight, ce_weight):
        return None
    mask = [x.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad]
    return below_autograd(FUSED_LINEAR_CROSS_ENTROPY_WITH_GRADS, (*args, mask))


def _setup_context(ctx, inputs, output) -> None:
    x, weight, target, bias, ce_weight, *options = inputs
    z_loss, lse = output[1], output[2]
    ctx.mark_non_differentiable(z_loss, lse)
    ctx.save_for_backward(x, weight, target, lse, bias, ce_weight)
    ctx.options = Options(*options)
    # Held as an attribute, not saved: the backward takes them off the node, then owns them alone.
    ctx._grads = output[3:] if len(output) > 3 else None


def _scaled(grads: tuple, grad_loss: torch.Tensor, needed: list[bool]) -> tuple:
    """The forward's unit-grad_loss gradients times grad_loss, in place (the formula owns them): one
    ``_foreach_mul_`` per dtype, with grad_loss cast to it.  ``g.mul_(grad_loss)`` by a 0-d CUDA tensor runs
    TensorIterator's unvectorized broadcast kernel (a grad_weight-sized pass at half the memory rate); the
    foreach kernel reads the scalar once and vectorizes, and takes it only in the list's dtype.  The math
    is mul_'s on CUDA, which casts the scalar to g's dtype too; on the CPU the foreach is mul_ per tensor,
    and other devices take mul_ by the cast scalar."""
    kept = tuple(g if g is not None and need else None for g, need in zip(grads, needed, strict=True))
    live = [g for g in kept if g is not None]
    foreach = grad_loss.device.type in ("cuda", "cpu") and not torch.compiler.is_compiling()
    for dtype in dict.fromkeys(g.dtype for g in live):
        same = [g for g in live if g.dtype == dtype]
        scale = grad_loss.to(dtype)
        if foreach:
            torch._foreach_mul_(same, scale)
        else:
            for g in same:
                g.mul_(scale)
    return kept


def _backward(ctx, grad_loss, grad_z_loss, grad_lse):
    held, ctx._grads = ctx._grads, None
    x, weight, target, lse, bias, ce_weight = ctx.saved_tensors
    if ctx.needs_input_grad[4]:
        raise RuntimeError(f"{_OP}: the gradient of the class weights (ce_weight) is not implemented")
    mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[3]]
    grads = (None, None, None)
    if held is not None and not torch.is_grad_enabled():
        grads = _scaled(held, grad_loss, mask)
    elif any(mask):
        grads = call_from_backward(
            FUSED_LINEAR_CROSS_ENTROPY_BACKWARD, grad_loss, x, weight, target, lse, bias, ce_weight, *ctx.options, mask
        )
        grads = (grads[0] if mask[0] else None, *grads[1:])  # the op's grad_x is empty where unmasked
    grad_x, grad_weight, grad_bias = grads
    return grad_x, grad_weight, None, grad_bias, None, None, None, None, None, None


register_autograd(
    FUSED_LINEAR_CROSS_ENTROPY, _backward, setup_context=_setup_context, forward_with_extras=_forward_with_grads
)
register_autograd_by_reference(FUSED_LINEAR_CROSS_ENTROPY_BACKWARD, launch.reference_backward)


def _with_grads_reference(x, weight, target, bias, ce_weight, *options_and_mask):
    """The with-grads op's reference, for its own gradient (the call it differentiates checked the targets)."""
    o, mask = Options(*options_and_mask[:5]), tuple(options_and_mask[5])
    return reference.forward_with_grads(x, weight, target, bias, ce_weight, o, mask)


register_autograd_by_reference(FUSED_LINEAR_CROSS_ENTROPY_WITH_GRADS, _with_grads_reference)
