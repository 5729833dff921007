"""rope, rope_backward and rope_ as PyTorch custom ops: opcheck with every
test util, and torch.compile (fullgraph, dynamic) without graph breaks or
recompiles across sequence lengths."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from csrc_free_ops.rope import reference
from tests.helpers import DEVICE, OPCHECK_UTILS, assert_close_to_ref
from tests.rope_cases import hf_tables, make_heads, make_table, reference_outputs_and_grads


def _inputs(seq, dtype=torch.float32, rot=12, requires_grad=False):
    q = make_heads(2, 3, seq, 12, dtype, "transposed")
    k = make_heads(2, 1, seq, 12, dtype, "contiguous")
    cos, sin = (make_table(2, seq, rot, dtype, "1SR") for _ in range(2))
    return q.requires_grad_(requires_grad), k.requires_grad_(requires_grad), cos, sin


@pytest.mark.parametrize("rot", [12, 4])
@pytest.mark.parametrize("op_name", ["rope", "rope_backward"])
def test_opcheck_functional_ops(op_name, rot):
    q, k, cos, sin = _inputs(5, rot=rot, requires_grad=True)
    torch.library.opcheck(getattr(torch.ops.liger, op_name).default, (q, k, cos, sin), test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("rot", [12, 4])
def test_opcheck_in_place_op(rot):
    q, k, cos, sin = _inputs(5, rot=rot)
    torch.library.opcheck(torch.ops.liger.rope_.default, (q, k, cos, sin), test_utils=OPCHECK_UTILS)


def _train_step(q, k, cos, sin):
    q_out, k_out = torch.ops.liger.rope(q, k, cos, sin)
    return (q_out.float().square().sum() + (k_out.float() * 3.0).sum()), q_out


def test_compile_fullgraph_dynamic_no_recompiles_forward_and_backward():
    counter = CompileCounterWithBackend("inductor")
    step = torch.compile(_train_step, backend=counter, fullgraph=True, dynamic=True)
    for seq in (5, 9, 13):
        q, k, cos, sin = _inputs(seq, torch.bfloat16, rot=8, requires_grad=True)
        loss, q_out = step(q, k, cos, sin)
        dq, dk = torch.autograd.grad(loss, (q, k))
        (q_ref, k_ref), (dq_ref, dk_ref) = reference_outputs_and_grads(
            q, k, cos, sin, 2.0 * q_out.detach().float(), torch.full_like(k, 3.0)
        )
        assert_close_to_ref(q_out, q_ref, torch.bfloat16, f"q_out (S={seq})")
        assert_close_to_ref(dq, dq_ref, torch.bfloat16, f"dq (S={seq})")
        assert_close_to_ref(dk, dk_ref, torch.bfloat16, f"dk (S={seq})")
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames for 3 sequence lengths"


def _decode_step(q, k_cache, cos, sin):
    torch.ops.liger.rope_(q, k_cache, cos, sin)
    return q * 2.0


def test_compile_in_place_op_fullgraph_dynamic():
    counter = CompileCounterWithBackend("inductor")
    step = torch.compile(_decode_step, backend=counter, fullgraph=True, dynamic=True)
    for seq in (3, 6, 10):
        q = make_heads(1, 4, seq, 8, torch.float32, "transposed")
        cache = torch.randn(1, 2, seq + 4, 8, device=DEVICE)
        k = cache[:, :, 2 : seq + 2]
        cos, sin = hf_tables(1, seq, 8, torch.float32)
        q_ref, k_ref = reference.forward(q.double(), k.double(), cos.double(), sin.double())
        out = step(q, k, cos, sin)
        assert_close_to_ref(q, q_ref, torch.float32, f"q (S={seq})")
        assert_close_to_ref(out, 2.0 * q_ref, torch.float32, f"2q (S={seq})")
        assert_close_to_ref(cache[:, :, 2 : seq + 2], k_ref, torch.float32, f"k cache slice (S={seq})")
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames for 3 sequence lengths"


def test_compile_hf_drop_in_no_graph_break():
    from liger_nn import apply_rotary_pos_emb

    counter = CompileCounterWithBackend("aot_eager")
    fn = torch.compile(apply_rotary_pos_emb, backend=counter, fullgraph=True, dynamic=True)
    for seq in (5, 9):  # first S unlike every other dim: no duck-sized guard
        q = torch.randn(2, seq, 4, 16, device=DEVICE)
        k = torch.randn(2, seq, 2, 16, device=DEVICE)
        cos, sin = hf_tables(2, seq, 16, torch.float32)
        q_out, k_out = fn(q, k, cos, sin, None, 2)
        q_ref, k_ref = reference.forward(
            q.double().transpose(1, 2), k.double().transpose(1, 2), cos.double(), sin.double()
        )
        assert_close_to_ref(q_out, q_ref.transpose(1, 2), torch.float32, "q_embed")
        assert_close_to_ref(k_out, k_ref.transpose(1, 2), torch.float32, "k_embed")
    assert counter.frame_count == 1


def test_compile_table_requiring_grad_is_an_error_not_a_zero_gradient():
    fn = torch.compile(torch.ops.liger.rope, backend="aot_eager", fullgraph=True)
    q, k, cos, sin = _inputs(5, requires_grad=True)
    with pytest.raises(Exception, match="cos and sin get no gradient"):
        fn(q, k, cos.requires_grad_(), sin)


# --- The options of issue 18: opcheck and compile


def _variant_calls(seq: int, dtype=torch.float32, requires_grad=False):
    """(args, kwargs) of calls covering each option: packed tokens with
    cu_seqlens, interleaved partial pairs and k alone (passed first); (B, H,
    S, D) with M-RoPE position ids, DeepSeek's pairs and q alone;
    position_ids (B, S) with both."""
    g = requires_grad
    cos, sin = (torch.randn(seq + 2, 8, device=DEVICE, dtype=dtype) for _ in range(2))
    packed_k = torch.randn(seq, 2, 12, device=DEVICE, dtype=dtype).requires_grad_(g)
    cu_seqlens = torch.tensor([0, seq // 2, seq], dtype=torch.int32, device=DEVICE)
    q = make_heads(2, 3, seq, 8, dtype, "transposed").requires_grad_(g)
    k = make_heads(2, 1, seq, 8, dtype, "contiguous").requires_grad_(g)
    mrope_ids = torch.randint(0, seq + 2, (3, 2, seq), device=DEVICE)
    ids = torch.randint(0, seq + 2, (2, seq), device=DEVICE)
    return [
        ((packed_k, None, cos, sin), {"cu_seqlens": cu_seqlens, "pairs": "interleaved"}),
        ((q, None, cos, sin), {"position_ids": mrope_ids, "mrope_section": [2, 1, 1], "mrope_interleaved": True,
                               "pairs": "interleaved_to_halves"}),
        ((q, k, cos, sin), {"position_ids": ids}),
    ]  # fmt: skip


@pytest.mark.parametrize("case", [0, 1])
@pytest.mark.parametrize("op_name", ["rope", "rope_backward", "rope_"])
def test_opcheck_options(op_name, case):
    args, kwargs = _variant_calls(6, requires_grad=op_name != "rope_")[case]
    torch.library.opcheck(getattr(torch.ops.liger, op_name).default, args, kwargs, test_utils=OPCHECK_UTILS)


def _variant_step(calls):
    """A loss over every call's outputs: one graph holding each option."""
    loss = 0.0
    for args, kwargs in calls:
        for out in torch.ops.liger.rope(*args, **kwargs):
            if out is not None:
                loss = loss + out.float().square().sum()
    return loss


def test_compile_options_fullgraph_dynamic_no_recompiles():
    """aot_eager: the tracing (fake kernels, autograd, functionalization) is
    what the options add; inductor's codegen around the ops is the plain
    rope test's."""
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(_variant_step, backend=counter, fullgraph=True, dynamic=True)
    for seq in (5, 7, 9):  # unlike every other size of a call: no duck-sized guard
        calls = _variant_calls(seq, requires_grad=True)
        leaves = [t for args, _ in calls for t in args[:2] if t is not None and t.requires_grad]
        grads = torch.autograd.grad(step(calls), leaves)
        want = torch.autograd.grad(_variant_step(calls), leaves)
        for got, ref in zip(grads, want, strict=True):
            torch.testing.assert_close(got, ref)
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames for 3 sequence lengths"
