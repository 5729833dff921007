"""registrations/eager.eager_call, the eager path of liger_nn: in plain
eager calls it enters the op's Autograd kernel without the dispatcher, with
the same results and gradients; under torch.compile, modes, torch.func
transforms and tensor subclasses it calls the op itself."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses import FakeTensorMode
from torch.testing._internal.two_tensor import TwoTensor

import liger_nn
from registrations import eager
from tests.helpers import DEVICE

OP = torch.ops.liger.group_norm.default


class _Spy:
    """eager_call(OP) with its direct kernel wrapped: ``direct`` counts the
    calls that took it instead of the op (the dispatcher's path)."""

    def __init__(self, monkeypatch):
        self.direct = 0
        kernel = eager.DIRECT_KERNELS[OP]

        def counting(*args, **kwargs):
            self.direct += 1
            return kernel(*args, **kwargs)

        monkeypatch.setitem(eager.DIRECT_KERNELS, OP, counting)
        self.call = eager.eager_call(torch.ops.liger.group_norm)


def _inputs(requires_grad=True):
    x = torch.randn(2, 8, 4, 4, device=DEVICE, requires_grad=requires_grad)
    return x, torch.randn(8, device=DEVICE, requires_grad=requires_grad), torch.randn(8, device=DEVICE)


@pytest.mark.parametrize("requires_grad", [True, False])
def test_plain_eager_call_skips_the_dispatcher_with_identical_results(requires_grad, monkeypatch):
    spy = _Spy(monkeypatch)
    x, w, b = _inputs(requires_grad)
    y = spy.call(x, 4, w, b, 1e-5)
    assert spy.direct == 1
    y_op = torch.ops.liger.group_norm(x, 4, w, b, 1e-5)
    assert torch.equal(y, y_op)
    if requires_grad:
        assert type(y.grad_fn).__name__ == type(y_op.grad_fn).__name__
        dy = torch.randn_like(y)
        grads = torch.autograd.grad(y, (x, w), dy)
        grads_op = torch.autograd.grad(y_op, (x, w), dy)
        for g, g_op in zip(grads, grads_op, strict=True):
            assert torch.equal(g, g_op)


def test_the_module_takes_the_fast_path():
    from liger_nn import group_norm

    assert group_norm._GROUP_NORM.__name__ == "group_norm_eager_call"
    module = liger_nn.GroupNorm(4, 8).to(DEVICE)
    x = torch.randn(2, 8, 4, 4, device=DEVICE, requires_grad=True)
    module(x).sum().backward()
    assert x.grad is not None


def test_modes_transforms_and_subclasses_call_the_op(monkeypatch):
    spy = _Spy(monkeypatch)
    x, w, b = _inputs(False)
    with FakeTensorMode():
        spy.call(torch.empty(2, 8, 4, 4, device=DEVICE), 4, None, None, 1e-5)
    torch.func.vmap(lambda t: spy.call(t, 4, w, b, 1e-5))(x.unsqueeze(0))
    y = spy.call(TwoTensor(x, x.clone()), 4, w, b, 1e-5)
    assert isinstance(y, TwoTensor)
    torch.func.grad(lambda t: spy.call(t, 4, w, b, 1e-5).sum())(x)
    assert spy.direct == 0
    spy.call(x, 4, w, b, 1e-5)
    assert spy.direct == 1


def test_compile_traces_the_op():
    """Dynamo records the op itself (the fast path is Python Dynamo would otherwise trace into)."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    module = liger_nn.GroupNorm(4, 8).to(DEVICE)
    x = torch.randn(2, 8, 4, 4, device=DEVICE, requires_grad=True)
    torch._dynamo.reset()
    out = torch.compile(module, backend=record, fullgraph=True)(x)
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert OP in targets or torch.ops.liger.group_norm in targets
    torch.testing.assert_close(out, module(x))


def test_bad_input_raises_as_through_the_op(monkeypatch):
    spy = _Spy(monkeypatch)
    x, w, b = _inputs(True)
    for _ in range(2):  # the check runs when a signature is prepared; a failed one is never cached
        with pytest.raises(ValueError, match="not divisible by num_groups=3"):
            spy.call(x, 3, w, b, 1e-5)
    assert spy.direct == 0


def test_rope_and_poly_norm_eager_calls_match_the_ops():
    q = torch.randn(1, 4, 8, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 2, 8, 16, device=DEVICE, requires_grad=True)
    cos, sin = torch.randn(8, 16, device=DEVICE), torch.randn(8, 16, device=DEVICE)
    fast, slow = eager.eager_call(torch.ops.liger.rope), torch.ops.liger.rope
    outs = [f(q, k, cos, sin, pairs="interleaved") for f in (fast, slow)]
    grads = [torch.autograd.grad(o, (q, k), [torch.ones_like(t) for t in o]) for o in outs]
    for a, b in zip((*outs[0], *grads[0]), (*outs[1], *grads[1]), strict=True):
        assert torch.equal(a, b)
    x = torch.randn(4, 32, device=DEVICE, requires_grad=True)
    w = torch.randn(3, device=DEVICE, requires_grad=True)
    bias = torch.randn(1, device=DEVICE, requires_grad=True)
    fast = eager.eager_call(torch.ops.liger.poly_norm)
    ys = [f(x, w, bias) for f in (fast, torch.ops.liger.poly_norm)]
    gs = [torch.autograd.grad(y.square().sum(), (x, w, bias)) for y in ys]
    for a, b in zip((ys[0], *gs[0]), (ys[1], *gs[1]), strict=True):
        assert torch.equal(a, b)


def _rms_args(x, w, eps=1e-6):
    return (x, w, eps, 0.0, "llama")


def test_a_kept_signature_matches_only_calls_of_that_signature():
    """A Hit (a prepared run kept with its guard) serves a call only where
    every property the run depends on is the same: any other stride, dtype,
    dispatch key (negative view, inference), alignment, scalar value or
    scalar type must miss, and a fresh tensor of the same signature hit."""
    x = torch.randn(8, 64, device=DEVICE)
    w = torch.randn(64, device=DEVICE)
    args = _rms_args(x, w)
    hit = eager.Hit(args, lambda *a: None, eager._cuda_index(args))

    def matches(args):
        return hit.matches(args, tuple(map(type, args)))

    assert matches(_rms_args(torch.randn(8, 64, device=DEVICE), torch.randn(64, device=DEVICE)))
    with torch.inference_mode():
        inference = torch.randn(8, 64, device=DEVICE)
    misses = {
        "strides": _rms_args(torch.randn(64, 8, device=DEVICE).t(), w),
        "shape": _rms_args(torch.randn(4, 64, device=DEVICE), w),
        "dtype": _rms_args(x.double(), w),
        "negative view": _rms_args(x._neg_view(), w),
        "inference tensor": _rms_args(inference, w),
        "requires_grad": _rms_args(x.detach().requires_grad_(), w),
        "misaligned": _rms_args(torch.randn(8 * 64 + 1, device=DEVICE)[1:].view(8, 64), w),
        "scalar value": _rms_args(x, w, 1e-5),
        "scalar type": (x, w, 1e-6, 0, "llama"),
        "absent weight": _rms_args(x, None),
    }
    for name, other in misses.items():
        assert not matches(other), name


def test_alternating_signatures_each_keep_their_run():
    """An op called at two signatures in turn (a model's hidden-size and per-head norms) takes each one's
    own prepared run, with results equal to the op's."""
    rms_norm = eager.eager_call(torch.ops.liger.rms_norm)
    wide, narrow = torch.randn(4, 256, device=DEVICE), torch.randn(4, 8, 32, device=DEVICE)
    w_wide, w_narrow = torch.randn(256, device=DEVICE), torch.randn(32, device=DEVICE)
    for _ in range(3):
        for x, w in ((wide, w_wide), (narrow, w_narrow)):
            torch.testing.assert_close(rms_norm(x, w, 1e-6), torch.ops.liger.rms_norm(x, w, 1e-6), rtol=0, atol=0)
    hits = eager.calls_of(torch.ops.liger.rms_norm.default).hits
    assert wide.shape in hits and narrow.shape in hits
