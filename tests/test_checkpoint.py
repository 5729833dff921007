"""Activation checkpointing through every op: non-reentrant
torch.utils.checkpoint, and selective checkpointing whose policy names the
torch.ops.liger ops (saves their outputs), give gradients identical to a run
without checkpointing, eagerly and under torch.compile.  The tests also
check that the checkpointing happened: plain checkpointing runs the liger
forward ops again in the backward, the selective policy does not (eagerly:
ops dispatched during the backward; compiled: the ops in the backward graph
of the min-cut partitioner, the one that honours checkpoint tags)."""

from __future__ import annotations

import collections
import functools

import pytest
import torch
from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from registrations import _library
from tests.helpers import DEVICE

liger = torch.ops.liger
LIGER_FORWARD_OPS = {liger.poly_norm.default, liger.rope.default, liger.group_norm.default}


def _block(x, w, b, gw, gb, proj, cos, sin):
    """poly_norm -> group_norm over the features -> q/k projections -> rope."""
    h = liger.poly_norm(x, w, b, 1e-6)  # (B, S, H)
    h = liger.group_norm(h.transpose(1, 2), 2, gw, gb, 1e-5).transpose(1, 2)
    q, k = (h @ proj).unflatten(-1, (2, 8)).transpose(1, 2).chunk(2, dim=1)  # (B, 1, S, 8) each
    q, k = liger.rope(q, k, cos, sin)
    return (q * k).sum(-1)


def _inputs():
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, grad=True):
        t = torch.randn(*shape, generator=gen).to(DEVICE)
        return t.requires_grad_() if grad else t

    return (rand(2, 6, 8), rand(3), rand(1), rand(8), rand(8), rand(8, 16), rand(6, 8, grad=False),
            rand(6, 8, grad=False))  # fmt: skip


class LigerForwardCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in LIGER_FORWARD_OPS:
            self.calls[func] += 1
        return func(*args, **(kwargs or {}))


def _policy(ctx, op, *args, **kwargs):
    if op in LIGER_FORWARD_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _capturing_backend(backward_graphs: list):
    def forward(gm, example_inputs):
        return make_boxed_func(gm.forward)

    def backward(gm, example_inputs):
        backward_graphs.append(gm)
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=forward, bw_compiler=backward, partition_fn=min_cut_rematerialization_partition)


def _run(mode: str, compiled: bool):
    """(loss, gradients, liger forward ops run again by the backward)."""
    args = _inputs()

    def step(*args):
        if mode == "none":
            out = _block(*args)
        elif mode == "checkpoint":
            out = checkpoint(_block, *args, use_reentrant=False)
        else:
            context = functools.partial(create_selective_checkpoint_contexts, _policy)
            out = checkpoint(_block, *args, use_reentrant=False, context_fn=context)
        return out.pow(2).sum()

    backward_graphs: list = []
    if compiled:
        torch._dynamo.reset()
        step = torch.compile(step, backend=_capturing_backend(backward_graphs), fullgraph=True)
        # The opaque ops, not their kernels (registrations/_library.py, "Under torch.compile"): the
        # policy and the count below name liger ops, which a decomposed graph no longer holds.
        with _library.decomposition(False):
            loss = step(*args)
    else:
        loss = step(*args)
    with LigerForwardCounter() as counter:
        grads = torch.autograd.grad(loss, [a for a in args if a.requires_grad])
    if compiled:
        torch._dynamo.reset()
        (graph,) = backward_graphs
        rerun = sum(n.op == "call_function" and n.target in LIGER_FORWARD_OPS for n in graph.graph.nodes)
    else:
        rerun = sum(counter.calls.values())
    return loss.detach(), grads, rerun


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("mode", ["checkpoint", "selective"])
def test_checkpointed_gradients_are_identical(mode, compiled):
    want_loss, want, _ = _run("none", compiled)
    loss, got, rerun = _run(mode, compiled)
    assert torch.equal(loss, want_loss)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.isfinite(w).all() and w.abs().sum() > 0, f"input {i}: reference gradient is zero or not finite"
        assert torch.equal(g, w), f"input {i}: gradient differs by {(g - w).abs().max().item():.3e}"
    if mode == "selective":
        assert rerun == 0, "the policy saves the liger ops' outputs, yet the backward ran them again"
    elif not compiled:  # the partitioner may keep custom ops' outputs anyway
        assert rerun == len(LIGER_FORWARD_OPS), f"checkpointing ran {rerun} liger forward ops again"
