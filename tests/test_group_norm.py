"""torch.ops.liger.group_norm: values and gradients against a float64
reference, the multi-block and split-group paths, determinism, the GroupNorm
module, and errors for bad input."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops.group_norm import cuda, launch, reference
from tests.helpers import DEVICE, FLOAT_DTYPES, assert_close_to_ref, assert_close_to_scale

AFFINE = ("both", "weight", "bias", "none")


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


def make_x(shape, dtype, layout="contiguous", offset=0.0):
    if layout == "channels_last" and len(shape) >= 3:  # channels innermost in memory
        base = torch.randn((shape[0], *shape[2:], shape[1]), dtype=torch.float32, device=DEVICE)
        x = base.movedim(-1, 1)
    else:
        x = torch.randn(shape, dtype=torch.float32, device=DEVICE)
    return (x + offset).to(dtype)


def make_params(channels, affine, dtype):
    weight = torch.randn(channels, dtype=dtype, device=DEVICE) if affine in ("both", "weight") else None
    bias = torch.randn(channels, dtype=dtype, device=DEVICE) if affine in ("both", "bias") else None
    return weight, bias


def reference_grads(x, num_groups, weight, bias, dy, eps):
    """(y, {name: grad}) in float64 by autograd through the reference forward."""
    named = {"x": x, "weight": weight, "bias": bias}
    leaves = {k: v.detach().double().requires_grad_() for k, v in named.items() if v is not None}
    y = reference.forward(leaves["x"], num_groups, leaves.get("weight"), leaves.get("bias"), eps)
    grads = torch.autograd.grad(y, list(leaves.values()), dy.double())
    return y.detach(), dict(zip(leaves, grads, strict=True))


def param_grad_term_scales(x, num_groups, dy, eps):
    """Per channel, the summed magnitudes of the terms the kernels add into
    dweight (dy * xhat) and dbias (dy), in float64."""
    xhat, _ = reference._normalized(x.detach().double(), num_groups, eps)
    dy64 = dy.double()
    per_channel = tuple(d for d in range(x.dim()) if d != 1)
    return {
        "weight": (dy64 * xhat.reshape(x.shape)).abs().sum(per_channel),
        "bias": dy64.abs().sum(per_channel),
    }


def check_against_reference(y, grads, x, num_groups, weight, bias, dy, eps, dtype):
    """y and dx against the float64 reference relative to their values;
    dweight and dbias, which are sums over N x spatial that can cancel far
    below their terms, by the error model of a float32 sum rounded to the
    dtype (tests.helpers.assert_close_to_scale)."""
    y_ref, grads_ref = reference_grads(x, num_groups, weight, bias, dy, eps)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_close_to_ref(y, y_ref, dtype, "y")
    assert set(grads) == set(grads_ref)
    scales = param_grad_term_scales(x, num_groups, dy, eps)
    for name, grad in grads.items():
        param = {"x": x, "weight": weight, "bias": bias}[name]
        assert grad.dtype == param.dtype, f"d{name} dtype {grad.dtype} != {param.dtype}"
        if name == "x":
            assert_close_to_ref(grad, grads_ref[name], dtype, "dx")
        else:
            assert_close_to_scale(grad, grads_ref[name], scales[name], dtype, f"d{name}")


@given(
    case=group_norm_cases(),
    dtype=st.sampled_from(FLOAT_DTYPES),
    affine=st.sampled_from(AFFINE),
    fp32_params=st.booleans(),
    layout=st.sampled_from(["contiguous", "channels_last"]),
    eps=st.sampled_from([1e-5, 1e-3]),
)
def test_op_forward_and_gradients_match_float64_reference(case, dtype, affine, fp32_params, layout, eps):
    shape, groups = case
    x = make_x(shape, dtype, layout).requires_grad_()
    weight, bias = make_params(shape[1], affine, torch.float32 if fp32_params else dtype)
    leaves = {"x": x} | {k: v.requires_grad_() for k, v in (("weight", weight), ("bias", bias)) if v is not None}
    dy = torch.randn(shape, dtype=dtype, device=DEVICE)

    y = torch.ops.liger.group_norm(x, groups, weight, bias, eps)
    grads = dict(zip(leaves, torch.autograd.grad(y, list(leaves.values()), dy), strict=True))
    check_against_reference(y, grads, x, groups, weight, bias, dy, eps, dtype)


@given(
    case=group_norm_cases(max_spatial=40, max_hw=120),
    dtype=st.sampled_from(FLOAT_DTYPES),
    affine=st.sampled_from(AFFINE),
    tile=st.sampled_from([8, 32]),
    target_items=st.sampled_from([1, 64]),
    looped_groups=st.booleans(),
)
def test_launchers_with_small_tiles_and_split_groups(case, dtype, affine, tile, target_items, looped_groups):
    """Tiles far smaller than a group force the looped tiles, channel blocks
    that straddle groups, and (with a large target) groups split across
    programs whose partials the finalize merges; or (looped_groups) one
    program walking each group in many tiles."""
    shape, groups = case
    x = make_x(shape, dtype)
    weight, bias = make_params(shape[1], affine, dtype)
    dy = torch.randn(shape, dtype=dtype, device=DEVICE)
    opts = {"tile": tile, "target_items": target_items, "looped_groups": looped_groups}
    y = cuda.forward(x, groups, weight, bias, 1e-5, **opts)
    dx, dweight, dbias = cuda.backward(dy, x, groups, weight, bias, 1e-5, **opts)
    grads = {"x": dx} | {k: v for k, v in (("weight", dweight), ("bias", dbias)) if v is not None}
    assert (dweight is None) == (weight is None) and (dbias is None) == (bias is None)
    check_against_reference(y, grads, x, groups, weight, bias, dy, 1e-5, dtype)


def test_split_plan_is_exercised():
    """The small-tile settings above really split groups across programs."""
    policy = cuda.CudaPolicy(torch.device("cpu"), tile=8, target_items=64, looped_groups=False)
    plan = launch.plan(policy, torch.empty(2, 4, 40), 2, False)
    assert plan.splits > 1 and plan.chunk < 40 and plan.block_c * plan.block_hw <= 8


@pytest.mark.parametrize("shape", [(2, 8, 50, 41), (1, 4, 97, 71)])
def test_group_larger_than_one_block_through_the_op(shape):
    """Groups of ~8k-27k elements: more than one tile, statistics split across programs."""
    x = make_x(shape, torch.float32, offset=3.0).requires_grad_()
    weight, bias = make_params(shape[1], "both", torch.float32)
    weight.requires_grad_()
    bias.requires_grad_()
    dy = torch.randn(shape, device=DEVICE)
    y = torch.ops.liger.group_norm(x, 2, weight, bias)
    grads = dict(zip(("x", "weight", "bias"), torch.autograd.grad(y, (x, weight, bias), dy), strict=True))
    check_against_reference(y, grads, x, 2, weight, bias, dy, 1e-5, torch.float32)


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
    check_against_reference(y, grads, x, 32, weight, bias, dy, 1e-5, torch.bfloat16)


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


LOOPED, SPLIT = {"looped_groups": True}, {"looped_groups": False}


@pytest.mark.parametrize(
    ("shape", "groups", "opts", "path"),
    [
        ((2, 6, 5, 7), 3, {}, "whole"),  # each (sample, group) normalized by one program, padded both ways
        ((2, 6, 5, 7), 3, {"whole_group_tile": 0, **LOOPED}, "looped"),  # each group walked in [2, 64] tiles
        ((2, 12, 9, 7), 3, {"tile": 16, **LOOPED}, "looped"),  # [1, 16] tiles: 4 channels x 4 padded steps
        ((2, 6, 5, 7), 3, {"whole_group_tile": 0, **SPLIT}, "fused"),  # one channel block over three groups
        ((2, 16, 128), 1, {"tile": 8, "target_items": 1, **SPLIT}, "fused"),  # a fused merge of several steps
        ((2, 4, 33, 17), 2, {"tile": 16, "target_items": 64, **SPLIT}, "finalize"),  # many partials per group
    ],
)
def test_every_path_writes_every_output(monkeypatch, shape, groups, opts, path):
    """The whole- and looped-group kernels and both ways of merging a group's
    partials, with NaN-poisoned allocations (y, dx, dweight, dbias and the
    workspace are all torch.empty)."""
    policy = cuda.CudaPolicy(torch.device(DEVICE), **opts)
    for backward in (False, True):
        plan = launch.plan(policy, torch.empty(shape), groups, backward)
        assert plan.whole_groups == (path == "whole")
        assert plan.looped_groups == (path == "looped")
        if path in ("fused", "finalize"):
            assert plan.fused == (path == "fused")
        if path == "fused" and "tile" in opts:
            assert policy.finalize_block(plan.segments_per_group, plan.block_c) < plan.segments_per_group
    x = make_x(shape, torch.float32, offset=2.0)
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    poison_allocations(monkeypatch)
    y = cuda.forward(x, groups, weight, bias, 1e-5, **opts)
    dx, dweight, dbias = cuda.backward(dy, x, groups, weight, bias, 1e-5, **opts)
    monkeypatch.undo()
    grads = {"x": dx, "weight": dweight, "bias": dbias}
    check_against_reference(y, grads, x, groups, weight, bias, dy, 1e-5, torch.float32)


def test_cuda_policy_picks_the_looped_path_when_groups_fill_the_sms():
    """Groups too large for registers: looped with enough (sample, group) rows
    per SM (fewer backward, which streams x and dy, needs more), split below
    that; small groups stay whole."""
    policy = cuda.CudaPolicy(None, sms=132)
    for backward in (False, True):
        assert policy.plan_for(4, 512, 4096, 32, 2, backward).looped_groups  # 128 rows
        assert policy.plan_for(2, 512, 4096, 32, 2, backward).looped_groups == (not backward)  # 64 rows
        split = policy.plan_for(1, 512, 4096, 32, 2, backward)  # 32 rows
        assert not split.per_group and split.items >= 32
        assert policy.plan_for(64, 512, 64, 32, 2, backward).whole_groups  # 16 x 64 elements


def test_cuda_whole_groups_get_one_program_each_and_few_warps():
    """Whole groups launch one program per (sample, group), not a capped grid,
    with one warp per WHOLE_GROUP_ELEMENTS_PER_WARP padded elements (the
    H200 sweep in bench/NOTES.md v7)."""
    policy = cuda.CudaPolicy(None, sms=132)
    per_warp = cuda.WHOLE_GROUP_ELEMENTS_PER_WARP
    for backward in (False, True):
        steps = launch._build(policy, 128, 2048, 512, 512, 4, True, True, backward)  # 65536 groups of 2048
        assert steps.plan.whole_groups
        assert steps.main.grid == 128 * 512 > 132 * cuda.PROGRAMS_PER_SM
        assert steps.main.launcher.meta["num_warps"] == max(1, 4 * 512 // per_warp)
    assert policy.whole_group_launch(3, 8 * per_warp) == (3, {"num_warps": 8})
    assert policy.whole_group_launch(3, 64 * per_warp)[1] == {"num_warps": cuda.MAX_WARPS}
    assert policy.whole_group_launch(2**40, 16)[0] == cuda.MAX_GRID


def test_cuda_looped_forward_keeps_x_in_l2_only_when_the_groups_in_flight_fit():
    """The cache hints go on while the groups in flight hold at most
    FWD_L2_HINT_BYTES (the (8, 512, 4096) harness shape in bf16 and fp32),
    off for larger ones, and never on the backward."""
    policy = cuda.CudaPolicy(None, sms=132)
    on = {"STATS_EVICT": "evict_last", "OUTPUT_EVICT": "evict_first"}
    for itemsize in (2, 4):  # 32 MiB in flight either way
        steps = launch._build(policy, 8, 512, 4096, 32, itemsize, True, True, False)
        assert steps.plan.looped_groups
        assert on.items() <= steps.main.launcher.meta.items()
    for itemsize, per_sm in cuda.FWD_LOOP_GROUPS_PER_SM.items():
        groups = 132 * per_sm
        limit = cuda.FWD_L2_HINT_BYTES // itemsize  # elements in flight
        assert policy.loop_options(False, groups, limit // groups, itemsize)["STATS_EVICT"] == "evict_last"
        assert policy.loop_options(False, 10**6, limit // groups + 1, itemsize)["STATS_EVICT"] == ""
        assert policy.loop_options(False, 1, limit, itemsize)["OUTPUT_EVICT"] == "evict_first"  # one group in flight
    assert "STATS_EVICT" not in policy.loop_options(True, 8, 1024, 2)


def test_per_group_backward_keeps_two_partial_rows():
    """The whole- and looped-group backward kernels need only the dweight and
    dbias rows of partials: 2 x N x C float32, not the split path's 5."""
    for opts, per_group in (({}, True), ({"looped": True}, True), ({"looped": False}, False)):
        policy = cuda.CudaPolicy(None, whole_group_tile=0 if opts else None, looped_groups=opts.get("looped"), sms=4)
        steps = launch._build(policy, 2, 6, 35, 3, 4, True, True, True)
        assert steps.plan.per_group == per_group
        assert steps.workspace == (2 * 2 * 6 if per_group else launch.BWD_PARTS * steps.plan.segments)


def test_repeated_calls_reuse_the_cached_launch_steps(monkeypatch):
    """The plan, grids and launch keywords are built once per shape / groups /
    dtype size / parameter set; later calls only allocate and launch."""
    x = make_x((2, 6, 5, 7), torch.float32)
    weight, bias = make_params(6, "both", torch.float32)
    dy = torch.randn_like(x)
    first = (cuda.forward(x, 3, weight, bias, 1e-5), *cuda.backward(dy, x, 3, weight, bias, 1e-5))

    def no_planning(*args, **kwargs):
        raise AssertionError("planned again for a cached shape")

    monkeypatch.setattr(launch, "_build", no_planning)
    second = (cuda.forward(x, 3, weight, bias, 1e-5), *cuda.backward(dy, x, 3, weight, bias, 1e-5))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("target_items", "looped_groups"), [(None, False), (64, False), (None, True)])
def test_bitwise_deterministic(target_items, looped_groups):
    x = make_x((2, 8, 7, 11), torch.bfloat16)
    weight, bias = make_params(8, "both", torch.float32)
    dy = torch.randn_like(x)
    opts = {"tile": 64, "target_items": target_items, "looped_groups": looped_groups}
    runs = [
        (cuda.forward(x, 4, weight, bias, 1e-5, **opts), *cuda.backward(dy, x, 4, weight, bias, 1e-5, **opts))
        for _ in range(2)
    ]
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    op_runs = [torch.ops.liger.group_norm_backward(dy, x, 4, weight, bias, 1e-5) for _ in range(2)]
    for a, b in zip(*op_runs, strict=True):
        assert torch.equal(a, b)


def test_large_mean_keeps_variance():
    """mean / std = 100: sums on shifted values keep the variance from cancelling."""
    x = make_x((2, 4, 33, 17), torch.float32, offset=100.0)
    dy = torch.randn_like(x)
    for opts in ({}, {"tile": 16, "target_items": 64, "looped_groups": False}, {"tile": 16, "looped_groups": True}):
        y = cuda.forward(x, 2, None, None, 1e-5, **opts)
        dx, _, _ = cuda.backward(dy, x, 2, None, None, 1e-5, **opts)
        y_ref, grads_ref = reference_grads(x, 2, None, None, dy, 1e-5)
        assert_close_to_ref(y, y_ref, torch.float32, "y")
        assert_close_to_ref(dx, grads_ref["x"], torch.float32, "dx")


def test_expanded_grad_and_weight_without_grad():
    """grad_out with stride 0 (from .sum()); only the bias requires grad."""
    x = make_x((2, 4, 9), torch.float32).requires_grad_()
    weight, bias = make_params(4, "both", torch.float32)
    bias.requires_grad_()
    dx, dbias = torch.autograd.grad(torch.ops.liger.group_norm(x, 2, weight, bias).sum(), (x, bias))
    _, grads_ref = reference_grads(x, 2, weight, bias, torch.ones_like(x), 1e-5)
    assert_close_to_ref(dbias, grads_ref["bias"], torch.float32, "dbias")
    assert_close_to_ref(dx, grads_ref["x"], torch.float32, "dx")


@pytest.mark.parametrize(("shape", "groups"), [((5, 2), 2), ((5, 2), 1), ((3, 4, 1), 2), ((2, 3, 1, 1), 3)])
def test_tiny_groups(shape, groups):
    """1- or 2-element groups: y is exact-ish; dx cancels down to ~eps, so it
    gets an absolute bound."""
    x = make_x(shape, torch.float32)
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    y = torch.ops.liger.group_norm(x, groups, weight, bias)
    dx, dweight, dbias = torch.ops.liger.group_norm_backward(dy, x, groups, weight, bias, 1e-5)
    y_ref, grads_ref = reference_grads(x, groups, weight, bias, dy, 1e-5)
    assert_close_to_ref(y, y_ref, torch.float32, "y")
    assert_close_to_ref(dweight, grads_ref["weight"], torch.float32, "dweight")
    assert_close_to_ref(dbias, grads_ref["bias"], torch.float32, "dbias")
    assert torch.isfinite(dx).all()
    assert (dx.double().cpu() - grads_ref["x"].cpu()).abs().max() <= 1e-3


def test_empty_batch():
    x = torch.randn(0, 4, 5, device=DEVICE, requires_grad=True)
    weight, bias = make_params(4, "both", torch.float32)
    weight.requires_grad_()
    y = torch.ops.liger.group_norm(x, 2, weight, bias)
    assert y.shape == x.shape
    dx, dweight = torch.autograd.grad(y.sum(), (x, weight))
    assert dx.shape == x.shape and torch.equal(dweight, torch.zeros_like(dweight))


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


def _x(*shape, dtype=torch.float32):
    return torch.randn(*(shape or (2, 8, 5)), dtype=dtype, device=DEVICE)


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
    ("weight has dtype torch.float16", lambda: (_x(dtype=torch.bfloat16), 2, _p(dtype=torch.float16))),
    ("bias has dtype torch.float64", lambda: (_x(), 2, None, _p(dtype=torch.float64))),
    ("weight is on meta", lambda: (_x(), 2, _p(dev="meta"))),
    ("x must be float32, bfloat16 or float16", lambda: (_x().double(), 2)),
    ("x must be float32, bfloat16 or float16", lambda: (torch.ones(2, 8, dtype=torch.int32, device=DEVICE), 2)),
]


@pytest.mark.parametrize(("message", "make_args"), BAD_CALLS)
def test_bad_input_raises_clear_error(message, make_args):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        torch.ops.liger.group_norm(*make_args())


@pytest.mark.parametrize("eps", [-1.0, math.inf, math.nan])
def test_bad_eps_raises(eps):
    with pytest.raises(ValueError, match="eps must be"):
        torch.ops.liger.group_norm(_x(), 2, None, None, eps)


def test_backward_op_rejects_mismatched_grad():
    x = _x()
    with pytest.raises(ValueError, match="grad_out shape"):
        torch.ops.liger.group_norm_backward(_x(2, 8, 6), x, 2, None, None, 1e-5)
    with pytest.raises(TypeError, match="grad_out has dtype"):
        torch.ops.liger.group_norm_backward(x.half(), x, 2, None, None, 1e-5)
