"""The Ascend NPU launchers of group_norm, run under the Triton interpreter on
CPU tensors with simulated Ascend profiles, and PrivateUse1 dispatch."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops import device
from csrc_free_ops.group_norm import kernels, launch, layout, npu_budget, plan
from tests.helpers import ALL_DTYPES, FLOAT_DTYPES, simulate_ascend
from tests.privateuse1_backend import scenario_output
from tests.test_group_norm import (
    AFFINE,
    check_against_reference,
    group_norm_cases,
    make_params,
    poison_allocations,
    problem,
    reference_grads,
)

# (profile, UB override, vector-core override): real chips, and a UB so
# small that every loop runs several steps (tiles of 2-4 elements, groups
# split across programs, multi-step finalize and reduce) on a few cores.
TINY_UB, TINY_CORES = 256, 9
# (Ascend910B1 differs from B4 only in a larger UB: at these shapes the same
# plans, so it is left out; the hypothesis test draws UB sizes.)
PROFILES = [("Ascend910B4", None, None), ("Ascend910B2", TINY_UB, TINY_CORES)]
# A shape that takes every multi-step path under the tiny profile (see test_tiny_ub_plans_every_multi_step_path).
MULTI_STEP_SHAPE = (1, 4, 100)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="NPU launchers are exercised on CPU tensors")


@pytest.fixture(params=PROFILES, ids=lambda p: f"{p[0]}-ub{p[1] or 'default'}-cores{p[2] or 'default'}")
def ascend(request, monkeypatch):
    return simulate_ascend(monkeypatch, *request.param)


def _check(x, groups, weight, bias, dy, eps=1e-5):
    y = launch.npu_forward(x, groups, weight, bias, eps)
    dx, dweight, dbias = launch.npu_backward(dy, x, groups, weight, bias, eps)
    grads = {"x": dx} | {k: v for k, v in (("weight", dweight), ("bias", dbias)) if v is not None}
    assert (dweight is None) == (weight is None) and (dbias is None) == (bias is None)
    assert y.stride() == dx.stride() == layout.empty_output(x).stride()
    check_against_reference(y, grads, x, groups, weight, bias, dy, eps)


def _plan(x, groups, backward, affine=True):
    pb = problem(x, groups, x if affine else None, x if affine else None, backward)
    return plan.npu(pb, device.npu_ub_bytes(), device.npu_vector_cores())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize(
    ("shape", "groups"),
    [((2, 6, 5, 7), 3), ((3, 8), 2), ((2, 4, 3, 5, 3), 1), (MULTI_STEP_SHAPE, 1), (MULTI_STEP_SHAPE, 2)],
)
@pytest.mark.parametrize("channels_last", [False, True])
def test_npu_launchers_match_reference(ascend, dtype, shape, groups, channels_last):
    x = torch.randn(shape, dtype=dtype)
    if channels_last and x.dim() >= 3:  # read in place, as on CUDA
        x = torch.randn((shape[0], *shape[2:], shape[1]), dtype=dtype).movedim(-1, 1)
    weight, bias = make_params(shape[1], "both", torch.float32)
    _check(x, groups, weight, bias, torch.randn_like(x))


@given(
    case=group_norm_cases(max_spatial=30, max_hw=200),
    dtype=st.sampled_from(ALL_DTYPES),
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
        for backward in (False, True):
            p = _plan(x, groups, backward)
            assert all(1 <= s.grid <= min(cores, device.NPU_MAX_GRID) for s in p.steps)
            assert p.path in ("whole", "split") and p.counters == 0


def test_tiny_ub_plans_every_multi_step_path(monkeypatch):
    """Under the tiny-UB profile MULTI_STEP_SHAPE takes every multi-step path:
    split groups walked in several tiles, more items than programs,
    multi-step finalize merges and a multi-step reduce."""
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(TINY_UB))
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", str(TINY_CORES))
    x = torch.empty(MULTI_STEP_SHAPE)
    for backward in (False, True):
        p = _plan(x, 1, backward)
        steps = {s.kernel: (s.grid, dict(s.constexprs)) for s in p.steps}
        grid, partials = steps[kernels.bwd_partials_kernel if backward else kernels.fwd_partials_kernel]
        assert p.path == "split" and p.chunk > partials["BLOCK_HW"]  # several tiles per item
        splits = -(-MULTI_STEP_SHAPE[2] // p.chunk)
        assert splits > 1  # a group's statistics come from several programs
        items = MULTI_STEP_SHAPE[1] // partials["BLOCK_C"] * splits
        assert items > grid  # grid-stride loop
        finalize = kernels.bwd_finalize_kernel if backward else kernels.fwd_finalize_kernel
        assert steps[finalize][1]["BLOCK_P"] < MULTI_STEP_SHAPE[1] * splits
    assert steps[kernels.reduce_param_grads_kernel][1]["BLOCK_R"] < splits


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
    x = torch.randn(shape, dtype=dtype)
    for backward in (False, True):
        steps = {s.kernel: dict(s.constexprs) for s in _plan(x, 1, backward).steps}
        main = steps[kernels.bwd_dx_kernel if backward else kernels.fwd_apply_kernel]
        assert main["FUSED"] == fused
        if fused:
            assert main["BLOCK_P"] < shape[1] * -(-shape[2] // _plan(x, 1, backward).chunk)
    weight, bias = make_params(shape[1], "both", torch.float32)
    dy = torch.randn_like(x)
    poison_allocations(monkeypatch)
    y = launch.npu_forward(x, 1, weight, bias, 1e-5)
    dx, dweight, dbias = launch.npu_backward(dy, x, 1, weight, bias, 1e-5)
    monkeypatch.undo()
    grads = {"x": dx, "weight": dweight, "bias": dbias}
    check_against_reference(y, grads, x, 1, weight, bias, dy, 1e-5)


def test_default_profile_plans_whole_groups(monkeypatch):
    """Small groups: one program per (sample, group), inside the UB budget."""
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_PROFILE", "Ascend910B4")
    for backward in (False, True):
        p = _plan(torch.empty(2, 6, 5, 7), 3, backward)
        c = dict(p.steps[0].constexprs)
        assert p.path == "whole" and (c["BLOCK_C"], c["BLOCK_HW"]) == (2, 64)
        per_element = npu_budget.npu_whole_bytes(4, 4, backward)
        assert c["BLOCK_C"] * c["BLOCK_HW"] * per_element <= device.npu_ub_bytes()  # whole groups: the whole UB


def test_default_profile_splits_groups_over_the_ub_budget(monkeypatch):
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_PROFILE", "Ascend910B4")
    p = _plan(torch.empty(2, 8, 64, 64), 1, backward=True)
    c = dict(p.steps[0].constexprs)
    assert p.path == "split" and c["BLOCK_C"] * c["BLOCK_HW"] < 8 * 4096


@pytest.mark.parametrize("cores", [1, 40, 10**6])
def test_grid_stays_under_the_ascend_limit(monkeypatch, cores):
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", str(cores))
    for shape in ((2, 6, 5, 7), (70000, 4, 3), (2, 8, 64, 64)):
        for backward in (False, True):
            assert all(
                1 <= s.grid <= min(cores, device.NPU_MAX_GRID) for s in _plan(torch.empty(shape), 2, backward).steps
            )


def test_tiles_fit_the_ub(ascend):
    """Whole groups within the whole UB (bishengir's UB plan fits them, the
    Ascend compile check), every other tile within half of it."""
    ub = device.npu_ub_bytes()
    for dtype in ALL_DTYPES:
        itemsize = torch.tensor([], dtype=dtype).element_size()
        compute = 8 if dtype == torch.float64 else 4
        for backward in (False, True):
            for shape in ((2, 64, 300), (2, 8, 100)):  # split, then (on real profiles) whole groups
                p = _plan(torch.empty(shape, dtype=dtype), 4, backward)
                for s in p.steps:
                    c = dict(s.constexprs)
                    if s.kernel in (kernels.fwd_whole_kernel, kernels.bwd_whole_kernel):
                        tile = (npu_budget.npu_whole_bytes(itemsize, compute, backward), ub)
                    else:
                        tile = (npu_budget.npu_split_bytes(itemsize, compute, backward), ub // 2)
                    sizes = [
                        (c.get("BLOCK_C", 1) * c.get("BLOCK_HW", 1), *tile),
                        (c.get("BLOCK_P", 1), 7 * compute, ub // 2),  # a group's merge
                        (c.get("BLOCK_R", 1) * c.get("BLOCK_C", 1), 4 * compute, ub // 2),  # the reduce
                    ]
                    for elements, cost, budget in sizes[2:] if "BLOCK_R" in c else sizes:
                        assert elements * cost <= budget or elements == 1, (s.kernel, elements, cost)


@pytest.mark.parametrize("dtypes", [(torch.float64, torch.float64), (torch.float32, torch.float64)])
def test_npu_float64_runs_the_reference(monkeypatch, dtypes):
    """triton-ascend compiles no float64: float64 data or parameters never reach a kernel on the NPU."""
    x = torch.randn(2, 8, 9, dtype=dtypes[0])
    weight, bias = make_params(8, "both", dtypes[1])
    dy = torch.randn_like(x)

    def no_kernels(*args, **kwargs):
        raise AssertionError("a float64 call reached the NPU launch sequence")

    monkeypatch.setattr(launch, "forward", no_kernels)
    monkeypatch.setattr(launch, "backward", no_kernels)
    _check(x, 4, weight, bias, dy)


def test_npu_is_bitwise_deterministic(ascend):
    x = torch.randn(2, 8, 9, 7, dtype=torch.float16)
    weight, bias = make_params(8, "both", torch.float32)
    dy = torch.randn_like(x)
    first = (launch.npu_forward(x, 4, weight, bias, 1e-5), *launch.npu_backward(dy, x, 4, weight, bias, 1e-5))
    second = (launch.npu_forward(x, 4, weight, bias, 1e-5), *launch.npu_backward(dy, x, 4, weight, bias, 1e-5))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_npu_plans_pass_no_launch_options(ascend):
    """triton-ascend takes no num_warps / num_stages; NPU plans set no launch option."""
    for shape in ((2, 6, 5, 7), (2, 64, 300), (1, 4, 100)):
        for backward in (False, True):
            p = _plan(torch.empty(shape), 2, backward)
            assert all(s.options == () for s in p.steps)
            assert all(dict(s.constexprs).get("LOOP_STAGES") is None for s in p.steps)


# --- PrivateUse1 dispatch (runs in a subprocess: the backend rename is once per process)


def dispatch_scenario() -> None:
    import registrations  # noqa: F401
    from csrc_free_ops.group_norm import launch as launch_mod
    from tests import privateuse1_backend as backend

    backend.install()
    calls: list[str] = []
    backend.spy_on(launch_mod, "forward", calls)
    backend.spy_on(launch_mod, "backward", calls)
    backend.spy_on(plan, "npu", calls, passthrough=True)
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
    out = json.loads(scenario_output("tests.test_group_norm_npu").strip().splitlines()[-1])
    assert out["device"] == "npu:0"
    assert out["grad_devices"] == ["npu:0"] * 3
    assert out["calls"] == [
        "csrc_free_ops.group_norm.plan.npu",
        "csrc_free_ops.group_norm.launch.forward",
        "csrc_free_ops.group_norm.plan.npu",
        "csrc_free_ops.group_norm.launch.backward",
    ]
    assert all(e < 1e-5 for e in out["errors"]), out["errors"]
