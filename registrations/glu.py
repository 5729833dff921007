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
"""

from __future__ import annotations

import functools

import torch

from csrc_free_ops.glu import launch, reference
from registrations import _checks
from registrations._library import (
    Entries,
    Prepare,
    call_from_backward,
    define_op,
    register_autograd,
    register_autograd_by_reference,
)

# op name -> its activation (csrc_free_ops/glu/reference.py: ACTIVATIONS)
ACTIVATION = {"swiglu": "silu", "geglu": "gelu_tanh"}


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


def _fake(gate, up):
    return torch.empty(gate.shape, dtype=reference.output_dtype(gate, up), device=gate.device)


def _backward_fake(grad_out, gate, up):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _entries(forward: bool, activation: str) -> Entries:
    """The launch entries with the op's activation bound."""
    if forward:
        cuda, npu, ref = launch.cuda_forward, launch.npu_forward, reference.forward
    else:
        cuda, npu, ref = launch.cuda_backward, launch.npu_backward, reference.backward
    cuda, npu, ref = (functools.partial(f, activation=activation) for f in (cuda, npu, ref))
    return Entries(cuda=cuda, npu=npu, interpreted=cuda, reference=ref)


def _prepare(forward: bool, activation: str) -> Prepare:
    """The CUDA entries' prepared forms with the op's activation bound."""
    prepare = functools.partial(launch.prepare_cuda_forward if forward else launch.prepare_cuda_backward,
                                activation=activation)  # fmt: skip
    return Prepare(cuda=prepare, interpreted=prepare)


def _define(name: str) -> tuple[torch._ops.OpOverload, torch._ops.OpOverload]:
    activation = ACTIVATION[name]
    forward = define_op(
        f"{name}(Tensor gate, Tensor up) -> Tensor",
        check=_checker(name),
        fake=_fake,
        entries=_entries(True, activation),
        prepare=_prepare(True, activation),
    )
    backward = define_op(
        f"{name}_backward(Tensor grad_out, Tensor gate, Tensor up) -> (Tensor, Tensor)",
        check=_backward_checker(name),
        fake=_backward_fake,
        entries=_entries(False, activation),
        prepare=_prepare(False, activation),
    )

    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    def backward_formula(ctx, grad_out):
        gate, up = ctx.saved_tensors
        dgate, dup = call_from_backward(backward, grad_out, gate, up)
        need_gate, need_up = ctx.needs_input_grad[:2]
        return dgate if need_gate else None, dup if need_up else None

    register_autograd(forward, backward_formula, setup_context=setup_context)
    register_autograd_by_reference(backward, functools.partial(reference.backward, activation=activation))
    return forward, backward


SWIGLU, SWIGLU_BACKWARD = _define("swiglu")
GEGLU, GEGLU_BACKWARD = _define("geglu")
