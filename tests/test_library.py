"""registrations/eager.py: the direct call of an op's entry (skipping the
dispatcher below Autograd) is taken exactly where the dispatcher would do
nothing but reach that entry, and every other call still goes through it."""

from __future__ import annotations

import torch
from torch._subclasses import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from csrc_free_ops.poly_norm import launch, reference
from registrations import define, eager
from tests.helpers import DEVICE, assert_close_to_ref

OP = torch.ops.liger.poly_norm.default


def _args(x):
    return (x, torch.randn(3, device=DEVICE), torch.randn(1, device=DEVICE), 1e-6)


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


def test_plain_tensors_reach_the_entry_directly():
    entry = eager.direct_entry(OP, _args(torch.randn(3, 16, device=DEVICE)))
    assert entry is launch.cuda_forward or entry is define.BOUND[OP].by_device["cpu"]


def test_tensors_with_extra_keys_go_through_the_dispatcher():
    assert eager.direct_entry(OP, _args(torch.randn(3, 16, device=DEVICE)._neg_view())) is None


def test_negative_view_is_resolved_by_the_dispatcher():
    """A direct call would read the raw memory of a negative view, i.e. -x."""
    x = torch.randn(3, 16, device=DEVICE)
    args = _args(x._neg_view())
    y = torch.ops.liger.poly_norm(*args)
    assert_close_to_ref(y, reference.forward(-x.double(), *(a.double() for a in args[1:3]), 1e-6), torch.float32)


def test_modes_and_transforms_go_through_the_dispatcher():
    x = torch.randn(3, 16, device=DEVICE)
    with FakeTensorMode():
        assert eager.direct_entry(OP, _args(torch.empty(3, 16, device=DEVICE))) is None
    with _Recorder():
        assert eager.direct_entry(OP, _args(x)) is None
    with torch.inference_mode():
        assert eager.direct_entry(OP, _args(torch.randn(3, 16, device=DEVICE))) is None
    seen = []
    params = _args(x)[1:]

    def probe(t):
        seen.append(eager.direct_entry(OP, (t, *params)))
        return t.sum()

    torch.func.vmap(probe)(torch.randn(2, 3, 16, device=DEVICE))
    torch.func.grad(probe)(x)
    assert seen == [None, None]


def test_a_dispatch_mode_sees_the_op_and_the_backward_op():
    x = torch.randn(3, 16, device=DEVICE, requires_grad=True)
    with _Recorder() as rec:
        y = torch.ops.liger.poly_norm(x, *_args(x)[1:])
        y.sum().backward()
    assert torch.ops.liger.poly_norm.default in rec.seen
    assert torch.ops.liger.poly_norm_backward.default in rec.seen
