"""torch.ops.liger.poly_norm: values and gradients against a float64
reference, determinism, and errors for bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops import device
from csrc_free_ops.poly_norm import cuda, launch, reference
from tests.helpers import DEVICE, FLOAT_DTYPES, assert_close_to_ref, assert_close_to_scale

# Rows of up to MAX_ROW_BLOCK elements run in one piece; wider rows take the
# column-blocked kernels, so draw some of those too.
SMALL_H = st.integers(2, 300)
BLOCKED_H = st.integers(cuda.MAX_ROW_BLOCK + 1, cuda.MAX_ROW_BLOCK + 700)


def make_input(shape, dtype, layout, device=DEVICE):
    """A tensor of `shape` with the requested memory layout."""
    if layout == "contiguous":
        return torch.randn(shape, dtype=dtype, device=device)
    if layout == "strided_last":  # last-dim stride 2
        return torch.randn((*shape[:-1], 2 * shape[-1]), dtype=dtype, device=device)[..., ::2]
    if layout == "transposed":  # leading dims permuted: not collapsible to one row stride
        if len(shape) < 3:
            return torch.randn(shape[::-1], dtype=dtype, device=device).mT
        base = torch.randn((shape[1], shape[0], *shape[2:]), dtype=dtype, device=device)
        return base.transpose(0, 1)
    raise ValueError(layout)


def make_params(dtype, bias_shape=(1,)):
    weight = torch.randn(3, dtype=dtype, device=DEVICE)
    bias = torch.randn(bias_shape, dtype=dtype, device=DEVICE)
    return weight, bias


def reference_grads(x, weight, bias, dy, eps):
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    y = reference.forward(*leaves, eps)
    grads = torch.autograd.grad(y, leaves, dy.double())
    return y.detach(), grads


def grad_term_scales(x, weight, dy, eps):
    """(dx, dweight, dbias) term scales in float64: for each gradient element,
    the summed magnitudes of the terms the kernel adds up into it (see
    assert_close_to_scale).  dx is J^T dy, whose terms cancel on short rows;
    dweight and dbias sum over every row, and sum(dy) can cancel to near 0."""
    x1, w, g = x.detach().double(), weight.detach().double(), dy.detach().double()
    n = x1.shape[-1]
    dx_scale = torch.zeros_like(x1)
    dw_scale = []
    for k, order in enumerate((3, 2, 1)):
        u = x1**order
        r = torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)
        s_abs = (g * u).abs().sum(-1, keepdim=True)
        dx_scale += w[k].abs() * (r * g.abs() + r**3 / n * s_abs * u.abs()) * order * x1.abs() ** (order - 1)
        dw_scale.append((r * s_abs).sum())
    return dx_scale, torch.stack(dw_scale), g.abs().sum().reshape(1)


def assert_grads_close(grads, refs, x, weight, dy, eps, dtype):
    """(dx, dweight, dbias) against the float64 reference, bounded relative to grad_term_scales."""
    for out, ref, scale, what in zip(grads, refs, grad_term_scales(x, weight, dy, eps), ("dx", "dweight", "dbias"),
                                     strict=True):  # fmt: skip
        assert_close_to_scale(out, ref, scale, dtype, what)


shapes = st.tuples(
    st.lists(st.integers(1, 4), min_size=0, max_size=3),
    st.one_of(SMALL_H, SMALL_H, BLOCKED_H),
).map(lambda t: (*t[0], t[1]))


@given(
    shape=shapes,
    dtype=st.sampled_from(FLOAT_DTYPES),
    layout=st.sampled_from(["contiguous", "strided_last", "transposed"]),
    bias_shape=st.sampled_from([(1,), ()]),
    eps=st.sampled_from([1e-6, 1e-5]),
)
def test_forward_and_gradients_match_float64_reference(shape, dtype, layout, bias_shape, eps):
    if layout == "transposed" and len(shape) < 2:
        layout = "contiguous"
    x = make_input(shape, dtype, layout).requires_grad_()
    weight, bias = make_params(dtype, bias_shape)
    weight.requires_grad_()
    bias.requires_grad_()
    dy = torch.randn(shape, dtype=dtype, device=DEVICE)

    y = torch.ops.liger.poly_norm(x, weight, bias, eps)
    dx, dw, db = torch.autograd.grad(y, (x, weight, bias), dy)

    y_ref, (dx_ref, dw_ref, db_ref) = reference_grads(x, weight, bias, dy, eps)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close_to_ref(y, y_ref, dtype, "y")
    assert db.shape == bias.shape
    assert_grads_close((dx, dw, db), (dx_ref, dw_ref, db_ref), x, weight, dy, eps, dtype)


def test_closed_form_backward_matches_autograd_of_reference():
    """The reference's analytic backward (what the CPU fallback runs) agrees
    with autograd through its forward, in float64."""
    x = torch.randn(6, 37, dtype=torch.float64)
    weight = torch.randn(3, dtype=torch.float64)
    bias = torch.randn(1, dtype=torch.float64)
    dy = torch.randn_like(x)
    _, expected = reference_grads(x, weight, bias, dy, 1e-6)
    for got, want in zip(reference.backward(dy, x, weight, 1e-6), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n_cols", [50, cuda.MAX_ROW_BLOCK + 5])
def test_backward_is_bitwise_deterministic(n_cols):
    x = torch.randn(23, n_cols, device=DEVICE, dtype=torch.bfloat16)
    weight, bias = make_params(torch.bfloat16)
    dy = torch.randn_like(x)
    first = torch.ops.liger.poly_norm_backward(dy, x, weight, 1e-6)
    second = torch.ops.liger.poly_norm_backward(dy, x, weight, 1e-6)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_weight_gradient_sums_over_all_rows():
    """More rows than backward programs: every row's contribution lands."""
    rows = 2 * device.num_sms(torch.device(DEVICE)) * cuda.BWD_PROGRAMS_PER_SM + 5
    x = torch.randn(rows, 16, device=DEVICE, dtype=torch.float32)
    weight, bias = make_params(torch.float32)
    dy = torch.randn_like(x)
    grads = torch.ops.liger.poly_norm_backward(dy, x, weight, 1e-6)
    _, refs = reference_grads(x, weight, bias, dy, 1e-6)
    assert_grads_close(grads, refs, x, weight, dy, 1e-6, torch.float32)


def test_zero_rows():
    x = torch.randn(0, 3, 8, device=DEVICE, requires_grad=True)
    weight, bias = make_params(torch.float32)
    weight.requires_grad_()
    y = torch.ops.liger.poly_norm(x, weight, bias, 1e-6)
    assert y.shape == x.shape
    dx, dw = torch.autograd.grad(y.sum(), (x, weight))
    assert dx.shape == x.shape and torch.equal(dw, torch.zeros_like(dw))


def test_large_values_stay_finite():
    x = torch.randn(4, 64, device=DEVICE) * 30.0
    weight, bias = make_params(torch.float32)
    y = torch.ops.liger.poly_norm(x, weight, bias, 1e-6)
    assert_close_to_ref(y, reference.forward(x.double(), weight.double(), bias.double(), 1e-6), torch.float32)


def test_module_drop_in():
    from liger_nn import PolyNorm

    module = PolyNorm().to(DEVICE)
    assert torch.equal(module.weight.detach().cpu(), torch.full((3,), 1 / 3))
    assert torch.equal(module.bias.detach().cpu(), torch.zeros(1))
    x = torch.randn(2, 5, 33, device=DEVICE)
    ref = reference.forward(x.double(), module.weight.double(), module.bias.double(), module.eps)
    assert_close_to_ref(module(x), ref, torch.float32)
    assert set(module.state_dict()) == {"weight", "bias"}


def _x():
    return torch.randn(2, 8, device=DEVICE)


def _t(*shape, dtype=torch.float32, device=DEVICE):
    return torch.ones(shape, dtype=dtype, device=device)


W, B = (lambda: _t(3)), (lambda: _t(1))
BAD_CALLS = [
    ("weight must have shape (3,)", lambda: (_x(), _t(2), B())),
    ("weight must have shape (3,)", lambda: (_x(), _t(1, 3), B())),
    ("bias must have shape (1,) or ()", lambda: (_x(), W(), _t(2))),
    ("bias must have shape (1,) or ()", lambda: (_x(), W(), _t(1, 1))),
    ("weight has dtype", lambda: (_x(), _t(3, dtype=torch.float16), B())),
    ("bias has dtype", lambda: (_x(), W(), _t(1, dtype=torch.bfloat16))),
    ("weight is on", lambda: (_x(), _t(3, device="meta"), B())),
    ("non-empty last dimension", lambda: (_t(4, 0), W(), B())),
    ("non-empty last dimension", lambda: (_t(), W(), B())),
    ("x must be float32, bfloat16 or float16", lambda: (_t(2, 8, dtype=torch.int32), W(), B())),
    ("x must be float32, bfloat16 or float16", lambda: (_x().double(), W().double(), B().double())),
]


@pytest.mark.parametrize(("message", "make_args"), BAD_CALLS)
def test_bad_input_raises_clear_error(message, make_args):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        torch.ops.liger.poly_norm(*make_args(), 1e-6)


@pytest.mark.parametrize("eps", [-1.0, math.inf, math.nan])
def test_bad_eps_raises(eps):
    weight, bias = make_params(torch.float32)
    with pytest.raises(ValueError, match="eps must be"):
        torch.ops.liger.poly_norm(_x(), weight, bias, eps)


def test_backward_op_rejects_mismatched_grad():
    x = _x()
    weight, _ = make_params(torch.float32)
    with pytest.raises(ValueError, match="grad_out shape"):
        torch.ops.liger.poly_norm_backward(torch.randn(2, 9, device=DEVICE), x, weight, 1e-6)


def test_cuda_forward_runs_one_program_per_row_without_a_loop():
    """The CUDA forward gets one program per row, so it runs loop-free; the
    loop is kept exactly when there are fewer programs than row blocks (the
    NPU tests cover that grid-stride form)."""
    for n_rows in (1, 37, 5000):
        p = cuda.plan(n_rows, 300, False, 132, cuda.MAX_ROW_BLOCK)
        assert (p.whole_rows, p.block_m, p.programs) == (True, 1, n_rows)
        assert not launch.walks_row_blocks(p, n_rows)
    assert launch.walks_row_blocks(launch.Plan(True, 4, 64, 3, ()), 13)  # 4 blocks, 3 programs
    assert not launch.walks_row_blocks(launch.Plan(True, 4, 64, 4, ()), 13)


def test_single_column_rows():
    """H == 1: norm(u) is ~sign(u), so dx is a cancellation of O(1) terms
    down to ~eps; compare it with an absolute bound instead of a relative one."""
    sign = torch.randint(0, 2, (9, 1), device=DEVICE) * 2 - 1
    x = (torch.rand(9, 1, device=DEVICE) * 1.5 + 0.5) * sign
    weight, bias = make_params(torch.float32)
    dy = torch.randn_like(x)
    y = torch.ops.liger.poly_norm(x, weight, bias, 1e-6)
    dx, dw, db = torch.ops.liger.poly_norm_backward(dy, x, weight, 1e-6)
    y_ref, (dx_ref, dw_ref, db_ref) = reference_grads(x, weight, bias, dy, 1e-6)
    assert_close_to_ref(y, y_ref, torch.float32, "y")
    assert_close_to_ref(dw, dw_ref, torch.float32, "dweight")
    assert_close_to_ref(db.reshape(1), db_ref, torch.float32, "dbias")
    assert torch.isfinite(dx).all()
    assert (dx.double().cpu() - dx_ref.cpu()).abs().max() <= 1e-4
