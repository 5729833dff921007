"""Comparison helpers shared by the op tests."""

from __future__ import annotations

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Per dtype: (bound on ||out - ref|| / ||ref||, bound on the largest
# elementwise error relative to max |ref|).  Float32 math with the output
# rounded to the dtype; bf16 keeps 8 mantissa bits, fp16 11.
TOLERANCES = {
    torch.float32: (2e-5, 1e-4),
    torch.float16: (2e-3, 4e-3),
    torch.bfloat16: (1.2e-2, 3e-2),
}

OPCHECK_UTILS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_static",
    "test_aot_dispatch_dynamic",
)


def assert_close_to_ref(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "output") -> None:
    """out (any dtype) against a float64 reference; NaN or inf never passes."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    out64 = out.detach().to("cpu", torch.float64)
    ref64 = ref.detach().to("cpu", torch.float64)
    assert torch.isfinite(ref64).all(), f"{what}: reference is not finite; the test drew a bad input"
    assert torch.isfinite(out64).all(), f"{what}: non-finite values in the output"
    norm_tol, elem_tol = TOLERANCES[dtype]
    scale = ref64.abs().max().item()
    if scale == 0.0:
        assert out64.abs().max().item() == 0.0, f"{what}: expected all zeros"
        return
    rel = ((out64 - ref64).norm() / ref64.norm()).item()
    worst = ((out64 - ref64).abs().max() / scale).item()
    assert rel <= norm_tol, f"{what}: relative error {rel:.3e} > {norm_tol:.1e} ({dtype})"
    assert worst <= elem_tol, f"{what}: max elementwise error {worst:.3e} of max|ref| > {elem_tol:.1e} ({dtype})"


def poison_like(t: torch.Tensor) -> torch.Tensor:
    """NaN-filled tensor: an output element a kernel forgets to write stays NaN."""
    return torch.full_like(t, float("nan"))


def simulate_ascend(monkeypatch, profile: str, ub_bytes: int | None = None, vector_cores: int | None = None) -> str:
    """Make csrc_free_ops.device report an Ascend profile, optionally with its
    UB size or vector-core count overridden; returns the profile name."""
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_PROFILE", profile)
    if ub_bytes is not None:
        monkeypatch.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(ub_bytes))
    if vector_cores is not None:
        monkeypatch.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", str(vector_cores))
    return profile
