"""The gated MLPs' backward writes dgate and dup over the saved gate and up
projections when nothing else can reach them (registrations/reuse.py), and
never otherwise: a tensor the caller, a hook, a view, a retained graph or a
double backward still needs keeps its values.  The in-place backward ops
themselves: values, checks, version counters, opcheck."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import liger_nn
from csrc_free_ops.glu import reference
from registrations import reuse
from tests.helpers import ALL_DTYPES, DEVICE, OPCHECK_UTILS, assert_close_to_ref

OPS = {"swiglu": "silu", "geglu": "gelu_tanh", "geglu_exact": "gelu"}
MLPS = {"swiglu": liger_nn.SwiGLUMLP, "geglu": liger_nn.GeGLUMLP}
HIDDEN, INTERMEDIATE = 16, 40

# The reuse decision needs torch's use counts (every supported torch has them); the in-place ops do not.
needs_counts = pytest.mark.skipif(reuse.saved_temporary_holders() is None, reason="this torch exposes no use counts")


def _mlp(name: str, dtype=torch.float64):
    torch.manual_seed(0)
    return MLPS[name](HIDDEN, INTERMEDIATE, device=DEVICE, dtype=dtype)


def _reference_grads(mlp, name: str, x: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
    """Gradients of the MLP's parameters and x with the elementwise part in float64 PyTorch."""
    params = [p.detach().double().requires_grad_() for p in mlp.parameters()]
    x64 = x.detach().double().requires_grad_()
    w_gate, w_up, w_down = params
    h = reference.forward(x64 @ w_gate.T, x64 @ w_up.T, OPS[name])
    return list(torch.autograd.grad(h @ w_down.T, [*params, x64], dy.double()))


def _grads(mlp, x: torch.Tensor, dy: torch.Tensor, **backward) -> list[torch.Tensor]:
    mlp.zero_grad()
    x.grad = None
    mlp(x).backward(dy, **backward)
    return [p.grad.clone() for p in mlp.parameters()] + [x.grad.clone()]


def _gate_gradient_pointers(mlp):
    """(data pointers of the gate projection's outputs, of the gradients reaching them), recorded
    without holding either tensor."""
    outputs, grads = [], []

    def hook(module, args, out):
        outputs.append(out.data_ptr())
        out.register_hook(lambda g: grads.append(g.data_ptr()))

    return outputs, grads, mlp.gate_proj.register_forward_hook(hook)


@needs_counts
@pytest.mark.parametrize("name", sorted(MLPS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_mlp_backward_takes_the_projections_memory_and_stays_exact(name, dtype):
    mlp = _mlp(name, dtype)
    x = torch.randn(3, 5, HIDDEN, device=DEVICE, dtype=dtype, requires_grad=True)
    dy = torch.randn(3, 5, HIDDEN, device=DEVICE, dtype=dtype)
    outputs, grads, handle = _gate_gradient_pointers(mlp)
    got = _grads(mlp, x, dy)
    handle.remove()
    assert grads == outputs, "dgate was not written over the gate projection's memory"
    for g, want, what in zip(got, _reference_grads(mlp, name, x, dy), ("w_gate", "w_up", "w_down", "x"),
                             strict=True):  # fmt: skip
        assert_close_to_ref(g, want, dtype, what)


@pytest.mark.parametrize("name", sorted(MLPS))
def test_the_out_of_place_and_in_place_backwards_agree_bitwise(name):
    mlp = _mlp(name, torch.float32)
    x = torch.randn(4, HIDDEN, device=DEVICE, requires_grad=True)
    dy = torch.randn(4, HIDDEN, device=DEVICE)
    in_place = _grads(mlp, x, dy)
    held = []  # holding the projections' outputs makes the backward allocate its gradients
    handle = mlp.gate_proj.register_forward_hook(lambda m, a, out: held.append(out))
    out_of_place = _grads(mlp, x, dy)
    handle.remove()
    for a, b in zip(in_place, out_of_place, strict=True):
        assert torch.equal(a, b)


def _keeps_values(name: str, run) -> None:
    """run(mlp, x, dy) returns tensors it kept from the forward (and their values then); after the
    backward each still holds them, and the gradients are the reference's."""
    mlp = _mlp(name)
    x = torch.randn(2, 7, HIDDEN, device=DEVICE, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 7, HIDDEN, device=DEVICE, dtype=torch.float64)
    kept, before, got = run(mlp, x, dy)
    for t, b in zip(kept, before, strict=True):
        assert torch.equal(t, b), "a tensor someone still held was overwritten by the backward"
    for g, want in zip(got, _reference_grads(mlp, name, x, dy), strict=True):
        assert_close_to_ref(g, want, torch.float64)


def _caller_holds_gate(mlp, x, dy):
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    before = gate.detach().clone()
    out = mlp.down_proj(liger_nn.swiglu(gate, up) if isinstance(mlp, liger_nn.SwiGLUMLP) else liger_nn.geglu(gate, up))
    got = torch.autograd.grad(out, [*mlp.parameters(), x], dy)
    return [gate], [before], got


def _kept_by_a_forward_hook(name: str, projection: str, take):
    """A run in which a forward hook on ``projection`` keeps ``take(its output)``."""

    def run(mlp, x, dy):
        kept = []
        handle = getattr(mlp, projection).register_forward_hook(lambda m, a, out: kept.append(take(out)))
        y = mlp(x)
        handle.remove()
        before = [t.detach().clone() for t in kept]
        return kept, before, torch.autograd.grad(y, [*mlp.parameters(), x], dy)

    run.__name__ = name
    return run


_hook_keeps_output = _kept_by_a_forward_hook("_hook_keeps_output", "up_proj", lambda out: out)
_view_of_gate_held = _kept_by_a_forward_hook("_view_of_gate_held", "gate_proj", lambda out: out[..., :3])


def _saved_tensor_hook_keeps(mlp, x, dy):
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (kept.append(t), t)[1], lambda t: t):
        y = mlp(x)
    before = [t.detach().clone() for t in kept]
    return kept, before, torch.autograd.grad(y, [*mlp.parameters(), x], dy)


def _retained_graph_twice(mlp, x, dy):
    y = mlp(x)
    first = torch.autograd.grad(y, [*mlp.parameters(), x], dy, retain_graph=True)
    second = torch.autograd.grad(y, [*mlp.parameters(), x], dy)
    return list(first), [f.clone() for f in first], second


def _double_backward(mlp, x, dy):
    y = mlp(x)
    grads = torch.autograd.grad(y, [*mlp.parameters(), x], dy, create_graph=True)
    # the graph of the gradients still reads the saved projections
    (gx,) = torch.autograd.grad(grads[-1].square().sum(), x)
    ref_x = x.detach().requires_grad_()
    w_gate, w_up, w_down = (p.detach() for p in mlp.parameters())
    act = OPS["swiglu" if isinstance(mlp, liger_nn.SwiGLUMLP) else "geglu"]
    h = reference.forward(ref_x @ w_gate.T, ref_x @ w_up.T, act)
    (rx,) = torch.autograd.grad(h @ w_down.T, ref_x, dy, create_graph=True)
    (ref_gx,) = torch.autograd.grad(rx.square().sum(), ref_x)
    assert_close_to_ref(gx, ref_gx, torch.float64, "second-order gradient")
    return [], [], [g.detach() for g in grads]


def _checkpointed(mlp, x, dy):
    y = checkpoint(mlp, x, use_reentrant=False)
    return [], [], torch.autograd.grad(y, [*mlp.parameters(), x], dy)


@pytest.mark.parametrize("name", sorted(MLPS))
@pytest.mark.parametrize(
    "run",
    [_caller_holds_gate, _hook_keeps_output, _view_of_gate_held, _saved_tensor_hook_keeps, _retained_graph_twice,
     _double_backward, _checkpointed],
    ids=lambda f: f.__name__.strip("_"),
)  # fmt: skip
def test_a_tensor_still_needed_is_never_overwritten(name, run):
    _keeps_values(name, run)


@needs_counts
def test_the_decision_holds_after_torch_compile_has_run_in_the_process():
    """Dynamo's frame-evaluation hook, installed once torch.compile has run (here: a compile error),
    adds references to every call's arguments; the counts must not move with it, either way."""
    from torch._dynamo.exc import TorchRuntimeError

    compiled = torch.compile(lambda *a: torch.ops.liger.rms_norm(*a), fullgraph=True)
    with pytest.raises(TorchRuntimeError):
        compiled(torch.randn(4, 8, device=DEVICE), torch.randn(9, device=DEVICE), 1e-6)
    test_mlp_backward_takes_the_projections_memory_and_stays_exact("swiglu", torch.float32)
    _keeps_values("swiglu", _caller_holds_gate)
    _keeps_values("swiglu", _hook_keeps_output)


# --- The in-place backward ops


def _in_place(name):
    return getattr(torch.ops.liger, name + "_backward_").default


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_in_place_backward_matches_the_reference(name, dtype):
    gate = torch.randn(3, 129, device=DEVICE).to(dtype)
    up = torch.randn(3, 129, device=DEVICE).to(dtype)
    dy = torch.randn(3, 129, device=DEVICE).to(dtype)[:, :]
    dgate_ref, dup_ref = reference.backward(dy.double(), gate.double(), up.double(), OPS[name])
    _in_place(name)(dy, gate, up)
    assert_close_to_ref(gate, dgate_ref, dtype, "dgate")
    assert_close_to_ref(up, dup_ref, dtype, "dup")


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize(
    ("message", "make_args"),
    [
        ("gate must be contiguous", lambda r: (r(4, 6), r(6, 4).T, r(4, 6))),
        ("gate and up overlap", lambda r: (lambda t: (r(4, 6), t, t))(r(4, 6))),
        ("grad_out and up overlap", lambda r: (lambda t: (t, r(4, 6), t))(r(4, 6))),
        ("gate shape", lambda r: (r(4, 6), r(4, 6), r(4, 5))),
    ],
)
def test_in_place_backward_refuses_what_it_would_corrupt(name, message, make_args):
    # Made on the device: a copy per argument would part the tensors an overlap case shares.
    args = make_args(lambda *size: torch.randn(*size, device=DEVICE))
    with pytest.raises(ValueError, match=message):
        _in_place(name)(*args)


@pytest.mark.parametrize("name", sorted(OPS))
def test_in_place_backward_bumps_versions_and_has_no_gradient(name):
    gate, up, dy = (torch.randn(4, 6, device=DEVICE) for _ in range(3))
    versions = gate._version, up._version
    _in_place(name)(dy, gate, up)
    assert (gate._version, up._version) == (versions[0] + 1, versions[1] + 1)
    with pytest.raises(NotImplementedError, match=f"liger.{name}_backward_ is not differentiable"):
        _in_place(name)(dy, gate.requires_grad_(), up)


@pytest.mark.parametrize("name", sorted(OPS))
def test_in_place_backward_opcheck(name):
    gate, up, dy = (torch.randn(3, 24, device=DEVICE) for _ in range(3))
    torch.library.opcheck(_in_place(name), (dy, gate, up), test_utils=OPCHECK_UTILS)
