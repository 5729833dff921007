"""The Ascend NPU launchers of group_norm, run under the Triton interpreter on
CPU tensors with simulated Ascend profiles, and PrivateUse1 dispatch."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops import device
from csrc_free_ops.group_norm import launch, npu
from tests.helpers import FLOAT_DTYPES, simulate_ascend
from tests.privateuse1_backend import run_scenario
from tests.test_group_norm import (
    AFFINE,
    check_against_reference,
    group_norm_cases,
    make_params,
    poison_allocations,
    reference_grads,
)

# (profile, UB override, vector-core override): real chips, and a UB so
# small that every loop runs several steps (tiles of 2-4 elements, groups
# split across programs, multi-step finalize and reduce) on a few cores.
TINY_UB, TINY_CORES = 256, 9
PROFILES = [("Ascend910B4", None, None), ("Ascend910B1", None, None), ("Ascend910B2", TINY_UB, TINY_CORES)]
# A shape that takes every multi-step path under the tiny profile (see test_tiny_ub_plans_every_multi_step_path).
MULTI_STEP_SHAPE = (1, 4, 100)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="NPU launchers are exercised on CPU tensors")


@pytest.fixture(params=PROFILES, ids=lambda p: f"{p[0]}-ub{p[1] or 'default'}-cores{p[2] or 'default'}")
def ascend(request, monkeypatch):
    return simulate_ascend(monkeypatch, *request.param)


def _check(x, groups, weight, bias, dy, eps=1e-5):
    y = npu.forward(x, groups, weight, bias, eps)
    dx, dweight, dbias = npu.backward(dy, x, groups, weight, bias, eps)
    grads = {"x": dx} | {k: v for k, v in (("weight", dweight), ("bias", dbias)) if v is not None}
    assert (dweight is None) == (weight is None) and (dbias is None) == (bias is None)
    check_against_reference(y, grads, x, groups, weight, bias, dy, eps, x.dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize(
    ("shape", "groups"),
    [((2, 6, 5, 7), 3), ((3, 8), 2), ((2, 4, 3, 5, 3), 1), (MULTI_STEP_SHAPE, 1), (MULTI_STEP_SHAPE, 2)],
)
def test_npu_launchers_match_reference(ascend, dtype, shape, groups):
    x = torch.randn(shape, dtype=dtype)
    weight, bias = make_params(shape[1], "both", torch.float32)
    _check(x, groups, weight, bias, torch.randn_like(x))


@given(
    case=group_norm_cases(max_spatial=30, max_hw=200),
    dtype=st.sampled_from(FLOAT_DTYPES),
    affine=st.sampled_from(AFFINE),
    ub=st.sampled_from([512, 4096, 192 * 1024]),
    cores=st.integers(1, 48),
)
def test_npu_launchers_any_shape_any_budget(case, dtype, affine, ub, cores):
    shape, groups = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(ub))
        mp.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", str(cores))
        x = torch.randn(shape, dtype=dtype)
        weight, bias = make_params(shape[1], affine, dtype)
        _check(x, groups, weight, bias, torch.randn_like(x))


def test_tiny_ub_plans_every_multi_step_path(monkeypatch):
    """Under the tiny-UB profile MULTI_STEP_SHAPE takes every multi-step path:
    looped tiles, split groups, multi-step finalize and reduce, and more items
    than programs."""
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(TINY_UB))
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", str(TINY_CORES))
    policy = npu.NpuPolicy()
    for backward in (False, True):
        plan = launch.plan(policy, torch.empty(MULTI_STEP_SHAPE), 1, backward)
        assert plan.chunk > plan.block_hw  # several tiles per item
        assert plan.splits > 1  # a group's statistics come from several programs
        assert plan.items > policy.grid(plan.items)  # grid-stride loop
        assert policy.finalize_block(plan.segments_per_group) < plan.segments_per_group
    block_r, _ = policy.reduce_blocks(plan.part_rows, plan.c)
    assert block_r < plan.part_rows


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize(
    ("shape", "cores", "fused"),
    [((1, 8, 100), 1, True), (MULTI_STEP_SHAPE, TINY_CORES, False)],
    ids=["fused-multi-step-merge", "finalize-launch"],
)
def test_npu_fused_and_finalize_merges_write_every_output(monkeypatch, dtype, shape, cores, fused):
    """Under the tiny UB: a group merged by the apply / dx programs themselves
    in several steps, and one merged by finalize launches; all allocations
    NaN-poisoned."""
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(TINY_UB))
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", str(cores))
    policy = npu.NpuPolicy()
    x = torch.randn(shape, dtype=dtype)
    for backward in (False, True):
        plan = launch.plan(policy, x, 1, backward)
        assert plan.fused == fused
        if fused:
            assert policy.finalize_block(plan.segments_per_group, plan.block_c) < plan.segments_per_group
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    poison_allocations(monkeypatch)
    y = npu.forward(x, 1, weight, bias, 1e-5)
    dx, dweight, dbias = npu.backward(dy, x, 1, weight, bias, 1e-5)
    monkeypatch.undo()
    grads = {"x": dx, "weight": dweight, "bias": dbias}
    check_against_reference(y, grads, x, 1, weight, bias, dy, 1e-5, dtype)


def test_default_profile_plans_whole_groups(monkeypatch):
    """Small groups: one program per (sample, group), inside the UB budget."""
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_PROFILE", "Ascend910B4")
    for backward in (False, True):
        plan = launch.plan(npu.NpuPolicy(), torch.empty(2, 6, 5, 7), 3, backward=backward)
        assert plan.whole_groups and (plan.block_c, plan.block_hw) == (2, 64)
        per_element = npu.group_bytes_per_element(4, backward)
        assert plan.block_c * plan.block_hw * per_element <= device.npu_ub_bytes()


def test_default_profile_splits_groups_over_the_ub_budget(monkeypatch):
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_PROFILE", "Ascend910B4")
    plan = launch.plan(npu.NpuPolicy(), torch.empty(2, 8, 64, 64), 1, backward=True)
    assert not plan.whole_groups and plan.block_c * plan.block_hw < 8 * 4096


@pytest.mark.parametrize("cores", [1, 40, 10**6])
def test_grid_stays_under_the_ascend_limit(monkeypatch, cores):
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", str(cores))
    policy = npu.NpuPolicy()
    for work in (1, 7, 10**5, 10**8):
        assert 1 <= policy.grid(work) <= min(work, cores, device.NPU_MAX_GRID)


def test_tiles_fit_half_the_ub(ascend):
    budget = device.npu_ub_bytes() // 2
    for dtype in FLOAT_DTYPES:
        itemsize = torch.tensor([], dtype=dtype).element_size()
        for backward in (False, True):
            cost = npu.bytes_per_element(itemsize, backward)
            tile = npu.tile_elements(cost)
            assert tile * cost <= budget or tile == 1
            for shape in ((2, 64, 300), (2, 8, 100)):  # split, then (on real profiles) whole groups
                plan = launch.plan(npu.NpuPolicy(), torch.empty(shape, dtype=dtype), 4, backward)
                if plan.whole_groups:  # whole groups budget the whole UB
                    cost = npu.group_bytes_per_element(itemsize, backward)
                    assert plan.block_c * plan.block_hw * cost <= 2 * budget
                else:
                    assert plan.block_c * plan.block_hw <= tile
    assert npu.tile_elements(npu.FINALIZE_BYTES_PER_ELEMENT) * npu.FINALIZE_BYTES_PER_ELEMENT <= budget


def test_npu_is_bitwise_deterministic(ascend):
    x = torch.randn(2, 8, 9, 7, dtype=torch.float16)
    weight, bias = make_params(8, "both", torch.float32)
    dy = torch.randn_like(x)
    first = (npu.forward(x, 4, weight, bias, 1e-5), *npu.backward(dy, x, 4, weight, bias, 1e-5))
    second = (npu.forward(x, 4, weight, bias, 1e-5), *npu.backward(dy, x, 4, weight, bias, 1e-5))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_npu_launchers_pass_no_warps_or_stages():
    """triton-ascend ignores num_warps / num_stages; the NPU policy sets neither."""
    policy = npu.NpuPolicy()
    assert policy.options(4096) == {}
    grid, options = policy.whole_group_launch(10**6, 4096)
    assert options == {} and grid == policy.grid(10**6) <= device.NPU_MAX_GRID
    assert policy.loop_options(False, 8, 1024, 2) == {"LOOP_STAGES": 1, "STATS_EVICT": "", "OUTPUT_EVICT": ""}
    source = inspect.getsource(npu)
    assert "num_warps" not in source.replace("no num_warps", "")
    assert "num_stages" not in source.replace("num_warps / num_stages", "")


# --- PrivateUse1 dispatch (runs in a subprocess: the backend rename is once per process)


def dispatch_scenario() -> None:
    import registrations  # noqa: F401
    from csrc_free_ops.group_norm import npu as npu_launchers
    from tests import privateuse1_backend as backend

    backend.install()
    calls: list[str] = []
    backend.spy_on(npu_launchers, "forward", calls)
    backend.spy_on(npu_launchers, "backward", calls)
    x, weight, bias, dy = torch.randn(3, 4, 5, 6), torch.randn(4), torch.randn(4), torch.randn(3, 4, 5, 6)
    leaves = [backend.to_npu(t).requires_grad_() for t in (x, weight, bias)]
    y = torch.ops.liger.group_norm(leaves[0], 2, leaves[1], leaves[2])
    grads = torch.autograd.grad(y, leaves, backend.to_npu(dy))
    y_ref, grads_ref = reference_grads(x, 2, weight, bias, dy, 1e-5)
    errors = [
        ((a.cpu().double() - b).norm() / b.norm()).item()
        for a, b in zip((y, *grads), (y_ref, *grads_ref.values()), strict=True)
    ]
    print(json.dumps({"device": str(y.device), "grad_devices": [str(g.device) for g in grads], "calls": calls,
                      "errors": errors}))  # fmt: skip


def test_privateuse1_dispatch_reaches_npu_launchers():
    out = json.loads(run_scenario("tests.test_group_norm_npu", "dispatch_scenario").strip().splitlines()[-1])
    assert out["device"] == "npu:0"
    assert out["grad_devices"] == ["npu:0"] * 3
    assert out["calls"] == ["csrc_free_ops.group_norm.npu.forward", "csrc_free_ops.group_norm.npu.backward"]
    assert all(e < 1e-5 for e in out["errors"]), out["errors"]
