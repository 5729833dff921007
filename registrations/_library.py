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

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch._functorch.utils import enable_single_level_autograd_function
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.autograd import forward_ad

from csrc_free_ops import launcher

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
        return (*args, *(kwargs[n] if n in kwargs else self.defaults[n] for n in self.names[len(args) :]))

    def call(self, op: Callable, args: tuple):
        """op(*args) for every schema argument in order, the keyword-only ones passed by name."""
        if self.n_positional == self.n_args:
            return op(*args)
        return op(*args[: self.n_positional], **dict(zip(self.keyword_names, args[self.n_positional :], strict=True)))


_SIGNATURES: dict[Any, _Signature] = {}


def _signature(op: torch._ops.OpOverload) -> _Signature:
    sig = _SIGNATURES.get(op)
    if sig is None:
        sig = _SIGNATURES[op] = _Signature(op)
    return sig


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


_INTERNAL_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch,) + tuple(sys.modules[n] for n in ("registrations",))
)


def _caller_stacklevel() -> int:
    """warnings.warn's stacklevel of the first frame outside this package and
    torch (the dispatcher and autograd sit between the user's call and here)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def _reference_on_cpu(reference: Callable, name: str) -> Callable:
    """The CPU binding without the interpreter: the reference, after making
    sure the interpreter was not asked for too late, and a one-time notice
    that this path is pure PyTorch."""

    def run(*args):
        global _NOTICE_GIVEN
        if os.environ.get("TRITON_INTERPRET") == "1":
            raise RuntimeError(
                f"liger.{name}: TRITON_INTERPRET=1 was set after csrc_free_ops was imported. Triton reads it when "
                "the kernels are defined, so set it before triton is first imported (before csrc_free_ops, "
                "liger_nn or anything else that imports triton, e.g. `TRITON_INTERPRET=1 python ...`) to run the "
                "Triton kernels on CPU tensors; unset it to keep running the pure-PyTorch reference."
            )
        if not _NOTICE_GIVEN:
            _NOTICE_GIVEN = True
            warnings.warn(
                f"liger.{name}: CPU tensors run the pure-PyTorch reference (set TRITON_INTERPRET=1 before triton "
                "is first imported to run the Triton kernels under the interpreter); shown once per process.",
                stacklevel=_caller_stacklevel(),
            )
        return reference(*args)

    return run


class _Bound(NamedTuple):
    """What ``define_op`` bound for one op: its check and the entry of each
    device type (``cpu`` as chosen at import), for calls that skip the
    dispatcher (``_direct_entry``)."""

    check: Callable
    by_device: dict[str, Callable]


_BOUND: dict[torch._ops.OpOverload, _Bound] = {}


def define_op(
    schema: str, *, check: Callable, fake: Callable, entries: Entries, traceable: bool = True
) -> torch._ops.OpOverload:
    """Define ``liger::<name>`` from its schema, bind each dispatch key to
    its entry and register the fake kernel; ``check`` runs first in all of
    them.  ``traceable``: under torch.compile, CUDA calls decompose into the
    entry's kernels (below).  Returns the op's default overload."""
    LIB.define(schema)
    name = schema.split("(", 1)[0]
    op = getattr(torch.ops.liger, name).default
    sig = _signature(op)
    cpu = entries.interpreted if INTERPRETER else _reference_on_cpu(entries.reference, name)
    for key, entry in (("CUDA", entries.cuda), ("PrivateUse1", entries.npu), ("CPU", cpu)):
        LIB.impl(name, _with_defaults(_checked(check, entry), sig), key)
    torch.library.register_fake("liger::" + name, _with_defaults(_checked(check, fake), sig), lib=LIB)
    privateuse1 = torch._C._get_privateuse1_backend_name()
    _BOUND[op] = _Bound(check, {"cuda": entries.cuda, "cpu": cpu, privateuse1: entries.npu})
    if traceable:
        torch.library.register_torch_dispatch(
            "liger::" + name, FunctionalTensorMode, _decomposition(sig, check, entries.cuda), lib=LIB
        )
    return op


# ---------------------------------------------------------------------------
# Under torch.compile: the kernels in the graph.
#
# Dynamo records a call of a liger op as one opaque node.  When AOTAutograd
# traces the graph (under FunctionalTensorMode), an op on CUDA tensors of
# concrete sizes is decomposed instead, as torch.library.triton_op does: its
# CUDA entry runs on the traced tensors with launches going through
# torch.library.wrap_triton (launcher.traced_launches), so the graph holds
# the entry's allocations and its triton_kernel_wrapper nodes, and Inductor
# launches the kernels from its generated code instead of calling back into
# Python for the op.  Everything else keeps the opaque op: other devices (the
# NPU, CPU tensors: the interpreter's kernels are no JITFunctions), symbolic
# sizes (the plans compute on plain ints; specializing them would recompile
# per shape), torch.export (a serializable program keeps high-level ops),
# tensor subclasses, and a launch the traced path cannot express
# (launcher.Untraceable).  CSRC_FREE_OPS_DECOMPOSE=0, or decomposition(False),
# turns it off.

_DECOMPOSE = [os.environ.get("CSRC_FREE_OPS_DECOMPOSE", "1") != "0"]


@contextlib.contextmanager
def decomposition(enabled: bool) -> Iterator[None]:
    """Whether graphs traced inside this block decompose the ops into their
    kernels (the compiled code keeps what was traced)."""
    previous = _DECOMPOSE[0]
    _DECOMPOSE[0] = enabled
    try:
        yield
    finally:
        _DECOMPOSE[0] = previous


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _concrete(args: tuple) -> bool:
    """Every tensor on CUDA with plain-int sizes, strides and offset, and no symbolic scalar."""
    for a in args:
        if isinstance(a, torch.Tensor):
            for s in (*a.shape, *a.stride(), a.storage_offset()):
                if isinstance(s, _SYMBOLIC):
                    return False
            if a.device.type != "cuda":
                return False
        elif isinstance(a, _SYMBOLIC) or (isinstance(a, (list, tuple)) and any(isinstance(v, _SYMBOLIC) for v in a)):
            return False
    return True


def _export_in_progress() -> bool:
    """torch.export keeps custom ops whole (triton_op's rule); its switch is private, so a torch
    without it counts as exporting never."""
    try:
        from torch.export._trace import custom_triton_ops_decomposition_disabled
    except ImportError:
        return False
    return custom_triton_ops_decomposition_disabled()


def _plain_types(types: Any) -> bool:
    """Only the tensor types AOTAutograd's own tracing brings (triton_op's rule)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return all(issubclass(t, FakeTensor) or t in (torch.Tensor, FunctionalTensor) for t in types)


def _decomposition(sig: _Signature, check: Callable, cuda_entry: Callable) -> Callable:
    def decompose(mode, op, types, args, kwargs):
        if not _plain_types(types):
            return NotImplemented
        full = sig.complete(args, kwargs or {})
        if not (_DECOMPOSE[0] and _concrete(full)) or _export_in_progress():
            return mode.__torch_dispatch__(op, types, args, kwargs)
        try:
            with mode, launcher.traced_launches():
                check(*full)
                return cuda_entry(*full)
        except launcher.Untraceable:  # what it traced before this is left unused, and dropped
            return mode.__torch_dispatch__(op, types, args, kwargs)

    return decompose


# The dispatch keys (raw_repr) of a plain dense tensor, per device type found
# so far, mapped to that device type.
_PLAIN_KEYS: dict[int, str] = {}
# The keys a thread includes in every dispatch when no transform (torch.func's
# dynamic layers, the Python dispatcher) has added its own.
_DEFAULT_INCLUDE = torch._C._dispatch_tls_local_include_set()
_dispatch_keys = torch._C._dispatch_keys
_mode_stack_depth = torch._C._len_torch_dispatch_stack
_local_include = torch._C._dispatch_tls_local_include_set


def _plain_device_type(t: torch.Tensor, keys: Any) -> str | None:
    """t's device type if ``keys`` (t's dispatch keys) are those of a plain
    dense tensor on that device, else None."""
    raw = keys.raw_repr()
    kind = _PLAIN_KEYS.get(raw)
    if kind is None and keys == _dispatch_keys(torch.empty(0, device=t.device)):
        kind = _PLAIN_KEYS[raw] = t.device.type
    return kind


def _direct_entry(op: torch._ops.OpOverload, args: tuple) -> Callable | None:
    """The entry the dispatcher would reach for these arguments below
    Autograd, when nothing else could run first: no TorchDispatchMode is
    active (fake tensors, tracing, profilers' modes), no transform has
    added dispatch keys to the thread (torch.func), and every tensor
    argument carries exactly a plain dense tensor's dispatch keys, the same
    for all (no subclass with __torch_dispatch__ (DTensor), no
    functionalization or functorch wrapper, no negative/conjugate view, no
    inference tensor).  None otherwise: then the call goes through the
    dispatcher.  Skipping it saves a trip through the dispatcher and a
    Python kernel per call, which is what decides small eager calls."""
    bound = _BOUND.get(op)
    if bound is None or _mode_stack_depth() or _local_include() != _DEFAULT_INCLUDE:
        return None
    keys = first = None
    for a in args:
        if isinstance(a, torch.Tensor):
            if first is None:
                first, keys = a, _dispatch_keys(a)
            elif _dispatch_keys(a) != keys:
                return None
    if first is None:
        return None
    kind = _plain_device_type(first, keys)
    return None if kind is None else bound.by_device.get(kind)


def _below_autograd(op: torch._ops.OpOverload, args: tuple):
    """Call ``op`` (every schema argument given, in order) with dispatch
    starting below the Autograd key."""
    with torch._C._AutoDispatchBelowAutograd():
        return _signature(op).call(op, args)


def _checked_below_autograd(op: torch._ops.OpOverload, args: tuple):
    """``_below_autograd(op, args)``, calling the checked entry directly where
    that is what the dispatcher would do (``_direct_entry``)."""
    entry = _direct_entry(op, args)
    if entry is None:
        return _below_autograd(op, args)
    _BOUND[op].check(*args)
    return entry(*args)


def call_from_backward(op: torch._ops.OpOverload, *args):
    """Call ``op`` (a backward op, every schema argument given) inside an
    autograd formula.  When the backward itself is being differentiated
    (grad mode on, or forward-mode tangents flowing in, e.g. a
    Hessian-vector product by jvp over grad) it goes through the op's
    Autograd kernel.  Otherwise dispatch starts below it; and where the
    dispatcher would only reach the entry (``_direct_entry``), the entry is
    called directly and without re-validating: the forward checked these
    tensors, and autograd hands the incoming gradient with its output's
    shape, dtype and device."""
    if torch.is_grad_enabled() or (forward_ad._current_level >= 0 and _any_tangent(args)):
        return _signature(op).call(op, args)
    entry = _direct_entry(op, args)
    return entry(*args) if entry is not None else _below_autograd(op, args)


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
    grad mode off, no input requiring grad and no forward-AD tangent it only
    redispatches.

    Forward-mode AD and torch.func transforms: see the section below.
    """
    name = op._schema.name.split("::", 1)[1]
    sig = _signature(op)

    def forward(ctx, *args):
        output = _below_autograd_in_transforms(op, args)
        setup_context(ctx, args, output)
        if forward_ad._current_level >= 0:  # a dual level is open: jvp may need the primals
            ctx.jvp_primals = args
        return output

    def formula_backward(ctx, *grads):
        return backward(ctx, *grads)

    def jvp(ctx, *tangents):
        return _jvp(op, ctx.jvp_primals, tangents)

    def forward_in_transforms(*args):
        return _below_autograd_in_transforms(op, args)

    def setup_context_in_transforms(ctx, inputs, output):
        setup_context(ctx, inputs, output)
        if forward_ad._current_level >= 0:
            ctx.jvp_primals = inputs

    # Named when created: autograd names the graph's node class (grad_fn) after it then.
    Formula = _function(f"{name}_autograd", forward=forward, backward=formula_backward, jvp=jvp)
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
        jvp=jvp,
    )
    apply = _apply_on_this_level(Formula, FormulaInTransforms)

    tensor_positions = _tensor_positions(op)

    def autograd_kernel(*args, **kwargs):
        args = sig.complete(args, kwargs)
        if torch.is_grad_enabled():
            for i in tensor_positions:
                a = args[i]
                if a is not None and a.requires_grad:
                    return apply(*args)
        if forward_ad._current_level >= 0 and _any_tangent(args):
            return apply(*args)
        return _checked_below_autograd(op, args)

    LIB.impl(name, autograd_kernel, "Autograd")

    check = _BOUND[op].check

    def direct_forward(ctx, *args_and_entry):
        args, entry = args_and_entry[:-1], args_and_entry[-1]
        check(*args)
        output = entry(*args)
        setup_context(ctx, args, output)
        return output

    def direct_backward(ctx, *grads):
        return (*backward(ctx, *grads), None)

    # Formula for fast_call's plain eager calls: the entry, found by the caller, comes after the
    # schema's arguments and is called directly.  Same name, so the same grad_fn name.
    Direct = _function(Formula.__name__, forward=direct_forward, backward=direct_backward)

    def direct_kernel(entry: Callable, args: tuple):
        """autograd_kernel(*args) (every schema argument given) for arguments
        whose entry ``_direct_entry`` found."""
        if torch.is_grad_enabled():
            for i in tensor_positions:
                a = args[i]
                if a is not None and a.requires_grad:
                    return apply(*args) if forward_ad._current_level >= 0 else Direct.apply(*args, entry)
        if forward_ad._current_level >= 0 and _any_tangent(args):
            return apply(*args)
        check(*args)
        return entry(*args)

    _DIRECT_KERNELS[op] = direct_kernel


# ---------------------------------------------------------------------------
# The eager fast path of the user-facing entries (liger_nn).

_DIRECT_KERNELS: dict[torch._ops.OpOverload, Callable] = {}
_is_compiling = torch.compiler.is_compiling


def fast_call(op: torch._ops.OpOverloadPacket | torch._ops.OpOverload) -> Callable:
    """``op`` as a plain callable for user-facing code.  In plain eager calls
    (not compiling, and ``_direct_entry`` finds the entry: no
    TorchDispatchMode, no transform's dispatch keys, plain tensors of one
    device) it does what the op's Autograd kernel (``register_autograd``)
    does, with the entry found once: the dispatcher's crossing into Python
    (~30 us a call on the H200's host) and a second plainness test inside
    the formula are skipped; the same autograd node (named like the
    kernel's) is recorded and the same entry reached.  Under torch.compile,
    modes (fake tensors, profilers' modes), torch.func transforms and tensor
    subclasses (DTensor) it calls ``op`` itself."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = op.default
    direct = _DIRECT_KERNELS[op]
    sig = _signature(op)

    def call(*args, **kwargs):
        if _is_compiling():
            return op(*args, **kwargs)
        entry = _direct_entry(op, args)
        if entry is None or (kwargs and _any_tensor(kwargs.values())):
            return op(*args, **kwargs)
        return direct(entry, sig.complete(args, kwargs))

    call.__name__ = call.__qualname__ = f"{op._schema.name.split('::', 1)[1]}_fast_call"
    return call


def _any_tensor(values: Any) -> bool:
    return any(isinstance(v, torch.Tensor) for v in values)


# ---------------------------------------------------------------------------
# Forward-mode AD and torch.func transforms (grad, vjp, jvp, jacrev, jacfwd,
# and vmap over them).
#
# The Autograd kernel records the Formula node on the tensors its dispatch
# level sees, as a built-in op's Autograd kernel does: under a torch.func
# transform those are already unwrapped by the transform's layer, so
# Function.apply's own detour into functorch (meant for a Function applied to
# wrapped tensors from user code, and demanding the setup_context style) is
# skipped.  Forward-mode tangents: dual tensors carry no requires_grad, so the
# kernel looks for them; Formula.jvp takes them from the op's rule in
# JVP_RULES (registered by registrations/functorch.py), and an op without a
# rule raises, naming itself, instead of dropping the tangent.

JVP_RULES: dict[torch._ops.OpOverload, Callable] = {}


def _apply_on_this_level(formula: type, formula_in_transforms: type) -> Callable:
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


def _below_autograd_in_transforms(op: Callable, args: tuple):
    """The op below autograd, from a Formula's forward.  Under torch.func
    transforms, a jvp level below this one (jvp over grad) computes its
    tangents in that level's Autograd kernel; Function.apply turned forward
    AD off for this forward, so it is turned back on for the levels below."""
    if not torch._C._are_functorch_transforms_active():
        return _checked_below_autograd(op, args)
    with forward_ad._set_fwd_grad_enabled(True):
        return _checked_below_autograd(op, args)


def _any_tangent(args: tuple) -> bool:
    return any(isinstance(a, torch.Tensor) and forward_ad.unpack_dual(a).tangent is not None for a in args)


def _jvp(op: torch._ops.OpOverload, primals: tuple, tangents: tuple):
    rule = JVP_RULES.get(op)
    if rule is None:
        raise NotImplementedError(
            f"{op._schema.name.replace('::', '.')}: forward-mode AD (torch.func.jvp / jacfwd, "
            "torch.autograd.forward_ad) has no rule for this op; use reverse mode (torch.func.vjp / jacrev)"
        )
    return rule(primals, tangents)


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
