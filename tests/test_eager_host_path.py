"""The eager host path does per call only what a call must: after the first
call with a signature, a plain eager call makes no more Python calls than a
bare autograd.Function with one allocation per direction, plus a fixed few
(the signature key, the prepared run, the launches), and never re-runs the
check, the plan or the launch sequence's general path.  On the CPU,
launches through Triton are stubbed, so the counts are host work alone; on a
GPU the direct launch of a prepared call runs and is counted with them."""

from __future__ import annotations

import gc
import sys
from collections import Counter

import pytest
import torch

from csrc_free_ops import launcher
from registrations.autograd import c_apply
from registrations.eager import eager_call
from tests.helpers import DEVICE

# Python calls a plain call may make beyond the bare Function's (forward; forward and backward),
# on the CPU path (rope's include the position check a CPU binding makes on every call).  The bare
# Function is applied through the C-level apply: what Function.apply is from torch 2.14 on, and
# what a plain call takes on older torch, whose Function.apply adds a Python layer around it.
EXTRA_FORWARD = 16
EXTRA_FORWARD_BACKWARD = 28
# Work that depends only on the signature: seen on the first call, never again.
ONCE_PER_SIGNATURE = ("_check", "_check_backward", "cuda", "_cuda_plan", "forward", "backward", "_launch")


def _python_calls(step) -> Counter:
    """The Python calls of one call of step, after a first one.  The garbage collector is off while they
    are counted: a collection would run the finalizers of whatever earlier tests in this process left
    behind (which tests those are varies with xdist's file placement), and count their calls as ours."""
    step()  # the signature's first call prepares it
    seen: Counter = Counter()

    def profile(frame, event, arg):
        if event == "call":
            seen[(frame.f_code.co_filename, frame.f_code.co_name)] += 1

    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
        gc.enable()
    return seen


class _Floor(torch.autograd.Function):
    """The bare Function: one allocation per output in each direction."""

    @staticmethod
    def forward(ctx, x, *params):
        ctx.n_params = len(params)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        return torch.empty_like(dy), *(None,) * ctx.n_params


def _cases():
    x = torch.randn(4, 64, device=DEVICE, requires_grad=True)
    w = torch.randn(3, device=DEVICE, requires_grad=True)
    b = torch.randn(1, device=DEVICE, requires_grad=True)
    poly_norm = eager_call(torch.ops.liger.poly_norm)
    yield "poly_norm", (lambda: poly_norm(x, w, b, 1e-6)), (x, w, b)
    gx = torch.randn(2, 8, 16, device=DEVICE, requires_grad=True)
    gw = torch.randn(8, device=DEVICE, requires_grad=True)
    gb = torch.randn(8, device=DEVICE, requires_grad=True)
    group_norm = eager_call(torch.ops.liger.group_norm)
    yield "group_norm", (lambda: group_norm(gx, 4, gw, gb, 1e-5)), (gx, gw, gb)
    q = torch.randn(1, 4, 16, 64, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 2, 16, 64, device=DEVICE, requires_grad=True)
    cos, sin = torch.randn(1, 16, 64, device=DEVICE), torch.randn(1, 16, 64, device=DEVICE)
    rope = eager_call(torch.ops.liger.rope)
    yield "rope", (lambda: rope(q, k, cos, sin)[0]), (q, k)
    h = torch.randn(64, device=DEVICE, requires_grad=True)
    hb = torch.randn(64, device=DEVICE, requires_grad=True)
    rms_norm = eager_call(torch.ops.liger.rms_norm)
    yield "rms_norm", (lambda: rms_norm(x, h, 1e-6)), (x, h)
    layer_norm = eager_call(torch.ops.liger.layer_norm)
    yield "layer_norm", (lambda: layer_norm(x, h, hb, 1e-5)), (x, h, hb)
    gate = torch.randn(4, 64, device=DEVICE, requires_grad=True)
    for name in ("swiglu", "geglu", "geglu_exact"):
        glu = eager_call(getattr(torch.ops.liger, name))
        yield name, (lambda glu=glu: glu(gate, x)), (gate, x)
    # the halves of one fused projection (diffusers' GEGLU, Phi-3), read in place through their row stride
    up_half, gate_half = torch.randn(4, 128, device=DEVICE, requires_grad=True).chunk(2, -1)
    geglu_exact = eager_call(torch.ops.liger.geglu_exact)
    yield "geglu_exact halves", (lambda: geglu_exact(gate_half, up_half)), (gate_half, up_half)


@pytest.fixture
def stubbed_launches(monkeypatch):
    monkeypatch.setattr(launcher.Launcher, "_launch_by_triton", lambda self, grid, args: None)


def _count(calls: Counter) -> int:
    return sum(calls.values())


def _forward_backward(forward, inputs):
    def step():
        y = forward()
        return torch.autograd.grad(y, inputs, torch.ones_like(y), allow_unused=True)

    return step


@pytest.mark.parametrize("case", list(_cases()), ids=lambda c: c[0])
def test_a_plain_call_costs_a_bare_function_and_a_fixed_few(case, stubbed_launches):
    _, call, inputs = case

    apply = c_apply(_Floor)

    def floor():
        return apply(*inputs)

    counts = {}
    for name, ours, bare, extra in (
        ("forward", call, floor, EXTRA_FORWARD),
        ("forward and backward", _forward_backward(call, inputs), _forward_backward(floor, inputs),
         EXTRA_FORWARD_BACKWARD),
    ):  # fmt: skip
        calls = _python_calls(ours)
        repeated = [fn for (_, fn) in calls if fn in ONCE_PER_SIGNATURE]
        assert not repeated, f"{name}: per-signature work repeated on a prepared call: {repeated}"
        counts[name] = (sum(calls.values()), sum(_python_calls(bare).values()))
        assert counts[name][0] <= counts[name][1] + extra, (name, counts[name], calls)


def test_in_place_rope_runs_its_prepared_rotation(stubbed_launches):
    """rope_ as liger_nn calls it on a model's fresh projections: recorded on their bases by the
    direct kernel, without the dispatcher's Autograd kernel, and no per-signature work repeated."""
    x = torch.randn(1, 4, 16, 64, device=DEVICE, requires_grad=True)
    y = torch.randn(1, 2, 16, 64, device=DEVICE, requires_grad=True)
    cos, sin = torch.randn(1, 16, 64, device=DEVICE), torch.randn(1, 16, 64, device=DEVICE)
    rope_ = eager_call(torch.ops.liger.rope_)

    def step():
        q, k = x * 1.0, y * 1.0
        rope_(q, k, cos, sin)
        return torch.autograd.grad(q.sum() + k.sum(), (x, y))

    calls = _python_calls(step)
    names = {fn for _, fn in calls}
    assert "_rope_inplace_direct" in names and "_rope_inplace_autograd" not in names, names
    # (the recording Function's own forward and backward run on every call)
    repeated = [fn for (file, fn) in calls if fn in ONCE_PER_SIGNATURE and not file.endswith("rope_inplace.py")]
    assert not repeated, repeated


def test_the_count_leaves_out_what_a_garbage_collection_runs():
    """Cycles with finalizers left by earlier code must not add their calls to a step's count (the swiglu
    count once read 58 for 56 where xdist had placed other files before this one)."""

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            pass

    def step():
        for _ in range(20):
            Cycle()  # garbage at once, in the youngest generation

    threshold = gc.get_threshold()
    gc.set_threshold(1)  # a collection at every few allocations, were the collector on
    try:
        calls = _python_calls(step)
    finally:
        gc.set_threshold(*threshold)
        gc.collect()
    assert calls[(__file__, "__init__")] == 20 and not [fn for (_, fn) in calls if fn == "__del__"]
