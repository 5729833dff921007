"""The fused linear cross-entropy launch sequence, one for every backend,
taking a Plan as data, and the entry of each dispatch key
(registrations/fused_linear_cross_entropy.py binds them).

Forward, per chunk of rows: logits = x_chunk @ weight.T (+ bias) in x's
dtype, then cross_entropy's forward kernel stores each row's loss, z-loss
and lse; the reduction runs once over all rows.  Backward, per chunk: the
logits again, cross_entropy's backward kernel turns them into their
gradient in place, then grad_x_chunk = g @ weight (into grad_x's rows),
grad_weight += g.T @ x_chunk (the first chunk writes it, later ones add:
chunk order fixed, so the sum is reproducible), grad_bias += sum(g).  Where
the plan says so (plan.py: short chunks), the backward walks the classes
instead (backward_by_classes).  Only the gradients output_mask asks for are
computed.

forward_with_grads does both in one walk, for a grad_loss of ones: each
chunk's logits are computed once, their loss taken, then turned into their
gradient in place.  Three matmuls per chunk instead of four; the autograd
formula scales the gradients by the real grad_loss later
(registrations/fused_linear_cross_entropy.py says when it is used: never
where the plan walks the classes, whose backward beats it).

A weight or bias of another dtype than x is cast to x's once per call (the
matmuls take one dtype); their gradients come back in their own dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from csrc_free_ops import device
from csrc_free_ops.cross_entropy import launch as ce
from csrc_free_ops.cross_entropy import plan as ce_plan
from csrc_free_ops.cross_entropy.reference import Options
from csrc_free_ops.cross_entropy.targets import check_targets, checked_targets
from csrc_free_ops.fused_linear_cross_entropy import plan, reference
from csrc_free_ops.fused_linear_cross_entropy.plan import Plan

OP = "liger.fused_linear_cross_entropy"


def _compute(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _like_x(t: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    return t if t is None or t.dtype == x.dtype else t.to(x.dtype)


def _logits(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A chunk's (rows, V) logits, a fresh contiguous buffer the backward may overwrite."""
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def _part(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """t's rows start:end as a view (narrow: one op call, where indexing takes Python's slower path)."""
    return t.narrow(0, start, end - start)


def _accumulate(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """acc + a @ b, kept in dtype (the weight's: float32 master weights beside
    bf16 activations accumulate in float32); the first chunk writes it."""
    if acc is None:
        return torch.mm(a, b).to(dtype)
    if a.dtype == dtype:
        return acc.addmm_(a, b)
    return acc.add_(torch.mm(a, b))


class _Gradients(NamedTuple):
    """What every gradient walk reads: the compute dtype, the targets contiguous, weight and bias in
    x's dtype for the matmuls, the backward kernel's row scales and the class-weight sum."""

    ct: torch.dtype
    target: torch.Tensor
    matmul_weight: torch.Tensor
    matmul_bias: torch.Tensor | None
    ce_scale: torch.Tensor
    z_scale: torch.Tensor
    stride: int
    w_sum: torch.Tensor


def _gradients(grad_loss: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
               bias: torch.Tensor | None, ce_weight: torch.Tensor | None, o: Options,
               lse: torch.Tensor) -> _Gradients:  # fmt: skip
    ct = _compute(x)
    target = target.contiguous()
    ce_scale, z_scale, stride = ce.row_scales(grad_loss, target, ce_weight, o, ct)
    w_sum = ce.weight_sum(ce_weight, o, ct, lse)
    return _Gradients(ct, target, _like_x(weight, x), _like_x(bias, x), ce_scale, z_scale, stride, w_sum)


def _rows_gradient(g: torch.Tensor, gr: _Gradients, ce_weight: torch.Tensor | None, lse: torch.Tensor, start: int,
                   end: int, o: Options, ce_p: ce_plan.Plan) -> None:  # fmt: skip
    """Rows start:end's logits g turned into their gradient in place."""
    ce_scale, z_scale = gr.ce_scale, gr.z_scale
    if gr.stride:  # per-row scales (reduction none): this chunk's rows
        ce_scale, z_scale = _part(ce_scale, start, end), _part(z_scale, start, end)
    ce.backward_rows(g, _part(gr.target, start, end), ce_weight, gr.w_sum, _part(lse, start, end), ce_scale,
                     z_scale, gr.stride, o, ce_p, None)  # fmt: skip


def forward(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
    ce_weight: torch.Tensor | None, o: Options, p: Plan,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    n_rows = x.shape[0]
    ct = _compute(x)
    target = target.contiguous()
    weight_t, bias = _like_x(weight, x).t(), _like_x(bias, x)
    loss, z_loss, lse = (torch.empty(n_rows, dtype=ct, device=x.device) for _ in range(3))
    w_sum = ce.weight_sum(ce_weight, o, ct, lse)
    for start, end in plan.chunks(n_rows, p.chunk_rows):
        logits = _logits(_part(x, start, end), weight_t, bias)
        ce.forward_rows(logits, target, ce_weight, w_sum, o, p.ce, loss, z_loss, lse, start)
        del logits  # freed before the next chunk's is allocated: one chunk's buffer at a time
    out_loss, out_z = ce.reduce_rows(loss, z_loss, target, ce_weight, o, ct)
    return out_loss, out_z, lse


class _GradSums:
    """grad_x's rows, grad_weight and grad_bias, summed chunk by chunk in a fixed order (reproducible)."""

    def __init__(self, x: torch.Tensor, bias: torch.Tensor | None, output_mask: tuple[bool, bool, bool]) -> None:
        self.need_x, self.need_weight = output_mask[0], output_mask[1]
        self.need_bias = output_mask[2] and bias is not None
        self.grad_x = torch.empty_like(x, memory_format=torch.contiguous_format) if self.need_x else None
        self.grad_weight: torch.Tensor | None = None
        self.grad_bias: torch.Tensor | None = None

    def add(self, g: torch.Tensor, x_chunk: torch.Tensor, matmul_weight: torch.Tensor, start: int, end: int,
            weight_dtype: torch.dtype, ct: torch.dtype) -> None:  # fmt: skip
        """One chunk's logits gradient g (rows start:end) into the sums."""
        if self.need_x:
            torch.mm(g, matmul_weight, out=_part(self.grad_x, start, end))
        if self.need_weight:
            self.grad_weight = _accumulate(self.grad_weight, g.t(), x_chunk, weight_dtype)
        if self.need_bias:
            part = g.sum(0, dtype=ct)
            self.grad_bias = part if self.grad_bias is None else self.grad_bias.add_(part)

    def result(
        self, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        grad_weight, grad_bias = self.grad_weight, self.grad_bias
        if self.need_weight and grad_weight is None:  # no rows
            grad_weight = torch.zeros_like(weight)
        if self.need_bias and grad_bias is None:
            grad_bias = torch.zeros_like(bias)
        return (
            self.grad_x,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
        )


def backward(
    grad_loss: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
    bias: torch.Tensor | None, ce_weight: torch.Tensor | None, o: Options, output_mask: tuple[bool, bool, bool],
    p: Plan,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    if p.class_slice:
        return backward_by_classes(grad_loss, x, weight, target, lse, bias, ce_weight, o, output_mask,
                                   p.class_slice, p.class_ce)  # fmt: skip
    gr = _gradients(grad_loss, x, weight, target, bias, ce_weight, o, lse)
    sums = _GradSums(x, bias, output_mask)
    for start, end in plan.chunks(x.shape[0], p.chunk_rows):
        x_chunk = _part(x, start, end)
        g = _logits(x_chunk, gr.matmul_weight.t(), gr.matmul_bias)
        _rows_gradient(g, gr, ce_weight, lse, start, end, o, p.ce)
        sums.add(g, x_chunk, gr.matmul_weight, start, end, weight.dtype, gr.ct)
        del g
    return sums.result(weight, bias)


def backward_by_classes(
    grad_loss: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
    bias: torch.Tensor | None, ce_weight: torch.Tensor | None, o: Options, output_mask: tuple[bool, bool, bool],
    class_slice: int, ce_p: ce_plan.Plan,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    """backward's gradients walking the classes instead of the rows, ``class_slice`` at a time (ce_p:
    cross_entropy's plan for all rows of one slice): each slice's logits for every row, their gradient
    in place from the saved lse, grad_weight[slice] = g.T @ x written once (an inner dimension of all
    rows), grad_x += g @ weight[slice] (in x's dtype, one rounding per slice, as the row walk rounds
    grad_weight once per chunk).  plan.py says when the backward takes it."""
    n_classes = weight.shape[0]
    need_x, need_weight, need_bias = output_mask[0], output_mask[1], output_mask[2] and bias is not None
    gr = _gradients(grad_loss, x, weight, target, bias, ce_weight, o, lse)
    grad_x = torch.zeros_like(x, memory_format=torch.contiguous_format) if need_x else None
    grad_weight = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_weight else None
    grad_bias = torch.empty_like(bias, dtype=gr.ct) if need_bias else None
    for start, end in plan.chunks(n_classes, class_slice):
        w_slice = _part(gr.matmul_weight, start, end)
        g = _logits(x, w_slice.t(), None if gr.matmul_bias is None else _part(gr.matmul_bias, start, end))
        ce.backward_rows(g, gr.target, ce_weight, gr.w_sum, lse, gr.ce_scale, gr.z_scale, gr.stride, o, ce_p, None,
                         (start, n_classes))  # fmt: skip
        if need_weight:
            if g.dtype == weight.dtype:  # written in place: a row slice is contiguous
                torch.mm(g.t(), x, out=_part(grad_weight, start, end))
            else:
                _part(grad_weight, start, end).copy_(torch.mm(g.t(), x))
        if need_x:
            grad_x.addmm_(g, w_slice)
        if need_bias:
            torch.sum(g, 0, dtype=gr.ct, out=_part(grad_bias, start, end))
        del g
    return grad_x, grad_weight, None if grad_bias is None else grad_bias.to(bias.dtype)


def forward_with_grads(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
    ce_weight: torch.Tensor | None, o: Options, output_mask: tuple[bool, bool, bool], p: Plan,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """forward's (loss, z_loss, lse), then backward's (grad_x, grad_weight, grad_bias) for a grad_loss of
    ones, each chunk's logits computed once."""
    n_rows = x.shape[0]
    ct = _compute(x)
    loss, z_loss, lse = (torch.empty(n_rows, dtype=ct, device=x.device) for _ in range(3))
    unit = torch.ones(() if o.reduction != "none" else (n_rows,), dtype=ct, device=x.device)
    gr = _gradients(unit, x, weight, target, bias, ce_weight, o, lse)
    sums = _GradSums(x, bias, output_mask)
    for start, end in plan.chunks(n_rows, p.chunk_rows):
        x_chunk = _part(x, start, end)
        g = _logits(x_chunk, gr.matmul_weight.t(), gr.matmul_bias)
        ce.forward_rows(g, gr.target, ce_weight, gr.w_sum, o, p.ce, loss, z_loss, lse, start)
        _rows_gradient(g, gr, ce_weight, lse, start, end, o, p.ce)
        sums.add(g, x_chunk, gr.matmul_weight, start, end, weight.dtype, ct)
        del g
    out_loss, out_z = ce.reduce_rows(loss, z_loss, gr.target, ce_weight, o, ct)
    return (out_loss, out_z, lse, *sums.result(weight, bias))


def _size_hint(n: int | torch.SymInt) -> int | None:
    """n, or a symbolic size's value in the example being traced (None where it has none)."""
    return n if isinstance(n, int) else n.node.hint


def _sizes(x: torch.Tensor, weight: torch.Tensor) -> tuple[int | None, int | None, int | None]:
    """(rows, hidden, classes) as the plans take them: plain ints, a symbolic size's traced value."""
    return _size_hint(x.shape[0]), _size_hint(x.shape[1]), _size_hint(weight.shape[0])


def gradients_in_forward(x: torch.Tensor, weight: torch.Tensor, ce_weight: torch.Tensor | None) -> bool:
    """Whether computing the gradients in the forward walk saves work: the backward's plan for x's device
    walks the rows (its class walk would not reuse the forward's logits).  Symbolic sizes decide by the
    traced example's, without a guard: either answer computes the same gradients."""
    if x.dim() != 2 or weight.dim() != 2:
        return True  # the with-grads op's check names the problem
    if None in _sizes(x, weight):
        return True
    if device.backend_of(x) == "npu":
        return x.dtype == torch.float64 or not _npu_plan(x, weight, ce_weight).class_slice
    return not _cuda_plan(x, weight).class_slice


# --- The entries of the dispatch keys


def _options(ignore_index, label_smoothing, reduction, lse_square_scale, softcap) -> Options:
    return Options(ignore_index, label_smoothing, reduction, lse_square_scale, softcap)


def _cuda_plan(x: torch.Tensor, weight: torch.Tensor) -> Plan:
    return plan.cuda(*_sizes(x, weight), x.element_size(), device.free_bytes(x))


def _npu_plan(x: torch.Tensor, weight: torch.Tensor, ce_weight: torch.Tensor | None) -> Plan:
    return plan.npu(*_sizes(x, weight), x.element_size(), device.free_bytes(x), ce_weight is not None,
                    device.npu_ub_bytes(), device.npu_vector_cores())  # fmt: skip


def cuda_forward(x, weight, target, bias, ce_weight, *options):
    o = _options(*options)
    with checked_targets(OP, target, weight.shape[0], o.ignore_index):
        return forward(x, weight, target, bias, ce_weight, o, _cuda_plan(x, weight))


def _op_grads(grads: tuple, x: torch.Tensor) -> tuple:
    """The backward op's outputs: grad_x an empty tensor where the mask leaves it out (the schema's first
    output is a Tensor: DTensor dispatches no other tuple-returning op)."""
    return (x.new_empty(0) if grads[0] is None else grads[0], *grads[1:])


def cuda_backward(grad_loss, x, weight, target, lse, bias, ce_weight, *options_and_mask):
    o, mask = _options(*options_and_mask[:5]), tuple(options_and_mask[5])
    return _op_grads(backward(grad_loss, x, weight, target, lse, bias, ce_weight, o, mask, _cuda_plan(x, weight)), x)


# triton-ascend compiles no float64: float64 on the NPU runs the reference there.


def npu_forward(x, weight, target, bias, ce_weight, *options):
    o = _options(*options)
    if x.dtype == torch.float64:
        check_targets(OP, target, weight.shape[0], o.ignore_index)
        return reference.forward(x, weight, target, bias, ce_weight, o)
    with checked_targets(OP, target, weight.shape[0], o.ignore_index):
        return forward(x, weight, target, bias, ce_weight, o, _npu_plan(x, weight, ce_weight))


def npu_backward(grad_loss, x, weight, target, lse, bias, ce_weight, *options_and_mask):
    o, mask = _options(*options_and_mask[:5]), tuple(options_and_mask[5])
    if x.dtype == torch.float64:
        return _op_grads(reference.backward(grad_loss, x, weight, target, lse, bias, ce_weight, o, mask), x)
    p = _npu_plan(x, weight, ce_weight)
    return _op_grads(backward(grad_loss, x, weight, target, lse, bias, ce_weight, o, mask, p), x)


def reference_forward(x, weight, target, bias, ce_weight, *options):
    o = _options(*options)
    check_targets(OP, target, weight.shape[0], o.ignore_index)
    return reference.forward(x, weight, target, bias, ce_weight, o)


def reference_backward(grad_loss, x, weight, target, lse, bias, ce_weight, *options_and_mask):
    o, mask = _options(*options_and_mask[:5]), tuple(options_and_mask[5])
    return _op_grads(reference.backward(grad_loss, x, weight, target, lse, bias, ce_weight, o, mask), x)


def cuda_forward_with_grads(x, weight, target, bias, ce_weight, *options_and_mask):
    o, mask = _options(*options_and_mask[:5]), tuple(options_and_mask[5])
    with checked_targets(OP, target, weight.shape[0], o.ignore_index):
        return forward_with_grads(x, weight, target, bias, ce_weight, o, mask, _cuda_plan(x, weight))


def npu_forward_with_grads(x, weight, target, bias, ce_weight, *options_and_mask):
    o, mask = _options(*options_and_mask[:5]), tuple(options_and_mask[5])
    if x.dtype == torch.float64:
        check_targets(OP, target, weight.shape[0], o.ignore_index)
        return reference.forward_with_grads(x, weight, target, bias, ce_weight, o, mask)
    with checked_targets(OP, target, weight.shape[0], o.ignore_index):
        return forward_with_grads(x, weight, target, bias, ce_weight, o, mask, _npu_plan(x, weight, ce_weight))


def reference_forward_with_grads(x, weight, target, bias, ce_weight, *options_and_mask):
    o, mask = _options(*options_and_mask[:5]), tuple(options_and_mask[5])
    check_targets(OP, target, weight.shape[0], o.ignore_index)
    return reference.forward_with_grads(x, weight, target, bias, ce_weight, o, mask)
