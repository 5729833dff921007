"""group_norm as a custom op: torch.library.opcheck of both ops and torch.compile."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import DEVICE, OPCHECK_UTILS


def _params(channels, dtype, affine, requires_grad):
    def make():
        return torch.randn(channels, dtype=dtype, device=DEVICE, requires_grad=requires_grad)

    weight = make() if affine in ("both", "weight") else None
    bias = make() if affine in ("both", "bias") else None
    return weight, bias


# (shape, groups, x dtype, parameter dtype, affine)
OPCHECK_CASES = [
    ((3, 6, 5, 7), 3, torch.float32, torch.float32, "both"),
    ((2, 4, 9), 2, torch.bfloat16, torch.float32, "both"),
    ((2, 8), 4, torch.float16, torch.float16, "weight"),
    ((1, 4, 3, 2, 5), 1, torch.float64, torch.bfloat16, "bias"),
    ((2, 6, 7), 2, torch.bfloat16, torch.bfloat16, "none"),
]


@pytest.mark.parametrize(("shape", "groups", "dtype", "param_dtype", "affine"), OPCHECK_CASES)
def test_opcheck_forward(shape, groups, dtype, param_dtype, affine):
    for requires_grad in (True, False):
        x = torch.randn(shape, dtype=dtype, device=DEVICE, requires_grad=requires_grad)
        weight, bias = _params(shape[1], param_dtype, affine, requires_grad)
        torch.library.opcheck(
            torch.ops.liger.group_norm.default, (x, groups, weight, bias, 1e-5), test_utils=OPCHECK_UTILS
        )


def test_opcheck_forward_with_defaults_keywords_and_noncontiguous_x():
    x = torch.randn(5, 7, 4, device=DEVICE).permute(2, 0, 1).requires_grad_()  # (4, 5, 7), not contiguous
    weight, _ = _params(5, torch.float32, "both", True)
    torch.library.opcheck(torch.ops.liger.group_norm.default, (x, 5), test_utils=OPCHECK_UTILS)
    torch.library.opcheck(
        torch.ops.liger.group_norm.default, (x, 1), {"weight": weight, "eps": 1e-3}, test_utils=OPCHECK_UTILS
    )


@pytest.mark.parametrize(("shape", "groups", "dtype", "param_dtype", "affine"), OPCHECK_CASES)
def test_opcheck_backward(shape, groups, dtype, param_dtype, affine):
    x = torch.randn(shape, dtype=dtype, device=DEVICE)
    weight, bias = _params(shape[1], param_dtype, affine, False)
    dy = torch.randn_like(x)
    torch.library.opcheck(
        torch.ops.liger.group_norm_backward.default, (dy, x, groups, weight, bias, 1e-5), test_utils=OPCHECK_UTILS
    )


CHANNELS_LAST = [((3, 6, 5, 7), torch.channels_last), ((2, 4, 3, 2, 5), torch.channels_last_3d)]


@pytest.mark.parametrize(("shape", "fmt"), CHANNELS_LAST)
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_opcheck_channels_last_in_either_grad_layout(shape, fmt, activation):
    """The fake kernels give y and dx x's memory format, as the kernels do;
    grad_out channels-last or contiguous."""
    x = torch.randn(shape, device=DEVICE).contiguous(memory_format=fmt).requires_grad_()
    weight, bias = _params(shape[1], torch.float32, "both", True)
    kwargs = {"activation": activation}
    torch.library.opcheck(torch.ops.liger.group_norm.default, (x, 2, weight, bias, 1e-5), kwargs,
                          test_utils=OPCHECK_UTILS)  # fmt: skip
    for dy in (torch.randn_like(x), torch.randn(shape, device=DEVICE)):
        torch.library.opcheck(torch.ops.liger.group_norm_backward.default,
                              (dy, x.detach(), 2, weight.detach(), bias.detach(), 1e-5), kwargs,
                              test_utils=OPCHECK_UTILS)  # fmt: skip


def test_compile_dynamic_channels_last_keeps_the_layout():
    torch._dynamo.reset()
    compiled = torch.compile(_model, fullgraph=True, dynamic=True)
    weight, bias = _params(8, torch.float32, "both", True)
    for shape in [(2, 8, 5, 7), (3, 8, 6, 9)]:
        x = torch.randn(shape, device=DEVICE).contiguous(memory_format=torch.channels_last).requires_grad_()
        _check_against_eager(compiled, _model, x, weight, bias)
        out = compiled(x, weight, bias)
        assert out.is_contiguous(memory_format=torch.channels_last)


def _model(x, weight, bias):
    return torch.ops.liger.group_norm(x * 0.5, 4, weight, bias, 1e-5).square()


def _model_no_affine(x):
    return torch.ops.liger.group_norm(x, 2).square()


def _check_against_eager(compiled, model, *args):
    out = compiled(*args)
    expected = model(*args)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), args)
    expected_grads = torch.autograd.grad(expected.sum(), args)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def _x(*shape):
    return torch.randn(*shape, device=DEVICE, requires_grad=True)


def test_compile_fullgraph_dynamic_matches_eager_without_recompiles():
    """Batch, spatial sizes and rank-4 spatial shapes change; one graph serves all."""
    torch._dynamo.reset()
    compiled = torch.compile(_model, fullgraph=True, dynamic=True)
    weight, bias = _params(8, torch.float32, "both", True)
    _check_against_eager(compiled, _model, _x(2, 8, 5, 7), weight, bias)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for shape in [(3, 8, 6, 9), (5, 8, 11, 2), (2, 8, 33, 17)]:
            _check_against_eager(compiled, _model, _x(*shape), weight, bias)


def test_compile_without_affine_and_graph_break_free():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(_model_no_affine)(_x(2, 6, 5))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(_model_no_affine, fullgraph=True, dynamic=True)
    _check_against_eager(compiled, _model_no_affine, _x(2, 6, 5))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for shape in [(4, 6, 9), (7, 6, 13)]:
            _check_against_eager(compiled, _model_no_affine, _x(*shape))


def test_compiled_module_with_mixed_precision():
    from liger_nn import GroupNorm

    torch._dynamo.reset()
    module = GroupNorm(2, 6).to(DEVICE)
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    x = torch.randn(3, 6, 10, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    out = compiled(x)
    torch.testing.assert_close(out, module(x))
    out.float().sum().backward()
    assert module.weight.grad is not None and module.weight.grad.dtype == torch.float32
