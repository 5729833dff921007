"""The Ascend NPU launchers of poly_norm, run under the Triton interpreter on
CPU tensors with simulated Ascend profiles, and PrivateUse1 dispatch."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops import device
from csrc_free_ops.poly_norm import launch, plan
from tests.helpers import ALL_DTYPES, FLOAT_DTYPES, assert_close_to_ref, simulate_ascend
from tests.privateuse1_backend import scenario_output
from tests.test_poly_norm import assert_grads_close, reference_grads

# (profile, UB override): real chips, and a UB so small that rows of a few
# hundred elements are column-blocked.
PROFILES = [("Ascend910B4", None), ("Ascend910B1", None), ("Ascend910B2", 4096)]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="NPU launchers are exercised on CPU tensors")


@pytest.fixture(params=PROFILES, ids=lambda p: f"{p[0]}-ub{p[1] or 'default'}")
def ascend(request, monkeypatch):
    return simulate_ascend(monkeypatch, *request.param)


def _check(x, weight, bias, dy, eps=1e-6):
    dtype = x.dtype
    y = launch.npu_forward(x, weight, bias, eps)
    dx, dw, db = launch.npu_backward(dy, x, weight, eps)
    y_ref, (dx_ref, dw_ref, db_ref) = reference_grads(x, weight, bias, dy, eps)
    assert_close_to_ref(y, y_ref, dtype, "y")
    # The launcher's dbias is (1,).
    assert_grads_close((dx, dw, db), (dx_ref, dw_ref, db_ref.reshape(1)), x, weight, dy, eps)


def _plan(n_rows, n_cols, dtype, backward):
    itemsize = torch.tensor([], dtype=dtype).element_size()
    return plan.npu(n_rows, n_cols, itemsize, backward, device.npu_ub_bytes(), device.npu_vector_cores())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize(("n_rows", "n_cols"), [(37, 48), (150, 129), (5, 2048), (7, 2500), (3, 5000)])
def test_npu_launchers_match_reference(ascend, dtype, n_rows, n_cols):
    x = torch.randn(n_rows, n_cols, dtype=dtype)
    weight = torch.randn(3, dtype=dtype)
    bias = torch.randn(1, dtype=dtype)
    _check(x, weight, bias, torch.randn_like(x))


@given(
    n_rows=st.integers(1, 24),
    n_cols=st.integers(2, 2600),
    dtype=st.sampled_from(FLOAT_DTYPES),
    ub=st.sampled_from([4096, 32 * 1024, 192 * 1024]),
    cores=st.integers(1, 48),
)
def test_npu_launchers_any_shape_any_budget(n_rows, n_cols, dtype, ub, cores):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(ub))
        mp.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", str(cores))
        x = torch.randn(n_rows, n_cols, dtype=dtype)
        weight = torch.randn(3, dtype=dtype)
        bias = torch.randn((), dtype=dtype)
        _check(x, weight, bias, torch.randn_like(x))
        for backward in (False, True):
            p = _plan(n_rows, n_cols, dtype, backward)
            assert 1 <= p.programs <= min(cores, device.NPU_MAX_GRID)
            assert (p.num_warps, p.loop_stages) == (None, plan.NPU_LOOP_STAGES)  # no num_warps on the NPU


def test_both_kernels_are_planned(ascend):
    """The shapes above cover both kernels on every profile."""
    for backward in (False, True):
        assert _plan(37, 48, torch.float32, backward).whole_rows is True
        assert _plan(7, 2500, torch.float32, backward).whole_rows is False
        assert _plan(150, 129, torch.float32, backward).whole_rows is (ascend != "Ascend910B2")


def test_tile_is_the_largest_that_fits_the_ub(ascend):
    for backward, n_inputs, temps in ((False, 1, plan.NPU_FWD_TEMPS), (True, 2, plan.NPU_BWD_TEMPS)):
        for dtype in ALL_DTYPES:
            elem = torch.tensor([], dtype=dtype).element_size()
            compute = 8 if dtype == torch.float64 else 4
            tile = plan.npu_tile_elements(backward, elem, compute, device.npu_ub_bytes())
            cost = n_inputs * elem + compute * temps
            assert tile * cost <= device.npu_ub_bytes() < 2 * tile * cost


def test_npu_backward_is_bitwise_deterministic(ascend):
    x = torch.randn(40, 300, dtype=torch.float16)
    weight = torch.randn(3, dtype=torch.float16)
    dy = torch.randn_like(x)
    first = launch.npu_backward(dy, x, weight, 1e-6)
    second = launch.npu_backward(dy, x, weight, 1e-6)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_npu_kernels_pass_no_warps_or_stages():
    """triton-ascend ignores num_warps / num_stages: NPU plans pass no launch options, and one-stage loops."""
    for n_rows, n_cols in [(1, 8), (37, 48), (7, 2500), (3, 100_000)]:
        for backward in (False, True):
            p = _plan(n_rows, n_cols, torch.bfloat16, backward)
            assert (p.num_warps, p.loop_stages) == (None, plan.NPU_LOOP_STAGES)


# --- PrivateUse1 dispatch (runs in a subprocess: the backend rename is once per process)


def dispatch_scenario() -> None:
    import registrations  # noqa: F401
    from csrc_free_ops.poly_norm import launch as launch_mod
    from tests import privateuse1_backend as backend

    backend.install()
    calls: list[str] = []
    backend.spy_on(launch_mod, "forward", calls)
    backend.spy_on(launch_mod, "backward", calls)
    backend.spy_on(plan, "npu", calls, passthrough=True)
    x, weight, bias, dy = torch.randn(3, 5, 40), torch.randn(3), torch.randn(1), torch.randn(3, 5, 40)
    leaves = [backend.to_npu(t).requires_grad_() for t in (x, weight, bias)]
    y = torch.ops.liger.poly_norm(*leaves, 1e-6)
    grads = torch.autograd.grad(y, leaves, backend.to_npu(dy))
    y_ref, grads_ref = reference_grads(x, weight, bias, dy, 1e-6)
    pairs = zip((y, *grads), (y_ref, *grads_ref), strict=True)
    errors = [((a.cpu().double() - b).norm() / b.norm()).item() for a, b in pairs]
    result = {"device": str(y.device), "grad_devices": [str(g.device) for g in grads], "calls": calls, "errors": errors}
    print(json.dumps(result))


def test_privateuse1_dispatch_reaches_npu_launchers():
    out = json.loads(scenario_output("tests.test_poly_norm_npu").strip().splitlines()[-1])
    assert out["device"] == "npu:0"
    assert out["grad_devices"] == ["npu:0"] * 3
    assert out["calls"] == [
        "csrc_free_ops.poly_norm.plan.npu",
        "csrc_free_ops.poly_norm.launch.forward",
        "csrc_free_ops.poly_norm.plan.npu",
        "csrc_free_ops.poly_norm.launch.backward",
    ]
    assert all(e < 1e-5 for e in out["errors"]), out["errors"]
