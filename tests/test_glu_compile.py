"""swiglu and geglu as custom ops: torch.library.opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import DEVICE, OPCHECK_UTILS

NAMES = ("swiglu", "geglu", "geglu_exact")
OPCHECK_CASES = [
    ((7, 48), torch.float32, torch.float32),
    ((2, 3, 33), torch.bfloat16, torch.bfloat16),
    ((5,), torch.float16, torch.float32),
    ((), torch.float64, torch.float64),
]


def _pair(shape, gate_dtype, up_dtype, requires_grad):
    gate = torch.randn(shape, device=DEVICE).to(gate_dtype).requires_grad_(requires_grad)
    up = torch.randn(shape, device=DEVICE).to(up_dtype).requires_grad_(requires_grad)
    return gate, up


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("shape", "gate_dtype", "up_dtype"), OPCHECK_CASES)
def test_opcheck_forward(name, shape, gate_dtype, up_dtype):
    op = getattr(torch.ops.liger, name).default
    for requires_grad in (True, False):
        torch.library.opcheck(op, _pair(shape, gate_dtype, up_dtype, requires_grad), test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("name", NAMES)
def test_opcheck_fused_halves(name):
    gate, up = torch.randn(4, 6, 2 * 24, device=DEVICE, requires_grad=True).chunk(2, -1)
    torch.library.opcheck(getattr(torch.ops.liger, name).default, (gate, up), test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("shape", "gate_dtype", "up_dtype"), OPCHECK_CASES)
def test_opcheck_backward(name, shape, gate_dtype, up_dtype):
    gate, up = _pair(shape, gate_dtype, up_dtype, False)
    dy = torch.randn(shape, device=DEVICE).to(torch.promote_types(gate_dtype, up_dtype))
    op = getattr(torch.ops.liger, name + "_backward").default
    torch.library.opcheck(op, (dy, gate, up), test_utils=OPCHECK_UTILS)


def _mlp(name):
    op = getattr(torch.ops.liger, name)

    def model(x, w_gate, w_up):
        return op(x @ w_gate, x @ w_up).square()

    return model


@pytest.mark.parametrize("name", NAMES)
def test_compile_fullgraph_dynamic_matches_eager_without_recompiles(name):
    torch._dynamo.reset()
    model = _mlp(name)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    w_gate = (0.25 * torch.randn(16, 24, device=DEVICE)).requires_grad_()  # gates within exp's float32 range
    w_up = torch.randn(16, 24, device=DEVICE, requires_grad=True)

    def check(x):
        out, expected = compiled(x, w_gate, w_up), model(x, w_gate, w_up)
        torch.testing.assert_close(out, expected)
        grads = torch.autograd.grad(out.sum(), (x, w_gate, w_up))
        expected_grads = torch.autograd.grad(expected.sum(), (x, w_gate, w_up))
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want)

    check(torch.randn(2, 5, 16, device=DEVICE, requires_grad=True))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for lead in [(4, 7), (6, 11)]:
            check(torch.randn(*lead, 16, device=DEVICE, requires_grad=True))
