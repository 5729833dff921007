"""An op's autograd: ``register_autograd`` (the formula as the op's Autograd
kernel, and the direct kernel ``eager_call`` enters), ``call_from_backward``
(a backward op called from a formula), ``register_autograd_by_reference``
(a backward op differentiable through its reference) and
``register_version_bumps`` (an in-place op's ADInplaceOrView kernel)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import forward_ad

from registrations.define import LIB, signature
from registrations.eager import DIRECT_KERNELS, below_autograd, calls_of, run_below_autograd
from registrations.transforms import any_tangent, apply_on_this_level, below_autograd_in_transforms, jvp


def call_from_backward(op: torch._ops.OpOverload, *args):
    """Call ``op`` (a backward op, every schema argument given) inside an
    autograd formula.  When the backward itself is being differentiated
    (grad mode on, or forward-mode tangents flowing in, e.g. a
    Hessian-vector product by jvp over grad) it goes through the op's
    Autograd kernel.  Otherwise dispatch starts below it; and where the
    dispatcher would only reach the entry, the prepared run is called
    directly (registrations/eager.py)."""
    if torch.is_grad_enabled() or (forward_ad._current_level >= 0 and any_tangent(args)):
        return signature(op).call(op, args)
    run = calls_of(op).run_for(args)
    return run(*args) if run is not None else below_autograd(op, args)


def _tensor_positions(op: torch._ops.OpOverload) -> tuple[int, ...]:
    """Positions of the schema's Tensor and Tensor? arguments."""
    positions = []
    for i, a in enumerate(op._schema.arguments):
        t = a.type
        if isinstance(t, torch.OptionalType):
            t = t.getElementType()
        if isinstance(t, torch.TensorType):
            positions.append(i)
    return tuple(positions)


def _function(name: str, base: type = torch.autograd.Function, **methods: Callable) -> type:
    """A ``base`` (torch.autograd.Function) subclass called ``name`` with these static methods."""
    body = {k: staticmethod(v) for k, v in methods.items()}
    return type(name, (base,), {"__qualname__": name, **body})


def c_apply(function: type) -> Callable:
    """``function.apply`` without Function.apply's Python layer, for plain
    calls only: that layer binds default arguments (none here) and unwraps
    tensors of transforms that ended, which a plain call has none of
    (registrations/eager.py)."""
    base = torch.autograd.function._SingleLevelFunction
    if base in function.__mro__ and torch._C._FunctionBase in base.__mro__:
        return super(base, function).apply
    return function.apply


def register_autograd(
    op: torch._ops.OpOverload,
    backward: Callable,
    *,
    setup_context: Callable,
    forward_with_extras: Callable[[tuple], tuple | None] | None = None,
) -> None:
    """Give ``op`` an autograd formula, like torch.library.register_autograd.

    torch.library's version wraps every call in generic machinery (default
    filling, pytree flattening, keyset bookkeeping) that costs more host time
    than a small kernel takes on the GPU.  This registers one plain
    autograd.Function as the op's Autograd kernel instead: its forward
    redispatches below autograd (so fake tensors, functionalization and the
    backend kernels see the op as before) and calls ``setup_context`` with
    the arguments, defaults filled in; its backward is ``backward``, which
    returns one gradient (or None) per schema argument.  With
    grad mode off, no input requiring grad and no forward-AD tangent it only
    redispatches.

    Forward-mode AD and torch.func transforms: registrations/transforms.py.

    ``forward_with_extras(args)``, where given, runs first in a plain
    recorded forward (no transform, no forward AD): it returns the op's
    outputs followed by extra values for ``setup_context`` (which then gets
    them all; the caller gets the op's outputs), or None to run the op.  An
    op with it records every eager call through its Autograd kernel.
    """
    name = op._schema.name.split("::", 1)[1]
    sig = signature(op)
    calls = calls_of(op)

    n_outputs = len(op._schema.returns)

    def forward(ctx, *args):
        if forward_with_extras is not None and forward_ad._current_level < 0:
            output = forward_with_extras(args)
            if output is not None:
                setup_context(ctx, args, output)
                return output[:n_outputs]
        output = below_autograd_in_transforms(calls, args)
        setup_context(ctx, args, output)
        if forward_ad._current_level >= 0:  # a dual level is open: jvp may need the primals
            ctx.jvp_primals = args
        return output

    def formula_backward(ctx, *grads):
        return backward(ctx, *grads)

    def formula_jvp(ctx, *tangents):
        return jvp(op, ctx.jvp_primals, tangents)

    def forward_in_transforms(*args):
        return below_autograd_in_transforms(calls, args)

    def setup_context_in_transforms(ctx, inputs, output):
        setup_context(ctx, inputs, output)
        if forward_ad._current_level >= 0:
            ctx.jvp_primals = inputs

    # Named when created: autograd names the graph's node class (grad_fn) after it then.
    Formula = _function(f"{name}_autograd", forward=forward, backward=formula_backward, jvp=formula_jvp)
    # The same formula as a single-level Function in the setup_context style, the form torch's own
    # functorch rules apply under a transform's layer (torch 2.14's C++ Function.apply sends a
    # torch.autograd.Function there back into functorch); plain eager calls keep the combined
    # style, whose apply skips Function.apply's per-call signature binding.
    FormulaInTransforms = _function(
        Formula.__name__,
        torch.autograd.function._SingleLevelFunction,
        forward=forward_in_transforms,
        setup_context=setup_context_in_transforms,
        backward=formula_backward,
        jvp=formula_jvp,
    )
    apply = apply_on_this_level(Formula, FormulaInTransforms)

    tensor_positions = _tensor_positions(op)

    def autograd_kernel(*args, **kwargs):
        args = sig.complete(args, kwargs)
        if torch.is_grad_enabled():
            for i in tensor_positions:
                a = args[i]
                if a is not None and a.requires_grad:
                    return apply(*args)
        if forward_ad._current_level >= 0 and any_tangent(args):
            return apply(*args)
        return run_below_autograd(calls, args)

    LIB.impl(name, autograd_kernel, "Autograd")

    def direct_forward(ctx, *args_and_run):
        args, run = args_and_run[:-1], args_and_run[-1]
        output = run(*args)
        setup_context(ctx, args, output)
        return output

    def direct_backward(ctx, *grads):
        return (*backward(ctx, *grads), None)

    # Formula for eager_call's plain calls: the prepared run, found by the caller, comes after the
    # schema's arguments and is called directly.  Same name, so the same grad_fn name.
    Direct = _function(Formula.__name__, forward=direct_forward, backward=direct_backward)
    direct_apply = c_apply(Direct)

    def direct_kernel(run: Callable, args: tuple):
        """autograd_kernel(*args) (every schema argument given) for a plain
        call whose prepared run (check passed) is ``run``."""
        if forward_with_extras is not None:
            return autograd_kernel(*args)
        if torch.is_grad_enabled():
            for i in tensor_positions:
                a = args[i]
                if a is not None and a.requires_grad:
                    return apply(*args) if forward_ad._current_level >= 0 else direct_apply(*args, run)
        if forward_ad._current_level >= 0 and any_tangent(args):
            return apply(*args)
        return run(*args)

    DIRECT_KERNELS[op] = direct_kernel


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


def bump(args: tuple, mutated: tuple[int, ...]) -> None:
    """Bump the version counters of the tensors at positions ``mutated`` of ``args`` (absent or None: none)."""
    for i in mutated:
        if i < len(args) and args[i] is not None:
            torch.autograd.graph.increment_version(args[i])


def register_version_bumps(op: torch._ops.OpOverload, mutated: tuple[int, ...]) -> None:
    """Bump the version counters of the tensors ``op`` writes (at schema positions ``mutated``), as
    torch.library.custom_op does for ops that mutate: a saved tensor written afterwards then fails
    backward's version check, grad mode or not."""
    after = torch._C._after_ADInplaceOrView_keyset

    def bump_versions(keyset, *args, **kwargs):
        bump(args, mutated)
        return op.redispatch(keyset & after, *args, **kwargs)

    LIB.impl(op._schema.name.split("::", 1)[1], bump_versions, "ADInplaceOrView", with_keyset=True)
