"""Under torch.compile: the kernels in the graph.

Dynamo records a call of a liger op as one opaque node.  When AOTAutograd
traces the graph (under FunctionalTensorMode), an op on CUDA tensors of
concrete sizes is decomposed instead, as torch.library.triton_op does: its
CUDA entry runs on the traced tensors with launches going through
torch.library.wrap_triton (launcher.traced_launches), so the graph holds
the entry's allocations and its triton_kernel_wrapper nodes, and Inductor
launches the kernels from its generated code instead of calling back into
Python for the op.  Everything else keeps the opaque op: other devices (the
NPU, CPU tensors: the interpreter's kernels are no JITFunctions), symbolic
sizes (the plans compute on plain ints; specializing them would recompile
per shape), torch.export (a serializable program keeps high-level ops),
tensor subclasses, and a launch the traced path cannot express
(launcher.Untraceable).  CSRC_FREE_OPS_DECOMPOSE=0, or decomposition(False),
turns it off.

CSRC_FREE_OPS_DECOMPOSE=math, or decomposition("math"), traces the op's
reference instead (its torch ops, in the same compute dtype), for the same
calls: Inductor then fuses the op's math with its neighbours (a residual
add into a norm, a cast into a matmul's input) as it fuses a model's own
layers, where a kernel of ours is a fusion boundary.  It is how the steps
benchmark measures what that boundary costs a compiled model.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from csrc_free_ops import launcher

# What a traced op becomes: its kernels, its reference's torch ops, or itself (None: opaque)
_WAYS = {"1": "kernels", "kernels": "kernels", "math": "math", "0": None}


def _way(value: bool | str, source: str) -> str | None:
    if isinstance(value, bool):
        value = "1" if value else "0"
    if value not in _WAYS:
        raise ValueError(f"{source}={value!r}: choose 1 (the kernels), math (the reference's torch ops) or 0 (opaque)")
    return _WAYS[value]


_DECOMPOSE = [_way(os.environ.get("CSRC_FREE_OPS_DECOMPOSE", "1"), "CSRC_FREE_OPS_DECOMPOSE")]


@contextlib.contextmanager
def decomposition(enabled: bool | str) -> Iterator[None]:
    """What graphs traced inside this block make of the ops: True (or
    "kernels") their kernels, "math" their reference's torch ops, False the
    opaque ops (the compiled code keeps what was traced)."""
    previous = _DECOMPOSE[0]
    _DECOMPOSE[0] = _way(enabled, "decomposition")
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


def decomposition_of(sig: Any, check: Callable, cuda_entry: Callable, math_entry: Callable) -> Callable:
    """The op's FunctionalTensorMode rule: ``cuda_entry`` (or, in the math way, ``math_entry``, the
    reference's binding) traced into the graph where it can be."""

    def decompose(mode, op, types, args, kwargs):
        if not _plain_types(types):
            return NotImplemented
        full = sig.complete(args, kwargs or {})
        way = _DECOMPOSE[0]
        if way is None or not _concrete(full) or _export_in_progress():
            return mode.__torch_dispatch__(op, types, args, kwargs)
        entry = math_entry if way == "math" else cuda_entry
        try:  # traced_launches also makes the entries skip what reads values (launcher.tracing())
            with mode, launcher.traced_launches():
                check(*full)
                return entry(*full)
        except launcher.Untraceable:  # what it traced before this is left unused, and dropped
            return mode.__torch_dispatch__(op, types, args, kwargs)

    return decompose
