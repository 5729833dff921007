"""torch.ops.liger.rope, rope_backward and rope_ (rotary position embedding,
HuggingFace's rotate_half convention).

rope(q, k, cos, sin) -> (q_out, k_out)
    q: (B, Hq, S, D), k: (B, Hkv, S, D), Hq and Hkv independent (GQA/MQA);
    any strides (HF's transposed (B, S, H, D) views are read in place).
    cos, sin: (S, R), (1, S, R) or (B, S, R), same shape, R even and <= D.
    out = x*cos + rotate_half(x)*sin on the first R dims of each head (all
    R columns of cos/sin are used, exactly as HF's formula does); dims R..D
    pass through unchanged (partial rotary).  Everything shares q's dtype
    (float32/bfloat16/float16) and device; math runs in float32.  Each
    output keeps its input's memory layout (torch.empty_like).
    Gradients flow to q and k only: cos and sin get none, and if either
    requires grad when autograd records the op it raises ValueError
    instead of returning a wrong zero.
rope_backward(dq, dk, cos, sin) -> (dq_in, dk_in)
    The transpose of the rotation (the inverse rotation for HF's tables);
    differentiable in dq and dk (its own backward is rope).
rope_(q, k, cos, sin) -> ()
    rope in place on q and k, for inference and KV-cache paths; no autograd.
"""

from __future__ import annotations

import torch

from csrc_free_ops.rope import cuda, npu, reference
from registrations import _checks
from registrations._library import Entries, call_from_backward, define_op, register_autograd

_OP = "liger.rope"


def _check_heads(op: str, name: str, shape: torch.Size) -> None:
    if len(shape) != 4:
        raise ValueError(f"{op}: {name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(shape)}")


def _check_table(op: str, cos: torch.Size, sin: torch.Size, batch: int, seq: int, head_dim: int) -> None:
    """cos and sin are the tables' shapes."""
    if cos != sin:
        raise ValueError(f"{op}: cos and sin must have the same shape, got {tuple(cos)} and {tuple(sin)}")
    rank = len(cos)
    if rank not in (2, 3) or (rank == 3 and cos[0] != 1 and cos[0] != batch):
        raise ValueError(
            f"{op}: cos/sin must have shape (S, R), (1, S, R) or (B, S, R) with B={batch}, got {tuple(cos)}"
        )
    if cos[-2] != seq:
        raise ValueError(f"{op}: cos/sin have sequence length {cos[-2]} but q and k have {seq}")
    rot = cos[-1]
    if rot % 2 != 0 or rot < 2 or rot > head_dim:
        raise ValueError(
            f"{op}: rotary dim R = cos.shape[-1] must be even and between 2 and head_dim={head_dim}, got {rot}"
        )


def _check(
    op: str, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, names: tuple[str, str] = ("q", "k")
) -> None:
    """Runs on every eager call: each shape is read once."""
    qn, kn = names
    _checks.check_float_dtype(op, qn, q)
    _checks.check_all_like(op, qn, q, ((kn, k), ("cos", cos), ("sin", sin)))
    qs, ks = q.shape, k.shape
    _check_heads(op, qn, qs)
    _check_heads(op, kn, ks)
    for dim, what in ((0, "batch size"), (2, "sequence length"), (3, "head_dim")):
        if qs[dim] != ks[dim]:
            raise ValueError(f"{op}: {qn} and {kn} must have the same {what}, got {qs[dim]} and {ks[dim]}")
    _check_table(op, cos.shape, sin.shape, qs[0], qs[2], qs[3])


def _check_in_place(q: torch.Tensor, k: torch.Tensor) -> None:
    """Memory that in-place rotation would corrupt (real tensors only)."""
    for name, t in (("q", q), ("k", k)):
        if torch._debug_has_internal_overlap(t) == 1:
            raise ValueError(f"{_OP}_: {name} has internally overlapping memory (e.g. an expanded view)")
    # data_ptr() is 0 on backends whose storage Python cannot see; skip those.
    if q is k or (q.numel() > 0 and k.numel() > 0 and 0 != q.data_ptr() == k.data_ptr()):
        raise ValueError(f"{_OP}_: q and k must not be the same memory")


def _check_rope(q, k, cos, sin) -> None:
    _check(_OP, q, k, cos, sin)


def _check_rope_backward(dq, dk, cos, sin) -> None:
    _check(_OP + "_backward", dq, dk, cos, sin, ("dq", "dk"))


def _check_rope_(q, k, cos, sin) -> None:
    _check(_OP + "_", q, k, cos, sin)
    if not isinstance(q, torch._subclasses.FakeTensor):
        _check_in_place(q, k)


def _fake(q, k, cos, sin):
    return torch.empty_like(q), torch.empty_like(k)


def _fake_(q, k, cos, sin) -> None:
    return None


ROPE = define_op(
    "rope(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)",
    check=_check_rope,
    fake=_fake,
    entries=Entries(cuda=cuda.forward, npu=npu.forward, interpreted=cuda.forward, reference=reference.forward),
)
ROPE_BACKWARD = define_op(
    "rope_backward(Tensor dq, Tensor dk, Tensor cos, Tensor sin) -> (Tensor, Tensor)",
    check=_check_rope_backward,
    fake=_fake,
    entries=Entries(cuda=cuda.backward, npu=npu.backward, interpreted=cuda.backward, reference=reference.backward),
)
ROPE_ = define_op(
    "rope_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin) -> ()",
    check=_check_rope_,
    fake=_fake_,
    entries=Entries(cuda=cuda.forward_, npu=npu.forward_, interpreted=cuda.forward_, reference=reference.forward_),
)


def _no_table_grad(op: str):
    def setup_context(ctx, inputs, output) -> None:
        _, _, cos, sin = inputs
        if cos.requires_grad or sin.requires_grad:
            raise ValueError(
                f"{op}: cos and sin get no gradient, but one of them requires grad; "
                "pass cos.detach() and sin.detach() (HF's rotary tables need none)"
            )
        ctx.save_for_backward(cos, sin)

    return setup_context


def _rope_grad(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    gq, gk = call_from_backward(ROPE_BACKWARD, dq, dk, cos, sin)
    need_q, need_k = ctx.needs_input_grad[:2]
    return (gq if need_q else None, gk if need_k else None, None, None)


def _rope_backward_grad(ctx, ddq, ddk):
    cos, sin = ctx.saved_tensors
    gq, gk = call_from_backward(ROPE, ddq, ddk, cos, sin)
    need_q, need_k = ctx.needs_input_grad[:2]
    return (gq if need_q else None, gk if need_k else None, None, None)


register_autograd(ROPE, _rope_grad, setup_context=_no_table_grad(_OP))
register_autograd(ROPE_BACKWARD, _rope_backward_grad, setup_context=_no_table_grad(_OP + "_backward"))
