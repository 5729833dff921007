"""Defining an op: the torch.library handle of the ``liger`` namespace and
``define_op`` (schema, fake kernel, one entry per dispatch key, and the
prepared form of each entry that the eager path caches per signature).

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
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import torch
from torch._subclasses.functional_tensor import FunctionalTensorMode

from registrations.decompose import decomposition_of

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


class Prepare(NamedTuple):
    """An entry's prepared form, per device type: ``prepare(*args)`` (an op's
    schema arguments, checked) returns a ``run(*args)`` for every call with
    the same argument signature (``registrations/eager.py``: shapes, strides,
    dtypes, device, 16-byte alignment and the scalars), with the plan, grid,
    compiled kernels and packed scalars fixed once; None where it has none
    for those arguments, and then the entry itself runs."""

    cuda: Callable | None = None
    npu: Callable | None = None
    interpreted: Callable | None = None


NO_PREPARE = Prepare()


def launch_entries(launch: ModuleType, direction: str, reference: Callable) -> dict:
    """``entries=`` and ``prepare=`` for define_op from a launch module named
    by the convention (csrc_free_ops/<op>/launch.py): ``cuda_<direction>``
    (also the interpreter's), ``npu_<direction>``, and the prepared forms
    ``prepare_cuda_<direction>`` / ``prepare_npu_<direction>`` it has."""
    cuda = getattr(launch, f"cuda_{direction}")
    prepare_cuda = getattr(launch, f"prepare_cuda_{direction}", None)
    return {
        "entries": Entries(cuda=cuda, npu=getattr(launch, f"npu_{direction}"), interpreted=cuda, reference=reference),
        "prepare": Prepare(
            cuda=prepare_cuda, npu=getattr(launch, f"prepare_npu_{direction}", None), interpreted=prepare_cuda
        ),  # fmt: skip
    }


class Signature:
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
        # The defaults of the trailing arguments that all have one, for calls without keywords.
        n_required = max((i + 1 for i, n in enumerate(self.names) if n not in self.defaults), default=0)
        self.n_required = n_required
        self.default_tail = tuple(self.defaults[n] for n in self.names[n_required:])

    def complete(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        n = len(args)
        if n == self.n_args:
            return args
        if not kwargs and n >= self.n_required:
            return args + self.default_tail[n - self.n_required :]
        return (*args, *(kwargs[n] if n in kwargs else self.defaults[n] for n in self.names[len(args) :]))

    def call(self, op: Callable, args: tuple):
        """op(*args) for every schema argument in order, the keyword-only ones passed by name."""
        if self.n_positional == self.n_args:
            return op(*args)
        return op(*args[: self.n_positional], **dict(zip(self.keyword_names, args[self.n_positional :], strict=True)))


SIGNATURES: dict[Any, Signature] = {}


def signature(op: torch._ops.OpOverload) -> Signature:
    sig = SIGNATURES.get(op)
    if sig is None:
        sig = SIGNATURES[op] = Signature(op)
    return sig


def _with_defaults(fn: Callable, sig: Signature) -> Callable:
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


class Bound(NamedTuple):
    """What ``define_op`` bound for one op, for calls that skip the
    dispatcher (``registrations/eager.py``): its check, the part of it that
    reads data pointers (run on every call; the rest is cached with the
    signature), and per device type (``cpu`` as chosen at import) the entry
    and its prepared form."""

    check: Callable
    check_each_call: Callable | None
    by_device: dict[str, Callable]
    prepare_by_device: dict[str, Callable | None]


BOUND: dict[torch._ops.OpOverload, Bound] = {}


def define_op(
    schema: str,
    *,
    check: Callable,
    fake: Callable,
    entries: Entries,
    prepare: Prepare = NO_PREPARE,
    check_each_call: Callable | None = None,
    traceable: bool = True,
) -> torch._ops.OpOverload:
    """Define ``liger::<name>`` from its schema, bind each dispatch key to
    its entry and register the fake kernel; ``check`` runs first in all of
    them.  ``check`` must depend only on the argument signature (shapes,
    strides, dtypes, devices, scalars): the eager path runs it once per
    signature.  ``check_each_call`` holds what depends on data pointers
    (memory overlap) and runs on every call, after ``check``.  ``prepare``:
    the entries' prepared forms (``Prepare``).  ``traceable``: under
    torch.compile, CUDA calls decompose into the entry's kernels
    (registrations/decompose.py).  Returns the op's default overload."""
    LIB.define(schema)
    name = schema.split("(", 1)[0]
    op = getattr(torch.ops.liger, name).default
    sig = signature(op)
    cpu = entries.interpreted if INTERPRETER else _reference_on_cpu(entries.reference, name)
    full_check = check if check_each_call is None else _both(check, check_each_call)
    for key, entry in (("CUDA", entries.cuda), ("PrivateUse1", entries.npu), ("CPU", cpu)):
        LIB.impl(name, _with_defaults(_checked(full_check, entry), sig), key)
    torch.library.register_fake("liger::" + name, _with_defaults(_checked(full_check, fake), sig), lib=LIB)
    privateuse1 = torch._C._get_privateuse1_backend_name()
    BOUND[op] = Bound(
        check,
        check_each_call,
        {"cuda": entries.cuda, "cpu": cpu, privateuse1: entries.npu},
        {"cuda": prepare.cuda, "cpu": prepare.interpreted if INTERPRETER else None, privateuse1: prepare.npu},
    )
    if traceable:
        torch.library.register_torch_dispatch(
            "liger::" + name,
            FunctionalTensorMode,
            decomposition_of(sig, full_check, entries.cuda, entries.reference),
            lib=LIB,
        )
    return op


def _both(first: Callable, second: Callable) -> Callable:
    def check(*args):
        first(*args)
        second(*args)

    return check
