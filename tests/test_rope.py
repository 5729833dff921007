"""torch.ops.liger.rope / rope_backward / rope_: values and gradients against
a float64 reference over shapes, GQA/MQA, partial rotary, cos/sin shapes and
memory layouts; the HF drop-in; and clear errors for bad input."""

from __future__ import annotations

import inspect

import pytest
import torch
import triton.language as tl
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops import device
from csrc_free_ops.rope import kernels, launch, plan, reference
from tests.helpers import ALL_DTYPES, DEVICE, assert_close_to_ref, poison_like
from tests.rope_cases import (
    HEAD_LAYOUTS,
    TABLE_LAYOUTS,
    hf_tables,
    make_heads,
    make_table,
    reference_outputs_and_grads,
)

# Powers of two, and not (92 is the case; 2 is the smallest head).
HEAD_DIMS = (2, 6, 8, 12, 18, 32, 64, 92)


@st.composite
def problems(draw):
    dim = draw(st.sampled_from(HEAD_DIMS))
    rot = draw(st.one_of(st.just(dim), st.integers(1, dim // 2).map(lambda h: 2 * h)))
    return {
        "batch": draw(st.integers(1, 2)),
        "n_qh": draw(st.integers(1, 5)),
        "n_kh": draw(st.integers(1, 5)),
        "seq": draw(st.integers(1, 5)),
        "dim": dim,
        "rot": rot,
        "dtype": draw(st.sampled_from(ALL_DTYPES)),
        "table_dtype": draw(st.sampled_from(ALL_DTYPES)),
        "q_layout": draw(st.sampled_from(HEAD_LAYOUTS)),
        "k_layout": draw(st.sampled_from(HEAD_LAYOUTS)),
        "table": draw(st.sampled_from(TABLE_LAYOUTS)),
    }


def build(p, device=DEVICE):
    q = make_heads(p["batch"], p["n_qh"], p["seq"], p["dim"], p["dtype"], p["q_layout"], device)
    k = make_heads(p["batch"], p["n_kh"], p["seq"], p["dim"], p["dtype"], p["k_layout"], device)
    cos = make_table(p["batch"], p["seq"], p["rot"], p["table_dtype"], p["table"], device)
    sin = make_table(p["batch"], p["seq"], p["rot"], p["table_dtype"], p["table"], device)
    return q, k, cos, sin


def cuda_plan(q, k, cos, sin, copy_pass):
    return plan.cuda(launch.problem(q, k, cos, sin, copy_pass))


def assert_layout_kept(out: torch.Tensor, inp: torch.Tensor) -> None:
    assert out.shape == inp.shape and out.dtype == inp.dtype
    assert out.stride() == torch.empty_like(inp).stride()


@given(p=problems())
def test_forward_and_gradients_match_float64_reference(p):
    """Any data dtype with tables of any dtype (fp32 tables under bf16 q and
    k is the AMP case; float64 for gradcheck): outputs and gradients in their
    input's dtype, all against float64."""
    q, k, cos, sin = build(p)
    q.requires_grad_()
    k.requires_grad_()
    dq_out = torch.randn_like(q)
    dk_out = torch.randn_like(k)

    q_out, k_out = torch.ops.liger.rope(q, k, cos, sin)
    dq, dk = torch.autograd.grad((q_out, k_out), (q, k), (dq_out, dk_out))

    (q_ref, k_ref), (dq_ref, dk_ref) = reference_outputs_and_grads(q, k, cos, sin, dq_out, dk_out)
    dtype = p["dtype"]
    assert_close_to_ref(q_out, q_ref, dtype, "q_out")
    assert_close_to_ref(k_out, k_ref, dtype, "k_out")
    assert_close_to_ref(dq, dq_ref, dtype, "dq")
    assert_close_to_ref(dk, dk_ref, dtype, "dk")
    assert_layout_kept(q_out, q)
    assert_layout_kept(k_out, k)
    assert dq.dtype == dk.dtype == dtype


@given(p=problems())
def test_in_place_matches_float64_reference(p):
    q, k, cos, sin = build(p)
    q_ref, k_ref = reference.forward(q.double(), k.double(), cos.double(), sin.double())
    q_ptr, q_strides = q.data_ptr(), q.stride()
    torch.ops.liger.rope_(q, k, cos, sin)
    assert q.data_ptr() == q_ptr and q.stride() == q_strides
    assert_close_to_ref(q, q_ref, p["dtype"], "q (in place)")
    assert_close_to_ref(k, k_ref, p["dtype"], "k (in place)")


def test_in_place_leaves_neighbouring_cache_entries_alone():
    """rope_ on a slice of a KV-cache buffer writes only inside the slice."""
    cache = torch.randn(2, 3, 10, 12, device=DEVICE)
    before = cache.clone()
    k = cache[:, :, 4:7]
    q = torch.randn(2, 6, 3, 12, device=DEVICE)
    cos, sin = hf_tables(2, 3, 12, torch.float32)
    torch.ops.liger.rope_(q, k, cos, sin)
    assert torch.equal(cache[:, :, :4], before[:, :, :4])
    assert torch.equal(cache[:, :, 7:], before[:, :, 7:])
    _, k_ref = reference.forward(q.double(), before[:, :, 4:7].double(), cos.double(), sin.double())
    assert_close_to_ref(k, k_ref, torch.float32)


@pytest.mark.parametrize("dim,rot", [(92, 92), (92, 46), (64, 16), (12, 2)])
def test_every_output_element_is_written(dim, rot):
    """NaN-poisoned outputs: rotated and pass-through dims are all overwritten."""
    q = make_heads(2, 3, 4, dim, torch.float32, "transposed")
    k = make_heads(2, 2, 4, dim, torch.float32, "contiguous")
    cos, sin = (make_table(2, 4, rot, torch.float32, "BSR") for _ in range(2))
    for backward in (False, True):
        qo, ko = poison_like(q), poison_like(k)
        launch.rotate(q, k, qo, ko, cos, sin, cuda_plan(q, k, cos, sin, rot < dim), backward=backward)
        want = (reference.backward if backward else reference.forward)(
            q.double(), k.double(), cos.double(), sin.double()
        )
        assert_close_to_ref(qo, want[0], torch.float32, "q_out")
        assert_close_to_ref(ko, want[1], torch.float32, "k_out")


@pytest.mark.parametrize("n_qh,n_kh,fits", [(4, 2, True), (40, 3, False), (2, 40, False)])
def test_heads_in_one_tile_or_walked(n_qh, n_kh, fits):
    """Head counts a tile holds whole take the loop-free path; more q or k
    heads than a tile holds are walked in blocks, and every head is rotated
    either way (NaN-poisoned outputs)."""
    dim = 256  # 8 KiB tiles of float32 half-rows hold 16 heads
    q = make_heads(1, n_qh, 2, dim, torch.float32, "transposed")
    k = make_heads(1, n_kh, 2, dim, torch.float32, "contiguous")
    cos, sin = (make_table(1, 2, dim, torch.float32, "SR") for _ in range(2))
    p = cuda_plan(q, k, cos, sin, False)
    assert p.heads_fit(n_qh, n_kh) is fits
    qo, ko = poison_like(q), poison_like(k)
    launch.rotate(q, k, qo, ko, cos, sin, p, backward=False)
    want = reference.forward(q.double(), k.double(), cos.double(), sin.double())
    assert_close_to_ref(qo, want[0], torch.float32, "q_out")
    assert_close_to_ref(ko, want[1], torch.float32, "k_out")


def test_backward_op_is_the_inverse_rotation_for_hf_tables():
    q = make_heads(2, 4, 6, 92, torch.float32, "transposed")
    k = make_heads(2, 1, 6, 92, torch.float32, "contiguous")
    cos, sin = hf_tables(2, 6, 64, torch.float32)
    q_out, k_out = torch.ops.liger.rope(q, k, cos, sin)
    q_back, k_back = torch.ops.liger.rope_backward(q_out, k_out, cos, sin)
    assert_close_to_ref(q_back, q.double(), torch.float32, "q")
    assert_close_to_ref(k_back, k.double(), torch.float32, "k")


def test_reference_backward_is_the_transpose_of_its_forward():
    """The reference's closed-form backward (the CPU fallback) against autograd, float64."""
    q = torch.randn(2, 3, 4, 10, dtype=torch.float64)
    k = torch.randn(2, 1, 4, 10, dtype=torch.float64)
    cos, sin = torch.randn(2, 4, 6, dtype=torch.float64), torch.randn(2, 4, 6, dtype=torch.float64)
    dq_out, dk_out = torch.randn_like(q), torch.randn_like(k)
    _, expected = reference_outputs_and_grads(q, k, cos, sin, dq_out, dk_out)
    for got, want in zip(reference.backward(dq_out, dk_out, cos, sin), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_double_backward_matches_reference():
    q = torch.randn(1, 2, 3, 8, device=DEVICE, dtype=torch.float64)
    k = torch.randn(1, 1, 3, 8, device=DEVICE, dtype=torch.float64)
    cos, sin = make_table(1, 3, 8, torch.float64, "SR"), make_table(1, 3, 8, torch.float64, "SR")
    dq_out = torch.randn_like(q).requires_grad_()
    dk_out = torch.randn_like(k).requires_grad_()
    # rope_backward is linear in (dq, dk): its gradient applies rope.
    gq, gk = torch.ops.liger.rope_backward.default(dq_out.float(), dk_out.float(), cos.float(), sin.float())
    vq, vk = torch.randn_like(gq), torch.randn_like(gk)
    ddq, ddk = torch.autograd.grad((gq, gk), (dq_out, dk_out), (vq, vk))
    want_q, want_k = reference.forward(vq.double(), vk.double(), cos, sin)
    assert_close_to_ref(ddq, want_q, torch.float32, "ddq")
    assert_close_to_ref(ddk, want_k, torch.float32, "ddk")


def test_gradient_only_for_k():
    q = make_heads(1, 2, 3, 8, torch.float32, "contiguous")
    k = make_heads(1, 2, 3, 8, torch.float32, "transposed").requires_grad_()
    cos, sin = hf_tables(1, 3, 8, torch.float32)
    _, k_out = torch.ops.liger.rope(q, k, cos, sin)
    (dk,) = torch.autograd.grad(k_out.sum(), (k,))
    _, (_, dk_ref) = reference_outputs_and_grads(q, k, cos, sin, torch.zeros_like(q), torch.ones_like(k))
    assert_close_to_ref(dk, dk_ref, torch.float32, "dk")


@pytest.mark.parametrize("shape", [(0, 2, 3, 8), (2, 2, 0, 8), (2, 0, 3, 8)])
def test_empty_inputs(shape):
    b, h, s, d = shape
    q = torch.randn(shape, device=DEVICE, requires_grad=True)
    k = torch.randn(b, 1, s, d, device=DEVICE)
    cos, sin = torch.randn(s, d, device=DEVICE), torch.randn(s, d, device=DEVICE)
    q_out, k_out = torch.ops.liger.rope(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    (dq,) = torch.autograd.grad(q_out.sum(), (q,))
    assert dq.shape == q.shape


@pytest.mark.parametrize("unsqueeze_dim", [1, 2, -3, -2])
@pytest.mark.parametrize("rot", [92, 32])
def test_hf_drop_in_matches_hf_formula(unsqueeze_dim, rot):
    from liger_nn import apply_rotary_pos_emb

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    def hf_apply(q, k, cos, sin):  # transformers' formula, with the partial-rotary split of its partial models
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        q_rot, q_pass = q[..., :rot], q[..., rot:]
        k_rot, k_pass = k[..., :rot], k[..., rot:]
        q_embed = torch.cat((q_rot * cos + rotate_half(q_rot) * sin, q_pass), dim=-1)
        k_embed = torch.cat((k_rot * cos + rotate_half(k_rot) * sin, k_pass), dim=-1)
        return q_embed, k_embed

    batch, seq, n_qh, n_kh, dim = 2, 5, 4, 2, 92
    if unsqueeze_dim in (1, -3):
        q = make_heads(batch, n_qh, seq, dim, torch.bfloat16, "transposed")
        k = make_heads(batch, n_kh, seq, dim, torch.bfloat16, "transposed")
    else:
        q = torch.randn(batch, seq, n_qh, dim, dtype=torch.bfloat16, device=DEVICE)
        k = torch.randn(batch, seq, n_kh, dim, dtype=torch.bfloat16, device=DEVICE)
    cos, sin = hf_tables(batch, seq, rot, torch.bfloat16)
    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=unsqueeze_dim)
    q_ref, k_ref = hf_apply(q.double(), k.double(), cos.double(), sin.double())
    assert_close_to_ref(q_out, q_ref, torch.bfloat16, "q_embed")
    assert_close_to_ref(k_out, k_ref, torch.bfloat16, "k_embed")
    assert q_out.stride() == q.stride() and k_out.stride() == k.stride()


def test_hf_drop_in_rejects_other_unsqueeze_dims():
    from liger_nn import apply_rotary_pos_emb

    q = torch.randn(1, 2, 3, 8, device=DEVICE)
    cos, sin = hf_tables(1, 3, 8, torch.float32)
    with pytest.raises(ValueError, match="unsqueeze_dim must be 1"):
        apply_rotary_pos_emb(q, q.clone(), cos, sin, unsqueeze_dim=0)


def test_table_requiring_grad_raises():
    q = torch.randn(1, 2, 3, 8, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, device=DEVICE)
    cos = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    sin = torch.randn(3, 8, device=DEVICE)
    with pytest.raises(ValueError, match="cos and sin get no gradient"):
        torch.ops.liger.rope(q, k, cos, sin)
    with pytest.raises(ValueError, match="cos and sin get no gradient"):
        torch.ops.liger.rope(q.detach(), k, sin, cos)  # table alone requiring grad
    with torch.no_grad():
        torch.ops.liger.rope(q, k, cos, sin)  # no autograd recorded: fine
    torch.ops.liger.rope(q, k, cos.detach(), sin)


def _tensor(spec) -> torch.Tensor:
    """spec: a shape, or (shape, dtype) or (shape, dtype, device)."""
    if isinstance(spec[0], int):
        spec = (spec,)
    shape, *rest = spec
    dtype = rest[0] if rest else torch.float32
    device = rest[1] if len(rest) > 1 else DEVICE
    return torch.randn(shape, device=device).to(dtype)


def _qkcs(table=None, **over):
    """(q, k, cos, sin) with B=2, Hq=4, Hkv=2, S=5, D=8, float32; table= sets both cos and sin."""
    specs = {"q": (2, 4, 5, 8), "k": (2, 2, 5, 8), "cos": table or (5, 8), "sin": table or (5, 8), **over}
    return tuple(_tensor(specs[name]) for name in ("q", "k", "cos", "sin"))


F8, BF16, I32 = torch.float8_e4m3fn, torch.bfloat16, torch.int32
BAD_CALLS = [
    (ValueError, "must be even", {"table": (5, 7)}),
    (ValueError, "between 2 and head_dim=8, got 10", {"table": (5, 10)}),
    (ValueError, "cos/sin have sequence length 6 but q and k have 5", {"table": (6, 8)}),
    (ValueError, "q and k must have the same sequence length, got 5 and 6", {"k": (2, 2, 6, 8)}),
    (ValueError, "q and k must have the same head_dim, got 8 and 6", {"k": (2, 2, 5, 6)}),
    (ValueError, "q and k must have the same batch size", {"k": (1, 2, 5, 8)}),
    (ValueError, "cos and sin must have the same shape", {"sin": (1, 5, 8)}),
    (ValueError, "cos and sin must have the same shape", {"sin": (5, 6)}),
    (ValueError, r"\(S, R\), \(1, S, R\) or \(B, S, R\) with B=2, got \(3, 5, 8\)", {"table": (3, 5, 8)}),
    (ValueError, r"\(S, R\), \(1, S, R\) or \(B, S, R\) with B=2, got \(8,\)", {"table": (8,)}),
    (ValueError, r"q must be 4-D \(batch, heads, seq, head_dim\) or 3-D packed", {"q": (4, 5)}),
    (ValueError, "k must be 4-D", {"k": (2, 2, 5, 8, 1)}),
    (ValueError, "q and k must have the same rank, got 3-D and 4-D", {"q": (4, 5, 8)}),
    (ValueError, "sin is on meta", {"sin": ((5, 8), torch.float32, "meta")}),
    (ValueError, "k is on meta", {"k": ((2, 2, 5, 8), BF16, "meta")}),
    (TypeError, "q must be float32, bfloat16, float16 or float64, got torch.int32", {"q": ((2, 4, 5, 8), I32)}),
    (TypeError, "k must be float32, bfloat16, float16 or float64, got torch.int32", {"k": ((2, 2, 5, 8), I32)}),
    (TypeError, "cos must be float32, bfloat16, float16 or float64, got torch.float8", {"cos": ((5, 8), F8)}),
    (TypeError, "sin must be float32, bfloat16, float16 or float64", {"sin": ((5, 8), torch.complex64)}),
]


@pytest.mark.parametrize(("error", "message", "specs"), BAD_CALLS)
@pytest.mark.parametrize("op", ["rope", "rope_"])
def test_bad_input_raises_clear_error(op, error, message, specs):
    with pytest.raises(error, match=rf"liger\.{op}: .*{message}"):
        getattr(torch.ops.liger, op)(*_qkcs(**specs))


def test_backward_op_names_its_arguments():
    q, k, cos, sin = _qkcs(k=(2, 2, 5, 6))
    with pytest.raises(ValueError, match="liger.rope_backward: dq and dk must have the same head_dim"):
        torch.ops.liger.rope_backward(q, k, cos, sin)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (over 2^31 elements)")
def test_offsets_beyond_int32():
    """q has 16*1.1M*128 > 2^31 elements: the last heads sit past int32 offsets."""
    batch, n_qh, seq, dim = 1, 16, 1_100_000, 128
    assert batch * n_qh * seq * dim > 2**31
    q = torch.randn(batch, n_qh, seq, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, 1, seq, dim, device="cuda", dtype=torch.bfloat16)
    cos, sin = hf_tables(1, seq, 64, torch.bfloat16, device="cuda")
    q_out, k_out = torch.ops.liger.rope(q, k, cos, sin)
    for s in (slice(0, 3), slice(seq // 2, seq // 2 + 2), slice(seq - 3, seq)):
        want_q, want_k = reference.forward(
            q[:, -2:, s].double(), k[:, :, s].double(), cos[:, s].double(), sin[:, s].double()
        )
        assert_close_to_ref(q_out[:, -2:, s], want_q, torch.bfloat16, f"q_out[..., {s}]")
        assert_close_to_ref(k_out[:, :, s], want_k, torch.bfloat16, f"k_out[..., {s}]")
    del q_out, k_out
    tail = (slice(None), slice(-1, None), slice(-2, None))
    want_q, _ = reference.forward(q[tail].double(), k[tail].double(), cos[:, -2:].double(), sin[:, -2:].double())
    torch.ops.liger.rope_(q, k, cos, sin)
    assert_close_to_ref(q[tail], want_q, torch.bfloat16, "q (in place) past int32 offsets")


def test_cached_scalar_args_give_the_scalars_of_their_tensors():
    """rope caches each call's kernel scalars by shapes and strides: layouts that
    differ only in one stride, table rank or head count get their own, and a
    warm cache returns what a fresh computation gives."""
    from csrc_free_ops.launcher import scalar_specialization

    base = torch.empty(2, 6, 5, 8)
    views = [
        (base[:, :4], base[:, 4:]),  # rows of the fused buffer: strides of the (2, 6, 5, 8) tensor
        (base[:, :4].contiguous(), base[:, 4:].contiguous()),
        (torch.empty(2, 5, 4, 8).transpose(1, 2), torch.empty(2, 5, 2, 8).transpose(1, 2)),  # HF layout
        (base[:, :3], base[:, 3:]),
    ]
    tables = [torch.empty(5, 8), torch.empty(1, 5, 8), torch.empty(2, 5, 8), torch.empty(5, 16)[:, :8]]
    for _ in range(2):  # cold, then warm
        for q, k in views:
            for cos in tables:
                qo, ko = torch.empty_like(q), torch.empty_like(k)
                got = launch.scalar_args(q, k, qo, ko, cos, cos)
                scalars = tuple(launch.kernel_args(q, k, qo, ko, cos, cos)[launch.N_TENSORS :])
                assert got == launch.ScalarArgs(scalars, scalar_specialization(scalars))


def test_kernel_args_are_the_kernels_runtime_arguments_in_order():
    """KernelArgs is the one written copy of the kernel's argument list."""
    params = inspect.signature(kernels.rope_kernel.fn).parameters.values()  # JITFunction or interpreted: .fn
    runtime = tuple(p.name for p in params if p.annotation is not tl.constexpr)
    assert launch.KernelArgs._fields == runtime
    q, k = torch.empty(2, 4, 5, 8), torch.empty(2, 2, 5, 8)
    args = launch.kernel_args(q, k, q, k, torch.empty(5, 6), torch.empty(1, 5, 6))
    assert all(isinstance(a, torch.Tensor) for a in args[: launch.N_TENSORS])
    assert not any(isinstance(a, torch.Tensor) for a in args[launch.N_TENSORS :])
    assert (args.n_rows, args.seq_len, args.n_qh, args.n_kh, args.half, args.rot_dim) == (10, 5, 4, 2, 3, 6)
    assert (args.stride_q_b, args.stride_q_h, args.stride_q_s, args.stride_q_d) == q.stride()
    assert (args.stride_cos_b, args.stride_sin_b, args.stride_sin_s) == (0, 0, 6)


def test_cuda_plan_is_one_warp_8k_tiles_one_program_per_row():
    """The common path's launch (what the H200 measurements were made with):
    one single-warp program per row, loop-free, heads in one 8 KiB tile;
    for contiguous (B, H, S, D) q and k, and for HF's transposed views with
    20 KiB rows (32/8 heads x 256, the sweep's shapes)."""
    for dim, layout in ((128, "contiguous"), (256, "transposed")):
        q = make_heads(2, 32, 7, dim, torch.bfloat16, layout)
        k = make_heads(2, 8, 7, dim, torch.bfloat16, layout)
        cos, sin = hf_tables(1, 7, dim, torch.bfloat16)
        p = cuda_plan(q, k, cos, sin, False)
        assert (p.block_qh, p.block_kh, p.num_warps, p.programs, p.rows_per_program) == (32, 8, 1, 14, 1), layout
        assert p.heads_fit(32, 8) and not p.walks_rows(14)
        assert p.block_qh * plan.block_half(dim) * q.element_size() <= plan.TILE_BYTES
    assert device.num_sms(q.device) >= 1


def test_cuda_plan_of_heads_adjacent_small_rows():
    """HF's transposed views with rows under ADJACENT_ROW_BYTES (head_dim 128
    and 64): the heads-adjacent plan; the same sizes contiguous keep one warp."""
    for n_qh, n_kh, dim in ((32, 8, 128), (16, 16, 64), (28, 4, 128)):
        q = make_heads(2, n_qh, 7, dim, torch.bfloat16, "transposed")
        k = make_heads(2, n_kh, 7, dim, torch.bfloat16, "transposed")
        cos, sin = hf_tables(1, 7, dim, torch.bfloat16)
        assert launch.heads_adjacent(q) and launch.heads_adjacent(k)
        p = cuda_plan(q, k, cos, sin, False)
        assert (p.num_warps, p.rows_per_program) == (plan.ADJACENT_WARPS, plan.ADJACENT_ROWS)
        assert p.programs * p.rows_per_program >= 14 and not p.walks_rows(14)
        assert cuda_plan(q.contiguous(), k.contiguous(), cos, sin, False).num_warps == 1


@pytest.mark.parametrize("rows", [2, 3])
def test_programs_of_several_rows_cover_every_row(rows):
    """rows_per_program > 1 with a row count it does not divide (the last
    program's extra rows masked), forward and backward, NaN-poisoned outputs."""
    q = make_heads(2, 3, 5, 16, torch.float32, "transposed")
    k = make_heads(2, 2, 5, 16, torch.float32, "transposed")
    cos, sin = (make_table(2, 5, 12, torch.float32, "BSR") for _ in range(2))
    p = plan.Plan(block_qh=4, block_kh=2, programs=-(-10 // rows), num_warps=4, split_pairs=True, rows_per_program=rows)
    assert not p.walks_rows(10)
    for backward in (False, True):
        qo, ko = poison_like(q), poison_like(k)
        launch.rotate(q, k, qo, ko, cos, sin, p, backward=backward)
        want = (reference.backward if backward else reference.forward)(
            q.double(), k.double(), cos.double(), sin.double()
        )
        assert_close_to_ref(qo, want[0], torch.float32, "q_out")
        assert_close_to_ref(ko, want[1], torch.float32, "k_out")


def test_gradcheck_and_gradgradcheck_in_float64():
    """Fast mode (random projections of the Jacobians): the full Jacobians
    cost a launch per column, minutes under the interpreter."""
    q = torch.randn(1, 2, 2, 6, dtype=torch.float64, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 2, 6, dtype=torch.float64, device=DEVICE, requires_grad=True)
    cos, sin = torch.randn(2, 4, dtype=torch.float64, device=DEVICE), torch.randn(2, 4, device=DEVICE)
    assert torch.autograd.gradcheck(torch.ops.liger.rope, (q, k, cos, sin), fast_mode=True)
    assert torch.autograd.gradgradcheck(torch.ops.liger.rope, (q, k, cos, sin), fast_mode=True)
