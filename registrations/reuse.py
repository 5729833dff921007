"""Whether an autograd formula may write its gradients over the tensors it saved.

A gated MLP's gate and up projections are temporaries: after the forward,
only the MLP op's saved variables hold them, and the engine frees them as
soon as its backward has run.  Writing dgate and dup over them then needs no
memory of its own (Liger-Kernel's SwiGLU does it unconditionally; torch's
AccumulateGrad steals a gradient on the same kind of evidence, its use
count).  ``saved_only_here(*tensors)`` tells, inside a formula, whether that
is safe; it is True only when all of these hold:

* grad mode is off (no ``create_graph``: a double backward would read the
  saved values) and the graph is not kept (``retain_graph`` runs the backward
  again on them);
* no TorchDispatchMode is active and no transform has added dispatch keys;
* each tensor is contiguous, not a view, alone on its storage (no view of it
  anywhere), on one device with the others and on a storage of its own;
* each is referenced exactly as a saved temporary is: its Python references,
  the C++ owners of the tensor and those of its storage equal what a probe
  Function measured, on this torch and Python, for a temporary saved by the
  forward and unpacked by the backward.  A tensor the caller, a hook, a list,
  another autograd node or a saved-tensor hook still holds has more (or, if
  unpacked from a hook's copy, other) counts.

The probe and the callers unpack their saved tensors the same way
(``a, b = ctx.saved_tensors``) and pass them straight here, so both are seen
through the same references.  Without the counts (a torch without
``Tensor._use_count``) nothing is reused.
"""

from __future__ import annotations

import functools
import sys

import torch

_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)
_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
_mode_stack_depth = torch._C._len_torch_dispatch_stack
_local_include = torch._C._dispatch_tls_local_include_set
_DEFAULT_INCLUDE = _local_include()


def _holders(t: torch.Tensor) -> tuple[tuple[int, int, int], int]:
    """((Python references, C++ owners of the tensor, owners of its storage), the storage's address)."""
    storage = t.untyped_storage()
    return (sys.getrefcount(t), t._use_count(), _storage_use_count(storage._cdata)), storage.data_ptr()


def _alone(t: torch.Tensor) -> bool:
    return type(t) is torch.Tensor and t.is_contiguous() and not t._is_view()


def saved_only_here(*tensors: torch.Tensor) -> bool:
    """Whether the formula calling this may overwrite ``tensors``, each unpacked from its
    ``ctx.saved_tensors`` into a local and passed straight here (see the module's doc)."""
    if _mode_stack_depth() or _local_include() != _DEFAULT_INCLUDE or torch.is_grad_enabled():
        return False
    expected = saved_temporary_holders()  # measured in a plain call, as the first to get here is
    if expected is None or _keep_graph():
        return False
    storages = set()
    for t in tensors:
        if not _alone(t):
            return False
        holders, storage = _holders(t)
        if holders != expected:
            return False
        storages.add(storage)
    return len(storages) == len(tensors)


class _Save(torch.autograd.Function):
    """A formula that saves its two inputs."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a + b

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


@functools.cache
def saved_temporary_holders() -> tuple[int, int, int] | None:
    """What holds a temporary a formula saved, unpacked as a formula unpacks it; None where this
    torch gives no counts.  Measured on a probe's node without running the autograd engine (which
    sizes its device queues when it first runs: a backend registered later, as torch_npu may be,
    would find none)."""
    if _storage_use_count is None or _keep_graph is None or not hasattr(torch.Tensor, "_use_count"):
        return None
    with torch.enable_grad():
        x = torch.ones(2, requires_grad=True)
        node = _Save.apply(x * 1.0, x * 2.0).grad_fn
    a, b = node.saved_tensors
    return _measured(a, b)


def _measured(*tensors: torch.Tensor) -> tuple[int, int, int] | None:
    """The holders of the tensors, seen as ``saved_only_here`` sees them (the same call shape); None
    where they differ (then a saved temporary's holders are no fixed number)."""
    counts = set()
    for t in tensors:
        holders, _ = _holders(t)
        counts.add(holders)
    return counts.pop() if len(counts) == 1 else None
