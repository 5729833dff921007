"""torch.ops.liger.rms_norm: values and gradients against a float64
expectation in both casting modes, with an offset and without a weight; the
tile and column-blocked kernels; determinism; errors for bad input; the
transformers conventions it stands in for (Llama, Gemma, Qwen3's q/k norms,
OLMo2)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from csrc_free_ops.rms_norm import launch, plan
from csrc_free_ops.rms_norm.launch import RowNorm
from csrc_free_ops.rms_norm.options import Options
from tests.helpers import ALL_DTYPES, DEVICE, OPCHECK_UTILS, assert_close_to_ref
from tests.row_norm_cases import assert_matches, expected

SMALL_H = st.integers(1, 300)
# Rows the backward column-blocks (the forward holds them whole), and rows both directions column-block.
BLOCKED_H = st.one_of(
    st.integers(plan.MAX_ROW_BLOCK[True] + 1, plan.MAX_ROW_BLOCK[True] + 300),
    st.integers(plan.MAX_ROW_BLOCK[False] + 1, plan.MAX_ROW_BLOCK[False] + 300),
)
MODES = [("llama", 0.0), ("gemma", 1.0), ("gemma", 0.0), ("llama", 0.5)]


def _call(x, weight, dy, eps, offset, mode):
    y = torch.ops.liger.rms_norm(x, weight, eps, offset=offset, casting_mode=mode)
    leaves = [t for t in (x, weight) if t is not None]
    grads = iter(torch.autograd.grad(y, leaves, dy))
    return y, (next(grads), next(grads) if weight is not None else None, None)


@settings(max_examples=16, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), max_size=3),
    h=st.one_of(SMALL_H, SMALL_H, SMALL_H, SMALL_H, BLOCKED_H),
    dtype=st.sampled_from(ALL_DTYPES),
    param_dtype=st.sampled_from((*ALL_DTYPES, None)),
    mode=st.sampled_from(MODES),
    transposed=st.booleans(),
    eps=st.sampled_from([1e-6, 1e-5, 0.1]),
)
def test_forward_and_gradients_match_float64(lead, h, dtype, param_dtype, mode, transposed, eps):
    """Any data dtype, parameters of any dtype or none (fp32 master weights
    under bf16 activations), both casting modes, with and without offset."""
    shape = (*lead, h)
    x = torch.randn(shape[::-1], dtype=dtype, device=DEVICE).permute(*reversed(range(len(shape))))
    if not transposed:  # else every stride reversed: the last dim is not innermost
        x = x.contiguous()
    x.requires_grad_()
    casting, offset = mode
    weight = None if param_dtype is None else torch.randn(h, dtype=param_dtype, device=DEVICE).requires_grad_()
    offset = offset if weight is not None else 0.0
    dy = torch.randn(shape, dtype=dtype, device=DEVICE)
    y, grads = _call(x, weight, dy, eps, offset, casting)
    assert_matches(y, grads, x, weight, None, dy, eps, offset, round_normed=casting == "llama")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float64_uses_eps_and_offset_exactly(dtype):
    """eps and offset reach the kernels as constexprs, so a float64 kernel
    adds them unrounded: 0.1 and 1/3 are not float32 numbers, and with
    x ~ 1e-4 the eps term decides the result.  float32 at float32's bound."""
    x = torch.randn(6, 40, dtype=dtype, device=DEVICE) * 1e-4
    weight = torch.randn(40, dtype=dtype, device=DEVICE)
    dy = torch.randn_like(x)
    y = torch.ops.liger.rms_norm(x, weight, 1e-7 / 3, offset=1 / 3, casting_mode="gemma")
    dx, dw = torch.ops.liger.rms_norm_backward(dy, x, weight, 1e-7 / 3, offset=1 / 3, casting_mode="gemma")
    y_ref, (dx_ref, dw_ref, _) = expected(x, weight, None, dy, 1e-7 / 3, 1 / 3)
    bound = 1e-13 if dtype == torch.float64 else 1e-5
    for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
        err = ((got.double().cpu() - ref.cpu()).abs().max() / ref.abs().max()).item()
        assert err <= bound, (dtype, err)


def _ulps_fp16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of b's last float16 place (normal range)."""
    ulp = torch.ldexp(torch.ones_like(b.float()), torch.frexp(b.float()).exponent - 11)
    return (a.float() - b.float()).abs() / ulp


def test_llama_and_gemma_casting_as_transformers_writes_them():
    """transformers' LlamaRMSNorm and GemmaRMSNorm formulas on half x and
    weight: within one float16 place everywhere (the kernel's float32 rsqrt
    may differ from torch's in its last bit), and the two modes differ.
    float16, not bfloat16: the CPU interpreter truncates float32 to bfloat16
    where a GPU rounds to nearest."""
    torch.manual_seed(0)
    x = torch.randn(8, 256, dtype=torch.float16, device=DEVICE) * 3
    w = torch.randn(256, dtype=torch.float16, device=DEVICE)
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
    llama = w * normed.to(torch.float16)
    gemma = (normed * (1.0 + w.float())).to(torch.float16)
    got_llama = torch.ops.liger.rms_norm(x, w, 1e-6)
    got_gemma = torch.ops.liger.rms_norm(x, w, 1e-6, offset=1.0, casting_mode="gemma")
    assert _ulps_fp16(got_llama, llama).max() <= 1 and _ulps_fp16(got_gemma, gemma).max() <= 1
    assert (got_llama == llama).float().mean() > 0.99
    assert not torch.equal(torch.ops.liger.rms_norm(x, w + 1, 1e-6), got_gemma)  # llama rounds normed(x) first


def test_qwen3_per_head_norm_over_head_dim():
    """(B, S, heads, head_dim) projections normalised over head_dim, as Qwen3's q_norm/k_norm."""
    x = torch.randn(2, 5, 4, 64, device=DEVICE, dtype=torch.bfloat16).requires_grad_()
    w = torch.randn(64, device=DEVICE, requires_grad=True)
    dy = torch.randn_like(x)
    y, grads = _call(x, w, dy, 1e-6, 0.0, "llama")
    assert_matches(y, grads, x, w, None, dy, 1e-6, round_normed=True)


@pytest.mark.parametrize("n_cols", [50, plan.MAX_ROW_BLOCK[True] + 5, plan.MAX_ROW_BLOCK[False] + 5])
def test_backward_is_bitwise_deterministic(n_cols):
    x = torch.randn(23, n_cols, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(n_cols, device=DEVICE)
    dy = torch.randn_like(x)
    first = torch.ops.liger.rms_norm_backward(dy, x, w, 1e-6)
    second = torch.ops.liger.rms_norm_backward(dy, x, w, 1e-6)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("programs", [1, 3, 7])
@pytest.mark.parametrize("whole_rows", [True, False])
def test_plans_through_the_launch_sequence(programs, whole_rows, dtype):
    """The launch sequence takes any Plan as data: several row blocks per
    program (the grid-stride forward and the partials' reduction), one
    program writing the gradients itself, and the column-blocked kernels
    on rows they would not get by size (their backward takes the squares
    in its sums' pass: float64 at float64's bound)."""
    x = torch.randn(13, 200, device=DEVICE, dtype=dtype)
    w = torch.randn(200, device=DEVICE, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    p = plan.Plan(whole_rows, 4 if whole_rows else 1, 256 if whole_rows else 64, programs, None, 1)
    norm = RowNorm.rms(Options(1e-6, 1.0, "gemma"))
    y = launch.forward(x, w, None, norm, p)
    dx, dw, db = launch.backward(dy, x, w, None, norm, p)
    assert db is None
    assert_matches(y, (dx, dw, None), x, w, None, dy, 1e-6, 1.0)


def test_plans():
    p = plan.cuda(10000, 128, False, 132, 2)
    assert p.whole_rows and p.block_m * p.block_n == plan.TILE_ELEMENTS and not p.walks_row_blocks(10000)
    b = plan.cuda(16384, 4096, True, 132, 2)
    assert b.programs == 132 * plan.BWD_PROGRAMS_PER_SM and b.loop_stages == plan.BWD_LOOP_STAGES
    assert plan.cuda(5, 40, True, 132, 2).programs == 1
    for backward in (False, True):
        widest = plan.MAX_ROW_BLOCK[backward]
        assert plan.cuda(2048, widest, backward, 132, 2).whole_rows
        assert not plan.cuda(4, widest + 1, backward, 132, 2).whole_rows
    assert plan.cuda(2048, 8192, True, 132, 2).num_warps == plan.WIDE_WARPS


@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("n_cols", [1024, 4096, 8192, 16384])
def test_backward_staging_fits_a_blocks_shared_memory(n_cols, itemsize):
    """The pipelined backward stages (stages - 1) tiles of x and of dy in shared memory; a plan asking more
    than a block may have fails to launch (float64 rows of 8192 would ask 256 KiB)."""
    p = plan.cuda(2048, n_cols, True, 132, itemsize)
    staged = 2 * (p.loop_stages - 1) * p.block_m * p.block_n * itemsize
    assert staged <= plan.BWD_PIPELINE_BYTES < 227 * 1024
    assert p.loop_stages == (1 if n_cols * itemsize > 32 * 1024 else plan.BWD_LOOP_STAGES)
    npu = plan.npu(5000, 1024, 2, False, 192 * 1024, 40)
    assert npu.num_warps is None and npu.programs <= 40 and npu.walks_row_blocks(5000)


def test_zero_rows():
    x = torch.randn(0, 3, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(8, device=DEVICE, requires_grad=True)
    y = torch.ops.liger.rms_norm(x, w)
    dx, dw = torch.autograd.grad(y.sum(), (x, w))
    assert y.shape == x.shape and dx.shape == x.shape and torch.equal(dw, torch.zeros_like(dw))


def test_nan_propagates():
    x = torch.randn(3, 16, device=DEVICE)
    x[1, 4] = float("nan")
    y = torch.ops.liger.rms_norm(x, torch.ones(16, device=DEVICE))
    assert torch.isnan(y[1]).all() and torch.isfinite(y[0]).all() and torch.isfinite(y[2]).all()


def test_gradcheck_and_gradgradcheck_in_float64():
    x = torch.randn(3, 7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    for mode, offset in (("llama", 0.0), ("gemma", 1.0)):

        def fn(x, w, mode=mode, offset=offset):
            return torch.ops.liger.rms_norm(x, w, 1e-5, offset=offset, casting_mode=mode)

        assert torch.autograd.gradcheck(fn, (x, w))
        assert torch.autograd.gradgradcheck(fn, (x, w))


def _x():
    return torch.randn(2, 8, device=DEVICE)


def _t(*shape, dtype=torch.float32, device=DEVICE):
    return torch.ones(shape, dtype=dtype, device=device)


BAD_CALLS = [
    ("weight must have shape (8,)", lambda: ((_x(), _t(7)), {})),
    ("weight must have shape (8,)", lambda: ((_x(), _t(1, 8)), {})),
    ("weight must be float32, bfloat16, float16 or float64", lambda: ((_x(), _t(8, dtype=torch.int32)), {})),
    ("weight is on", lambda: ((_x(), _t(8, device="meta")), {})),
    ("non-empty last dimension", lambda: ((_t(4, 0), None), {})),
    ("non-empty last dimension", lambda: ((_t(), None), {})),
    ("x must be float32", lambda: ((_t(2, 8, dtype=torch.int32), None), {})),
    ("casting_mode must be one of", lambda: ((_x(), _t(8)), {"casting_mode": "none"})),
    ("weight is None", lambda: ((_x(), None), {"offset": 1.0})),
    ("offset must be a finite number", lambda: ((_x(), _t(8)), {"offset": math.nan})),
    ("eps must be", lambda: ((_x(), _t(8), -1.0), {})),
    ("eps must be", lambda: ((_x(), _t(8), math.inf), {})),
]


@pytest.mark.parametrize(("message", "make_args"), BAD_CALLS)
def test_bad_input_raises_clear_error(message, make_args):
    args, kwargs = make_args()
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        torch.ops.liger.rms_norm(*args, **kwargs)
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        if len(args) == 2:
            args = (*args, 1e-6)
        torch.ops.liger.rms_norm_backward(torch.ones_like(args[0]), *args, **kwargs)


def test_backward_checks_grad_out():
    with pytest.raises(ValueError, match="grad_out shape"):
        torch.ops.liger.rms_norm_backward(_t(2, 9), _x(), _t(8), 1e-6)


OPCHECK_CASES = [
    ((7, 48), torch.float32, torch.float32, {}),
    ((2, 3, 4, 32), torch.bfloat16, torch.float32, {"offset": 1.0, "casting_mode": "gemma"}),
    ((5,), torch.float16, None, {}),
]


@pytest.mark.parametrize(("shape", "dtype", "param_dtype", "options"), OPCHECK_CASES)
def test_opcheck(shape, dtype, param_dtype, options):
    for requires_grad in (True, False):
        x = torch.randn(shape, dtype=dtype, device=DEVICE, requires_grad=requires_grad)
        w = None if param_dtype is None else torch.randn(shape[-1], dtype=param_dtype, device=DEVICE,
                                                         requires_grad=requires_grad)  # fmt: skip
        torch.library.opcheck(torch.ops.liger.rms_norm.default, (x, w, 1e-5), options, test_utils=OPCHECK_UTILS)
    dy = torch.randn(shape, dtype=dtype, device=DEVICE)
    torch.library.opcheck(torch.ops.liger.rms_norm_backward.default, (dy, x.detach(), None if w is None else
                          w.detach(), 1e-5), options, test_utils=OPCHECK_UTILS)  # fmt: skip


def _model(x, w):
    return torch.ops.liger.rms_norm(x * 0.5, w, 1e-6, offset=1.0, casting_mode="gemma").square()


def test_compile_fullgraph_dynamic_matches_eager_without_recompiles():
    torch._dynamo.reset()
    compiled = torch.compile(_model, fullgraph=True, dynamic=True)
    w = torch.randn(40, device=DEVICE, requires_grad=True)
    for i, lead in enumerate([(2, 5), (4, 7), (6, 11)]):
        x = torch.randn(*lead, 40, device=DEVICE, requires_grad=True)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            out = compiled(x, w)
        want = _model(x, w)
        torch.testing.assert_close(out, want)
        for got, ref in zip(torch.autograd.grad(out.sum(), (x, w)), torch.autograd.grad(want.sum(), (x, w)),
                            strict=True):  # fmt: skip
            torch.testing.assert_close(got, ref)


def test_module_drop_ins_match_transformers():
    """liger_nn.RMSNorm against transformers' Llama and Gemma RMSNorm modules, a forward and a backward.
    Both cast x to float32 whatever its dtype, so float32 is their precision."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from liger_nn import RMSNorm

    for theirs, ours in (
        (LlamaRMSNorm(48, eps=1e-6), RMSNorm(48, eps=1e-6)),
        (GemmaRMSNorm(48, eps=1e-6), RMSNorm(48, eps=1e-6, offset=1.0, casting_mode="gemma", init=0.0)),
    ):
        theirs = theirs.to(DEVICE, torch.float32)
        ours = ours.to(DEVICE, torch.float32)
        with torch.no_grad():
            theirs.weight.normal_()
            ours.weight.copy_(theirs.weight)
        x = torch.randn(3, 5, 48, device=DEVICE)
        dy = torch.randn_like(x)
        y_theirs, y_ours = theirs(x), ours(x)
        assert_close_to_ref(y_ours, y_theirs, torch.float32, type(theirs).__name__)
        (y_theirs * dy).sum().backward()
        (y_ours * dy).sum().backward()
        assert_close_to_ref(ours.weight.grad, theirs.weight.grad, torch.float32, "dweight")
        assert set(ours.state_dict()) == set(theirs.state_dict())
