"""torch.ops.liger.layer_norm: values and gradients against a float64
expectation with weight and bias each optional; the tile and column-blocked
kernels; determinism; errors for bad input; opcheck and torch.compile; the
nn.LayerNorm drop-in."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from csrc_free_ops.rms_norm import launch, plan
from csrc_free_ops.rms_norm.launch import RowNorm
from tests.helpers import ALL_DTYPES, DEVICE, OPCHECK_UTILS, assert_close_to_ref
from tests.row_norm_cases import assert_matches, expected

SMALL_H = st.integers(1, 300)
# Rows the backward column-blocks (the forward holds them whole), and rows both directions column-block.
BLOCKED_H = st.one_of(
    st.integers(plan.MAX_ROW_BLOCK[True] + 1, plan.MAX_ROW_BLOCK[True] + 300),
    st.integers(plan.MAX_ROW_BLOCK[False] + 1, plan.MAX_ROW_BLOCK[False] + 300),
)


def _call(x, weight, bias, dy, eps):
    y = torch.ops.liger.layer_norm(x, weight, bias, eps)
    leaves = [t for t in (x, weight, bias) if t is not None]
    grads = iter(torch.autograd.grad(y, leaves, dy))
    return y, tuple(None if t is None else next(grads) for t in (x, weight, bias))


@settings(max_examples=16, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), max_size=3),
    h=st.one_of(SMALL_H, SMALL_H, SMALL_H, SMALL_H, BLOCKED_H),
    dtype=st.sampled_from(ALL_DTYPES),
    weight_dtype=st.sampled_from((*ALL_DTYPES, None)),
    bias_dtype=st.sampled_from((*ALL_DTYPES, None)),
    transposed=st.booleans(),
    shift=st.sampled_from([0.0, 20.0]),
    eps=st.sampled_from([1e-5, 1e-6, 0.1]),
)
def test_forward_and_gradients_match_float64(lead, h, dtype, weight_dtype, bias_dtype, transposed, shift, eps):
    """Any data dtype, weight and bias of any dtype or absent; rows with a
    large mean (shift) test that the variance is of the centred values."""
    shape = (*lead, h)
    x = torch.randn(shape[::-1], device=DEVICE).permute(*reversed(range(len(shape))))
    if not transposed:
        x = x.contiguous()
    x = (x + shift).to(dtype).requires_grad_()
    weight = None if weight_dtype is None else torch.randn(h, dtype=weight_dtype, device=DEVICE).requires_grad_()
    bias = None if bias_dtype is None else torch.randn(h, dtype=bias_dtype, device=DEVICE).requires_grad_()
    dy = torch.randn(shape, dtype=dtype, device=DEVICE)
    y, grads = _call(x, weight, bias, dy, eps)
    assert_matches(y, grads, x, weight, bias, dy, eps, center=True)


def test_float64_uses_eps_exactly():
    """eps reaches the kernels as a constexpr: a float64 kernel adds 1e-7/3
    unrounded, which decides the result for x ~ 1e-4."""
    x = torch.randn(6, 40, dtype=torch.float64, device=DEVICE) * 1e-4
    w, b = torch.randn(2, 40, dtype=torch.float64, device=DEVICE)
    dy = torch.randn_like(x)
    y = torch.ops.liger.layer_norm(x, w, b, 1e-7 / 3)
    grads = torch.ops.liger.layer_norm_backward(dy, x, w, b, 1e-7 / 3)
    y_ref, refs = expected(x, w, b, dy, 1e-7 / 3, center=True)
    for got, ref in ((y, y_ref), *zip(grads, refs, strict=True)):
        assert ((got.cpu() - ref.cpu()).abs().max() / ref.abs().max()).item() <= 1e-13


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_layer_norm(dtype):
    x = torch.randn(4, 9, 96, device=DEVICE, dtype=dtype) * 2 + 1
    w, b = torch.randn(2, 96, device=DEVICE, dtype=dtype)
    ours = torch.ops.liger.layer_norm(x, w, b, 1e-5)
    theirs = torch.nn.functional.layer_norm(x.double(), (96,), w.double(), b.double(), 1e-5)
    assert_close_to_ref(ours, theirs, dtype)


@pytest.mark.parametrize("n_cols", [50, plan.MAX_ROW_BLOCK[True] + 5, plan.MAX_ROW_BLOCK[False] + 5])
def test_backward_is_bitwise_deterministic(n_cols):
    x = torch.randn(23, n_cols, device=DEVICE, dtype=torch.bfloat16)
    w, b = torch.randn(2, n_cols, device=DEVICE)
    dy = torch.randn_like(x)
    first = torch.ops.liger.layer_norm_backward(dy, x, w, b, 1e-5)
    second = torch.ops.liger.layer_norm_backward(dy, x, w, b, 1e-5)
    for a, c in zip(first, second, strict=True):
        assert torch.equal(a, c)


@pytest.mark.parametrize("programs", [1, 5])
@pytest.mark.parametrize("whole_rows", [True, False])
def test_plans_through_the_launch_sequence(programs, whole_rows):
    x = torch.randn(13, 200, device=DEVICE) + 3
    w = torch.randn(200, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(200, device=DEVICE)
    dy = torch.randn_like(x)
    p = plan.Plan(whole_rows, 4 if whole_rows else 1, 256 if whole_rows else 64, programs, None, 1)
    norm = RowNorm(1e-5, 0.0, True, False)
    y = launch.forward(x, w, b, norm, p)
    grads = launch.backward(dy, x, w, b, norm, p)
    assert_matches(y, grads, x, w, b, dy, 1e-5, center=True)


def test_zero_rows():
    x = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    w, b = (torch.randn(8, device=DEVICE, requires_grad=True) for _ in "wb")
    y = torch.ops.liger.layer_norm(x, w, b)
    dx, dw, db = torch.autograd.grad(y.sum(), (x, w, b))
    assert y.shape == x.shape and not dw.any() and not db.any()


def test_gradcheck_and_gradgradcheck_in_float64():
    x = torch.randn(3, 7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    w, b = (torch.randn(7, dtype=torch.float64, device=DEVICE, requires_grad=True) for _ in "wb")
    assert torch.autograd.gradcheck(torch.ops.liger.layer_norm, (x, w, b))
    assert torch.autograd.gradgradcheck(torch.ops.liger.layer_norm, (x, w, b))


def _t(*shape, dtype=torch.float32, device=DEVICE):
    return torch.ones(shape, dtype=dtype, device=device)


BAD_CALLS = [
    ("weight must have shape (8,)", lambda: (_t(2, 8), _t(7), None)),
    ("bias must have shape (8,)", lambda: (_t(2, 8), None, _t(2, 8))),
    ("bias must be float32", lambda: (_t(2, 8), None, _t(8, dtype=torch.int64))),
    ("bias is on", lambda: (_t(2, 8), _t(8), _t(8, device="meta"))),
    ("non-empty last dimension", lambda: (_t(3, 0), None, None)),
    ("x must be float32", lambda: (_t(2, 8, dtype=torch.int32), None, None)),
]


@pytest.mark.parametrize(("message", "make_args"), BAD_CALLS)
def test_bad_input_raises_clear_error(message, make_args):
    args = make_args()
    pattern = message.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises((ValueError, TypeError), match=pattern):
        torch.ops.liger.layer_norm(*args, 1e-5)
    with pytest.raises((ValueError, TypeError), match=pattern):
        torch.ops.liger.layer_norm_backward(torch.ones_like(args[0]), *args, 1e-5)
    with pytest.raises(ValueError, match="eps must be"):
        torch.ops.liger.layer_norm(_t(2, 8), None, None, -1.0)


@pytest.mark.parametrize("present", ["wb", "w", "b", ""])
def test_opcheck(present):
    for requires_grad in (True, False):
        x = torch.randn(3, 5, 24, device=DEVICE, dtype=torch.bfloat16, requires_grad=requires_grad)
        w = torch.randn(24, device=DEVICE, requires_grad=requires_grad) if "w" in present else None
        b = torch.randn(24, device=DEVICE, requires_grad=requires_grad) if "b" in present else None
        torch.library.opcheck(torch.ops.liger.layer_norm.default, (x, w, b, 1e-5), test_utils=OPCHECK_UTILS)
    dy = torch.randn_like(x)
    w, b = (None if t is None else t.detach() for t in (w, b))
    torch.library.opcheck(torch.ops.liger.layer_norm_backward.default, (dy, x.detach(), w, b, 1e-5),
                          test_utils=OPCHECK_UTILS)  # fmt: skip


def _model(x, w, b):
    return torch.ops.liger.layer_norm(x * 0.5, w, b, 1e-5).square()


def test_compile_fullgraph_dynamic_matches_eager_without_recompiles():
    torch._dynamo.reset()
    compiled = torch.compile(_model, fullgraph=True, dynamic=True)
    w, b = (torch.randn(40, device=DEVICE, requires_grad=True) for _ in "wb")
    for i, lead in enumerate([(2, 5), (4, 7), (6, 11)]):
        x = torch.randn(*lead, 40, device=DEVICE, requires_grad=True)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            out = compiled(x, w, b)
        want = _model(x, w, b)
        torch.testing.assert_close(out, want)
        for got, ref in zip(torch.autograd.grad(out.sum(), (x, w, b)), torch.autograd.grad(want.sum(), (x, w, b)),
                            strict=True):  # fmt: skip
            torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"elementwise_affine": False}])
def test_module_drop_in_matches_nn_layer_norm(kwargs):
    from liger_nn import LayerNorm

    for shape in ((48,), (4, 12)):
        theirs = torch.nn.LayerNorm(shape, **kwargs).to(DEVICE, torch.float64)
        ours = LayerNorm(shape, **kwargs).to(DEVICE, torch.float64)
        ours.load_state_dict(theirs.state_dict())
        if theirs.weight is not None:
            with torch.no_grad():
                theirs.weight.normal_()
                ours.weight.copy_(theirs.weight)
        x = torch.randn(3, 5, *shape, device=DEVICE, dtype=torch.float64)
        xs = [x.clone().requires_grad_() for _ in "12"]
        y_theirs, y_ours = theirs(xs[0]), ours(xs[1])
        assert_close_to_ref(y_ours, y_theirs, torch.float64)
        dy = torch.randn_like(x)  # not y itself: with no affine, dx of sum(y^2) cancels to rounding noise
        (y_theirs * dy).sum().backward()
        (y_ours * dy).sum().backward()
        assert_close_to_ref(xs[1].grad, xs[0].grad, torch.float64, "dx")
        for p_ours, p_theirs in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert_close_to_ref(p_ours.grad, p_theirs.grad, torch.float64)
        assert isinstance(ours, torch.nn.LayerNorm) and repr(ours) == repr(theirs)


def test_rows_of_a_channels_first_activation_take_the_prepared_run(monkeypatch):
    """diffusers' transformer blocks normalize (B, H*W, C) views of NCHW activations (rows not one
    stride apart): after the first call the prepared runs read them (through a copy, as the
    general sequence does; no plan is looked up again) and return contiguous y and dx, against
    float64."""
    base = torch.randn(2, 32, 4, 5, device=DEVICE, dtype=torch.float64)
    x = base.permute(0, 2, 3, 1).reshape(2, 20, 32).requires_grad_()
    assert not x.is_contiguous() and x.stride() == (640, 1, 20)
    w, b = (torch.randn(32, device=DEVICE, dtype=torch.float64).requires_grad_() for _ in range(2))
    dy = torch.randn(2, 20, 32, device=DEVICE, dtype=torch.float64)
    for call in range(2):
        if call:
            monkeypatch.setattr(launch, "cuda_plan", lambda *a: pytest.fail("planned again: no prepared run"))
        y, grads = _call(x, w, b, dy, 1e-5)
        assert y.is_contiguous() and grads[0].is_contiguous()
        assert_matches(y, grads, x, w, b, dy, 1e-5, center=True)
