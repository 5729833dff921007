"""group_norm's nhwc team paths (channels-last x by teams of whole groups,
csrc_free_ops/group_norm/nhwc_team_kernels.py) against the float64
reference: nhwc_team (over launches) with small tiles, so that teams have
several members and channel blocks several groups, some lanes masked; and
nhwc_one_pass with one-member teams walking several team rows each (the
only teams the interpreter can run: residency.py); the CUDA planner's
conditions for them."""

from __future__ import annotations

import faulthandler

import pytest
import torch

from csrc_free_ops.group_norm import kernels, launch, nhwc_team_kernels, plan, tiles
from csrc_free_ops.group_norm.plan import Problem
from csrc_free_ops.group_norm.residency import CudaDevice
from csrc_free_ops.host_math import next_pow2
from tests.helpers import DEVICE
from tests.test_group_norm import (
    SMALL_REDUCE,
    check_against_reference,
    make_params,
    named_grads,
    poison_allocations,
    problem,
)
from tests.test_group_norm_nhwc import CASES, SILU, make_cl

PATHS = ("nhwc_team", "nhwc_one_pass")


def team_plan(pb: Problem, path: str, tile_c: int = 8, tile: int = 64, programs: int = 5) -> plan.Plan:
    block_c = tiles.team_channels(pb, tile_c)
    if path == "nhwc_one_pass":
        return plan.nhwc_one_pass(pb, block_c, next_pow2(pb.hw), programs, None, 32, None, SMALL_REDUCE)
    block_hw = max(1, min(next_pow2(pb.hw), tile // block_c))
    return plan.nhwc_team(pb, block_c, block_hw, programs, False, SMALL_REDUCE)


def run_team(x, groups, weight, bias, dy, eps, path, activation="none", **geometry):
    cl = x.movedim(1, -1).contiguous().movedim(-1, 1)
    plans = [team_plan(problem(cl, groups, weight, bias, bw, activation), path, **geometry) for bw in (False, True)]
    y = launch.forward(x, groups, weight, bias, eps, plans[0])
    grads = launch.backward(dy, x, groups, weight, bias, eps, plans[1])
    return y, grads, plans


# The one-pass kernels compute in float32 only (plan._one_pass_math says why).
TEAM_CASES = [(path, *case) for path in PATHS for case in CASES if path != "nhwc_one_pass" or case[2] != torch.float64]


@pytest.mark.parametrize(("path", "shape", "groups", "dtype", "activation"), TEAM_CASES)
def test_team_paths_match_float64_reference(path, shape, groups, dtype, activation):
    x = make_cl(shape, dtype, offset=1.5)
    weight, bias = make_params(shape[1], "both", torch.float64 if dtype == torch.float64 else torch.float32)
    dy = torch.randn_like(x)
    y, grads, plans = run_team(x, groups, weight, bias, dy, 1e-5, path, activation)
    assert all(p.path == path for p in plans)
    check_against_reference(y, named_grads(*grads), x, groups, weight, bias, dy, 1e-5, activation)


GEOMETRIES = [  # (shape, groups, block_c, block_hw): groups per block, masked lanes, members per team
    ((2, 12, 5, 7), 4, 8, 4),  # cpg 3: 2 groups in 8 lanes, 9 members
    ((2, 20, 5, 7), 4, 16, 8),  # cpg 5: 3 groups a block, the last block 1 group; 5 members
    ((1, 4, 33, 3), 4, 4, 16),  # cpg 1: 4 groups a block, 7 members, the last partly masked
    ((3, 8, 2, 2, 3), 2, 8, 2),  # 5-D, 2 groups a block, 6 members
]


@pytest.mark.parametrize("merge", [4, plan.NHWC_TEAM_MERGE], ids=["merge_steps", "one_merge_step"])
@pytest.mark.parametrize("activation", ["none", SILU])
@pytest.mark.parametrize(("shape", "groups", "block_c", "block_hw"), GEOMETRIES)
def test_team_merges_across_members_and_groups_of_a_block(monkeypatch, shape, groups, block_c, block_hw, activation,
                                                          merge):  # fmt: skip
    """merge_steps: the team's partials merged a few segments at a time."""
    monkeypatch.setattr(plan, "NHWC_TEAM_MERGE", merge)
    x = make_cl(shape, torch.float32, offset=-2.0)
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    plans = [
        plan.nhwc_team(problem(x, groups, weight, bias, bw, activation), block_c, block_hw, 3, False, SMALL_REDUCE)
        for bw in (False, True)
    ]
    y = launch.forward(x, groups, weight, bias, 1e-5, plans[0])
    grads = launch.backward(dy, x, groups, weight, bias, 1e-5, plans[1])
    check_against_reference(y, named_grads(*grads), x, groups, weight, bias, dy, 1e-5, activation)


@pytest.mark.parametrize("path", PATHS)
def test_team_paths_write_every_output_and_are_bitwise_deterministic(monkeypatch, path):
    """NaN-poisoned allocations (y, dx, dweight, dbias, the workspace); two
    runs agree bitwise (no atomics on data: dweight / dbias reduced in a fixed order)."""
    shape, groups = (3, 12, 9, 5), 4
    x = make_cl(shape, torch.float32, offset=2.0)
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    poison_allocations(monkeypatch)
    first = run_team(x, groups, weight, bias, dy, 1e-5, path, SILU, tile_c=16, tile=64)
    second = run_team(x, groups, weight, bias, dy, 1e-5, path, SILU, tile_c=16, tile=64)
    monkeypatch.undo()
    check_against_reference(first[0], named_grads(*first[1]), x, groups, weight, bias, dy, 1e-5, SILU)
    for a, b in zip((first[0], *first[1]), (second[0], *second[1]), strict=True):
        assert torch.equal(a, b)


def test_team_steps():
    """nhwc_team: partials then apply forward; backward with an activation a
    statistics-only partials launch first.  nhwc_one_pass: one cooperative
    launch (plus the reduce), a team of one member per segment per (sample, channel block)."""
    x = make_cl((2, 12, 9, 5), torch.float32)
    weight, bias = make_params(12, "both", torch.float32)
    k = nhwc_team_kernels
    fwd = team_plan(problem(x, 4, weight, bias, False), "nhwc_team")
    assert [s.kernel for s in fwd.steps] == [k.nhwc_fwd_team_partials_kernel, k.nhwc_fwd_team_apply_kernel]
    bwd = team_plan(problem(x, 4, weight, bias, True, SILU), "nhwc_team")
    assert [s.kernel for s in bwd.steps] == [
        k.nhwc_bwd_team_partials_kernel, k.nhwc_bwd_team_partials_kernel, k.nhwc_bwd_team_dx_kernel,
        kernels.reduce_param_grads_kernel,
    ]  # fmt: skip
    assert [dict(s.constexprs)["HAS_DY"] for s in bwd.steps[:2]] == [False, True]
    pb = problem(x, 4, weight, bias, True)
    one = plan.nhwc_one_pass(pb, 8, 16, 99, 4, 32, None, SMALL_REDUCE)
    assert [s.kernel for s in one.steps] == [k.nhwc_bwd_one_pass_kernel, kernels.reduce_param_grads_kernel]
    assert one.team_size == 3 and one.counters == plan.team_rows(pb, 8) == 2 * 2  # 45 positions; 2 groups a block
    assert one.steps[0].grid == one.counters * one.team_size  # at most one team per team row
    assert ("launch_cooperative_grid", True) in one.steps[0].options


@pytest.mark.parametrize(
    ("pb", "block_c", "message"),
    [
        (Problem(2, 8, 64, 2, 4, True, True, False), 8, "channels-last"),
        (Problem(2, 8, 64, 2, 4, True, True, False, "none", True), 2, "whole groups"),
        (Problem(2, 8, 64, 2, 4, True, True, False, "none", True), 6, "whole groups"),
        (Problem(1, 2**16, 2**15, 2**10, 2, True, True, False, "none", True), 64, "2\\*\\*31"),
    ],
)
def test_team_plans_refuse_what_their_kernels_cannot_read(pb, block_c, message):
    for make in (lambda: plan.nhwc_team(pb, block_c, 8, 5, False, SMALL_REDUCE),
                 lambda: plan.nhwc_one_pass(pb, block_c, 8, 5, None, 32, None, SMALL_REDUCE)):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            make()


def test_team_channels_hold_whole_groups_with_the_fewest_masked_lanes():
    def block_c(c, groups, most=64):
        return tiles.team_channels(Problem(2, c, 4096, groups, 2, True, True, False, "none", True), most)

    assert block_c(320, 32) == 64  # cpg 10: 6 groups in 64 lanes (32 lanes hold 3: as full, narrower)
    assert block_c(640, 32) == 64  # cpg 20: 3 groups in 64 lanes
    assert block_c(1280, 32) == 64  # cpg 40: one group in the widest allowed
    assert block_c(1280, 32, most=128) == 128  # 64 lanes would hold 1 group (62%); 128 hold 3 (94%)
    assert block_c(128, 32) == 64  # cpg 4, every width full: the widest
    assert block_c(96, 32, most=16) == 16  # cpg 3: 5 groups in 16 lanes


def test_cuda_nhwc_one_pass_plans_resident_teams_with_the_nhwc_fallback():
    """At the diffusion shapes in channels-last a real GPU gets a one-pass plan
    whose teams fit by the estimated registers; the interpreter, float64 math
    and samples of 2**31 elements get none."""
    h100 = CudaDevice(sms=132, cooperative=True)
    for backward in (False, True):
        for n, c, hw in ((2, 320, 64 * 64), (8, 640, 32 * 32), (16, 1280, 16 * 16)):
            pb = Problem(n, c, hw, 32, 2, True, True, backward, SILU, True)
            fallback = plan.cuda(pb, h100)
            p = plan.cuda_nhwc_one_pass(pb, h100, fallback)
            assert p is not None and p.path == "nhwc_one_pass" and p.fallback is fallback
            assert p.team_size == -(-hw // dict(p.steps[0].constexprs)["BLOCK_HW"])
        pb = Problem(2, 320, 64 * 64, 32, 2, True, True, backward, SILU, True)
        assert plan.cuda_nhwc_one_pass(pb, CudaDevice(sms=132), None) is None  # the interpreter's device
        assert plan.cuda_nhwc_one_pass(Problem(2, 320, 4096, 32, 8, True, True, backward, SILU, True), h100,
                                       None) is None  # fmt: skip
        huge = Problem(1, 2**16, 2**15, 2**10, 2, True, True, backward, SILU, True)
        assert plan.cuda_nhwc_one_pass(huge, h100, None) is None
        assert plan.cuda_nhwc_team(huge, 132) is None


@pytest.mark.skipif(DEVICE != "cuda", reason="multi-member teams need resident programs (a GPU)")
@pytest.mark.parametrize("activation", ["none", SILU])
@pytest.mark.parametrize("shape", [(2, 320, 64, 64), (16, 1280, 16, 16), (3, 96, 17, 19)])
def test_gpu_one_pass_teams_of_many_members(shape, activation):
    """nhwc_one_pass at diffusion shapes (and an odd one): teams of many
    members meet at the barrier (twice a row backward with SiLU), the plan's
    grid capped to resident teams (not its fallback); nhwc_team beside it,
    against float64."""
    # A barrier that never completes would hang this worker: end it with a traceback instead.
    faulthandler.dump_traceback_later(BARRIER_TIMEOUT_S, exit=True)
    try:
        _one_pass_teams_of_many_members(shape, activation)
    finally:
        faulthandler.cancel_dump_traceback_later()


# Seconds test_gpu_one_pass_teams_of_many_members may take, its kernels' compiles included, before its
# worker is ended as hung.
BARRIER_TIMEOUT_S = 120


def _one_pass_teams_of_many_members(shape, activation):
    x = make_cl(shape, torch.bfloat16, offset=1.0)
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    dev = launch._cuda_device(x.device, torch.cuda.get_device_properties(x.device).multi_processor_count)
    for path in PATHS:
        plans = []
        for bw in (False, True):
            pb = problem(x, 32, weight, bias, bw, activation)
            if path == "nhwc_team":
                plans.append(plan.cuda_nhwc_team(pb, dev.sms))
                continue
            block_c, block_hw, _ = tiles.team_geometry(pb, plan.NHWC_TILE_C, plan.NHWC_TILE[bw])
            rows = plan.team_rows(pb, block_c)
            plans.append(plan.nhwc_one_pass(pb, block_c, block_hw, rows, 4, 64, plan.cuda(pb, dev), SMALL_REDUCE))
            assert plans[-1].team_size > 1
        y = launch.forward(x, 32, weight, bias, 1e-5, plans[0])
        grads = launch.backward(dy, x, 32, weight, bias, 1e-5, plans[1])
        if path == "nhwc_one_pass":
            assert all(None not in launch.capped_steps(p) for p in plans), "a one-pass team was not resident"
        check_against_reference(y, named_grads(*grads), x, 32, weight, bias, dy, 1e-5, activation)
