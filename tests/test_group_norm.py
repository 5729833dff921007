"""torch.ops.liger.group_norm: values and gradients against a float64
reference in every dtype combination, every path of the launch sequence
(reached by building its Plan), the CUDA planner's choices, determinism,
double backward, the GroupNorm module, and errors for bad input."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from csrc_free_ops.group_norm import kernels, launch, layout, plan, reference, residency, tiles, workspace
from csrc_free_ops.group_norm.plan import Problem
from csrc_free_ops.group_norm.residency import CudaDevice
from csrc_free_ops.host_math import next_pow2
from tests.helpers import ALL_DTYPES, DEVICE, assert_close_to_ref, assert_close_to_scale, compute_dtype

AFFINE = ("both", "weight", "bias", "none")
PATHS = ("whole", "one_pass", "looped", "split")
# The one-pass kernels compute in float32 only (plan._one_pass_math says why).
FLOAT64_PATHS = tuple(p for p in PATHS if p != "one_pass")
# The reduce of the small plans below: 2 x 4 tiles on 2 programs, so it loops both ways.
SMALL_REDUCE = (2, 4, 2, ())


@st.composite
def group_norm_cases(draw, max_spatial: int = 9, max_hw: int = 400):
    """(shape, num_groups): rank 2 to 5, C % G == 0, spatial sizes mostly not
    powers of two, at most max_hw spatial positions.  Groups hold at least 4
    elements; dx of a 1- or 2-element group is a cancellation down to ~eps
    (test_tiny_groups covers those with an absolute bound)."""
    groups = draw(st.integers(1, 4))
    per_group = draw(st.integers(1, 4))
    spatial = draw(st.lists(st.integers(1, max_spatial), min_size=0, max_size=3))
    while math.prod(spatial) > max_hw:
        spatial.pop()
    if per_group * math.prod(spatial) < 4:
        spatial.append(draw(st.integers(4, max_spatial)))
    return (draw(st.integers(1, 3)), groups * per_group, *spatial), groups


def make_x(shape, dtype, x_layout="contiguous", offset=0.0):
    if x_layout == "channels_last" and len(shape) >= 3:  # channels innermost in memory
        base = torch.randn((shape[0], *shape[2:], shape[1]), dtype=torch.float32, device=DEVICE)
        x = base.movedim(-1, 1)
    else:
        x = torch.randn(shape, dtype=torch.float32, device=DEVICE)
    return (x + offset).to(dtype)


def make_params(channels, affine, dtype, bias_dtype=None):
    weight = torch.randn(channels, dtype=dtype, device=DEVICE) if affine in ("both", "weight") else None
    bias = torch.randn(channels, dtype=bias_dtype or dtype, device=DEVICE) if affine in ("both", "bias") else None
    return weight, bias


def reference_grads(x, num_groups, weight, bias, dy, eps, activation="none"):
    """(y, {name: grad}) in float64 by autograd through the reference forward."""
    named = {"x": x, "weight": weight, "bias": bias}
    leaves = {k: v.detach().double().requires_grad_() for k, v in named.items() if v is not None}
    y = reference.forward(leaves["x"], num_groups, leaves.get("weight"), leaves.get("bias"), eps, activation)
    grads = torch.autograd.grad(y, list(leaves.values()), dy.double())
    return y.detach(), dict(zip(leaves, grads, strict=True))


def _through_activation(dy, xhat, x, weight, bias, activation):
    """dy taken through the activation at z = xhat * w + b, in float64 (dy itself without one)."""
    dz = dy.double()
    if activation == "none":
        return dz
    z = reference._affine(xhat, x, weight, bias, torch.float64)
    s = torch.sigmoid(z)
    return dz * s * (1 + z * (1 - s))


def param_grad_term_scales(x, num_groups, dy, eps, weight=None, bias=None, activation="none"):
    """Per channel, the summed magnitudes of the terms the kernels add into
    dweight (dy * xhat) and dbias (dy), in float64 (dy taken through the
    activation first)."""
    xhat, _ = reference._normalized(x.detach().double(), num_groups, eps)
    dy64 = _through_activation(dy, xhat, x, weight, bias, activation)
    per_channel = tuple(d for d in range(x.dim()) if d != 1)
    return {
        "weight": (dy64 * xhat.reshape(x.shape)).abs().sum(per_channel),
        "bias": dy64.abs().sum(per_channel),
    }


def check_against_reference(y, grads, x, num_groups, weight, bias, dy, eps, activation="none"):
    """y against the float64 reference relative to its values, in x's dtype's
    tolerance.  dx, dweight and dbias are sums whose terms can cancel far below
    them: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) over a group (few
    elements, or g nearly in the span of 1 and xhat, leave little of its
    terms; the float64 reference itself is then as far off), dweight and
    dbias over N x spatial.  Each is checked by the error model of a sum in
    the compute dtype rounded to its own dtype, relative to its terms
    (tests.helpers.assert_close_to_scale)."""
    y_ref, grads_ref = reference_grads(x, num_groups, weight, bias, dy, eps, activation)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_close_to_ref(y, y_ref, x.dtype, "y")
    assert set(grads) == set(grads_ref)
    scales = param_grad_term_scales(x, num_groups, dy, eps, weight, bias, activation)
    for name, grad in grads.items():
        param = {"x": x, "weight": weight, "bias": bias}[name]
        assert grad.dtype == param.dtype, f"d{name} dtype {grad.dtype} != {param.dtype}"
        if name == "x":
            dx_scale = dx_term_scale(x, num_groups, weight, dy, eps, bias, activation)
            assert_close_to_scale(grad, grads_ref[name], dx_scale, x.dtype, "dx", compute_dtype(x.dtype))
        else:
            assert_close_to_scale(grad, grads_ref[name], scales[name], param.dtype, f"d{name}", compute_dtype(x.dtype))


def _ill_conditioned_dx_case(delta: float):
    """(x, weight, dy) of shape (1, 8), 2 groups, float64, where each group's g = dz * w is 0.7 + 1.3 * xhat
    plus a delta-sized remainder: dx keeps only that remainder of terms of order one."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 8, dtype=torch.float64, generator=gen)
    weight = torch.randn(8, dtype=torch.float32, generator=gen)
    xhat = reference._normalized(x, 2, 1e-5)[0].reshape(1, 8)
    s = torch.sigmoid(xhat * weight.double())
    silu_grad = s * (1 + xhat * weight.double() * (1 - s))
    g = 0.7 + 1.3 * xhat + delta * torch.randn(1, 8, dtype=torch.float64, generator=gen)
    return x.to(DEVICE), weight.to(DEVICE), (g / (weight.double() * silu_grad)).to(DEVICE)


@pytest.mark.parametrize("path", FLOAT64_PATHS)
def test_dx_of_an_ill_conditioned_group_is_checked_against_its_terms(path):
    """Where a group's dx cancels to 1e-4 of its terms, the float64 reference and every float64 path differ by
    1.0e-12 to 2.2e-12 of dx (the interpreter, every path), beyond a bound relative to dx, but within
    float64's bound on the terms; an error of 1e-10 of the terms still fails."""
    x, weight, dy = _ill_conditioned_dx_case(1e-4)
    _, (dx, _, _) = run_plans(x, 2, weight, None, dy, 1e-5, lambda pb: small_plan(pb, path, 8, 1), "silu")
    _, grads_ref = reference_grads(x, 2, weight, None, dy, 1e-5, "silu")
    scale = dx_term_scale(x, 2, weight, dy, 1e-5, activation="silu")
    assert scale.norm() > 100 * grads_ref["x"].norm()  # the case is as ill-conditioned as meant
    assert_close_to_scale(dx, grads_ref["x"], scale, torch.float64, "dx", torch.float64)
    off = dx + 1e-10 * scale.norm() * torch.sign(torch.randn_like(dx))
    with pytest.raises(AssertionError, match="dx: error norm"):
        assert_close_to_scale(off, grads_ref["x"], scale, torch.float64, "dx", torch.float64)


@pytest.mark.parametrize("channels_last", [False, True], ids=["one_pass", "nhwc_one_pass"])
def test_one_pass_plans_refuse_float64(channels_last):
    """The one-pass kernels take eps as a float32: a float64 plan of theirs would not be float64 all the way through."""
    x = make_x((2, 8, 4, 4), torch.float64, "channels_last" if channels_last else "contiguous")
    pb = problem(x, 2, None, None, backward=False)
    with pytest.raises(ValueError, match="compute in float32; plan float64 x another path"):
        if channels_last:
            plan.nhwc_one_pass(pb, 8, 8, 1, None, 1, None, SMALL_REDUCE)
        else:
            plan.one_pass(pb, 4, 16, 1, None, False, 4)


def problem(x, num_groups, weight, bias, backward, activation="none"):
    n, c = x.shape[:2]
    return Problem(n, c, x.numel() // (n * c), num_groups, x.element_size(), weight is not None, bias is not None,
                   backward, activation, layout.channels_last(x))  # fmt: skip


def small_plan(pb: Problem, path: str, tile: int = 16, target_items: int = 64, programs: int = 3,
               prefetch: bool = False) -> plan.Plan:  # fmt: skip
    """A plan of the given path with small tiles and grids, so that loops run
    several steps on tiny shapes.  one_pass: teams of one program (a whole
    group per program), the only teams the interpreter can run."""
    if path == "whole":
        return plan.whole(pb, programs, (), SMALL_REDUCE)
    if path == "looped":
        return plan.looped(pb, tile, programs, None, None, ("", ""), SMALL_REDUCE)
    if path == "split":
        block_c, block_hw, chunk = tiles.split_geometry(pb, tile, tile, target_items)
        return plan.split(pb, block_c, block_hw, chunk, programs, 4, False, SMALL_REDUCE)
    return plan.one_pass(pb, next_pow2(pb.cpg), next_pow2(pb.hw), programs, None, prefetch, 4, reduce=SMALL_REDUCE)


def run_plans(x, num_groups, weight, bias, dy, eps, make, activation="none"):
    """launch.forward / backward with the plans make(problem) gives."""
    fwd = make(problem(x, num_groups, weight, bias, False, activation))
    bwd = make(problem(x, num_groups, weight, bias, True, activation))
    return launch.forward(x, num_groups, weight, bias, eps, fwd), launch.backward(dy, x, num_groups, weight, bias, eps,
                                                                                   bwd)  # fmt: skip


def named_grads(dx, dweight, dbias):
    return {"x": dx} | {k: v for k, v in (("weight", dweight), ("bias", dbias)) if v is not None}


# --- values and gradients


@given(
    case=group_norm_cases(),
    dtype=st.sampled_from(ALL_DTYPES),
    weight_dtype=st.sampled_from(ALL_DTYPES),
    bias_dtype=st.sampled_from(ALL_DTYPES),
    affine=st.sampled_from(AFFINE),
    x_layout=st.sampled_from(["contiguous", "channels_last"]),
    eps=st.sampled_from([1e-5, 1e-3]),
)
def test_op_forward_and_gradients_match_float64_reference(case, dtype, weight_dtype, bias_dtype, affine, x_layout, eps):
    """Any data dtype with weight and bias each of any dtype (fp32 master
    weights under bf16 activations, float64 for gradcheck): y in x's dtype,
    each gradient in its input's dtype, all against float64."""
    shape, groups = case
    x = make_x(shape, dtype, x_layout).requires_grad_()
    weight, bias = make_params(shape[1], affine, weight_dtype, bias_dtype)
    leaves = {"x": x} | {k: v.requires_grad_() for k, v in (("weight", weight), ("bias", bias)) if v is not None}
    dy = torch.randn(shape, dtype=dtype, device=DEVICE)

    y = torch.ops.liger.group_norm(x, groups, weight, bias, eps)
    grads = dict(zip(leaves, torch.autograd.grad(y, list(leaves.values()), dy), strict=True))
    assert y.stride() == grads["x"].stride() == layout.empty_output(x).stride()  # x's layout (as torch's CPU kernel)
    check_against_reference(y, grads, x, groups, weight, bias, dy, eps)


@given(
    case=group_norm_cases(max_spatial=40, max_hw=120),
    dtype=st.sampled_from(ALL_DTYPES),
    affine=st.sampled_from(AFFINE),
    path=st.sampled_from(PATHS),
    tile=st.sampled_from([8, 32]),
    target_items=st.sampled_from([1, 64]),
    prefetch=st.booleans(),
    x_layout=st.sampled_from(["contiguous", "channels_last"]),
    dy_layout=st.sampled_from(["contiguous", "channels_last"]),
    activation=st.sampled_from(reference.ACTIVATIONS),
)
def test_every_path_on_any_shape(case, dtype, affine, path, tile, target_items, prefetch, x_layout, dy_layout,
                                 activation):  # fmt: skip
    """Each path's Plan, with tiles far smaller than a group: looped tiles,
    channel blocks and spatial segments of a group, groups split across
    programs whose partials are merged (fused or by finalize launches), and
    one-pass teams walking several rows each; x read in place in either
    layout, with grad_out in the same or the other one; with and without
    the fused SiLU."""
    assume(path in FLOAT64_PATHS or dtype != torch.float64)
    shape, groups = case
    x = make_x(shape, dtype, "contiguous" if path == "one_pass" else x_layout)  # one-pass: plan.one_pass says why
    weight, bias = make_params(shape[1], affine, torch.float32)
    dy = make_x(shape, dtype, dy_layout)
    y, (dx, dweight, dbias) = run_plans(
        x,
        groups,
        weight,
        bias,
        dy,
        1e-5,
        lambda pb: small_plan(pb, path, tile, target_items, prefetch=prefetch),
        activation,
    )
    assert (dweight is None) == (weight is None) and (dbias is None) == (bias is None)
    assert y.stride() == dx.stride() == layout.empty_output(x).stride()
    check_against_reference(y, named_grads(dx, dweight, dbias), x, groups, weight, bias, dy, 1e-5, activation)


@pytest.mark.parametrize("path", ["whole", "split"])
def test_float64_data_with_half_precision_parameters(path):
    """dweight / dbias summed in float64 and stored as bfloat16 / float16: the
    narrowing goes through float32 (the interpreter's direct float64 ->
    bfloat16 cast gives garbage)."""
    x = make_x((2, 6, 5, 3), torch.float64)
    weight, bias = make_params(6, "both", torch.bfloat16, torch.float16)
    dy = torch.randn_like(x)
    y, grads = run_plans(x, 3, weight, bias, dy, 1e-5, lambda pb: small_plan(pb, path))
    check_against_reference(y, named_grads(*grads), x, 3, weight, bias, dy, 1e-5)


def poison_allocations(monkeypatch) -> None:
    """Every floating-point torch.empty / torch.empty_like from here on comes
    back NaN-filled: an output element no kernel writes stays NaN."""

    def poisoned(make):
        def alloc(*args, **kwargs):
            t = make(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t

        return alloc

    monkeypatch.setattr(torch, "empty", poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(torch.empty_like))


SPLIT_FUSED = {"path": "split", "tile": 64, "target_items": 1}  # one segment per channel block, fused merge
SPLIT_FINALIZE = {"path": "split", "tile": 16, "target_items": 64}  # many partials per group: finalize launches


@pytest.mark.parametrize(
    ("shape", "groups", "opts", "kernel"),
    [
        ((2, 6, 5, 7), 3, {"path": "whole"}, kernels.fwd_whole_kernel),  # padded both ways
        ((2, 12, 9, 7), 3, {"path": "looped"}, kernels.fwd_looped_kernel),  # [1, 16] tiles: 4 channels x 4 steps
        ((2, 16, 128), 1, SPLIT_FUSED, kernels.fwd_apply_kernel),  # a fused merge over several steps
        ((2, 4, 33, 17), 2, SPLIT_FINALIZE, kernels.fwd_finalize_kernel),
        ((3, 6, 5, 7), 3, {"path": "one_pass", "programs": 2}, kernels.fwd_one_pass_kernel),  # 2 teams, 6 rows
        ((3, 6, 5, 7), 3, {"path": "one_pass", "programs": 2, "prefetch": True}, kernels.fwd_one_pass_kernel),
    ],
)
def test_every_path_writes_every_output(monkeypatch, shape, groups, opts, kernel):
    """With NaN-poisoned allocations (y, dx, dweight, dbias and the workspace
    are all torch.empty)."""
    x = make_x(shape, torch.float32, offset=2.0)
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    plans = {bw: small_plan(problem(x, groups, weight, bias, bw), **opts) for bw in (False, True)}
    steps = {s.kernel: dict(s.constexprs) for s in plans[False].steps}
    assert kernel in steps
    if kernel is kernels.fwd_apply_kernel:
        assert steps[kernel]["FUSED"] and steps[kernel]["BLOCK_P"] < 2 * 16
    if opts.get("prefetch"):
        assert steps[kernels.fwd_one_pass_kernel]["PREFETCH"]
    poison_allocations(monkeypatch)
    y = launch.forward(x, groups, weight, bias, 1e-5, plans[False])
    dx, dweight, dbias = launch.backward(dy, x, groups, weight, bias, 1e-5, plans[True])
    monkeypatch.undo()
    check_against_reference(y, named_grads(dx, dweight, dbias), x, groups, weight, bias, dy, 1e-5)


@pytest.mark.parametrize("shape", [(2, 8, 50, 41), (1, 4, 97, 71)])
def test_group_larger_than_one_block_through_the_op(shape):
    """Groups of ~8k-27k elements: more than one tile; split across programs."""
    x = make_x(shape, torch.float32, offset=3.0).requires_grad_()
    weight, bias = make_params(shape[1], "both", torch.float32)
    weight.requires_grad_()
    bias.requires_grad_()
    dy = torch.randn(shape, device=DEVICE)
    y = torch.ops.liger.group_norm(x, 2, weight, bias)
    grads = dict(zip(("x", "weight", "bias"), torch.autograd.grad(y, (x, weight, bias), dy), strict=True))
    check_against_reference(y, grads, x, 2, weight, bias, dy, 1e-5)


def test_large_mean_keeps_variance():
    """mean / std = 100: sums on shifted values (split, looped) and per-tile
    two-pass moments (one-pass) keep the variance from cancelling."""
    x = make_x((2, 4, 33, 17), torch.float32, offset=100.0)
    dy = torch.randn_like(x)
    y_ref, grads_ref = reference_grads(x, 2, None, None, dy, 1e-5)
    for opts in ({"path": "split", "tile": 64}, {"path": "looped", "tile": 64}, {"path": "one_pass"}):
        y, (dx, _, _) = run_plans(x, 2, None, None, dy, 1e-5, lambda pb, opts=opts: small_plan(pb, **opts))
        assert_close_to_ref(y, y_ref, torch.float32, "y")
        assert_close_to_ref(dx, grads_ref["x"], torch.float32, "dx")


def test_reference_matches_torch_group_norm_in_float64():
    x = torch.randn(3, 6, 5, 7, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, dtype=torch.float64, requires_grad=True)
    dy = torch.randn_like(x)
    y = torch.nn.functional.group_norm(x, 3, weight, bias, 1e-5)
    expected = torch.autograd.grad(y, (x, weight, bias), dy)
    torch.testing.assert_close(reference.forward(x, 3, weight, bias, 1e-5), y, rtol=1e-12, atol=1e-12)
    for got, want in zip(
        reference.backward(dy, x.detach(), 3, weight.detach(), bias.detach(), 1e-5), expected, strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("shape", "groups"), [((5, 2), 2), ((5, 2), 1), ((3, 4, 1), 2), ((2, 3, 1, 1), 3)])
def test_tiny_groups(shape, groups):
    """1- or 2-element groups: y is exact-ish; dx cancels (see dx_term_scale),
    so its error is bounded relative to its terms' magnitudes."""
    x = make_x(shape, torch.float32)
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    y = torch.ops.liger.group_norm(x, groups, weight, bias)
    dx, dweight, dbias = torch.ops.liger.group_norm_backward(dy, x, groups, weight, bias, 1e-5)
    y_ref, grads_ref = reference_grads(x, groups, weight, bias, dy, 1e-5)
    assert_close_to_ref(y, y_ref, torch.float32, "y")
    assert_close_to_ref(dweight, grads_ref["weight"], torch.float32, "dweight")
    assert_close_to_ref(dbias, grads_ref["bias"], torch.float32, "dbias")
    assert_close_to_scale(dx, grads_ref["x"], dx_term_scale(x, groups, weight, dy, 1e-5), torch.float32, "dx")


def dx_term_scale(x, num_groups, weight, dy, eps, bias=None, activation="none"):
    """Per element of dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
    g = dz * w (dz: dy taken through the activation; w: 1 without a weight):
    the summed magnitudes of its terms, in float64.  A kernel's error is
    relative to these: with 1- or 2-element groups, or g near the span of 1
    and xhat, dx cancels down to ~eps of terms that are O(1), or comes out
    O(rstd) where the group's values nearly coincide."""
    xhat, rstd = reference._normalized(x.detach().double(), num_groups, eps)
    dz = _through_activation(dy, xhat, x, weight, bias, activation)
    g = dz if weight is None else dz * reference._channel_view(weight, x, torch.float64)
    g = g.reshape(xhat.shape)
    terms = g.abs() + g.mean(-1, keepdim=True).abs() + xhat.abs() * (g * xhat).mean(-1, keepdim=True).abs()
    return (rstd * terms).reshape(x.shape)


def test_expanded_grad_and_weight_without_grad():
    """grad_out with stride 0 (from .sum()); only the bias requires grad."""
    x = make_x((2, 4, 9), torch.float32).requires_grad_()
    weight, bias = make_params(4, "both", torch.float32)
    bias.requires_grad_()
    dx, dbias = torch.autograd.grad(torch.ops.liger.group_norm(x, 2, weight, bias).sum(), (x, bias))
    _, grads_ref = reference_grads(x, 2, weight, bias, torch.ones_like(x), 1e-5)
    assert_close_to_ref(dbias, grads_ref["bias"], torch.float32, "dbias")
    assert_close_to_ref(dx, grads_ref["x"], torch.float32, "dx")


def test_empty_batch():
    x = torch.randn(0, 4, 5, device=DEVICE, requires_grad=True)
    weight, bias = make_params(4, "both", torch.float32)
    weight.requires_grad_()
    y = torch.ops.liger.group_norm(x, 2, weight, bias)
    assert y.shape == x.shape
    dx, dweight = torch.autograd.grad(y.sum(), (x, weight))
    assert dx.shape == x.shape and torch.equal(dweight, torch.zeros_like(dweight))


@pytest.mark.parametrize("path", ["split", "looped", "one_pass"])
def test_bitwise_deterministic(path):
    x = make_x((2, 8, 7, 11), torch.bfloat16)
    weight, bias = make_params(8, "both", torch.float32)
    dy = torch.randn_like(x)

    def make(pb):
        return small_plan(pb, path, tile=64)

    runs = [run_plans(x, 4, weight, bias, dy, 1e-5, make) for _ in range(2)]
    for a, b in zip((runs[0][0], *runs[0][1]), (runs[1][0], *runs[1][1]), strict=True):
        assert torch.equal(a, b)


# --- double backward (issue 23)


def test_gradcheck_and_gradgradcheck_in_float64():
    x = torch.randn(2, 4, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    weight = torch.randn(4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, device=DEVICE, requires_grad=True)

    def fn(x, weight, bias):
        return torch.ops.liger.group_norm(x, 2, weight, bias, 1e-5)

    assert torch.autograd.gradcheck(fn, (x, weight, bias), fast_mode=True)
    assert torch.autograd.gradgradcheck(fn, (x, weight, bias), fast_mode=True)


def test_gradient_penalty_matches_float64_reference():
    """y.sum() + (dx ** 2).sum() with create_graph: the second-order gradient
    once came back None with only a warning (rel error ~1)."""

    def penalty(fn, x, weight, bias):
        y = fn(x, 2, weight, bias, 1e-5)
        dy = torch.linspace(-1, 1, y.numel(), dtype=y.dtype, device=y.device).reshape(y.shape)
        (dx,) = torch.autograd.grad((y * dy).sum(), x, create_graph=True)
        return torch.autograd.grad((y * dy).sum() + (dx**2).sum(), (x, weight, bias))

    x = torch.randn(2, 4, 9, device=DEVICE, requires_grad=True)
    weight, bias = (t.requires_grad_() for t in make_params(4, "both", torch.float32))
    got = penalty(torch.ops.liger.group_norm, x, weight, bias)
    want = penalty(reference.forward, *(t.detach().double().requires_grad_() for t in (x, weight, bias)))
    for g, w, what in zip(got, want, ("dx", "dweight", "dbias"), strict=True):
        assert g is not None, what
        assert_close_to_ref(g, w, torch.float32, what)


# --- the CUDA planner (pure functions: no GPU needed)

H200 = CudaDevice(sms=132, cooperative=True)
DIFFUSION = [(2, 320, 64 * 64), (8, 640, 32 * 32), (16, 1280, 16 * 16), (4, 512, 128 * 128), (1, 128, 512 * 512)]


def _pb(n, c, hw, groups=32, itemsize=2, backward=False, affine=True):
    return Problem(n, c, hw, groups, itemsize, affine, affine, backward)


def test_resident_ctas_follows_the_occupancy_limits():
    """H100/H200 limits: 64 K registers, 2048 threads, 32 CTAs, 228 KiB shared per SM."""
    assert residency.resident_ctas(H200, 4, 64, 0) == 8  # registers: 65536 / (128 * 64)
    assert residency.resident_ctas(H200, 4, 65, 0) == 7  # 72 per thread once rounded to whole 256-register units
    assert residency.resident_ctas(H200, 1, 16, 0) == 32  # the CTA limit
    assert residency.resident_ctas(H200, 8, 32, 0) == 8  # threads: 2048 / 256
    assert residency.resident_ctas(H200, 1, 16, 100 * 1024) == 2  # shared memory


@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("shape", [*DIFFUSION, (8, 512, 4096)])
def test_cuda_plans_one_pass_teams_at_large_groups(shape, backward, itemsize):
    """Large groups take the one-pass path on a GPU, except where x is small
    and the looped path has rows enough (measured faster there): one team
    per row (the launch caps it at what is resident), a cooperative launch,
    one zeroed barrier counter per row, and a two-walk fallback."""
    pb = _pb(*shape, itemsize=itemsize, backward=backward)
    p = plan.cuda(pb, H200)
    small = math.prod(shape) * itemsize < plan.ONE_PASS_MIN_BYTES
    if small and plan.cuda_two_walk(pb, H200.sms).path == "looped":
        assert p.path == "looped"
        return
    assert p.path == "one_pass" and p.fallback is not None and p.fallback.path in ("looped", "split")
    step = p.steps[0]
    c, o = dict(step.constexprs), dict(step.options)
    assert p.team_size == tiles.team_size(pb, c["BLOCK_C"], c["BLOCK_HW"]) and step.grid == pb.rows * p.team_size
    assert o["launch_cooperative_grid"] is True and "maxnreg" not in o
    assert p.chunk == c["BLOCK_HW"] and p.counters == pb.rows and p.max_rounds == plan.ONE_PASS_MAX_ROUNDS
    assert c["EVEN"] == (pb.cpg % c["BLOCK_C"] == 0 and pb.hw % c["BLOCK_HW"] == 0)
    regs = residency.estimated_registers(pb, c["BLOCK_C"] * c["BLOCK_HW"], o["num_warps"], c["PREFETCH"], c["EVEN"])
    shared = residency.ONE_PASS_SHARED_ESTIMATE
    teams = residency.resident_teams(H200, o["num_warps"], regs, shared, p.team_size, pb.rows)
    assert 1 <= teams and math.ceil(pb.rows / teams) <= plan.ONE_PASS_MAX_ROUNDS
    assert c["PREFETCH"] == (teams < pb.rows)  # only where a team has a next row to load early


def test_resident_teams_caps_at_whole_teams():
    assert residency.resident_teams(H200, 4, 64, 0, 5, 1000) == 8 * 132 // 5
    assert residency.resident_teams(H200, 4, 64, 0, 5, 7) == 7
    assert residency.resident_teams(H200, 4, 255, 0, 300, 7) == 0  # a team larger than the device holds


def test_interpreter_and_float64_never_plan_one_pass():
    """The interpreter runs programs one at a time (a team would wait
    forever), and float64 keeps the two-walk kernels."""
    for shape in DIFFUSION:
        assert plan.cuda(_pb(*shape), CudaDevice(sms=132)).path in ("looped", "split")
        assert plan.cuda(_pb(*shape, itemsize=8), H200).path in ("looped", "split")
    cpu = launch._cuda_device(torch.device("cpu"), 4)
    assert not cpu.cooperative


def test_cuda_two_walk_choice_and_whole_groups():
    """Without one-pass: looped with enough rows per SM (backward needs more),
    split below; small groups stay whole, one program per row, one warp per
    WHOLE_GROUP_ELEMENTS_PER_WARP padded elements."""
    dev = CudaDevice(sms=132)
    for backward in (False, True):
        assert plan.cuda(_pb(4, 512, 4096, backward=backward), dev).path == "looped"  # 128 rows
        assert plan.cuda(_pb(2, 512, 4096, backward=backward), dev).path == ("split" if backward else "looped")
        assert plan.cuda(_pb(1, 512, 4096, backward=backward), dev).path == "split"  # 32 rows
        whole = plan.cuda(_pb(128, 2048, 512, groups=512, itemsize=4, backward=backward), H200)
        assert whole.path == "whole" and whole.steps[0].grid == 128 * 512
        warps = dict(whole.steps[0].options)["num_warps"]
        assert warps == max(1, 4 * 512 // plan.WHOLE_GROUP_ELEMENTS_PER_WARP)


def test_whole_groups_give_way_to_teams_only_when_rows_are_few_and_data_large():
    assert plan.cuda(_pb(1, 64, 2048), H200).path == "whole"  # 32 rows of 4096 elements, but 256 KiB
    assert plan.cuda(_pb(1, 512, 2048, groups=256, itemsize=4), H200).path == "whole"  # 256 rows: enough
    few_large = _pb(2, 64, 4096, itemsize=4)  # 64 rows of 8192 elements, 2 MiB
    assert tiles.whole_fits(few_large, plan.FWD_GROUP_TILE)
    assert plan.cuda(few_large, H200).path == "one_pass"


def test_looped_forward_keeps_x_in_l2_only_when_the_groups_in_flight_fit():
    dev = CudaDevice(sms=132)
    on = {"STATS_EVICT": "evict_last", "OUTPUT_EVICT": "evict_first"}
    for itemsize in (2, 4):  # 32 MiB in flight either way
        step = plan.cuda(_pb(8, 512, 4096, itemsize=itemsize), dev).steps[0]
        assert on.items() <= dict(step.constexprs).items()
    step = plan.cuda(_pb(8, 512, 4 * 4096, itemsize=2), dev).steps[0]  # 128 MiB in flight
    assert dict(step.constexprs)["STATS_EVICT"] == ""


def test_workspace_layouts_name_each_row_once(monkeypatch):
    """Per-group backward keeps two rows (dweight, dbias terms); the split and
    one-pass backward five, the forward two; finalize plans add their
    per-(sample, group) statistics."""
    monkeypatch.setattr(plan, "WHOLE_ONE_PROGRAM_ELEMENTS", 0)  # the per-row backward, not the one-program one
    pb = _pb(2, 6, 35, groups=3, itemsize=4, backward=True)
    whole = small_plan(pb, "whole")
    assert whole.workspace == workspace.PARAM_TERMS and whole.workspace_size == 2 * 2 * 6
    one = small_plan(pb, "one_pass")
    assert one.workspace == workspace.BWD_PARTIALS and one.workspace_size == 5 * 2 * 6
    finalize = small_plan(pb, "split", tile=4, target_items=64)
    assert finalize.workspace.stats == workspace.BWD_STATS
    splits = math.ceil(35 / finalize.chunk)
    assert finalize.workspace_size == 5 * 2 * splits * 6 + 4 * 2 * 3
    steps = {s.kernel: dict(s.constexprs) for s in finalize.steps}
    reduce = steps[kernels.reduce_param_grads_kernel]
    assert steps[kernels.bwd_dx_kernel]["DWEIGHT_ROW"] == reduce["DWEIGHT_ROW"] == 4
    assert reduce["DBIAS_ROW"] == steps[kernels.bwd_partials_kernel]["SUM_DY_ROW"] == 2
    assert steps[kernels.bwd_finalize_kernel]["STATS_ROW"] == 5
    assert small_plan(_pb(2, 6, 35, groups=3, backward=True, affine=False), "whole").workspace_size == 0


def test_repeated_calls_reuse_the_cached_plan_and_launchers(monkeypatch):
    x = make_x((2, 6, 5, 7), torch.float32)
    weight, bias = make_params(6, "both", torch.float32)
    dy = torch.randn_like(x)
    first = (launch.cuda_forward(x, 3, weight, bias, 1e-5), *launch.cuda_backward(dy, x, 3, weight, bias, 1e-5))

    def no_planning(*args, **kwargs):
        raise AssertionError("planned again for a cached shape")

    monkeypatch.setattr(plan, "cuda", no_planning)
    monkeypatch.setattr(launch, "Launcher", no_planning)
    second = (launch.cuda_forward(x, 3, weight, bias, 1e-5), *launch.cuda_backward(dy, x, 3, weight, bias, 1e-5))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


# --- the module


@pytest.mark.parametrize(("affine", "bias"), [(True, True), (True, False), (False, True)])
def test_module_is_a_drop_in_for_torch_group_norm(affine, bias):
    from liger_nn import GroupNorm

    if not bias and "bias" not in inspect.signature(torch.nn.GroupNorm).parameters:
        pytest.skip("this torch's nn.GroupNorm has no bias argument (added after 2.11)")
    extra = {"bias": bias} if "bias" in inspect.signature(torch.nn.GroupNorm).parameters else {}
    torch_module = torch.nn.GroupNorm(4, 8, eps=1e-4, affine=affine, **extra).to(DEVICE)
    with torch.no_grad():
        for p in torch_module.parameters():
            p.normal_()
    module = GroupNorm(4, 8, eps=1e-4, affine=affine, bias=bias).to(DEVICE)
    assert set(module.state_dict()) == set(torch_module.state_dict())
    fresh = dict(GroupNorm(4, 8).named_parameters())
    assert torch.equal(fresh["weight"].detach().cpu(), torch.ones(8))
    assert torch.equal(fresh["bias"].detach().cpu(), torch.zeros(8))
    module.load_state_dict(torch_module.state_dict())
    assert repr(module).endswith(repr(torch_module)[len("GroupNorm") :])
    x = torch.randn(2, 8, 6, 5, device=DEVICE, dtype=torch.float64, requires_grad=True)
    expected = torch_module.double()(x)
    y = module(x.detach().float().requires_grad_())
    assert_close_to_ref(y, expected, torch.float32)
    dy = torch.randn_like(expected)
    y.backward(dy.float())
    expected.backward(dy)
    for (name, p), (_, p_ref) in zip(module.named_parameters(), torch_module.named_parameters(), strict=True):
        assert_close_to_ref(p.grad, p_ref.grad, torch.float32, f"d{name}")


def test_module_in_float64_works_like_torch_group_norm():
    """``.double()`` (issue 16): float64 parameters and input, as torch.nn.GroupNorm takes."""
    from liger_nn import GroupNorm

    torch_module = torch.nn.GroupNorm(2, 6).to(DEVICE).double()
    module = GroupNorm(2, 6).to(DEVICE).double()
    with torch.no_grad():
        for p, q in zip(torch_module.parameters(), module.parameters(), strict=True):
            p.normal_()
            q.copy_(p)
    x = torch.randn(3, 6, 7, device=DEVICE, dtype=torch.float64, requires_grad=True)
    y, expected = module(x), torch_module(x)
    assert y.dtype == torch.float64
    assert_close_to_ref(y, expected, torch.float64)
    grads = torch.autograd.grad(y.square().sum(), (x, *module.parameters()))
    expected_grads = torch.autograd.grad(expected.square().sum(), (x, *torch_module.parameters()))
    for g, e in zip(grads, expected_grads, strict=True):
        assert g.dtype == torch.float64
        assert_close_to_ref(g, e, torch.float64)


def test_module_with_fp32_params_and_bf16_activations():
    from liger_nn import GroupNorm

    module = GroupNorm(2, 6).to(DEVICE)
    x = torch.randn(3, 6, 7, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    y = module(x)
    y.float().square().sum().backward()
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    assert module.weight.grad.dtype == torch.float32 and module.bias.grad.dtype == torch.float32


def test_module_rejects_indivisible_channels():
    from liger_nn import GroupNorm

    with pytest.raises(ValueError, match="divisible"):
        GroupNorm(3, 8)


# --- bad input


def _x(*shape, dtype=torch.float32, dev=DEVICE):
    return torch.randn(*(shape or (2, 8, 5)), device=dev).to(dtype)


def _p(n=8, dtype=torch.float32, dev=DEVICE):
    return torch.ones(n, dtype=dtype, device=dev)


BAD_CALLS = [
    ("not divisible by num_groups=3", lambda: (_x(), 3)),
    ("num_groups must be positive", lambda: (_x(), 0)),
    ("rank >= 2", lambda: (_x(8), 2)),
    ("rank >= 2", lambda: (torch.tensor(1.0, device=DEVICE), 1)),
    ("weight must have shape (8,)", lambda: (_x(), 2, _p(4))),
    ("weight must have shape (8,)", lambda: (_x(), 2, _p(8).reshape(2, 4))),
    ("bias must have shape (8,)", lambda: (_x(), 2, _p(), _p(9))),
    ("weight must be float32, bfloat16, float16 or float64", lambda: (_x(), 2, _p(dtype=torch.int32))),
    ("bias must be float32, bfloat16, float16 or float64", lambda: (_x(), 2, None, _p(dtype=torch.int64))),
    ("weight is on meta", lambda: (_x(), 2, _p(dev="meta"))),
    ("x must be float32, bfloat16, float16 or float64", lambda: (_x(dtype=torch.int32), 2)),
]


@pytest.mark.parametrize(("message", "make_args"), BAD_CALLS)
def test_bad_input_raises_clear_error(message, make_args):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        torch.ops.liger.group_norm(*make_args())


@pytest.mark.parametrize("eps", [-1.0, math.inf, math.nan])
def test_bad_eps_raises(eps):
    with pytest.raises(ValueError, match="eps must be"):
        torch.ops.liger.group_norm(_x(), 2, None, None, eps)


BAD_BACKWARD_CALLS = [
    # (message, (grad_out, x, num_groups, weight, bias, eps)): what the backward op once accepted (issue 23).
    ("grad_out shape", lambda: (_x(2, 8, 6), _x(), 2, None, None, 1e-5)),
    ("grad_out is on", lambda: (_x(dev="meta"), _x(), 2, None, None, 1e-5)),
    ("grad_out must be float32", lambda: (_x(dtype=torch.int32), _x(), 2, None, None, 1e-5)),
    ("weight must have shape (8,)", lambda: (_x(), _x(), 2, _p(4), None, 1e-5)),
    ("bias must have shape (8,)", lambda: (_x(), _x(), 2, None, _p(9), 1e-5)),
    ("weight is on meta", lambda: (_x(), _x(), 2, _p(dev="meta"), None, 1e-5)),
    ("bias is on meta", lambda: (_x(), _x(), 2, None, _p(dev="meta"), 1e-5)),
    ("weight must be float32", lambda: (_x(), _x(), 2, _p(dtype=torch.int32), None, 1e-5)),
    ("eps must be", lambda: (_x(), _x(), 2, None, None, -1.0)),
    ("eps must be", lambda: (_x(), _x(), 2, None, None, math.nan)),
    ("not divisible by num_groups=3", lambda: (_x(), _x(), 3, None, None, 1e-5)),
    ("num_groups must be positive", lambda: (_x(), _x(), 0, None, None, 1e-5)),
    ("x must be float32", lambda: (_x(), _x(dtype=torch.int32), 2, None, None, 1e-5)),
    ("rank >= 2", lambda: (_x(8), _x(8), 2, None, None, 1e-5)),
]


@pytest.mark.parametrize(("message", "make_args"), BAD_BACKWARD_CALLS)
def test_backward_op_validates_its_inputs(message, make_args):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        torch.ops.liger.group_norm_backward(*make_args())


def test_backward_op_takes_any_float_grad_dtype():
    """grad_out of another float dtype than x (the dtype policy's data
    dtypes): read in the compute dtype, dx in x's dtype."""
    x = _x()
    dy = torch.randn_like(x).half()
    dx, _, _ = torch.ops.liger.group_norm_backward(dy, x, 2, None, None, 1e-5)
    _, grads_ref = reference_grads(x, 2, None, None, dy, 1e-5)
    assert dx.dtype == torch.float32
    assert_close_to_ref(dx, grads_ref["x"], torch.float32, "dx")


# --- GPU only: the one-pass path with multi-program teams (the interpreter runs one-program teams only)

gpu = pytest.mark.skipif(DEVICE != "cuda", reason="multi-program one-pass teams need a GPU")


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 320, 64, 64), (8, 512, 4096), (1, 128, 256, 256), (3, 96, 75, 61)])
def test_one_pass_on_gpu_matches_reference(shape, dtype):
    """Teams of several programs, one and several rounds, prefetching or not,
    against the float64 reference, forward and backward."""
    x = make_x(shape, dtype, offset=1.0)
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    dev = launch._cuda_device(x.device, 132)
    pbs = {bw: problem(x, 32, weight, bias, bw) for bw in (0, 1)}
    # The planner's one-pass choice, also where small x runs looped instead (plan.ONE_PASS_MIN_BYTES).
    plans = {bw: plan._cuda_one_pass(pb, dev, plan.cuda_two_walk(pb, dev.sms)) for bw, pb in pbs.items()}
    assert all(p is not None and p.path == "one_pass" for p in plans.values())
    y = launch.forward(x, 32, weight, bias, 1e-5, plans[0])
    grads = launch.backward(dy, x, 32, weight, bias, 1e-5, plans[1])
    check_against_reference(y, named_grads(*grads), x, 32, weight, bias, dy, 1e-5)


@gpu
@pytest.mark.parametrize("prefetch", [False, True])
def test_one_pass_small_teams_for_the_sanitizer(prefetch):
    """Teams of 4 programs over 2048 rows (many rounds per team), forward and
    backward, small enough to run under compute-sanitizer (racecheck,
    synccheck, memcheck): ``-k sanitizer``."""
    x = make_x((64, 64, 32, 32), torch.float32)
    weight, bias = make_params(64, "both", torch.float32)
    dy = torch.randn_like(x)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    plans = {}
    for bw in (False, True):
        pb = problem(x, 32, weight, bias, bw)
        plans[bw] = plan.cuda_one_pass(pb, sms, 512, 4, prefetch, plan.cuda_two_walk(pb, sms))
        assert plans[bw].team_size == 4
    y = launch.forward(x, 32, weight, bias, 1e-5, plans[False])
    grads = launch.backward(dy, x, 32, weight, bias, 1e-5, plans[True])
    capped = launch.capped_steps(plans[False])
    assert capped and capped[0] is not None and capped[0][0][1] // 4 < 2048  # several rounds per team
    check_against_reference(y, named_grads(*grads), x, 32, weight, bias, dy, 1e-5)


@gpu
def test_one_pass_on_gpu_repeats_replays_and_runs_on_two_streams():
    """Barrier counters are zeroed per call: repeated launches, CUDA-graph
    replays and concurrent launches on two streams give the eager result,
    bitwise."""
    x = make_x((8, 512, 64, 64), torch.bfloat16)
    weight, bias = make_params(512, "both", torch.float32)
    dy = torch.randn_like(x)
    pb = problem(x, 32, weight, bias, False)
    p = plan.cuda(pb, launch._cuda_device(x.device, 132))
    c = dict(p.steps[0].constexprs)
    assert p.path == "one_pass" and tiles.team_size(pb, c["BLOCK_C"], c["BLOCK_HW"]) > 1
    expected = torch.ops.liger.group_norm(x, 32, weight, bias)
    expected_grads = torch.ops.liger.group_norm_backward(dy, x, 32, weight, bias, 1e-5)
    for _ in range(20):
        assert torch.equal(torch.ops.liger.group_norm(x, 32, weight, bias), expected)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.ops.liger.group_norm(x, 32, weight, bias)  # warm-up on the capture stream
        with torch.cuda.graph(graph):
            out = torch.ops.liger.group_norm(x, 32, weight, bias)
            out_grads = torch.ops.liger.group_norm_backward(dy, x, 32, weight, bias, 1e-5)
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
        for a, b in zip(out_grads, expected_grads, strict=True):
            assert torch.equal(a, b)
    streams = [torch.cuda.Stream() for _ in range(2)]
    results = [[], []]
    for _ in range(10):
        for s, r in zip(streams, results, strict=True):
            with torch.cuda.stream(s):
                r.append(torch.ops.liger.group_norm(x, 32, weight, bias))
    torch.cuda.synchronize()
    assert all(torch.equal(t, expected) for r in results for t in r)


@gpu
def test_one_pass_grid_is_capped_at_the_compiled_kernels_residency_or_falls_back():
    """The launch caps a one-pass grid at whole teams of what the compiled
    kernel keeps resident on the real SMs, and runs the two-walk fallback
    when the rows would take more rounds than the plan allows."""
    x = make_x((4, 512, 128, 128), torch.bfloat16)
    weight, bias = make_params(512, "both", torch.float32)
    p = plan.cuda(problem(x, 32, weight, bias, False), launch._cuda_device(x.device, 132))
    y = launch.forward(x, 32, weight, bias, 1e-5, p)
    (hit,) = launch.capped_steps(p)
    (launcher, grid), *_ = hit
    compiled = launcher.compiled_for(x, weight, bias, y, *launch._buffers(p, x), *launch._dims(x, p), 32, p.chunk,
                                     1e-5)  # fmt: skip
    props = torch.cuda.get_device_properties(x.device)
    per_sm = residency.resident_ctas(launch._cuda_device(x.device, props.multi_processor_count),
                                compiled.metadata.num_warps, compiled.n_regs, compiled.metadata.shared)  # fmt: skip
    assert grid % p.team_size == 0 and 0 < grid <= per_sm * props.multi_processor_count
    strict = dataclasses.replace(p, max_rounds=0)
    fallback_y = launch.forward(x, 32, weight, bias, 1e-5, p.fallback)
    assert torch.equal(launch.forward(x, 32, weight, bias, 1e-5, strict), fallback_y)
    assert launch.capped_steps(strict) == [None]


@pytest.mark.skipif(DEVICE != "cuda", reason="too large for the interpreter")
@pytest.mark.parametrize("shape", [(8, 512, 64, 64), (2, 128, 8, 64, 64)])
def test_diffusion_shapes_on_gpu(shape):
    x = make_x(shape, torch.bfloat16).requires_grad_()
    weight, bias = make_params(shape[1], "both", torch.float32)
    weight.requires_grad_()
    bias.requires_grad_()
    dy = torch.randn(shape, dtype=torch.bfloat16, device=DEVICE)
    y = torch.ops.liger.group_norm(x, 32, weight, bias)
    grads = dict(zip(("x", "weight", "bias"), torch.autograd.grad(y, (x, weight, bias), dy), strict=True))
    check_against_reference(y, grads, x, 32, weight, bias, dy, 1e-5)


@pytest.mark.parametrize("fmt, shape", [(torch.channels_last, (2, 8, 5, 6)), (torch.channels_last_3d, (2, 8, 3, 4, 5))])
def test_output_and_gradient_layouts_follow_x(fmt, shape):
    """y and dx in x's memory format, with channels-last x read in place (no
    contiguous copy of x), as torch's CPU GroupNorm gives them.  torch's CUDA
    kernel (2.11) returns a contiguous y and dx for channels-last x instead,
    which the next channels-last convolution copies back: so torch is asked
    on the CPU, wherever the op runs."""
    x = torch.randn(shape, device=DEVICE).contiguous(memory_format=fmt).requires_grad_()
    weight, bias = make_params(shape[1], "both", torch.float32)
    y = torch.ops.liger.group_norm(x, 4, weight, bias)
    (dx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert y.is_contiguous(memory_format=fmt) and y.stride() == x.stride()
    assert dx.stride() == x.stride()
    x_torch = x.detach().cpu().requires_grad_()
    y_torch = torch.nn.functional.group_norm(x_torch, 4, weight.cpu(), bias.cpu())
    y_torch.backward(torch.randn_like(y_torch))
    assert y.stride() == y_torch.stride() and dx.stride() == x_torch.grad.stride()


@pytest.mark.parametrize("path", [p for p in PATHS if p != "one_pass"])
@pytest.mark.parametrize("activation", reference.ACTIVATIONS)
@pytest.mark.parametrize("dy_layout", ["contiguous", "channels_last"])
def test_every_path_reads_channels_last_in_place(path, activation, dy_layout):
    """A channels-last x through each path with tiles smaller than a group
    (channel blocks, spatial tiles and segments), grad_out in either layout:
    values against float64, y and dx channels-last."""
    shape, groups = (2, 12, 5, 7), 2
    x = make_x(shape, torch.float32, "channels_last")
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = make_x(shape, torch.float32, dy_layout)
    y, (dx, dweight, dbias) = run_plans(
        x, groups, weight, bias, dy, 1e-5, lambda pb: small_plan(pb, path, 8, 16), activation
    )
    assert y.stride() == dx.stride() == x.stride()
    check_against_reference(y, named_grads(dx, dweight, dbias), x, groups, weight, bias, dy, 1e-5, activation)


def test_channels_last_never_plans_one_pass():
    h200 = CudaDevice(sms=132, cooperative=True)
    for backward in (False, True):
        pb = dataclasses.replace(_pb(2, 320, 4096, backward=backward), channels_last=True)
        assert plan.cuda(pb, h200).path in ("whole", "looped", "split", "nhwc")
        with pytest.raises(ValueError, match="contiguous x only"):
            plan.one_pass(pb, 2, 1024, 1, 4, False, 64)


def test_a_tiny_whole_backward_is_one_launch_writing_the_parameter_grads():
    """At most WHOLE_ONE_PROGRAM_ELEMENTS: one program, no workspace, no reduce launch (the host's
    second launch and allocation cost more there); above it the per-row programs and the reduce."""
    tiny = plan.cuda(_pb(2, 8, 16, groups=4, backward=True), H200)
    assert tiny.path == "whole" and len(tiny.steps) == 1 and tiny.workspace_size == 0
    assert tiny.steps[0].grid == 1 and dict(tiny.steps[0].constexprs)["DIRECT_GRADS"]
    larger = plan.cuda(_pb(2, 64, 256, groups=8, backward=True), H200)
    assert larger.path == "whole" and len(larger.steps) == 2 and larger.steps[0].grid > 1


@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_one_program_backward_matches_the_per_row_one(affine, monkeypatch):
    """The one-program backward (sums over samples in registers) and the per-row programs plus reduce
    give the same gradients, to float32 rounding, with each parameter present or absent."""
    x = torch.randn(3, 8, 5, 7, device=DEVICE)
    dy = torch.randn_like(x)
    w = torch.randn(8, device=DEVICE) if affine in ("both", "weight") else None
    b = torch.randn(8, device=DEVICE) if affine in ("both", "bias") else None
    pb = Problem(3, 8, 35, 4, 4, w is not None, b is not None, True)
    one = plan.whole(pb, 64, (), (2, 8, 1, ()))
    monkeypatch.setattr(plan, "WHOLE_ONE_PROGRAM_ELEMENTS", 0)
    rows = plan.whole(pb, 64, (), (2, 8, 1, ()))
    assert len(one.steps) == 1 and len(rows.steps) == (2 if affine != "none" else 1)
    got = launch.backward(dy, x, 4, w, b, 1e-5, one)
    want = launch.backward(dy, x, 4, w, b, 1e-5, rows)
    for g, r in zip(got, want, strict=True):
        assert (g is None) == (r is None)
        if g is not None:
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
