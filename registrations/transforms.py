"""Forward-mode AD and torch.func transforms (grad, vjp, jvp, jacrev, jacfwd,
and vmap over them).

The Autograd kernel records the Formula node on the tensors its dispatch
level sees, as a built-in op's Autograd kernel does: under a torch.func
transform those are already unwrapped by the transform's layer, so
Function.apply's own detour into functorch (meant for a Function applied to
wrapped tensors from user code, and demanding the setup_context style) is
skipped.  Forward-mode tangents: dual tensors carry no requires_grad, so the
kernel looks for them; Formula.jvp takes them from the op's rule in
JVP_RULES (registered by registrations/functorch.py), and an op without a
rule raises, naming itself, instead of dropping the tangent.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._functorch.utils import enable_single_level_autograd_function
from torch.autograd import forward_ad

from registrations.eager import Calls, run_below_autograd

JVP_RULES: dict[torch._ops.OpOverload, Callable] = {}


def apply_on_this_level(formula: type, formula_in_transforms: type) -> Callable:
    """formula.apply, except under torch.func transforms: there Function.apply
    would detour into functorch (meant for a Function applied to wrapped
    tensors from user code), so the C++ apply it ends in otherwise is called
    on ``formula_in_transforms`` (the same formula as a single-level
    Function with a setup_context),
    allowed under a transform's layer the way torch's own functorch rules
    apply their single-level Functions."""
    single_level = formula_in_transforms.apply

    def apply(*args):
        if not torch._C._are_functorch_transforms_active():
            return formula.apply(*args)
        with enable_single_level_autograd_function():
            return single_level(*args)

    return apply


def below_autograd_in_transforms(calls: Calls, args: tuple):
    """The op below autograd, from a Formula's forward.  Under torch.func
    transforms, a jvp level below this one (jvp over grad) computes its
    tangents in that level's Autograd kernel; Function.apply turned forward
    AD off for this forward, so it is turned back on for the levels below."""
    if not torch._C._are_functorch_transforms_active():
        return run_below_autograd(calls, args)
    with forward_ad._set_fwd_grad_enabled(True):
        return run_below_autograd(calls, args)


def any_tangent(args: tuple) -> bool:
    return any(isinstance(a, torch.Tensor) and forward_ad.unpack_dual(a).tangent is not None for a in args)


def jvp(op: torch._ops.OpOverload, primals: tuple, tangents: tuple):
    rule = JVP_RULES.get(op)
    if rule is None:
        raise NotImplementedError(
            f"{op._schema.name.replace('::', '.')}: forward-mode AD (torch.func.jvp / jacfwd, "
            "torch.autograd.forward_ad) has no rule for this op; use reverse mode (torch.func.vjp / jacrev)"
        )
    return rule(primals, tangents)
