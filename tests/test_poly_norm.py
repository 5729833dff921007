"""torch.ops.liger.poly_norm: values and gradients against a float64
reference, determinism, and errors for bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops import device
from csrc_free_ops.poly_norm import launch, plan, reference
from tests.helpers import (
    ALL_DTYPES,
    DEVICE,
    assert_close_to_ref,
    assert_close_to_scale,
    compute_dtype,
)

# Rows of up to MAX_ROW_BLOCK elements run in one piece; wider rows take the
# column-blocked kernels, so draw some of those too.
SMALL_H = st.integers(2, 300)
BLOCKED_H = st.integers(plan.MAX_ROW_BLOCK + 1, plan.MAX_ROW_BLOCK + 700)


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


def make_params(dtype, bias_shape=(1,), bias_dtype=None):
    weight = torch.randn(3, dtype=dtype, device=DEVICE)
    bias = torch.randn(bias_shape, dtype=bias_dtype or dtype, device=DEVICE)
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


def assert_grads_close(grads, refs, x, weight, dy, eps, dtype=None):
    """(dx, dweight, dbias) against the float64 reference, bounded relative to
    grad_term_scales; each gradient is held to its own dtype's bound, its
    sums to the compute dtype's (float64 for float64 x, else float32)."""
    compute = compute_dtype(x.dtype)
    for out, ref, scale, what in zip(grads, refs, grad_term_scales(x, weight, dy, eps), ("dx", "dweight", "dbias"),
                                     strict=True):  # fmt: skip
        assert_close_to_scale(out, ref, scale, out.dtype, what, compute)


shapes = st.tuples(
    st.lists(st.integers(1, 4), min_size=0, max_size=3),
    st.one_of(SMALL_H, SMALL_H, BLOCKED_H),
).map(lambda t: (*t[0], t[1]))


@given(
    shape=shapes,
    dtype=st.sampled_from(ALL_DTYPES),
    param_dtype=st.sampled_from(ALL_DTYPES),
    layout=st.sampled_from(["contiguous", "strided_last", "transposed"]),
    bias_shape=st.sampled_from([(1,), ()]),
    eps=st.sampled_from([1e-6, 1e-5]),
)
def test_forward_and_gradients_match_float64_reference(shape, dtype, param_dtype, layout, bias_shape, eps):
    """Any data dtype with parameters of any dtype (fp32 master weights under
    bf16 activations, float64 for gradcheck): y in x's dtype, each gradient in
    its input's dtype, all against float64."""
    if layout == "transposed" and len(shape) < 2:
        layout = "contiguous"
    x = make_input(shape, dtype, layout).requires_grad_()
    weight, bias = make_params(param_dtype, bias_shape)
    weight.requires_grad_()
    bias.requires_grad_()
    dy = torch.randn(shape, dtype=dtype, device=DEVICE)

    y = torch.ops.liger.poly_norm(x, weight, bias, eps)
    dx, dw, db = torch.autograd.grad(y, (x, weight, bias), dy)

    y_ref, (dx_ref, dw_ref, db_ref) = reference_grads(x, weight, bias, dy, eps)
    assert y.dtype == dtype and y.shape == x.shape
    assert (dx.dtype, dw.dtype, db.dtype) == (dtype, param_dtype, param_dtype)
    assert_close_to_ref(y, y_ref, dtype, "y")
    assert db.shape == bias.shape
    assert_grads_close((dx, dw, db), (dx_ref, dw_ref, db_ref), x, weight, dy, eps)


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


@pytest.mark.parametrize("n_cols", [50, plan.MAX_ROW_BLOCK + 5])
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
    rows = 2 * device.num_sms(torch.device(DEVICE)) * plan.BWD_PROGRAMS_PER_SM + 5
    x = torch.randn(rows, 130, device=DEVICE, dtype=torch.float32)
    assert plan.cuda(rows, 130, True, device.num_sms(x.device)).programs > 1
    weight, bias = make_params(torch.float32)
    dy = torch.randn_like(x)
    grads = torch.ops.liger.poly_norm_backward(dy, x, weight, 1e-6)
    _, refs = reference_grads(x, weight, bias, dy, 1e-6)
    assert_grads_close(grads, refs, x, weight, dy, 1e-6, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_one_program_backward_writes_the_gradients_itself(dtype):
    """Small backwards run as one program that stores dweight/dbias in their
    dtype (no partials, no reduce launch); the same rows through several
    programs and the reduce give the same gradients."""
    x = torch.randn(5, 40, device=DEVICE, dtype=dtype)
    weight, bias = make_params(torch.float32)
    dy = torch.randn_like(x)
    assert plan.cuda(5, 40, True, 132).programs == 1
    one = launch.backward(dy, x, weight, 1e-6, plan.Plan(True, 1, 64, 1, None, None))
    several = launch.backward(dy, x, weight, 1e-6, plan.Plan(True, 1, 64, 3, None, None))
    _, refs = reference_grads(x, weight, bias, dy, 1e-6)
    assert_grads_close(one, refs, x, weight, dy, 1e-6)
    for a, b in zip(one[1:], several[1:], strict=True):
        torch.testing.assert_close(a, b)


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
    ("weight must be float32, bfloat16, float16 or float64", lambda: (_x(), _t(3, dtype=torch.int32), B())),
    ("bias must be float32, bfloat16, float16 or float64", lambda: (_x(), W(), _t(1, dtype=torch.int64))),
    ("weight is on", lambda: (_x(), _t(3, device="meta"), B())),
    ("bias is on", lambda: (_x(), W(), _t(1, device="meta"))),
    ("non-empty last dimension", lambda: (_t(4, 0), W(), B())),
    ("non-empty last dimension", lambda: (_t(), W(), B())),
    ("x must be float32, bfloat16, float16 or float64", lambda: (_t(2, 8, dtype=torch.int32), W(), B())),
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


BAD_BACKWARD_CALLS = [
    # (message, (grad_out, x, weight, eps)): the cases the backward op once accepted (issue 23).
    ("grad_out shape", lambda: (_t(2, 9), _x(), W(), 1e-6)),
    ("weight must have shape (3,)", lambda: (_x(), _x(), _t(2), 1e-6)),
    ("weight is on", lambda: (_x(), _x(), _t(3, device="meta"), 1e-6)),
    ("grad_out is on", lambda: (_t(2, 8, device="meta"), _x(), W(), 1e-6)),
    ("eps must be", lambda: (_x(), _x(), W(), -1.0)),
    ("x must be float32, bfloat16, float16 or float64", lambda: (_x(), _t(2, 8, dtype=torch.int32), W(), 1e-6)),
    ("grad_out must be float32", lambda: (_t(2, 8, dtype=torch.int32), _x(), W(), 1e-6)),
    ("weight must be float32", lambda: (_x(), _x(), _t(3, dtype=torch.int32), 1e-6)),
    ("non-empty last dimension", lambda: (_t(4, 0), _t(4, 0), W(), 1e-6)),
    ("non-empty last dimension", lambda: (_t(), _t(), W(), 1e-6)),
]


@pytest.mark.parametrize(("message", "make_args"), BAD_BACKWARD_CALLS)
def test_backward_op_validates_its_inputs(message, make_args):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        torch.ops.liger.poly_norm_backward(*make_args())


def test_cuda_forward_runs_one_program_per_row_without_a_loop():
    """The CUDA forward gets one program per row, so it runs loop-free; the
    loop is kept exactly when there are fewer programs than row blocks (the
    NPU tests cover that grid-stride form)."""
    for n_rows in (1, 37, 5000):
        p = plan.cuda(n_rows, 300, False, 132)
        assert (p.whole_rows, p.block_m, p.programs) == (True, 1, n_rows)
        assert not p.walks_row_blocks(n_rows)
    assert plan.Plan(True, 4, 64, 3).walks_row_blocks(13)  # 4 blocks, 3 programs
    assert not plan.Plan(True, 4, 64, 4).walks_row_blocks(13)


def test_blocked_kernels_through_the_launch_sequence():
    """The column-blocked kernels on narrow rows: the launch sequence takes
    any Plan as data, which is how tests reach a path without its shapes."""
    x = torch.randn(6, 200, device=DEVICE)
    weight, bias = make_params(torch.float32)
    dy = torch.randn_like(x)
    p = plan.Plan(whole_rows=False, block_m=1, block_n=64, programs=4, num_warps=None)
    y = launch.forward(x, weight, bias, 1e-6, p)
    grads = launch.backward(dy, x, weight, 1e-6, p)
    y_ref, refs = reference_grads(x, weight, bias, dy, 1e-6)
    assert_close_to_ref(y, y_ref, torch.float32, "y")
    assert_grads_close(grads, refs, x, weight, dy, 1e-6)


def test_gradcheck_and_gradgradcheck_in_float64():
    x = torch.randn(3, 7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    weight = torch.randn(3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    bias = torch.randn(1, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.liger.poly_norm, (x, weight, bias))
    assert torch.autograd.gradgradcheck(torch.ops.liger.poly_norm, (x, weight, bias))


def test_gradient_penalty_matches_float64_reference():
    """Double backward (issue 23): y.sum() + (dx ** 2).sum() with create_graph.
    It once came back None with only a warning, rel error ~1."""

    def penalty(fn, x, weight, bias):
        y = fn(x, weight, bias, 1e-6)
        (dx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        return torch.autograd.grad(y.sum() + (dx**2).sum(), (x, weight, bias))

    x = torch.randn(4, 33, device=DEVICE, requires_grad=True)
    weight, bias = (t.requires_grad_() for t in make_params(torch.float32))
    got = penalty(torch.ops.liger.poly_norm, x, weight, bias)
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    want = penalty(reference.forward, *leaves)
    for g, w, what in zip(got, want, ("dx", "dweight", "dbias"), strict=True):
        assert g is not None, what
        assert_close_to_ref(g, w, torch.float32, what)


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
