"""The Ascend NPU launchers of swiglu and geglu, run under the Triton
interpreter on CPU tensors with simulated Ascend profiles, and PrivateUse1
dispatch."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from csrc_free_ops import device
from csrc_free_ops.glu import launch, plan
from tests.helpers import FLOAT_DTYPES, assert_close_to_ref, assert_glu_dgate_close, simulate_ascend
from tests.privateuse1_backend import scenario_output
from tests.test_glu import OPS, torch_grads

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="NPU launchers are exercised on CPU tensors")


def _check(activation, gate, up, dy):
    y = launch.npu_forward(gate, up, activation)
    dgate, dup = launch.npu_backward(dy, gate, up, activation)
    y_ref, (dgate_ref, dup_ref) = torch_grads(activation, gate, up, dy)
    assert_close_to_ref(y, y_ref, y.dtype, "y")
    assert_glu_dgate_close(dgate, dgate_ref, activation, gate, up, dy)
    assert_close_to_ref(dup, dup_ref, up.dtype, "dup")


@settings(deadline=None, max_examples=15)
@given(
    activation=st.sampled_from(sorted(OPS.values())),
    n_rows=st.integers(1, 40),
    n_cols=st.integers(1, 700),
    dtype=st.sampled_from(FLOAT_DTYPES),
    halves=st.booleans(),
    ub=st.sampled_from([4096, 32 * 1024, 192 * 1024]),
    cores=st.integers(1, 48),
)
def test_npu_launchers_any_shape_any_budget(activation, n_rows, n_cols, dtype, halves, ub, cores):
    with pytest.MonkeyPatch.context() as mp:
        simulate_ascend(mp, "Ascend910B4", ub, cores)
        if halves:
            gate, up = torch.randn(n_rows, 2 * n_cols).to(dtype).chunk(2, -1)
        else:
            gate, up = (torch.randn(n_rows, n_cols).to(dtype) for _ in "gu")
        _check(activation, gate, up, torch.randn(n_rows, n_cols).to(dtype))
        for backward in (False, True):
            size = (3 if backward else 2) * gate.element_size() + 2 * gate.element_size()
            p = plan.npu(*launch.problem(gate, up), size, 4, backward, device.npu_ub_bytes(), device.npu_vector_cores())
            assert 1 <= p.programs <= min(cores, device.NPU_MAX_GRID) and p.num_warps is None


def test_npu_float64_runs_the_reference(monkeypatch):
    simulate_ascend(monkeypatch, "Ascend910B1")
    gate, up, dy = (torch.randn(5, 33, dtype=torch.float64) for _ in range(3))
    _check("gelu_tanh", gate, up, dy)


def test_tile_fits_the_ub_and_narrow_rows_are_budgeted_wide(monkeypatch):
    simulate_ascend(monkeypatch, "Ascend910B4")
    ub = device.npu_ub_bytes()
    for backward, temps, data in ((False, plan.NPU_FWD_TEMPS, 6), (True, plan.NPU_BWD_TEMPS, 10)):
        tile = plan.npu_tile_elements(backward, data, 4, ub)
        assert tile * (data + 4 * temps) <= ub < 2 * tile * (data + 4 * temps)
    p = plan.npu(5000, 3, 10, 4, True, ub, 40)
    assert p.block_n == 4 and p.block_m * plan.NPU_MIN_BLOCK_N <= plan.npu_tile_elements(True, 10, 4, ub)


# --- PrivateUse1 dispatch (runs in a subprocess: the backend rename is once per process)


def dispatch_scenario() -> None:
    import registrations  # noqa: F401
    from csrc_free_ops.glu import launch as launch_mod
    from tests import privateuse1_backend as backend

    backend.install()
    calls: list[str] = []
    backend.spy_on(launch_mod, "forward", calls)
    backend.spy_on(launch_mod, "backward", calls)
    gate, up, dy = torch.randn(3, 40), torch.randn(3, 40), torch.randn(3, 40)
    leaves = [backend.to_npu(t).requires_grad_() for t in (gate, up)]
    y = torch.ops.liger.geglu(*leaves)
    grads = torch.autograd.grad(y, leaves, backend.to_npu(dy))
    y_ref, grads_ref = torch_grads("gelu_tanh", gate, up, dy)
    pairs = zip((y, *grads), (y_ref, *grads_ref), strict=True)
    errors = [((a.cpu().double() - b).norm() / b.norm()).item() for a, b in pairs]
    print(json.dumps({"device": str(y.device), "calls": calls, "errors": errors}))


def test_privateuse1_dispatch_reaches_npu_launchers():
    out = json.loads(scenario_output("tests.test_glu_npu").strip().splitlines()[-1])
    assert out["device"] == "npu:0"
    assert out["calls"] == ["csrc_free_ops.glu.launch.forward", "csrc_free_ops.glu.launch.backward"]
    assert all(e < 1e-5 for e in out["errors"]), out["errors"]
