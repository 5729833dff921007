"""torch.ops.liger.swiglu, torch.ops.liger.geglu and their backward ops.

swiglu(gate, up) -> y
    y = silu(gate) * up, the elementwise part of Llama's, Mistral's and
    Qwen's MLPs.  gate and up: the same shape (no broadcasting), any strides
    (the halves of a fused [gate | up] projection are read in place), each
    float32/bfloat16/float16/float64, on one device.  y is contiguous, of
    torch.promote_types(gate.dtype, up.dtype).  Gradients flow to gate and
    up, each in its input's dtype; the backward op is differentiable too
    (second-order gradients through the reference).
swiglu_backward(grad_out, gate, up) -> (dgate, dup)
    dgate = grad_out * silu'(gate) * up, dup = grad_out * silu(gate);
    grad_out of any float dtype with gate's shape.
geglu(gate, up) -> y
    y = gelu(gate, approximate='tanh') * up (Gemma's MLP); as swiglu.
geglu_backward(grad_out, gate, up) -> (dgate, dup)
    As swiglu_backward, with GELU's tanh approximation.
geglu_exact(gate, up) -> y
    y = gelu(gate) * up with torch's exact (erf) GELU, F.gelu's default
    (diffusers' GEGLU, in SD 1.5's and SDXL's UNets); as swiglu.
geglu_exact_backward(grad_out, gate, up) -> (dgate, dup)
    As swiglu_backward, with the exact GELU.
swiglu_backward_(grad_out, gate, up) -> ()
    swiglu_backward in place: dgate written over gate, dup over up
    (contiguous, neither sharing memory with the other or with grad_out).
    Not differentiable.  swiglu's formula calls it instead of the
    out-of-place backward when nothing but the formula can reach the saved
    gate and up (registrations/reuse.py), so a gated MLP's backward takes no
    memory for its two gradients.
geglu_backward_(grad_out, gate, up) -> ()
    geglu_backward in place; as swiglu_backward_.
geglu_exact_backward_(grad_out, gate, up) -> ()
    geglu_exact_backward in place; as swiglu_backward_.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from csrc_free_ops.glu import launch, reference
from registrations import _checks, overlap, reuse
from registrations._library import (
    Entries,
    Prepare,
    call_from_backward,
    define_op,
    register_autograd,
    register_autograd_by_reference,
    register_version_bumps,
)

# op name -> its activation (csrc_free_ops/glu/reference.py: ACTIVATIONS)
ACTIVATION = {"swiglu": "silu", "geglu": "gelu_tanh", "geglu_exact": "gelu"}


def _check_inputs(op: str, gate: torch.Tensor, up: torch.Tensor) -> None:
    _checks.check_float(op, "gate", gate)
    _checks.check_float(op, "up", up)
    if gate.shape != up.shape:
        raise ValueError(
            f"{op}: gate shape {tuple(gate.shape)} != up shape {tuple(up.shape)}; they must match (no broadcasting)"
        )
    _checks.check_same_device(op, "gate", gate, (("up", up),))


def _checker(name: str):
    op = "liger." + name

    def check(gate: torch.Tensor, up: torch.Tensor) -> None:
        _check_inputs(op, gate, up)

    return check


def _backward_checker(name: str):
    op = f"liger.{name}_backward"

    def check(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> None:
        _check_inputs(op, gate, up)
        _checks.check_grad(op, "grad_out", grad_out, "gate", gate)

    return check


def _in_place_checker(name: str):
    op = f"liger.{name}_backward_"
    check_out_of_place = _backward_checker(name)

    def check(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> None:
        check_out_of_place(grad_out, gate, up)
        for arg, t in (("gate", gate), ("up", up)):
            if not t.is_contiguous():
                raise ValueError(f"{op}: {arg} must be contiguous (its gradient is written over it)")

    return check


def _disjoint_checker(name: str):
    op = f"liger.{name}_backward_"

    def check(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> None:
        for a, b, x, y in (("gate", "up", gate, up), ("grad_out", "gate", grad_out, gate),
                           ("grad_out", "up", grad_out, up)):  # fmt: skip
            if _overlapping(x, y):
                raise ValueError(f"{op}: {a} and {b} overlap in memory; writing the gradients in place would "
                                 "change what is still to be read")  # fmt: skip

    return check


def _overlapping(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact: plain contiguous tensors (gate and up always, grad_out nearly always) by their byte
    ranges, others (fake tensors under torch.compile included) by registrations/overlap.py."""
    if type(a) is torch.Tensor and type(b) is torch.Tensor and a.is_contiguous() and b.is_contiguous():
        start_a, start_b = a.data_ptr(), b.data_ptr()
        return start_a < start_b + b.nbytes and start_b < start_a + a.nbytes and a.numel() > 0 and b.numel() > 0
    return overlap.overlapping(a, b)


def _fake(gate, up):
    return torch.empty(gate.shape, dtype=reference.output_dtype(gate, up), device=gate.device)


def _backward_fake(grad_out, gate, up):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _in_place_fake(grad_out, gate, up) -> None:
    return None


def _entries(direction: str, activation: str) -> Entries:
    """The launch entries of ``direction`` (forward, backward or backward_) with the op's activation bound."""
    cuda, npu, ref = (functools.partial(getattr(module, f"{prefix}{direction}"), activation=activation)
                      for module, prefix in ((launch, "cuda_"), (launch, "npu_"), (reference, "")))  # fmt: skip
    return Entries(cuda=cuda, npu=npu, interpreted=cuda, reference=ref)


def _prepare(direction: str, activation: str) -> Prepare:
    """The CUDA entry's prepared form with the op's activation bound."""
    prepare = functools.partial(getattr(launch, f"prepare_cuda_{direction}"), activation=activation)
    return Prepare(cuda=prepare, interpreted=prepare)


class GatedUnit(NamedTuple):
    """One gated unit's three ops and its activation (csrc_free_ops/glu/reference.py: ACTIVATIONS)."""

    forward: torch._ops.OpOverload
    backward: torch._ops.OpOverload
    backward_: torch._ops.OpOverload
    activation: str


def _define(name: str) -> GatedUnit:
    activation = ACTIVATION[name]
    forward = define_op(
        f"{name}(Tensor gate, Tensor up) -> Tensor",
        check=_checker(name),
        fake=_fake,
        entries=_entries("forward", activation),
        prepare=_prepare("forward", activation),
    )
    backward = define_op(
        f"{name}_backward(Tensor grad_out, Tensor gate, Tensor up) -> (Tensor, Tensor)",
        check=_backward_checker(name),
        fake=_backward_fake,
        entries=_entries("backward", activation),
        prepare=_prepare("backward", activation),
    )
    backward_ = define_op(
        f"{name}_backward_(Tensor grad_out, Tensor(a!) gate, Tensor(b!) up) -> ()",
        check=_in_place_checker(name),
        check_each_call=_disjoint_checker(name),
        fake=_in_place_fake,
        entries=_entries("backward_", activation),
        prepare=_prepare("backward_", activation),
        traceable=False,  # in place: torch.compile functionalizes the opaque op
    )

    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    def backward_formula(ctx, grad_out):
        (gate, up), in_place = reuse.unpack(ctx)  # in place: no other tensor, grad_out included, shares their memory
        need_gate, need_up = ctx.needs_input_grad[:2]
        if in_place:
            call_from_backward(backward_, grad_out, gate, up)
            dgate, dup = gate.detach(), up.detach()  # no graph history on a gradient
        else:
            dgate, dup = call_from_backward(backward, grad_out, gate, up)
        return dgate if need_gate else None, dup if need_up else None

    register_autograd(forward, backward_formula, setup_context=setup_context)
    register_autograd_by_reference(backward, functools.partial(reference.backward, activation=activation))
    register_version_bumps(backward_, (1, 2))
    return GatedUnit(forward, backward, backward_, activation)


# Every gated unit by op name; the DTensor and torch.func rules (sharding.py, functorch.py) take each
# unit's ops from here, alike.
GATED_UNITS: dict[str, GatedUnit] = {name: _define(name) for name in ACTIVATION}
# Each op at module level too, where registrations._docs finds the module that defines it.
SWIGLU, SWIGLU_BACKWARD, SWIGLU_BACKWARD_, _ = GATED_UNITS["swiglu"]
GEGLU, GEGLU_BACKWARD, GEGLU_BACKWARD_, _ = GATED_UNITS["geglu"]
GEGLU_EXACT, GEGLU_EXACT_BACKWARD, GEGLU_EXACT_BACKWARD_, _ = GATED_UNITS["geglu_exact"]
