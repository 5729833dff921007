"""poly_norm as a custom op: torch.library.opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import DEVICE, OPCHECK_UTILS


def _args(shape, dtype, requires_grad):
    x = torch.randn(shape, dtype=dtype, device=DEVICE, requires_grad=requires_grad)
    weight = torch.randn(3, dtype=dtype, device=DEVICE, requires_grad=requires_grad)
    bias = torch.randn(1, dtype=dtype, device=DEVICE, requires_grad=requires_grad)
    return x, weight, bias


OPCHECK_CASES = [
    ((7, 48), torch.float32, 1e-6),
    ((2, 3, 33), torch.bfloat16, 1e-5),
    ((5,), torch.float16, 1e-6),
    ((2, 2, 2, 20), torch.float32, 1e-6),
]


@pytest.mark.parametrize(("shape", "dtype", "eps"), OPCHECK_CASES)
def test_opcheck_forward(shape, dtype, eps):
    for requires_grad in (True, False):
        torch.library.opcheck(
            torch.ops.liger.poly_norm.default, _args(shape, dtype, requires_grad) + (eps,), test_utils=OPCHECK_UTILS
        )


def test_opcheck_forward_noncontiguous_and_0d_bias():
    x = torch.randn(20, 6, device=DEVICE).t().requires_grad_()
    weight = torch.randn(3, device=DEVICE, requires_grad=True)
    bias = torch.randn((), device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.liger.poly_norm.default, (x, weight, bias), test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize(("shape", "dtype", "eps"), OPCHECK_CASES)
def test_opcheck_backward(shape, dtype, eps):
    x, weight, _ = _args(shape, dtype, False)
    dy = torch.randn_like(x)
    torch.library.opcheck(torch.ops.liger.poly_norm_backward.default, (dy, x, weight, eps), test_utils=OPCHECK_UTILS)


def _model(x, weight, bias):
    return torch.ops.liger.poly_norm(x * 0.5, weight, bias, 1e-6).square()


def _check_against_eager(compiled, x, weight, bias):
    out = compiled(x, weight, bias)
    expected = _model(x, weight, bias)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), (x, weight, bias))
    expected_grads = torch.autograd.grad(expected.sum(), (x, weight, bias))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_compile_fullgraph_dynamic_matches_eager_without_recompiles():
    torch._dynamo.reset()
    compiled = torch.compile(_model, fullgraph=True, dynamic=True)
    _, weight, bias = _args((1,), torch.float32, True)
    # Leading sizes avoid 3: duck sizing would share a symbol with the static weight.shape[0].
    _check_against_eager(compiled, torch.randn(2, 5, 40, device=DEVICE, requires_grad=True), weight, bias)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for lead in [(4, 7), (6, 11)]:
            x = torch.randn(*lead, 40, device=DEVICE, requires_grad=True)
            _check_against_eager(compiled, x, weight, bias)


def test_eps_reaches_the_launchers_as_a_python_float_under_compile(monkeypatch):
    """Triton types a Python float argument as fp32 unless the kernel says
    otherwise; a tensor or SymFloat here would mean the graph handing the
    launch sequence something else.  Each direction reaches the launches
    through the general sequence or its prepared run (registrations/eager.py)."""
    from csrc_free_ops.poly_norm import launch
    from registrations import eager

    seen = {"forward": [], "backward": []}

    def recording(direction, real):
        def call(*args):
            seen[direction].append(type(args[-2]))  # eps, just before the plan
            return real(*args)

        return call

    for direction, names in (("forward", ("forward", "_prepared_forward")),
                             ("backward", ("backward", "_prepared_backward"))):  # fmt: skip
        for name in names:
            monkeypatch.setattr(launch, name, recording(direction, getattr(launch, name)))
    for calls in list(eager._CALLS.values()):  # this process's earlier signatures would skip the prepare
        monkeypatch.setattr(calls, "runs", {})
    torch._dynamo.reset()
    compiled = torch.compile(_model, fullgraph=True, dynamic=True)
    x, weight, bias = _args((4, 6, 24), torch.float32, True)
    compiled(x, weight, bias).sum().backward()
    assert seen["forward"] and seen["backward"], seen
    assert set(seen["forward"]) | set(seen["backward"]) == {float}, seen
