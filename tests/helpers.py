"""Comparison helpers shared by the op tests."""

from __future__ import annotations

import collections

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Every dtype the ops take (docs/ops.md, "Dtypes"): the above plus float64.
ALL_DTYPES = (*FLOAT_DTYPES, torch.float64)

# Per dtype: (bound on ||out - ref|| / ||ref||, bound on the largest
# elementwise error relative to max |ref|).  Float32 math with the output
# rounded to the dtype (float64 math for float64); bf16 keeps 8 mantissa
# bits, fp16 11.
TOLERANCES = {
    torch.float64: (1e-12, 1e-11),
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


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the ops compute in for data of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def assert_close_to_scale(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
                          what: str, compute: torch.dtype = torch.float32) -> None:  # fmt: skip
    """out against a float64 reference for an output the kernel sums up in
    ``compute`` (float32 unless the data is float64) and then rounds to ``dtype``.  ``scale``: per element, the summed
    magnitudes of the terms added into it (>= |ref|).  The float32 sum's
    rounding error is relative to its terms, not to the sum, which can cancel
    far below them; the final rounding is relative to the value.  So each
    bound is the dtype's bound on |ref| plus float32's bound on the terms.
    NaN or inf never passes."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    ref64 = ref.detach().to("cpu", torch.float64)
    err = out.detach().to("cpu", torch.float64) - ref64
    assert torch.isfinite(err).all(), f"{what}: non-finite values in the output"
    scale = scale.detach().to("cpu", torch.float64).reshape(ref.shape)
    norm_tol, elem_tol = TOLERANCES[dtype]
    sum_norm_tol, sum_elem_tol = TOLERANCES[compute]
    norm_bound = norm_tol * ref64.norm().item() + sum_norm_tol * scale.norm().item()
    elem_bound = elem_tol * ref64.abs().max().item() + sum_elem_tol * scale.max().item()
    assert err.norm().item() <= norm_bound, f"{what}: error norm {err.norm().item():.3e} > {norm_bound:.3e} ({dtype})"
    assert err.abs().max().item() <= elem_bound, f"{what}: max error {err.abs().max().item():.3e} > {elem_bound:.3e}"


def glu_dgate_term_scale(activation: str, gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """Per element, in float64, the magnitudes of the terms dgate = dy * act'(gate) * up is made of.
    act' is a sum (silu' = s + g s (1 - s); GELU's likewise) that cancels to 0 at one gate value
    (silu's near -1.278), where any float32 evaluation, torch's included, keeps an error relative to
    those terms, not to act' itself."""
    from csrc_free_ops.glu import reference

    g = gate.detach().double()
    if activation == "silu":
        s = torch.sigmoid(g)
        terms = s + (g * s * (1 - s)).abs()
    elif activation == "gelu_tanh":
        s = torch.sigmoid(2 * reference.SQRT_2_OVER_PI * (g + reference.GELU_CUBIC * g**3))
        dz = reference.SQRT_2_OVER_PI * (1 + 3 * reference.GELU_CUBIC * g * g)
        terms = s + (2 * g * s * (1 - s) * dz).abs()
    else:
        terms = (
            0.5 * (1 + torch.erf(g * reference.INV_SQRT_2)) + (g * reference.INV_SQRT_2PI * torch.exp(-g * g / 2)).abs()
        )
    return (dy.detach().double() * up.detach().double()).abs() * terms


def assert_glu_dgate_close(dgate: torch.Tensor, ref: torch.Tensor, activation: str, gate: torch.Tensor,
                           up: torch.Tensor, dy: torch.Tensor, what: str = "dgate") -> None:  # fmt: skip
    """dgate against its float64 reference: rounded once to gate's dtype, computed in float32 (float64
    when gate or up is), with that computation's error relative to its terms (glu_dgate_term_scale)."""
    compute = torch.float64 if torch.float64 in (gate.dtype, up.dtype) else torch.float32
    scale = glu_dgate_term_scale(activation, gate, up, dy)
    assert_close_to_scale(dgate, ref, scale, gate.dtype, what, compute)


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


class LigerOpCounter(TorchDispatchMode):
    """Counts the torch.ops.liger calls that reach dispatch."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "liger":
            self.calls[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class TorchPolyNorm(nn.Module):
    """PolyNorm (the PolyCom formula) as a model writes it in torch."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([0.5, -0.3, 0.8]))
        self.bias = nn.Parameter(torch.tensor([0.1]))
        self.eps = eps

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        w = self.weight
        return w[0] * self._norm(x**3) + w[1] * self._norm(x**2) + w[2] * self._norm(x) + self.bias


def record_launches_and_reads(monkeypatch) -> list[str]:
    """The order of the kernel launches and the host reads (Tensor.item) that follow."""
    from csrc_free_ops import launcher

    events: list[str] = []
    call, item = launcher.Launcher.__call__, torch.Tensor.item

    def recorded_launch(self, grid, *args):  # every launch of the loss ops, interpreted or on a GPU
        events.append("launch")
        return call(self, grid, *args)

    def recorded_item(t):
        events.append("read")
        return item(t)

    monkeypatch.setattr(launcher.Launcher, "__call__", recorded_launch)
    monkeypatch.setattr(torch.Tensor, "item", recorded_item)
    return events
