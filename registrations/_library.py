"""The torch.library handle of the ``liger`` namespace and the one helper that
registers every op the same way: ``define_op`` (schema, fake kernel and one
entry per dispatch key) and ``register_autograd`` (the autograd formula).

Each dispatch key is bound to its own launch entry, so there is no second
routing by device:

* ``CUDA``: the op's CUDA launch (``csrc_free_ops/<op>/launch.py``);
* ``PrivateUse1`` (torch_npu's Ascend NPU): the op's NPU launch;
* ``CPU``: the CUDA launch sequence on CPU tensors under the Triton
  interpreter when ``TRITON_INTERPRET=1`` was set before this package was
  imported (Triton reads it when the kernels are defined), else the
  pure-PyTorch reference (``csrc_free_ops/<op>/reference.py``).

Every binding runs the op's ``check`` before its entry; the fake kernel runs
the same check, so bad input fails alike eagerly and under torch.compile.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

LIB = torch.library.Library("liger", "DEF")

# Read once, when the kernels are imported (with this package): Triton decides
# then whether a kernel is compiled or interpreted.
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"


class Entries(NamedTuple):
    """The launch entry of each dispatch key.  Each takes the op's schema
    arguments in order, defaults filled in, already checked."""

    cuda: Callable
    npu: Callable
    interpreted: Callable  # CPU tensors with TRITON_INTERPRET=1: the CUDA launch sequence, interpreted
    reference: Callable  # CPU tensors otherwise


class _Signature:
    """An op's arguments as its Python kernels receive them: the dispatcher
    passes positional arguments in order (dropping trailing ones equal to
    their default) and keyword-only ones by name (only those not at their
    default).  ``complete`` gives back every schema argument in order,
    defaults filled in; ``call`` calls the op with such a tuple."""

    def __init__(self, op: torch._ops.OpOverload):
        arguments = op._schema.arguments
        self.names = tuple(a.name for a in arguments)
        self.n_args = len(arguments)
        self.n_positional = sum(not a.kwarg_only for a in arguments)
        self.defaults = {a.name: a.default_value for a in arguments if a.has_default_value()}
        self.keyword_names = self.names[self.n_positional :]

    def complete(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        if len(args) == self.n_args:
            return args
        rest = [kwargs[n] if n in kwargs else self.defaults[n] for n in self.names[len(args) :]]
        return (*args, *rest)

    def call(self, op: Callable, args: tuple):
        """op(*args) for every schema argument in order, the keyword-only ones passed by name."""
        if self.n_positional == self.n_args:
            return op(*args)
        return op(*args[: self.n_positional], **dict(zip(self.keyword_names, args[self.n_positional :], strict=True)))


def _with_defaults(fn: Callable, sig: _Signature) -> Callable:
    """fn called with every schema argument, in order, defaults filled in."""
    if not sig.defaults:
        return fn

    def call(*args, **kwargs):
        return fn(*sig.complete(args, kwargs))

    return call


def _checked(check: Callable, entry: Callable) -> Callable:
    def kernel(*args):
        check(*args)
        return entry(*args)

    return kernel


_NOTICE_GIVEN = False


def _reference_on_cpu(reference: Callable, name: str) -> Callable:
    """The CPU binding without the interpreter: the reference, after making
    sure the interpreter was not asked for too late, and a one-time notice
    that this path is pure PyTorch."""

    def run(*args):
        global _NOTICE_GIVEN
        if os.environ.get("TRITON_INTERPRET") == "1":
            raise RuntimeError(
                f"liger.{name}: TRITON_INTERPRET=1 was set after csrc_free_ops was imported. Triton reads it when "
                "the kernels are defined, so set it before the first import of csrc_free_ops / registrations / "
                "liger_nn (e.g. `TRITON_INTERPRET=1 python ...`) to run the Triton kernels on CPU tensors; unset "
                "it to keep running the pure-PyTorch reference."
            )
        if not _NOTICE_GIVEN:
            _NOTICE_GIVEN = True
            warnings.warn(
                f"liger.{name}: CPU tensors run the pure-PyTorch reference (set TRITON_INTERPRET=1 before importing "
                "csrc_free_ops to run the Triton kernels under the interpreter); shown once per process.",
                stacklevel=3,
            )
        return reference(*args)

    return run


def define_op(schema: str, *, check: Callable, fake: Callable, entries: Entries) -> torch._ops.OpOverload:
    """Define ``liger::<name>`` from its schema, bind each dispatch key to
    its entry and register the fake kernel; ``check`` runs first in all of
    them.  Returns the op's default overload."""
    LIB.define(schema)
    name = schema.split("(", 1)[0]
    op = getattr(torch.ops.liger, name).default
    sig = _Signature(op)
    cpu = entries.interpreted if INTERPRETER else _reference_on_cpu(entries.reference, name)
    for key, entry in (("CUDA", entries.cuda), ("PrivateUse1", entries.npu), ("CPU", cpu)):
        LIB.impl(name, _with_defaults(_checked(check, entry), sig), key)
    torch.library.register_fake("liger::" + name, _with_defaults(_checked(check, fake), sig), lib=LIB)
    return op


def _below_autograd(op: Callable, args: tuple, kwargs: dict[str, Any] | None = None):
    """Call ``op`` with dispatch starting below the Autograd key."""
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args, **(kwargs or {}))


def call_from_backward(op: Callable, *args, **kwargs):
    """Call ``op`` inside an autograd formula.  Unless the backward itself is
    being differentiated (grad mode on), the op's Autograd kernel would only
    redispatch, so dispatch starts below it: one Python kernel fewer."""
    return op(*args, **kwargs) if torch.is_grad_enabled() else _below_autograd(op, args, kwargs)


def register_autograd(op: torch._ops.OpOverload, backward: Callable, *, setup_context: Callable) -> None:
    """Give ``op`` an autograd formula, like torch.library.register_autograd.

    torch.library's version wraps every call in generic machinery (default
    filling, pytree flattening, keyset bookkeeping) that costs more host time
    than a small kernel takes on the GPU.  This registers one plain
    autograd.Function as the op's Autograd kernel instead: its forward
    redispatches below autograd (so fake tensors, functionalization and the
    backend kernels see the op as before) and calls ``setup_context`` with
    the arguments, defaults filled in; its backward is ``backward``, which
    returns one gradient (or None) per schema argument.  With
    grad mode off or no input requiring grad it only redispatches.
    """
    name = op._schema.name.split("::", 1)[1]
    sig = _Signature(op)

    class Formula(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            with torch._C._AutoDispatchBelowAutograd():
                output = sig.call(op, args)
            setup_context(ctx, args, output)
            return output

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    Formula.__name__ = Formula.__qualname__ = f"{name}_autograd"

    def autograd_kernel(*args, **kwargs):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return Formula.apply(*sig.complete(args, kwargs))
        return _below_autograd(op, args, kwargs)

    LIB.impl(name, autograd_kernel, "Autograd")


def register_autograd_by_reference(op: torch._ops.OpOverload, reference: Callable) -> None:
    """Make a backward op differentiable through its pure-PyTorch reference
    (same arguments, same outputs, built from differentiable torch ops): its
    gradient is the vector-Jacobian product of the reference, so second-order
    gradients (gradient penalties, Hessian-vector products) are exact, at the
    reference's speed.  With create_graph it stays differentiable."""

    def setup_context(ctx, args, output) -> None:
        ctx.is_tensor = tuple(isinstance(a, torch.Tensor) for a in args)
        ctx.others = tuple(None if t else a for a, t in zip(args, ctx.is_tensor, strict=True))
        ctx.save_for_backward(*(a for a, t in zip(args, ctx.is_tensor, strict=True) if t))

    def backward(ctx, *grads):
        create_graph = torch.is_grad_enabled()
        saved = iter(ctx.saved_tensors)
        args, wrt = [], []
        with torch.enable_grad():
            for i, (is_tensor, other) in enumerate(zip(ctx.is_tensor, ctx.others, strict=True)):
                a = next(saved) if is_tensor else other
                if is_tensor and ctx.needs_input_grad[i]:
                    a = a if create_graph and a.requires_grad else a.detach().requires_grad_()
                    wrt.append(i)
                args.append(a)
            outs = reference(*args)
            pairs = [
                (o, g) for o, g in zip(outs, grads, strict=True) if g is not None and o is not None and o.requires_grad
            ]
            found = (None,) * len(wrt)
            if pairs:
                found = torch.autograd.grad(
                    [o for o, _ in pairs], [args[i] for i in wrt], [g for _, g in pairs],
                    allow_unused=True, create_graph=create_graph,
                )  # fmt: skip
        result: list[torch.Tensor | None] = [None] * len(args)
        for i, g in zip(wrt, found, strict=True):
            result[i] = g if g is not None else torch.zeros_like(args[i])
        return tuple(result)

    register_autograd(op, backward, setup_context=setup_context)
