"""A float64 result is float64 all the way through, its float scalars
included: every op that takes a float (poly_norm's and group_norm's eps;
rope takes none), in float64 on CUDA, against its float64 reference at
1e-13, with an eps that float32 cannot hold.  Triton types a Python float
kernel argument fp32 unless the parameter is annotated, and eps rounded to
float32 moves rstd by ~1e-8 relative where the variance is near eps, as it
is here.  Every kernel path, eagerly and under torch.compile (where
Inductor launches the kernels from its own code, typing floats itself).

The Triton interpreter passes a Python float whole, so only compiled
kernels can fail here; on the CPU, tests/test_cuda_compile.py checks the
types Triton's JIT gives every float64 launch's scalars."""

from __future__ import annotations

import pytest
import torch

from csrc_free_ops.poly_norm import launch as pn_launch
from csrc_free_ops.poly_norm import plan as pn_plan
from csrc_free_ops.poly_norm import reference as pn_reference
from tests.test_group_norm import SPLIT_FINALIZE, SPLIT_FUSED, reference_grads, run_plans, small_plan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels only (see the docstring)")

EPS = 1e-3 + 2**-40
# Inputs scaled so that mean(x^2) (and group variances) sit near EPS: its rounding shows at ~1e-8.
SCALE = 0.03
TOL = {"rtol": 1e-13, "atol": 1e-13}


def test_eps_is_not_a_float32():
    assert float(torch.tensor(EPS, dtype=torch.float32)) != EPS


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64, device="cuda") * SCALE


def _assert_all_close(got: tuple, want: tuple, names: tuple) -> None:
    for g, w, name in zip(got, want, names, strict=True):
        assert g.dtype == torch.float64, name
        torch.testing.assert_close(g, w, **TOL, msg=lambda m, name=name: f"{name}: {m}")


def _op_values_and_grads(op, inputs: tuple, dy: torch.Tensor, compiled: bool) -> tuple:
    """op(*inputs) and its gradients for dy, eagerly or through torch.compile;
    compiled, the generated code must launch the kernels itself (the op
    decomposed, registrations/_library.py), forward and backward."""
    from torch._inductor.utils import run_and_get_code

    leaves = [t.clone().requires_grad_() for t in inputs]
    torch._dynamo.reset()
    fn = torch.compile(op, fullgraph=True) if compiled else op

    def run():
        y = fn(*leaves)
        return (y, *torch.autograd.grad(y, leaves, dy))

    if not compiled:
        return run()
    out, code = run_and_get_code(run)
    assert code and not any("torch.ops.liger." in c for c in code), "the op was not decomposed"
    return out


# --- poly_norm


def _poly_norm_inputs(rows: int, cols: int) -> tuple:
    x = _x(rows, cols)
    weight = torch.randn(3, dtype=torch.float64, device="cuda")
    bias = torch.randn(1, dtype=torch.float64, device="cuda")
    return x, weight, bias, torch.randn_like(x)


def _poly_norm_reference(x, weight, bias, dy) -> tuple:
    return pn_reference.forward(x, weight, bias, EPS), *pn_reference.backward(dy, x, weight, EPS)


Plan = pn_plan.Plan
POLY_NORM_PLANS = {
    # (forward plan, backward plan): tiles, a program per row and a backward of one program (direct grads)
    "tile-per-row": (Plan(True, 1, 64, 5, 1), Plan(True, 1, 64, 1, 1, 3)),
    # tiles walked with a grid stride, a backward of three programs (partials, then their reduction)
    "tile-grid-stride": (Plan(True, 2, 64, 2, 1), Plan(True, 1, 64, 3, 1, 3)),
    # rows in column blocks of 16
    "column-blocks": (Plan(False, 1, 16, 3, 1), Plan(False, 1, 16, 3, 1)),
}


@pytest.mark.parametrize("plans", POLY_NORM_PLANS.values(), ids=POLY_NORM_PLANS.keys())
def test_poly_norm_every_kernel_keeps_eps_in_float64(plans):
    fwd, bwd = plans
    x, weight, bias, dy = _poly_norm_inputs(5, 40)
    got = (pn_launch.forward(x, weight, bias, EPS, fwd), *pn_launch.backward(dy, x, weight, EPS, bwd))
    _assert_all_close(got, _poly_norm_reference(x, weight, bias, dy), ("y", "dx", "dweight", "dbias"))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_poly_norm_op_keeps_eps_in_float64(compiled):
    x, weight, bias, dy = _poly_norm_inputs(6, 48)
    got = _op_values_and_grads(lambda x, w, b: torch.ops.liger.poly_norm(x, w, b, EPS), (x, weight, bias), dy, compiled)
    _assert_all_close(got, _poly_norm_reference(x, weight, bias, dy), ("y", "dx", "dweight", "dbias"))


# --- group_norm

GROUP_NORM_PLANS = {
    "whole": {"path": "whole"},
    "looped": {"path": "looped"},
    "split-fused": SPLIT_FUSED,
    "split-finalize": SPLIT_FINALIZE,
}


def _group_norm_inputs(shape: tuple) -> tuple:
    x = _x(*shape)
    weight = torch.randn(shape[1], dtype=torch.float64, device="cuda")
    bias = torch.randn(shape[1], dtype=torch.float64, device="cuda")
    return x, weight, bias, torch.randn_like(x)


def _group_norm_reference(x, groups, weight, bias, dy) -> tuple:
    y, grads = reference_grads(x, groups, weight, bias, dy, EPS)
    return y, grads["x"], grads["weight"], grads["bias"]


@pytest.mark.parametrize("opts", GROUP_NORM_PLANS.values(), ids=GROUP_NORM_PLANS.keys())
def test_group_norm_every_kernel_keeps_eps_in_float64(opts):
    x, weight, bias, dy = _group_norm_inputs((2, 8, 5, 7))
    y, grads = run_plans(x, 2, weight, bias, dy, EPS, lambda pb: small_plan(pb, **opts))
    _assert_all_close((y, *grads), _group_norm_reference(x, 2, weight, bias, dy), ("y", "dx", "dweight", "dbias"))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(("shape", "groups"), [((1, 4), 1), ((2, 8, 6, 6), 4)], ids=["seen-on-the-H200", "nchw"])
def test_group_norm_op_keeps_eps_in_float64(shape, groups, compiled):
    """(1, 4) with one group: the shape on which the H200 first showed
    float64 y off by 7e-12 with eps rounded to float32."""
    x, weight, bias, dy = _group_norm_inputs(shape)
    got = _op_values_and_grads(
        lambda x, w, b: torch.ops.liger.group_norm(x, groups, w, b, EPS), (x, weight, bias), dy, compiled
    )
    want = _group_norm_reference(x, groups, weight, bias, dy)
    _assert_all_close(got, want, ("y", "dx", "dweight", "dbias"))
