"""Launching a Triton kernel with a fixed set of compile-time arguments,
without ``JITFunction.run``'s per-call work once it has been compiled.

``kernel[grid](*args, **meta)`` binds and specializes every argument, reads
several runtime knobs and checks the kernel's globals on every call: on the
H200 machine's host that is ~26 us a launch, against ~9 us for handing the
same arguments to the compiled kernel directly.  A ``Launcher`` does the first
launch of each specialization through ``kernel[grid]`` (so Triton compiles and
caches it as usual) and keeps the returned compiled kernel under a key of the
argument properties Triton specializes on (``Launcher._key``); later calls
with the same key launch it directly on the tensors' device and that
device's current stream.  Callers whose scalar arguments repeat can keep
them with their ``scalar_specialization`` and call ``Launcher.launch``,
which skips working that out again.

The direct path is taken only where it is known to match Triton's own launch:
a real GPU build of a Triton version listed in ``DIRECT_LAUNCH_TRITON``, no
launch hooks installed (profilers), and a kernel whose compile-time
parameters all follow its runtime ones.  Everywhere else (the interpreter,
triton-ascend, other versions) every call goes through ``kernel[grid]``.

Inside ``traced_launches()`` (registrations/_library.py turns it on while
AOTAutograd traces an op on CUDA tensors) a launcher instead calls
``torch.library.wrap_triton(kernel)[grid]``: the call is recorded as a
``triton_kernel_wrapper`` node, which Inductor launches from its generated
code.  There, one tensor object may fill only one kernel parameter (the
functionalization of a traced launch clones each written parameter
separately): entries pass ``placeholder(t)`` where a parameter takes a
tensor it never touches, and a launch with a tensor in two parameters
raises ``Untraceable``, which keeps the op opaque.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
import triton

# Triton releases whose CompiledKernel.run takes (grid x3, stream, function,
# packed metadata, launch metadata, enter hook, exit hook, *all parameters):
# run on the H200 with 3.6; for 3.7.1, 3.8.0 and 3.9.0 read in JITFunction.run's
# source, which makes that same call (not run on a GPU).
DIRECT_LAUNCH_TRITON = ("3.6", "3.7", "3.8", "3.9")
_INT32 = range(-(2**31), 2**31)
_INT64 = range(-(2**63), 2**63)
# Scalar keys kept per launcher before the cache is dropped (a bound on its memory).
MAX_SCALAR_KEYS = 4096
# A direct launch hands Triton each tensor's address as an int: its launcher then takes the int as
# the pointer, where for a tensor it calls data_ptr() and checks the address with the driver
# (cuPointerGetAttribute, one driver call per tensor per launch).  Direct launches only ever take
# CUDA tensors of the device they run on, which is what that check would confirm.
_data_ptr = torch.Tensor.data_ptr


# Each distinct scalar specialization seen, numbered: launch keys hold the
# number, which hashes in constant time (a tuple rehashes every element on
# every lookup).  Distinct specializations are few; the table is not capped
# because a number must never change meaning.
_SPECIALIZATION_IDS: dict[tuple, int] = {}


def scalar_specialization(scalars: tuple) -> int:
    """A number standing for what Triton specializes on for non-tensor
    arguments: an int's equality to 1, divisibility by 16 and width; for
    anything else (float, bool, None) its type.  Callers that reuse one tuple
    of scalars compute this once and pass both to ``Launcher.launch``."""
    key = []
    for a in scalars:
        if isinstance(a, torch.Tensor):
            raise TypeError("Launcher: a kernel's tensor arguments must all come before its scalars")
        key.append((a == 1, a & 15 == 0, a in _INT32, a in _INT64) if type(a) is int else type(a))
    return _SPECIALIZATION_IDS.setdefault(tuple(key), len(_SPECIALIZATION_IDS))


def _direct_launch_supported(kernel: Any) -> bool:
    if not isinstance(kernel, triton.runtime.jit.JITFunction):  # e.g. the interpreter's InterpretedFunction
        return False
    if ".".join(triton.__version__.split(".")[:2]) not in DIRECT_LAUNCH_TRITON:
        return False
    try:
        driver = triton.runtime.driver.active
        return driver.get_current_target().backend == "cuda"
    except Exception:
        return False


def on_device_of(t: Any) -> contextlib.AbstractContextManager:
    """Make ``t``'s device the current one for a launch.  Triton launches on
    (and compiles for) the current device, while a model spread over several
    devices (``device_map="auto"``) hands kernels tensors on another one;
    launching there anyway fails or reads the wrong memory."""
    index = t.get_device() if isinstance(t, torch.Tensor) else -1
    if index < 0 or index == torch.accelerator.current_device_index():
        return contextlib.nullcontext()
    return torch.accelerator.device_index(index)


class _Tracing(threading.local):
    active = False


_TRACING = _Tracing()


class Untraceable(Exception):
    """A launch that a traced (wrap_triton) call cannot express faithfully."""


@contextlib.contextmanager
def traced_launches() -> Iterator[None]:
    """Launches in this thread go through ``torch.library.wrap_triton``."""
    previous = _TRACING.active
    _TRACING.active = True
    try:
        yield
    finally:
        _TRACING.active = previous


def tracing() -> bool:
    """Whether launches in this thread are being traced (``traced_launches``)."""
    return _TRACING.active


def placeholder(t: torch.Tensor) -> torch.Tensor:
    """What to pass for a kernel parameter that takes a tensor it never reads
    or writes (an absent weight, an unused workspace): ``t`` itself, except
    while launches are traced, where a fresh empty tensor of t's dtype and
    device keeps every parameter's tensor distinct."""
    return t.new_empty(0) if _TRACING.active else t


# Where Triton keeps its launch hooks: its runtime knobs from 3.4 on, CompiledKernel's class attributes
# before (triton-ascend's 3.2, which must import this module though it never launches directly).
_HOOKS = triton.knobs.runtime if hasattr(triton, "knobs") else triton.compiler.CompiledKernel


def _launch_hooks_installed() -> bool:
    # A hook is a HookChain (its .calls list) on newer Triton, a callable or None on older; no generator,
    # since a bound launch asks on every call.
    enter, leave = getattr(_HOOKS, "launch_enter_hook", None), getattr(_HOOKS, "launch_exit_hook", None)
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))


class Launcher:
    """``Launcher(kernel, **meta)(grid, *args)`` runs ``kernel[(grid,)](*args, **meta)``.

    ``args`` are the kernel's runtime parameters, in order, tensors first and
    then scalars; ``meta`` holds its constexpr parameters and launch options
    (num_warps, ...).  The specialization key of a call is each tensor's
    dtype and 16-byte alignment plus the scalars' key, which is cached per
    tuple of scalar values (they repeat from call to call).  How many tensors
    lead is taken from the first call; a later call with a non-tensor among
    them, or a tensor among the scalars, raises.
    """

    def __init__(self, kernel: Any, **meta: Any):
        self.kernel = kernel
        self.meta = meta
        self._n_tensors = -1
        self._compiled: dict[tuple, Any] = {}
        self._scalar_keys: dict[tuple, int] = {}
        self._n_runtime = -1
        self._tail: tuple = ()
        if _direct_launch_supported(kernel):
            params = kernel.params
            n_runtime = sum(not p.is_constexpr for p in params)
            tail = params[n_runtime:]
            if all(p.is_constexpr and p.name in meta for p in tail) and not any(
                p.is_constexpr for p in params[:n_runtime]
            ):
                self._n_runtime = n_runtime
                self._tail = tuple(meta[p.name] for p in tail)

    def __call__(self, grid: int, *args: Any) -> None:
        """Launch on the device of the first argument (a tensor)."""
        if _TRACING.active:
            self._launch_traced(grid, args)
            return
        if len(args) != self._n_runtime:
            self._launch_by_triton(grid, args)
            return
        n = self._tensor_count(args)
        scalars = args[n:]
        self.launch(grid, args[:n], scalars, self._scalar_key(scalars))

    def launch(self, grid: int, tensors: tuple, scalars: tuple, scalar_key: int) -> None:
        """``self(grid, *tensors, *scalars)`` for a caller that keeps
        ``scalar_key = scalar_specialization(scalars)`` with its scalars."""
        if _TRACING.active:
            self._launch_traced(grid, (*tensors, *scalars))
            return
        if len(tensors) + len(scalars) != self._n_runtime:
            self._launch_by_triton(grid, (*tensors, *scalars))
            return
        dev = tensors[0].get_device()
        if dev != torch._C._cuda_getDevice():  # CUDA is initialized: tensors[0] lives there
            with torch.cuda.device(dev):
                self._launch(dev, grid, tensors, scalars, scalar_key)
        else:
            self._launch(dev, grid, tensors, scalars, scalar_key)

    def _launch_traced(self, grid: int, args: tuple) -> None:
        seen: set[int] = set()
        for a in args:
            if isinstance(a, torch.Tensor):
                if id(a) in seen:
                    raise Untraceable(f"{self.kernel.__name__}: one tensor fills two parameters")
                seen.add(id(a))
        torch.library.wrap_triton(self.kernel)[(grid,)](*args, **self.meta)

    def _launch_by_triton(self, grid: int, args: tuple) -> None:
        with on_device_of(args[0] if args else None):
            self.kernel[(grid,)](*args, **self.meta)

    def _launch(self, dev: int, grid: int, tensors: tuple, scalars: tuple, scalar_key: int) -> None:
        key = self._key(dev, tensors, scalar_key)
        compiled = self._compiled.get(key)
        if compiled is None or _launch_hooks_installed():
            compiled = self.kernel[(grid,)](*tensors, *scalars, **self.meta)
            if compiled is not None:
                self._compiled[key] = compiled
            return
        stream = torch._C._cuda_getCurrentRawStream(dev)
        compiled.run(
            grid, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
            *map(_data_ptr, tensors), *scalars, *self._tail,
        )  # fmt: skip

    def _tensor_count(self, args: tuple) -> int:
        n = self._n_tensors
        if n < 0:
            n = self._n_tensors = next((i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)), len(args))
        return n

    def _scalar_key(self, scalars: tuple) -> int:
        # With the types: 1, 1.0 and True are equal as dict keys but not to Triton.
        cache_key = (scalars, tuple(map(type, scalars)))
        scalar_key = self._scalar_keys.get(cache_key)
        if scalar_key is None:
            if len(self._scalar_keys) >= MAX_SCALAR_KEYS:
                self._scalar_keys.clear()
            scalar_key = self._scalar_keys[cache_key] = scalar_specialization(scalars)
        return scalar_key

    @staticmethod
    def _key(dev: int, tensors: tuple, scalar_key: int) -> tuple:
        # A non-tensor among the tensors fails here (no .dtype).
        return dev, tuple([(t.dtype, t.data_ptr() & 15 == 0) for t in tensors]), scalar_key

    def bind(self, grid: int, scalars: tuple) -> BoundLaunch:
        """This launcher's launch with ``grid`` and ``scalars`` fixed (a prepared call's)."""
        return BoundLaunch(self, grid, scalars)

    def compiled_for(self, *args: Any) -> Any:
        """The compiled kernel a direct launch would use for ``args`` (None if
        none yet); tests compare it with what ``kernel[grid]`` selects."""
        n = self._tensor_count(args)
        key = self._key(args[0].get_device(), args[:n], self._scalar_key(args[n:]))
        return self._compiled.get(key)


class BoundLaunch:
    """``launcher(grid, *tensors, *scalars)`` with the grid and scalars fixed:
    ``bound(*tensors)``.  Made once per argument signature by an op's
    prepared call (registrations/eager.py), whose tensors then always have
    the same dtypes, 16-byte alignment and device, so the compiled kernel
    the first launch selects serves every later one: those call it directly
    with no key to compute.  Launch hooks (profilers), tracing and builds
    without the direct path take ``Launcher.launch`` as before."""

    __slots__ = ("_launcher", "_grid", "_scalars", "_scalar_key", "_device", "_tail", "_run_args")

    def __init__(self, launcher: Launcher, grid: int, scalars: tuple):
        self._launcher = launcher
        self._grid = grid
        self._scalars = scalars
        self._scalar_key = scalar_specialization(scalars)
        self._device = -1
        self._tail = (*scalars, *launcher._tail)
        # (launcher, function, metadata) of the compiled kernel once the first direct launch chose it
        self._run_args: tuple = ()

    def __call__(self, *tensors: torch.Tensor) -> None:
        run_args = self._run_args
        if not run_args or _TRACING.active or _launch_hooks_installed():
            launcher = self._launcher
            launcher.launch(self._grid, tensors, self._scalars, self._scalar_key)
            if not run_args and launcher._n_runtime == len(tensors) + len(self._scalars):
                self._keep(launcher, tensors)
            return
        dev = self._device
        run, function, packed = run_args
        if dev != torch._C._cuda_getDevice():
            with torch.cuda.device(dev):
                stream = torch._C._cuda_getCurrentRawStream(dev)
                run(self._grid, 1, 1, stream, function, packed, None, None, None, *map(_data_ptr, tensors),
                    *self._tail)  # fmt: skip
        else:
            stream = torch._C._cuda_getCurrentRawStream(dev)
            run(self._grid, 1, 1, stream, function, packed, None, None, None, *map(_data_ptr, tensors), *self._tail)

    def _keep(self, launcher: Launcher, tensors: tuple) -> None:
        """After the first direct launch: the compiled kernel it selected, for every later call."""
        self._device = tensors[0].get_device()
        compiled = launcher._compiled.get(launcher._key(self._device, tensors, self._scalar_key))
        if compiled is not None:  # compiled.run is a property (a Python call): kept here, not read per launch
            self._run_args = (compiled.run, compiled.function, compiled.packed_metadata)
