"""group_norm's nhwc path (channels-last x read by whole pixel rows,
csrc_free_ops/group_norm/nhwc_kernels.py) against the float64 reference:
4-D channels_last, 5-D channels_last_3d and 3-D (N, L, C) transposed x, x
handed over contiguous too (read through a channels-last copy), SiLU on and
off, float32 / bfloat16 / float64, odd sizes and groups of few channels;
small tiles so that items span several channel blocks and segments."""

from __future__ import annotations

import pytest
import torch

from csrc_free_ops.group_norm import kernels, launch, nhwc_kernels, plan, tiles
from csrc_free_ops.group_norm.plan import Problem
from csrc_free_ops.group_norm.residency import CudaDevice
from tests.helpers import DEVICE
from tests.test_group_norm import (
    SMALL_REDUCE,
    check_against_reference,
    make_params,
    named_grads,
    poison_allocations,
    problem,
)

SILU = "silu"


def make_cl(shape, dtype, offset=0.0):
    """x of ``shape`` with its channels innermost in memory (channels_last,
    channels_last_3d, or a transposed (N, L, C) for 3-D shapes)."""
    base = torch.randn((shape[0], *shape[2:], shape[1]), dtype=torch.float32, device=DEVICE)
    return (base.movedim(-1, 1) + offset).to(dtype)


def nhwc_plan(pb: Problem, tile_c: int = 4, tile: int = 16, target_items: int = 12, programs: int = 5) -> plan.Plan:
    block_c, block_hw, chunk = tiles.nhwc_geometry(pb, tile_c, tile, target_items)
    return plan.nhwc(pb, block_c, block_hw, chunk, programs, 4, False, SMALL_REDUCE)


def run_nhwc(x, groups, weight, bias, dy, eps, activation="none", **geometry):
    cl = x if x.dim() < 3 or x.movedim(1, -1).is_contiguous() else x.movedim(1, -1).contiguous().movedim(-1, 1)
    plans = [nhwc_plan(problem(cl, groups, weight, bias, bw, activation), **geometry) for bw in (False, True)]
    y = launch.forward(x, groups, weight, bias, eps, plans[0])
    grads = launch.backward(dy, x, groups, weight, bias, eps, plans[1])
    return y, grads, plans


F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64
CASES = [  # (shape, groups, dtype, activation)
    ((2, 6, 5, 7), 3, F32, "none"),  # cpg 2, odd spatial sizes
    ((2, 6, 5, 7), 3, BF16, SILU),
    ((3, 12, 9, 5), 4, F32, SILU),  # cpg 3: channel blocks cut across groups
    ((3, 12, 9, 5), 4, F64, "none"),
    ((2, 8, 3, 4, 5), 2, F32, "none"),  # 5-D channels_last_3d
    ((2, 8, 3, 4, 5), 2, BF16, SILU),
    ((2, 8, 3, 4, 5), 2, F64, SILU),
    ((2, 10, 23), 5, F32, SILU),  # 3-D: (N, L, C) transposed
    ((2, 10, 23), 5, BF16, "none"),
    ((1, 4, 33, 3), 4, F32, SILU),  # one channel per group
    ((1, 4, 33, 3), 4, F64, SILU),
]


@pytest.mark.parametrize(("shape", "groups", "dtype", "activation"), CASES)
def test_nhwc_matches_float64_reference(shape, groups, dtype, activation):
    x = make_cl(shape, dtype, offset=1.5)
    weight, bias = make_params(shape[1], "both", F64 if dtype == F64 else F32)
    dy = torch.randn_like(x)
    y, grads, plans = run_nhwc(x, groups, weight, bias, dy, 1e-5, activation)
    assert all(p.path == "nhwc" for p in plans)
    check_against_reference(y, named_grads(*grads), x, groups, weight, bias, dy, 1e-5, activation)


@pytest.mark.parametrize("affine", ["weight", "bias", "none"])
def test_nhwc_contiguous_x_and_partial_affine(affine):
    """x handed over contiguous is read through a channels-last copy; each affine case."""
    shape, groups = (2, 6, 5, 7), 3
    x = torch.randn(shape, device=DEVICE)
    weight, bias = make_params(shape[1], affine, torch.float32)
    dy = torch.randn_like(x)
    for activation in ("none", SILU):
        y, grads, _ = run_nhwc(x, groups, weight, bias, dy, 1e-5, activation)
        check_against_reference(y, named_grads(*grads), x, groups, weight, bias, dy, 1e-5, activation)


def test_nhwc_writes_every_output_and_is_bitwise_deterministic(monkeypatch):
    """NaN-poisoned allocations (y, dx, dweight, dbias, the workspace); two
    runs agree bitwise (dweight / dbias reduced in a fixed order)."""
    shape, groups = (3, 12, 9, 5), 4
    x = make_cl(shape, torch.float32, offset=2.0)
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    poison_allocations(monkeypatch)
    first = run_nhwc(x, groups, weight, bias, dy, 1e-5, SILU, tile_c=8, tile=32, target_items=20)
    second = run_nhwc(x, groups, weight, bias, dy, 1e-5, SILU, tile_c=8, tile=32, target_items=20)
    monkeypatch.undo()
    check_against_reference(first[0], named_grads(*first[1]), x, groups, weight, bias, dy, 1e-5, SILU)
    for a, b in zip((first[0], *first[1]), (second[0], *second[1]), strict=True):
        assert torch.equal(a, b)


def test_nhwc_steps():
    """Forward: partials, finalize, apply; a backward with an activation runs
    the statistics first; items span channel blocks and several segments."""
    x = make_cl((2, 12, 9, 5), torch.float32)
    weight, bias = make_params(12, "both", torch.float32)
    fwd = nhwc_plan(problem(x, 4, weight, bias, False))
    assert [s.kernel for s in fwd.steps] == [nhwc_kernels.nhwc_fwd_partials_kernel, kernels.fwd_finalize_kernel,
                                             nhwc_kernels.nhwc_fwd_apply_kernel]  # fmt: skip
    c = dict(fwd.steps[0].constexprs)
    assert c["BLOCK_C"] < 12 and fwd.chunk < 45
    bwd = nhwc_plan(problem(x, 4, weight, bias, True, SILU))
    assert [s.kernel for s in bwd.steps] == [
        nhwc_kernels.nhwc_bwd_partials_kernel, kernels.bwd_finalize_kernel,
        nhwc_kernels.nhwc_bwd_partials_kernel, kernels.bwd_finalize_kernel,
        nhwc_kernels.nhwc_bwd_dx_kernel, kernels.reduce_param_grads_kernel,
    ]  # fmt: skip


def test_nhwc_plans_read_channels_last_only():
    pb = Problem(2, 8, 64, 2, 4, True, True, False)
    with pytest.raises(ValueError, match="channels-last"):
        nhwc_plan(pb)


def test_cuda_plans_nhwc_for_narrow_channels_last_groups():
    """The diffusion shapes in channels-last take nhwc; contiguous x, wide
    group runs and small x keep today's paths."""
    h100 = CudaDevice(sms=132, cooperative=True)
    for backward in (False, True):
        for n, c, hw in ((1, 128, 512 * 512), (2, 320, 64 * 64), (4, 1280, 16 * 16 * 4)):
            cl = Problem(n, c, hw, 32, 2, True, True, backward, SILU, True)
            assert plan.cuda(cl, h100).path == "nhwc"
            assert plan.cuda(Problem(n, c, hw, 32, 2, True, True, backward, SILU, False), h100).path != "nhwc"
        wide = Problem(1, 4096, 4096, 2, 2, True, True, backward, "none", True)  # 2048 channels a group
        assert plan.cuda(wide, h100).path != "nhwc"
        small = Problem(1, 64, 64, 32, 2, True, True, backward, "none", True)
        assert plan.cuda(small, h100).path != "nhwc"


@pytest.mark.parametrize("activation", ["none", SILU])
def test_op_takes_the_nhwc_plan_for_channels_last_x(monkeypatch, activation):
    """torch.ops.liger.group_norm through autograd (the eager entry and its
    prepared runs) on channels-last x, with the planner's size bound lowered
    so that the interpreter's small x takes the nhwc plan; y and dx come back
    channels-last."""
    monkeypatch.setattr(plan, "NHWC_MIN_BYTES", 0)
    monkeypatch.setattr(launch, "_CACHE", {})
    shape, groups = (2, 12, 7, 3), 4  # a shape no other test plans, so no earlier plan is kept for it
    x = make_cl(shape, torch.float32).requires_grad_()
    weight, bias = make_params(shape[1], "both", torch.float32)
    weight.requires_grad_()
    bias.requires_grad_()
    dy = torch.randn_like(x)
    for _ in range(2):  # the second call runs what the first prepared
        y = torch.ops.liger.group_norm(x, groups, weight, bias, 1e-5, activation=activation)
        grads = torch.autograd.grad(y, [x, weight, bias], dy)
        assert y.stride() == grads[0].stride() == x.stride()
        check_against_reference(y, named_grads(*grads), x, groups, weight, bias, dy, 1e-5, activation)
    assert {p.path for key, p in launch._CACHE.items() if key[0] == "cuda"} == {"nhwc"}


@pytest.mark.skipif(DEVICE != "cuda", reason="the diffusion shapes need a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 320, 64, 64), (16, 1280, 16, 16), (1, 128, 512, 512), (1, 128, 8, 64, 64)])
def test_gpu_diffusion_shapes_take_nhwc_eager_and_compiled(shape, dtype):
    """The planner's nhwc choice at diffusion shapes (and a 5-D video one),
    eager and under torch.compile (the decomposed launches), against float64."""
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    x = torch.randn(shape, device=DEVICE).to(dtype).contiguous(memory_format=fmt).requires_grad_()
    weight, bias = make_params(shape[1], "both", torch.float32)
    weight.requires_grad_()
    bias.requires_grad_()
    dy = torch.randn_like(x)
    assert launch._cuda_plan(x, 32, True, True, False, SILU).path == "nhwc"

    def fn(x, weight, bias):
        return torch.ops.liger.group_norm(x, 32, weight, bias, 1e-5, activation=SILU)

    for run in (fn, torch.compile(fn, fullgraph=True, dynamic=False)):
        y = run(x, weight, bias)
        grads = torch.autograd.grad(y, [x, weight, bias], dy)
        check_against_reference(y, named_grads(*grads), x, 32, weight, bias, dy, 1e-5, SILU)
