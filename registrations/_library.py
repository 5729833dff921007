"""The torch.library handle of the ``liger`` namespace and the routing from
a backend's dispatch key to the launcher module that serves it."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

import torch

from csrc_free_ops import device

LIB = torch.library.Library("liger", "DEF")

# Each op's kernel is registered under these keys; PrivateUse1 is where
# torch_npu puts Ascend NPU tensors.
BACKEND_KEYS = ("CUDA", "PrivateUse1", "CPU")


class Launchers(NamedTuple):
    """The per-backend launcher modules of one op."""

    cuda: ModuleType
    npu: ModuleType
    reference: ModuleType


def triton_interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def pick(t: torch.Tensor, launchers: Launchers) -> ModuleType:
    """The module serving t's backend.  CPU tensors run the CUDA Triton
    launchers under the Triton interpreter, else the pure-PyTorch reference."""
    backend = device.backend_of(t)
    if backend == "cuda":
        return launchers.cuda
    if backend == "npu":
        return launchers.npu
    return launchers.cuda if triton_interpreter_on() else launchers.reference


def define(schema: str, kernel: Callable) -> str:
    """Define ``liger::<name>`` from its schema, register ``kernel`` for every
    backend key, and return the qualified name."""
    LIB.define(schema)
    name = schema.split("(", 1)[0]
    for key in BACKEND_KEYS:
        LIB.impl(name, kernel, key)
    return "liger::" + name


def _below_autograd(op: Callable, args: tuple):
    """Call ``op`` with dispatch starting below the Autograd key."""
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def call_from_backward(op: Callable, *args):
    """Call ``op`` inside an autograd formula.  Unless the backward itself is
    being differentiated (grad mode on), the op's Autograd kernel would only
    redispatch, so dispatch starts below it: one Python kernel fewer."""
    return op(*args) if torch.is_grad_enabled() else _below_autograd(op, args)


def register_autograd(
    qualname: str,
    backward: Callable,
    *,
    setup_context: Callable,
    defaults: tuple = (),
) -> None:
    """Give ``qualname`` an autograd formula, like torch.library.register_autograd.

    torch.library's version wraps every call in generic machinery (default
    filling, pytree flattening, keyset bookkeeping) that costs more host time
    than a small kernel takes on the GPU.  This registers one plain
    autograd.Function as the op's Autograd kernel instead: its forward
    redispatches below autograd (so fake tensors, functionalization and the
    backend kernels see the op as before) and calls ``setup_context``; its
    backward is ``backward``.  With grad mode off or no input requiring grad
    it only redispatches.  ``defaults`` are the schema defaults of the
    trailing arguments, which the dispatcher drops when a caller omits them.
    """
    ns, name = qualname.split("::", 1)
    op = getattr(getattr(torch.ops, ns), name).default
    n_args = len(op._schema.arguments)

    def complete(args: tuple) -> tuple:
        return args + defaults[len(defaults) - (n_args - len(args)) :] if len(args) < n_args else args

    class Formula(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            args = complete(args)
            output = _below_autograd(op, args)
            setup_context(ctx, args, output)
            return output

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    Formula.__name__ = Formula.__qualname__ = f"{name}_autograd"

    def autograd_kernel(*args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return Formula.apply(*args)
        return _below_autograd(op, args)

    LIB.impl(name, autograd_kernel, "Autograd")
