"""Under torch.compile, AOTAutograd decomposes a liger op on CUDA tensors of
concrete sizes into its entry's allocations and Triton kernels
(registrations/_library.py), so Inductor launches them from its generated
code; everywhere else the op stays one opaque node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from registrations import _library, decompose
from tests.helpers import assert_close_to_ref

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()


@pytest.mark.skipif(CUDA, reason="on a GPU the compiled tests below run the decomposed graphs")
def test_traced_graph_holds_the_kernels_and_no_liger_op():
    """Fake CUDA tensors and the compiled (not interpreted) kernels, in a
    fresh process: every op and backward op becomes kernel wrapper nodes;
    with the decomposition off they stay liger ops."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "tests.decomposition_check"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # group_norm x2 (1 launch each), its backward x2 (1 each: one program writes the parameter grads),
    # poly_norm 1, its backward 1 (direct grads), rope x2, rope_backward 1.
    assert found["decomposed"] == {"liger": [], "kernels": 9}
    # group_norm 1 + its backward 2, poly_norm's backward 2 (partials, then their reduction), rope 4 calls
    assert found["larger"] == {"liger": [], "kernels": 9}
    # the fused loss's three ops stay opaque (their chunk walks sum in place); cross_entropy is 1 launch
    assert found["losses"] == {
        "liger": [
            "liger.fused_linear_cross_entropy.default", "liger.fused_linear_cross_entropy_backward.default",
            "liger.fused_linear_cross_entropy_with_grads.default",
        ],
        "kernels": 1,
    }  # fmt: skip
    # the row norms (a hidden size and a wide, column-blocked row) and the gated MLP, each direction
    assert found["row_norms_and_glu"]["liger"] == [] and found["row_norms_and_glu"]["kernels"] >= 12
    # A launch that writes into part of a larger buffer becomes a clone and a scatter back per launch:
    # the compiled Llama step's illegal access was Inductor reading past such a clone's end.
    assert found["views_written"] == []
    # decomposition("math"): the references' torch ops, which Inductor fuses, and no kernel of ours
    assert found["math"] == {"liger": [], "kernels": 0}
    opaque = found["opaque"]
    assert opaque["kernels"] == 0
    assert sorted(set(opaque["liger"])) == [
        "liger.group_norm.default", "liger.group_norm_backward.default", "liger.poly_norm.default",
        "liger.poly_norm_backward.default", "liger.rope.default", "liger.rope_backward.default",
    ]  # fmt: skip


def test_symbolic_sizes_keep_the_op_opaque():
    """The plans compute on plain ints: a call with a symbolic size is not decomposed."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = mode.from_tensor(torch.randn(4, 8), symbolic_context=dynamic)
    assert isinstance(x.shape[0], torch.SymInt)
    assert not decompose._concrete((x, 4, None, None, 1e-5))
    assert not decompose._concrete((torch.randn(4, 8), 4))  # a CPU tensor: the interpreter's kernels stay opaque


needs_cuda = pytest.mark.skipif(not CUDA, reason="the decomposed graph runs Triton kernels on a GPU")


def _group_norm_block(x, weight, bias):
    for _ in range(2):
        x = torch.nn.functional.silu(torch.ops.liger.group_norm(x, 4, weight, bias, 1e-5))
    return x


class _Rounded(torch.autograd.Function):
    """x rounded to ``dtype`` and back to float64; its gradient likewise."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.to(dtype).double()

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype).double(), None


def _compiled_code(fn, *args, **compile_kwargs):
    """fn compiled (fullgraph), run on args; then, where args require grad, the gradients of a
    square loss over its outputs (AOTAutograd's compiled backward).  Returns (outputs and
    gradients, the generated code of forward and backward)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, **compile_kwargs)
    wrt = tuple(a for a in args if isinstance(a, torch.Tensor) and a.requires_grad)

    def run():
        out = compiled(*args)
        outs = out if isinstance(out, tuple) else (out,)
        if not wrt:
            return outs
        return (*outs, *torch.autograd.grad(sum(o.float().square().sum() for o in outs), wrt))

    out, code = run_and_get_code(run)
    return out, "\n".join(code)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_group_norm_runs_its_kernels_from_inductor(dtype):
    from csrc_free_ops.group_norm import reference

    x = torch.randn(2, 16, 8, 8, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(16, device="cuda", requires_grad=True)
    b = torch.randn(16, device="cuda", requires_grad=True)

    out, code = _compiled_code(_group_norm_block, x, w, b)
    assert "torch.ops.liger." not in code

    def ref(x, w, b):
        # The activations between the layers, and their gradient, rounded to x's dtype as the compiled
        # graph stores them: each layer is judged on its own error, not on the first one's rounding
        # amplified by the second's normalization.
        x = _Rounded.apply(torch.nn.functional.silu(reference.forward(x, 4, w, b, 1e-5)), dtype)
        return torch.nn.functional.silu(reference.forward(x, 4, w, b, 1e-5))

    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    y = ref(xd, wd, bd)
    expected = (y, *torch.autograd.grad(y.square().sum(), (xd, wd, bd)))
    for got, want in zip(out, expected, strict=True):
        assert_close_to_ref(got, want, dtype)


@needs_cuda
def test_decomposition_off_and_dynamic_sizes_keep_the_opaque_op():
    x = torch.randn(2, 16, 8, 8, device="cuda")
    w, b = torch.randn(16, device="cuda"), torch.randn(16, device="cuda")
    eager = _group_norm_block(x, w, b)
    with _library.decomposition(False):
        out, code = _compiled_code(_group_norm_block, x, w, b)
    assert "torch.ops.liger.group_norm" in code
    torch.testing.assert_close(out[0], eager)
    out, code = _compiled_code(_group_norm_block, x, w, b, dynamic=True)
    assert "torch.ops.liger.group_norm" in code
    torch.testing.assert_close(out[0], eager)


@needs_cuda
def test_compiled_poly_norm_and_rope_run_their_kernels_from_inductor():
    from csrc_free_ops.poly_norm import reference as poly_ref
    from csrc_free_ops.rope import reference as rope_ref

    h = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    pw = torch.randn(3, device="cuda", requires_grad=True)
    pb = torch.randn(1, device="cuda", requires_grad=True)
    q = torch.randn(2, 4, 32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, 32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cos, sin = torch.randn(32, 64, device="cuda"), torch.randn(32, 64, device="cuda")

    def step(h, pw, pb, q, k):
        return (torch.ops.liger.poly_norm(h, pw, pb, 1e-6), *torch.ops.liger.rope(q, k, cos, sin))

    out, code = _compiled_code(step, h, pw, pb, q, k)
    assert "torch.ops.liger." not in code

    hd, pwd, pbd, qd, kd = (t.detach().double().requires_grad_() for t in (h, pw, pb, q, k))
    z = poly_ref.forward(hd, pwd, pbd, 1e-6)
    qo, ko = rope_ref.forward(qd, kd, cos.double(), sin.double())
    loss = z.square().sum() + qo.square().sum() + ko.square().sum()
    expected = (z, qo, ko, *torch.autograd.grad(loss, (hd, pwd, pbd, qd, kd)))
    for got, want in zip(out, expected, strict=True):
        assert_close_to_ref(got, want, torch.bfloat16)


@needs_cuda
def test_math_decomposition_compiles_the_references_of_the_llm_ops():
    """decomposition("math"): Inductor's code holds neither the ops nor their kernels, and the results
    are the ops' own, judged against the same ops in float64."""
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(256, device="cuda", requires_grad=True)
    gate = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    up = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q = torch.randn(2, 4, 32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cos, sin = torch.randn(32, 64, device="cuda"), torch.randn(32, 64, device="cuda")

    def step(x, w, gate, up, q):
        normed = torch.ops.liger.rms_norm(x, w, 1e-6)
        return normed, torch.ops.liger.swiglu(gate, up), torch.ops.liger.rope(q, None, cos, sin)[0]

    with _library.decomposition("math"):
        out, code = _compiled_code(step, x, w, gate, up, q)
    assert "torch.ops.liger." not in code
    ours = (
        "fwd_tile_kernel",
        "fwd_blocked_kernel",
        "bwd_tile_kernel",
        "def fwd_kernel",
        "def bwd_kernel",
        "rope_kernel",
    )
    assert not [name for name in ours if name in code]

    args64 = [t.detach().double().requires_grad_() for t in (x, w, gate, up, q)]
    cos, sin = cos.double(), sin.double()
    outs64 = step(*args64)
    loss = sum(o.square().sum() for o in outs64)
    expected = (*outs64, *torch.autograd.grad(loss, args64))
    for got, want in zip(out, expected, strict=True):
        assert_close_to_ref(got, want, torch.bfloat16)


def test_decomposition_names_its_ways():
    with pytest.raises(ValueError, match="choose 1 .*math.* or 0"):
        with _library.decomposition("reference"):
            pass


@needs_cuda
def test_export_keeps_the_op():
    """An exported program stays serializable: the op is not decomposed into kernels."""
    import liger_nn

    module = liger_nn.GroupNorm(4, 16).cuda()
    program = torch.export.export(module, (torch.randn(2, 16, 8, 8, device="cuda"),))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert "liger.group_norm.default" in targets
    assert not any("triton_kernel_wrapper" in t for t in targets)
