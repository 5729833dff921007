"""torch.ops.liger.rope, rope_backward and rope_ (rotary position embedding,
HuggingFace's rotate_half convention).

rope(q, k, cos, sin) -> (q_out, k_out)
    q: (B, Hq, S, D), k: (B, Hkv, S, D), Hq and Hkv independent (GQA/MQA);
    any strides (HF's transposed (B, S, H, D) views are read in place).
    cos, sin: (S, R), (1, S, R) or (B, S, R), same shape, R even and <= D.
    out = x*cos + rotate_half(x)*sin on the first R dims of each head (all
    R columns of cos/sin are used, exactly as HF's formula does); dims R..D
    pass through unchanged (partial rotary).  q, k, cos and sin may each be
    float32, bfloat16, float16 or float64 (fp32 tables with bf16 q and k is
    the AMP case), all on one device; math runs in float32, float64 when q
    or k is float64.  Each output keeps its input's dtype and memory layout
    (torch.empty_like).
    Gradients flow to q and k only: cos and sin get none, and if either
    requires grad when autograd records the op it raises ValueError
    instead of returning a wrong zero.
rope_backward(dq, dk, cos, sin) -> (dq_in, dk_in)
    The transpose of the rotation (the inverse rotation for HF's tables);
    differentiable in dq and dk (its own backward is rope).
rope_(q, k, cos, sin) -> ()
    rope in place on q and k (inference, KV-cache appends).  It refuses q or
    k overlapping itself and q and k sharing any element, eagerly and while
    torch.compile traces.  Autograd treats it as torch's in-place ops: the
    version counters are bumped, a leaf that requires grad raises, a saved
    tensor it rotated makes backward raise, and otherwise gradients flow
    through the rotation (rope_backward) to the values q and k had before.
"""

from __future__ import annotations

import torch

from csrc_free_ops.rope import launch, reference
from registrations import _checks, overlap
from registrations._library import LIB, Entries, call_from_backward, define_op, register_autograd

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
    for name, t in ((qn, q), (kn, k), ("cos", cos), ("sin", sin)):
        _checks.check_float(op, name, t)
    _checks.check_same_device(op, qn, q, ((kn, k), ("cos", cos), ("sin", sin)))
    qs, ks = q.shape, k.shape
    _check_heads(op, qn, qs)
    _check_heads(op, kn, ks)
    for dim, what in ((0, "batch size"), (2, "sequence length"), (3, "head_dim")):
        if qs[dim] != ks[dim]:
            raise ValueError(f"{op}: {qn} and {kn} must have the same {what}, got {qs[dim]} and {ks[dim]}")
    _check_table(op, cos.shape, sin.shape, qs[0], qs[2], qs[3])


def _check_in_place(q: torch.Tensor, k: torch.Tensor) -> None:
    """Memory that in-place rotation would corrupt: exact on real and fake
    tensors (registrations/overlap.py)."""
    for name, t in (("q", q), ("k", k)):
        if overlap.self_overlapping(t):
            raise ValueError(f"{_OP}_: {name} has internally overlapping memory (e.g. an expanded view)")
    if overlap.overlapping(q, k):
        raise ValueError(f"{_OP}_: q and k overlap in memory; rotating one in place would change the other")


def _check_rope(q, k, cos, sin) -> None:
    _check(_OP, q, k, cos, sin)


def _check_rope_backward(dq, dk, cos, sin) -> None:
    _check(_OP + "_backward", dq, dk, cos, sin, ("dq", "dk"))


def _check_rope_(q, k, cos, sin) -> None:
    _check(_OP + "_", q, k, cos, sin)
    _check_in_place(q, k)


def _fake(q, k, cos, sin):
    return torch.empty_like(q), torch.empty_like(k)


def _fake_(q, k, cos, sin) -> None:
    return None


ROPE = define_op(
    "rope(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)",
    check=_check_rope,
    fake=_fake,
    entries=Entries(
        cuda=launch.cuda_forward, npu=launch.npu_forward, interpreted=launch.cuda_forward, reference=reference.forward
    ),
)
ROPE_BACKWARD = define_op(
    "rope_backward(Tensor dq, Tensor dk, Tensor cos, Tensor sin) -> (Tensor, Tensor)",
    check=_check_rope_backward,
    fake=_fake,
    entries=Entries(
        cuda=launch.cuda_backward,
        npu=launch.npu_backward,
        interpreted=launch.cuda_backward,
        reference=reference.backward,
    ),
)
ROPE_ = define_op(
    "rope_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin) -> ()",
    check=_check_rope_,
    fake=_fake_,
    entries=Entries(
        cuda=launch.cuda_forward_,
        npu=launch.npu_forward_,
        interpreted=launch.cuda_forward_,
        reference=reference.forward_,
    ),
)


def _refuse_table_grad(op: str, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if cos.requires_grad or sin.requires_grad:
        raise ValueError(
            f"{op}: cos and sin get no gradient, but one of them requires grad; "
            "pass cos.detach() and sin.detach() (HF's rotary tables need none)"
        )


def _no_table_grad(op: str):
    def setup_context(ctx, inputs, output) -> None:
        _, _, cos, sin = inputs
        _refuse_table_grad(op, cos, sin)
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


# --- rope_ under autograd: torch's in-place semantics
#
# ADInplaceOrView bumps the version counters (as torch.library.custom_op does
# for ops that mutate), so a saved tensor rotated afterwards fails backward's
# version check, grad mode or not.  The Autograd kernel records the op as an
# autograd.Function that marks q and k dirty: a leaf requiring grad raises,
# and q, k take the rotation into their history (gradient: rope_backward).


def _bump_versions(keyset, q, k, *args, **kwargs):
    for t in (q, k):
        torch.autograd.graph.increment_version(t)
    return ROPE_.redispatch(keyset & torch._C._after_ADInplaceOrView_keyset, q, k, *args, **kwargs)


class _RopeInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        with torch._C._AutoDispatchBelowAutograd():
            ROPE_(q, k, cos, sin)
        ctx.mark_dirty(q, k)
        ctx.save_for_backward(cos, sin)
        return q, k

    @staticmethod
    def backward(ctx, dq, dk):
        return _rope_grad(ctx, dq, dk)


def _rope_inplace_autograd(q, k, cos, sin) -> None:
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, cos, sin)):
        _refuse_table_grad(_OP + "_", cos, sin)
        _RopeInPlace.apply(q, k, cos, sin)
        return None
    with torch._C._AutoDispatchBelowAutograd():
        return ROPE_(q, k, cos, sin)


LIB.impl("rope_", _bump_versions, "ADInplaceOrView", with_keyset=True)
LIB.impl("rope_", _rope_inplace_autograd, "Autograd")
