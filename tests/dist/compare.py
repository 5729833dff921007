"""Comparing a distributed result with the single-process one."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

# ||got - want|| / ||want|| and max |got - want| / max |want|: float32 kernels
# on shards against the same kernels on the full tensor (sums split across
# ranks add in another order).
RTOL, ELEM_TOL = 2e-5, 1e-4


def full(t: torch.Tensor) -> torch.Tensor:
    """The global value of a DTensor (Partial reduced, shards gathered), on CPU in float64."""
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().to("cpu", torch.float64)


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str, rtol: float = RTOL, elem_tol: float = ELEM_TOL):
    got64, want64 = full(got), full(want)
    assert got64.shape == want64.shape, f"{what}: shape {tuple(got64.shape)} != {tuple(want64.shape)}"
    assert torch.isfinite(want64).all(), f"{what}: the single-process result is not finite"
    assert torch.isfinite(got64).all(), f"{what}: non-finite values"
    scale = want64.abs().max().item()
    assert scale > 0, f"{what}: the single-process result is all zeros; nothing is checked"
    rel = ((got64 - want64).norm() / want64.norm()).item()
    worst = ((got64 - want64).abs().max() / scale).item()
    assert rel <= rtol and worst <= elem_tol, f"{what}: relative error {rel:.2e} (max elementwise {worst:.2e})"
