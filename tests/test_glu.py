"""torch.ops.liger.swiglu, geglu and geglu_exact: values and gradients
against torch's own activations in float64, the float64 path exact, the
layouts a model hands them (separate projections, the halves of a fused
one), the plans, and errors for bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from csrc_free_ops.glu import launch, plan, reference
from tests.helpers import ALL_DTYPES, DEVICE, assert_close_to_ref, assert_glu_dgate_close, glu_dgate_term_scale

OPS = {"swiglu": "silu", "geglu": "gelu_tanh", "geglu_exact": "gelu"}
# torch's own activations: the ground truth, independent of reference.py's formulas.
TORCH_ACT = {"silu": F.silu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh"), "gelu": F.gelu}
LAYOUTS = ("contiguous", "fused_halves", "transposed", "strided_last", "expanded")


def op_of(name: str):
    return getattr(torch.ops.liger, name)


def make_pair(shape, gate_dtype, up_dtype, layout, device=DEVICE):
    """(gate, up) of ``shape`` in one of LAYOUTS; fused_halves: gate and up are
    ``proj.chunk(2, -1)`` of one (..., 2H) projection (up converted if its dtype differs)."""
    shape = tuple(shape)
    if layout == "fused_halves" and shape:
        proj = torch.randn((*shape[:-1], 2 * shape[-1]), device=device)
        gate, up = proj.to(gate_dtype).chunk(2, -1)
        return gate, (up if up_dtype == gate_dtype else proj.to(up_dtype).chunk(2, -1)[1])
    return tuple(_make(shape, dt, layout, device) for dt in (gate_dtype, up_dtype))


def _make(shape, dtype, layout, device=DEVICE):
    if layout in ("contiguous", "fused_halves") or not shape:
        return torch.randn(shape, device=device).to(dtype)
    if layout == "transposed":
        return torch.randn(shape[::-1], device=device).to(dtype).permute(*reversed(range(len(shape))))
    if layout == "strided_last":
        return torch.randn((*shape[:-1], 2 * shape[-1]), device=device).to(dtype)[..., ::2]
    if layout == "expanded":
        return torch.randn((1, *shape[1:]), device=device).to(dtype).expand(shape)
    raise ValueError(layout)


def torch_grads(activation, gate, up, dy):
    """y, (dgate, dup) by autograd through torch's activation, in float64."""
    g, u = (t.detach().double().requires_grad_() for t in (gate, up))
    y = TORCH_ACT[activation](g) * u
    return y.detach(), torch.autograd.grad(y, (g, u), dy.double())


shapes = st.tuples(st.lists(st.integers(1, 4), max_size=3), st.integers(1, 300)).map(lambda t: (*t[0], t[1]))


@settings(deadline=None, max_examples=40)
@given(
    name=st.sampled_from(sorted(OPS)),
    shape=shapes,
    gate_dtype=st.sampled_from(ALL_DTYPES),
    up_dtype=st.sampled_from(ALL_DTYPES),
    layout=st.sampled_from(LAYOUTS),
)
def test_forward_and_gradients_match_torch_in_float64(name, shape, gate_dtype, up_dtype, layout):
    """y in promote_types(gate, up), each gradient in its input's dtype, all against float64."""
    gate, up = make_pair(shape, gate_dtype, up_dtype, layout)
    gate, up = gate.requires_grad_(), up.requires_grad_()
    out_dtype = torch.promote_types(gate_dtype, up_dtype)
    dy = torch.randn(shape, device=DEVICE).to(out_dtype)

    y = op_of(name)(gate, up)
    dgate, dup = torch.autograd.grad(y, (gate, up), dy)

    y_ref, (dgate_ref, dup_ref) = torch_grads(OPS[name], gate, up, dy)
    assert y.dtype == out_dtype and y.shape == gate.shape and y.is_contiguous()
    assert (dgate.dtype, dup.dtype) == (gate_dtype, up_dtype)
    assert_close_to_ref(y, y_ref, out_dtype, "y")
    # each gradient rounded once to its dtype from float32 math (float64 when an input is float64); dgate's
    # act'(gate) cancels to 0 at one gate value, so its error is bounded by its terms
    assert_glu_dgate_close(dgate, dgate_ref, OPS[name], gate, up, dy)
    assert_close_to_ref(dup, dup_ref, up_dtype, "dup")


def test_dgate_where_silus_derivative_cancels_is_checked_against_its_terms():
    """A lone float32 gate near silu'(g) = 0 (g ~ -1.2785): dgate is 1e-4 or more off the float64
    reference relative to itself (any float32 s * (1 + g * (1 - s)) is), so the check is relative to its
    terms; an error of 1e-3 of the terms still fails it."""
    gate = torch.tensor([-1.2784], device=DEVICE)
    up, dy = torch.ones_like(gate), torch.ones_like(gate)
    dgate, _ = torch.ops.liger.swiglu_backward(dy, gate, up)
    _, (dgate_ref, _) = torch_grads("silu", gate, up, dy)
    assert ((dgate.double().cpu() - dgate_ref.cpu()).abs() / dgate_ref.abs().cpu()).item() > 1e-4
    assert_glu_dgate_close(dgate, dgate_ref, "silu", gate, up, dy)
    scale = glu_dgate_term_scale("silu", gate, up, dy)
    with pytest.raises(AssertionError, match="dgate: error norm"):
        assert_glu_dgate_close(dgate + 1e-3 * scale.float(), dgate_ref, "silu", gate, up, dy)


@pytest.mark.parametrize("name", sorted(OPS))
def test_float64_is_float64_throughout(name):
    """No float32 rounding on the float64 path, GELU's constants included:
    sqrt(2/pi) or 0.044715 rounded to float32 would put y ~1e-9 off."""
    gate = torch.linspace(-6, 6, 4001, dtype=torch.float64, device=DEVICE).reshape(1, -1)
    up = torch.randn_like(gate)
    dy = torch.randn_like(gate)
    y = op_of(name)(gate, up)
    dgate, dup = op_of(name + "_backward")(dy, gate, up)
    y_ref, (dgate_ref, dup_ref) = torch_grads(OPS[name], gate, up, dy)
    for got, want, what in ((y, y_ref, "y"), (dgate, dgate_ref, "dgate"), (dup, dup_ref, "dup")):
        assert got.dtype == torch.float64
        err = ((got.cpu() - want.cpu()).abs().max() / want.abs().max()).item()
        assert err <= 1e-14, f"{name} {what}: {err:.3e} of max|ref|"


@pytest.mark.parametrize("activation", sorted(TORCH_ACT))
def test_reference_closed_form_backward_matches_autograd_of_torch(activation):
    gate, up, dy = (torch.randn(7, 33, dtype=torch.float64) * 3 for _ in range(3))
    _, want = torch_grads(activation, gate, up, dy)
    got = reference.backward(dy, gate, up, activation)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-13)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the interpreter's numpy exp
@pytest.mark.parametrize("name", sorted(OPS))
def test_large_magnitudes_stay_finite(name):
    """exp overflows to inf for very negative gates: the sigmoid is then 0, never NaN."""
    gate = torch.tensor([[-1e4, -200.0, -90.0, -30.0, 0.0, 30.0, 90.0, 200.0, 1e4]], device=DEVICE)
    up = torch.full_like(gate, 1.5)
    dy = torch.ones_like(gate)
    y = op_of(name)(gate, up)
    dgate, dup = op_of(name + "_backward")(dy, gate, up)
    y_ref, (dgate_ref, dup_ref) = torch_grads(OPS[name], gate, up, dy)
    assert_close_to_ref(y, y_ref, torch.float32, "y")
    assert_close_to_ref(dgate, dgate_ref, torch.float32, "dgate")
    assert_close_to_ref(dup, dup_ref, torch.float32, "dup")


@pytest.mark.parametrize("name", sorted(OPS))
def test_fused_halves_are_read_in_place(name, monkeypatch):
    """The halves of a fused projection reach the kernel without a copy (row stride 2H)."""
    proj = torch.randn(6, 2 * 40, device=DEVICE)
    gate, up = proj.chunk(2, -1)
    seen = []
    real = launch._rows

    def rows(t, n_rows, n_cols):
        out = real(t, n_rows, n_cols)
        seen.append((out[0].data_ptr(), out[1]))
        return out

    monkeypatch.setattr(launch, "_rows", rows)
    y = launch.cuda_forward(gate, up, OPS[name])
    assert seen == [(gate.data_ptr(), 80), (up.data_ptr(), 80)]
    assert_close_to_ref(y, torch_grads(OPS[name], gate, up, torch.ones_like(gate))[0], torch.float32)


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_plan_writes_every_element(name):
    """One tile per program and a grid stride over the tiles, tiles wider and
    narrower than the rows: the launch sequence takes any Plan as data."""
    activation = OPS[name]
    proj = torch.randn(9, 2 * 37, device=DEVICE)
    for gate, up in (proj.chunk(2, -1), (proj[:, :37].contiguous(), proj[:, 37:].contiguous())):
        dy = torch.randn(gate.shape, device=DEVICE)
        y_ref, (dgate_ref, dup_ref) = torch_grads(activation, gate, up, dy)
        for p in (plan.Plan(4, 16, 3), plan.Plan(1, 64, 2), plan.Plan(2, 8, 1), plan.cuda(*launch.problem(gate, up))):
            assert_close_to_ref(launch.forward(gate, up, activation, p), y_ref, torch.float32, f"y {p}")
            dgate, dup = launch.backward(dy, gate, up, activation, p)
            assert_close_to_ref(dgate, dgate_ref, torch.float32, f"dgate {p}")
            assert_close_to_ref(dup, dup_ref, torch.float32, f"dup {p}")


def test_cuda_plan_one_tile_per_program():
    """Contiguous data is one row of every element; strided rows get tiles of whole rows."""
    assert launch.problem(torch.empty(4, 6, 10), torch.empty(4, 6, 10)) == (1, 240)
    assert launch.problem(*torch.empty(4, 6, 20).chunk(2, -1)) == (24, 10)
    p = plan.cuda(1, 10_000_000)
    assert (p.block_m, p.block_n, p.num_warps) == (1, plan.CUDA_BLOCK, plan.CUDA_WARPS)
    assert p.programs == -(-10_000_000 // plan.CUDA_BLOCK) and not p.walks_tiles(1, 10_000_000)
    p = plan.cuda(24, 10)
    assert (p.block_m, p.block_n) == (32, 16) and p.programs == 1
    p = plan.cuda(4096, 11008)
    assert (p.block_m, p.block_n) == (1, plan.CUDA_BLOCK) and p.programs == 4096 * 6


@pytest.mark.parametrize("name", sorted(OPS))
def test_empty_and_zero_dim(name):
    op = op_of(name)
    for shape in ((0, 5), (3, 0), ()):
        gate = torch.randn(shape, device=DEVICE, requires_grad=True)
        up = torch.randn(shape, device=DEVICE, requires_grad=True)
        y = op(gate, up)
        assert y.shape == gate.shape
        dgate, dup = torch.autograd.grad(y.sum(), (gate, up))
        assert dgate.shape == dup.shape == gate.shape
        if gate.numel():
            y_ref, (dgate_ref, dup_ref) = torch_grads(OPS[name], gate, up, torch.ones_like(gate))
            assert_close_to_ref(y, y_ref, torch.float32, "y")
            assert_close_to_ref(dgate, dgate_ref, torch.float32, "dgate")


@pytest.mark.parametrize("name", sorted(OPS))
def test_backward_is_bitwise_deterministic(name):
    gate, up, dy = (torch.randn(13, 70, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    first = op_of(name + "_backward")(dy, gate, up)
    second = op_of(name + "_backward")(dy, gate, up)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradcheck_and_gradgradcheck_in_float64(name):
    gate = torch.randn(3, 7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    up = torch.randn(3, 7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(op_of(name), (gate, up))
    assert torch.autograd.gradgradcheck(op_of(name), (gate, up))


def _t(*shape, dtype=torch.float32, device=DEVICE):
    return torch.ones(shape, dtype=dtype, device=device)


BAD_CALLS = [
    ("gate shape (2, 8) != up shape (2, 4)", lambda: (_t(2, 8), _t(2, 4))),
    ("gate shape (2, 8) != up shape (8,)", lambda: (_t(2, 8), _t(8))),
    ("gate must be float32, bfloat16, float16 or float64", lambda: (_t(2, 8, dtype=torch.int32), _t(2, 8))),
    ("up must be float32, bfloat16, float16 or float64", lambda: (_t(2, 8), _t(2, 8, dtype=torch.int64))),
    ("up is on", lambda: (_t(2, 8), _t(2, 8, device="meta"))),
]


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize(("message", "make_args"), BAD_CALLS)
def test_bad_input_raises_clear_error(name, message, make_args):
    pattern = f"liger.{name}: " + message.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises((ValueError, TypeError), match=pattern):
        op_of(name)(*make_args())


BAD_BACKWARD_CALLS = [
    ("grad_out shape", lambda: (_t(2, 9), _t(2, 8), _t(2, 8))),
    ("grad_out must be float32", lambda: (_t(2, 8, dtype=torch.int32), _t(2, 8), _t(2, 8))),
    ("grad_out is on", lambda: (_t(2, 8, device="meta"), _t(2, 8), _t(2, 8))),
    ("gate shape (2, 8) != up shape (2, 4)", lambda: (_t(2, 8), _t(2, 8), _t(2, 4))),
]


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize(("message", "make_args"), BAD_BACKWARD_CALLS)
def test_backward_op_validates_its_inputs(name, message, make_args):
    op = f"liger.{name}_backward: "
    with pytest.raises((ValueError, TypeError), match=op + message.replace("(", r"\(").replace(")", r"\)")):
        op_of(name + "_backward")(*make_args())


@pytest.mark.parametrize(("module", "name"), [("SwiGLUMLP", "swiglu"), ("GeGLUMLP", "geglu")])
def test_mlp_drop_in_matches_transformers_layout_and_gradients(module, name):
    import liger_nn

    torch.manual_seed(0)
    mlp = getattr(liger_nn, module)(16, 40).to(DEVICE, torch.float64)
    assert set(mlp.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    x = torch.randn(3, 5, 16, dtype=torch.float64, device=DEVICE)
    y = mlp(x)
    want = mlp.down_proj(TORCH_ACT[OPS[name]](mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(y.square().sum(), list(mlp.parameters()))
    expected = torch.autograd.grad(want.square().sum(), list(mlp.parameters()))
    for g, w in zip(got, expected, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_diffusers_geglu_drop_in_matches_its_layout_and_gradients():
    """liger_nn.GEGLU: diffusers' proj to [up | gate], then gelu(gate) * up with the exact GELU."""
    import liger_nn

    torch.manual_seed(0)
    module = liger_nn.GEGLU(16, 20).to(DEVICE, torch.float64)
    assert set(module.state_dict()) == {"proj.weight", "proj.bias"}
    x = torch.randn(3, 5, 16, dtype=torch.float64, device=DEVICE, requires_grad=True)
    y = module(x)
    up, gate = module.proj(x).chunk(2, dim=-1)
    want = up * F.gelu(gate)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(y.square().sum(), [x, *module.parameters()])
    expected = torch.autograd.grad(want.square().sum(), [x, *module.parameters()])
    for g, w in zip(got, expected, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="out_features must be even"):
        liger_nn.GEGLU.from_projection(torch.nn.Linear(4, 5))
