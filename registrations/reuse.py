"""Whether an autograd formula may write its gradients over the tensors it saved.

A gated MLP's gate and up projections are temporaries: after the forward,
only the MLP op's saved variables hold them, and the engine frees them as
soon as its backward has run.  Writing dgate and dup over them then needs no
memory of its own (Liger-Kernel's SwiGLU does it unconditionally; torch's
AccumulateGrad steals a gradient on the same kind of evidence, its use
count).  ``unpack(ctx)``, a formula's one unpacking of its saved tensors,
also tells whether that is safe for every one of them; it is True only when
all of these hold:

* grad mode is off (no ``create_graph``: a double backward would read the
  saved values) and the graph is not kept (``retain_graph`` runs the backward
  again on them);
* no TorchDispatchMode is active and no transform has added dispatch keys;
* each tensor is a plain contiguous tensor, not a view, alone on a storage of
  its own (no view of it anywhere, no other saved tensor on it);
* each is referenced exactly as a saved temporary is: its Python references,
  the C++ owners of the tensor and those of its storage equal what a probe
  node measured, on this torch and Python, for a temporary saved by the
  forward.  A tensor the caller, a hook, a list, another autograd node or a
  saved-tensor hook still holds has more (or, if unpacked from a hook's
  copy, other) counts.

The tensors are counted by this module's one function (``_holders_of``), for
the probe and for every caller alike, as locals of its frame taken from the
saved tuple, never as arguments: a frame-evaluation hook (Dynamo's, once
torch.compile has run in the process) holds extra references to a call's
arguments, but not to a frame's own locals.  Without the counts (a torch
without ``Tensor._use_count``) nothing is reused.
"""

from __future__ import annotations

import functools
import sys

import torch

# eager.plain_call's parts, inlined on this per-backward path as eager.Calls.run_for inlines them
from registrations.eager import _DEFAULT_INCLUDE, _local_include, _mode_stack_depth

_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)
_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
_Tensor = torch.Tensor


def unpack(ctx) -> tuple[tuple, bool]:
    """(ctx.saved_tensors, whether the formula may overwrite every one of them): the formula's one
    unpacking (torch.utils.checkpoint allows one), see the module's doc."""
    saved = ctx.saved_tensors
    return saved, _saved_only_here(saved)


def _saved_only_here(saved: tuple) -> bool:
    if _mode_stack_depth() or _local_include() != _DEFAULT_INCLUDE or torch.is_grad_enabled():
        return False
    expected = saved_temporary_holders()  # measured in a plain call, as the first to get here is
    if expected is None or _keep_graph():
        return False
    holders = _holders_of(saved)
    return holders is not None and all(h == expected for h in holders)


def _holders_of(saved: tuple) -> list[tuple[int, int, int]] | None:
    """Per tensor of ``saved`` (a context's saved_tensors): (Python references, C++ owners of the
    tensor, owners of its storage); None where one is not a plain contiguous non-view tensor or two
    share a storage.  The tensors are counted as this frame's locals, never as arguments."""
    found = []
    storages = set()
    for i in range(len(saved)):
        t = saved[i]
        if type(t) is not _Tensor or not t.is_contiguous() or t._is_view():
            return None
        storage = t.untyped_storage()
        found.append((sys.getrefcount(t), t._use_count(), _storage_use_count(storage._cdata)))
        storages.add(storage.data_ptr())
        del t, storage
    return found if len(storages) == len(found) else None


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
    """What holds a temporary a formula saved, as ``_holders_of`` counts it; None where this torch
    gives no counts.  Measured on a probe's node without running the autograd engine (which sizes
    its device queues when it first runs: a backend registered later, as torch_npu may be, would
    find none)."""
    if _storage_use_count is None or _keep_graph is None or not hasattr(_Tensor, "_use_count"):
        return None
    with torch.enable_grad():
        x = torch.ones(2, requires_grad=True)
        y = _Save.apply(x * 1.0, x * 2.0)  # kept: torch 2.11 frees a node's saved tensors with its output
    holders = _holders_of(y.grad_fn.saved_tensors)
    return holders[0] if holders is not None and holders[0] == holders[1] else None
