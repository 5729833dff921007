"""The Ascend NPU entries of cross_entropy and fused_linear_cross_entropy,
run under the Triton interpreter on CPU tensors with a simulated Ascend
profile: the same results as the CUDA entries (float64 through the
reference), and bad targets raising after the kernels are queued."""

from __future__ import annotations

import pytest
import torch

from csrc_free_ops.cross_entropy import launch as ce
from csrc_free_ops.fused_linear_cross_entropy import launch as flce
from tests.helpers import simulate_ascend

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="NPU launchers are exercised on CPU tensors")

IGNORE = -100
# ignore_index, label_smoothing, reduction, lse_square_scale, softcap
OPTIONS = (IGNORE, 0.1, "mean", 1e-3, None)
MASK = [True, True, True]


def _inputs(dtype: torch.dtype) -> tuple:
    x, weight, bias = torch.randn(9, 16, dtype=dtype), torch.randn(40, 16, dtype=dtype), torch.randn(40, dtype=dtype)
    target = torch.tensor([0, 5, IGNORE, 39, 7, 1, IGNORE, 20, 3])
    return x, weight, bias, target


def _assert_same(got: tuple, want: tuple) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_npu_entries_match_the_cuda_entries(monkeypatch, dtype):
    simulate_ascend(monkeypatch, "Ascend910B4")
    x, weight, bias, target = _inputs(dtype)
    logits = x @ weight.T
    _assert_same(ce.npu_forward(logits, target, None, *OPTIONS), ce.cuda_forward(logits, target, None, *OPTIONS))
    _assert_same(
        flce.npu_forward(x, weight, target, bias, None, *OPTIONS),
        flce.cuda_forward(x, weight, target, bias, None, *OPTIONS),
    )
    _assert_same(
        flce.npu_forward_with_grads(x, weight, target, bias, None, *OPTIONS, MASK),
        flce.cuda_forward_with_grads(x, weight, target, bias, None, *OPTIONS, MASK),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("entry", ["cross_entropy", "fused", "fused_with_grads"])
def test_npu_entries_raise_on_bad_targets(monkeypatch, dtype, entry):
    simulate_ascend(monkeypatch, "Ascend910B4")
    x, weight, bias, target = _inputs(dtype)
    target[4] = 40
    with pytest.raises(ValueError, match=r"target holds \[40\].*outside \[0, 40\)"):
        if entry == "cross_entropy":
            ce.npu_forward(x @ weight.T, target, None, *OPTIONS)
        elif entry == "fused":
            flce.npu_forward(x, weight, target, bias, None, *OPTIONS)
        else:
            flce.npu_forward_with_grads(x, weight, target, bias, None, *OPTIONS, MASK)
