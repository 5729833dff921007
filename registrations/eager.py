"""The eager path: plain calls reach their entry without the dispatcher, and
an entry's per-call work is done once per argument signature.

A call is plain when no TorchDispatchMode is active (fake tensors, tracing,
profilers' modes), no transform has added dispatch keys to the thread
(torch.func), and every tensor argument carries exactly a plain dense
tensor's dispatch keys, the same for all (no subclass with
__torch_dispatch__ such as DTensor, no functionalization or functorch
wrapper, no negative view, no inference tensor).  For a plain call the
dispatcher would only reach the entry bound to the tensors' device, so
calling it directly gives the same result without the crossing.

Everything an entry works out from its arguments' signature (the check, the
plan, the compiled kernels, the grid and the packed scalars) is the same
for every call with that signature.  ``Calls`` keeps, per op, one prepared
``run`` per signature (``signature_key``: each tensor's type, shape,
strides, dtype, device, 16-byte alignment and the two dispatch-key bits a
plain tensor can carry, and each scalar with its type), made by the entry's
``Prepare`` form (``define.Prepare``) or, without one, the entry itself.
The signatures an op saw are also kept as ``Hit``s, found by the first
argument's shape and checked by torch's C++ tensor guards (the check Dynamo
runs on a compiled graph's inputs: dispatch keys, dtype, device,
requires_grad, sizes, strides) with the
16-byte alignment and the other arguments' values and types compared
alongside, a fraction of building the key.  A call then costs one check,
the output allocations and the launches.  A prepared run is always called
with its tensors' CUDA device current (its allocations use the current one).

``eager_call(op)`` is the public entry: ``op`` as a plain callable for
user-facing code (``liger_nn`` calls every op through it).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from registrations.define import BOUND, signature

__all__ = ["eager_call"]

# Signatures kept per op before its cache is dropped (a bound on its memory).
MAX_SIGNATURES = 512
# Hits kept per op, indexed by the first argument's shape (every op's first argument is a tensor): an op
# called at many shapes in turn (a UNet's norms, a model's q/k and hidden-size norms) finds each
# signature's Hit by one lookup and one guard check, and never rebuilds it.  Bounds on their memory:
MAX_HIT_SHAPES = 64
HITS_PER_SHAPE = 4

_Tensor = torch.Tensor
# The dispatch keys (raw_repr) of a plain dense tensor, per device type found
# so far, mapped to that device type.
_PLAIN_KEYS: dict[int, str] = {}
# The keys a thread includes in every dispatch when no transform (torch.func's
# dynamic layers, the Python dispatcher) has added its own.
_DEFAULT_INCLUDE = torch._C._dispatch_tls_local_include_set()
_dispatch_keys = torch._C._dispatch_keys
_mode_stack_depth = torch._C._len_torch_dispatch_stack
_local_include = torch._C._dispatch_tls_local_include_set
_is_compiling = torch.compiler.is_compiling
# Absent from CPU-only builds, where no tensor is on CUDA and it is never called.
_cuda_device = getattr(torch._C, "_cuda_getDevice", None)
_data_ptr = _Tensor.data_ptr
_MISSING = object()
try:  # the C++ guard Dynamo checks a compiled graph's tensor inputs with
    from torch._C._dynamo.guards import TensorGuards
except ImportError:  # pragma: no cover - every supported torch has it
    TensorGuards = None


def _plain_device_type(t: torch.Tensor, keys: Any) -> str | None:
    """t's device type if ``keys`` (t's dispatch keys) are those of a plain
    dense tensor on that device, else None."""
    raw = keys.raw_repr()
    kind = _PLAIN_KEYS.get(raw)
    if kind is None and keys == _dispatch_keys(torch.empty(0, device=t.device)):
        kind = _PLAIN_KEYS[raw] = t.device.type
    return kind


def plain_call() -> bool:
    """No TorchDispatchMode active and no transform's keys in this thread."""
    return not _mode_stack_depth() and _local_include() == _DEFAULT_INCLUDE


def direct_entry(op: torch._ops.OpOverload, args: tuple) -> Callable | None:
    """The entry the dispatcher would reach for these arguments below
    Autograd when nothing else could run first (a plain call, above), else
    None: then the call goes through the dispatcher."""
    bound = BOUND.get(op)
    if bound is None or not plain_call():
        return None
    keys = first = None
    for a in args:
        if isinstance(a, _Tensor):
            if first is None:
                first, keys = a, _dispatch_keys(a)
            elif _dispatch_keys(a) != keys:
                return None
    if first is None:
        return None
    kind = _plain_device_type(first, keys)
    return None if kind is None else bound.by_device.get(kind)


def signature_key(args: tuple) -> tuple:
    """What a prepared run depends on: per tensor its type, shape, strides,
    dtype, device, 16-byte alignment (Triton specializes on it) and
    negative and inference bits (the dispatch keys a plain-typed tensor
    can add); per other argument its value and type (1, 1.0 and True are
    equal keys but not equal arguments to a kernel).  Raises RuntimeError
    for a tensor without storage (a transform's wrapper)."""
    key = []
    append = key.append
    for a in args:
        if isinstance(a, _Tensor):
            append((type(a), a.shape, a.stride(), a.dtype, a.device, a.data_ptr() & 15, a.is_neg(), a.is_inference()))
        elif type(a) is list:
            append(tuple(a))
            append(list)
        else:
            append(a)
            append(type(a))
    return tuple(key)


class Hit:
    """A prepared run and what a call must match to take it: the arguments' types, the non-tensor
    arguments' values, the tensors' guard (TensorGuards) and all tensors 16-byte aligned."""

    __slots__ = ("types", "tensors_of", "others_of", "others", "guards", "run", "cuda_index")

    def __init__(self, args: tuple, run: Callable, cuda_index: int):
        tensor_at = [i for i, a in enumerate(args) if isinstance(a, _Tensor)]
        other_at = [i for i, a in enumerate(args) if not isinstance(a, _Tensor)]
        self.types = tuple(map(type, args))
        self.tensors_of = _getter(tensor_at)
        self.others_of = _getter(other_at)
        self.others = self.others_of(args)
        tensors = self.tensors_of(args)
        self.guards = TensorGuards(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        )
        self.run = run
        self.cuda_index = cuda_index

    def matches(self, args: tuple, types: tuple) -> bool:
        if types != self.types or self.others_of(args) != self.others:
            return False
        tensors = self.tensors_of(args)
        return self.guards.check(*tensors) and not functools.reduce(operator.or_, map(_data_ptr, tensors)) & 15

    @staticmethod
    def can_keep(args: tuple) -> bool:
        """Hits are kept for calls of 16-byte-aligned tensors (nearly all); others keep only the key."""
        tensors = [a for a in args if isinstance(a, _Tensor)]
        return TensorGuards is not None and bool(tensors) and not any(_data_ptr(t) & 15 for t in tensors)


def _getter(positions: list[int]) -> Callable[[tuple], tuple]:
    """args -> the tuple of args at these positions."""
    if len(positions) == 1:
        (i,) = positions
        return lambda args: (args[i],)
    return operator.itemgetter(*positions) if positions else lambda args: ()


def _cuda_index(args: tuple) -> int:
    """The CUDA device index of the arguments' tensors (all on one device), -1 off CUDA."""
    first = next(a for a in args if isinstance(a, _Tensor))
    return first.get_device() if first.is_cuda else -1


def _on_device(index: int, run: Callable, *args):
    with torch.cuda.device(index):
        return run(*args)


def _with_current_device(run: Callable, cuda_index: int) -> Callable:
    """``run``, made to run with CUDA device ``cuda_index`` current where another one is."""
    if cuda_index < 0 or _cuda_device() == cuda_index:
        return run
    return functools.partial(_on_device, cuda_index, run)


class Calls:
    """One op's prepared runs, one per argument signature, also kept as ``Hit``s by the first argument's shape."""

    __slots__ = ("op", "bound", "runs", "hits")

    def __init__(self, op: torch._ops.OpOverload):
        self.op = op
        self.bound = BOUND[op]
        self.runs: dict[tuple, Callable | None] = {}
        self.hits: dict[torch.Size, list[Hit]] = {}

    def run_for(self, args: tuple) -> Callable | None:
        """The prepared ``run(*args)`` (every schema argument, in order) for
        a plain call, its check passed; None where the call must go through
        the dispatcher.  Bad input raises here, on every call (a failed
        check is never cached)."""
        if _mode_stack_depth() or _local_include() != _DEFAULT_INCLUDE:
            return None
        first = args[0]
        hits = self.hits.get(first.shape) if isinstance(first, _Tensor) else None
        if hits:
            types = tuple(map(type, args))
            for i, hit in enumerate(hits):
                if hit.matches(args, types):
                    if i:  # the most recent first: a run of calls at one signature checks one Hit each
                        hits.insert(0, hits.pop(i))
                    index, run = hit.cuda_index, hit.run  # _with_current_device inline: every prepared call's path
                    return run if index < 0 or _cuda_device() == index else functools.partial(_on_device, index, run)
        try:
            key = signature_key(args)
        except RuntimeError:
            return None
        run = self.runs.get(key, _MISSING)
        if run is _MISSING:
            run = self._prepare(args)
            if len(self.runs) >= MAX_SIGNATURES:
                self.runs.clear()
            self.runs[key] = run
        if run is None:
            return None
        index = _cuda_index(args)
        if isinstance(first, _Tensor) and Hit.can_keep(args):
            self._keep(first.shape, Hit(args, run, index))
        return _with_current_device(run, index)

    def _keep(self, shape: torch.Size, hit: Hit) -> None:
        hits = self.hits.get(shape)
        if hits is None:
            if len(self.hits) >= MAX_HIT_SHAPES:
                self.hits.clear()
            hits = self.hits[shape] = []
        hits.insert(0, hit)
        del hits[HITS_PER_SHAPE:]

    def _prepare(self, args: tuple) -> Callable | None:
        entry = direct_entry(self.op, args)
        if entry is None:
            return None
        bound = self.bound
        bound.check(*args)
        kind = next(a.device.type for a in args if isinstance(a, _Tensor))
        prepare = bound.prepare_by_device.get(kind)
        run = prepare(*args) if prepare is not None else None
        if run is None:
            run = entry
        if bound.check_each_call is not None:
            run = _checked_each_call(bound.check_each_call, run)
        return run


def _checked_each_call(check: Callable, run: Callable) -> Callable:
    def checked(*args):
        check(*args)
        return run(*args)

    return checked


# By id: an OpOverload hashes in Python.
_CALLS: dict[int, Calls] = {}


def calls_of(op: torch._ops.OpOverload) -> Calls:
    calls = _CALLS.get(id(op))
    if calls is None:
        calls = _CALLS[id(op)] = Calls(op)
    return calls


def below_autograd(op: torch._ops.OpOverload, args: tuple):
    """Call ``op`` (every schema argument given, in order) with dispatch
    starting below the Autograd key."""
    with torch._C._AutoDispatchBelowAutograd():
        return signature(op).call(op, args)


def run_below_autograd(calls: Calls, args: tuple):
    """``below_autograd(op, args)``, running the prepared call directly where
    that is what the dispatcher would reach."""
    run = calls.run_for(args)
    if run is None:
        return below_autograd(calls.op, args)
    return run(*args)


# The direct kernel of each op (registrations/autograd.py): what its Autograd
# kernel does, given the prepared run.
DIRECT_KERNELS: dict[torch._ops.OpOverload, Callable] = {}


def eager_call(op: torch._ops.OpOverloadPacket | torch._ops.OpOverload) -> Callable:
    """``op`` as a plain callable for user-facing code.  In plain eager calls
    (not compiling, and the prepared run found: no TorchDispatchMode, no
    transform's dispatch keys, plain tensors of one device) it does what the
    op's Autograd kernel does, with the run found once: the dispatcher's
    crossing into Python is skipped; the same autograd node (named like the
    kernel's) is recorded and the same entry's work done.  Under
    torch.compile, modes (fake tensors, profilers' modes), torch.func
    transforms and tensor subclasses (DTensor) it calls ``op`` itself."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = op.default
    direct = DIRECT_KERNELS[op]
    calls = calls_of(op)
    sig = signature(op)
    n_args, n_required, default_tail = sig.n_args, sig.n_required, sig.default_tail

    def call(*args, **kwargs):
        if _is_compiling():
            return op(*args, **kwargs)
        n = len(args)
        if kwargs:
            if any(isinstance(v, _Tensor) for v in kwargs.values()):
                return op(*args, **kwargs)
            args = sig.complete(args, kwargs)
        elif n != n_args:
            if not n_required <= n < n_args:  # the op's own error for a wrong argument count
                return op(*args)
            args = args + default_tail[n - n_required :]
        run = calls.run_for(args)
        if run is None:
            return sig.call(op, args)
        return direct(run, args)

    call.__name__ = call.__qualname__ = f"{op._schema.name.split('::', 1)[1]}_eager_call"
    return call
