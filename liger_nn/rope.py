"""HuggingFace's apply_rotary_pos_emb, backed by torch.ops.liger.rope, and
the one decision every transformers adapter shares: rotate q and k in place
(``rope_``) or into new tensors (``rope``).  docs/patching.md says when the
in-place path is taken."""

from __future__ import annotations

import torch
from torch.autograd import forward_ad

from registrations import overlap
from registrations.eager import eager_call

# torch.ops.liger.rope and rope_, called without the dispatcher's crossing in plain eager calls
# (registrations/eager.py).
_ROPE = eager_call(torch.ops.liger.rope)
_ROPE_ = eager_call(torch.ops.liger.rope_)

_MISSING = object()
# unsqueeze_dim values that put heads at dim 1, (B, H, S, D), or at dim 2, (B, S, H, D).
_HEADS_FIRST = (1, -3)
_SEQ_FIRST = (2, -2)

# Autograd nodes that make a projection's output and save no tensor sharing
# its memory (derivatives.yaml: each saves its inputs or sizes, never its
# result), so rotating that output in place leaves every saved value intact.
PRODUCERS = frozenset(
    {
        "MmBackward0",  # q_proj(x) without bias (through _unsafe_view)
        "AddmmBackward0",  # q_proj(x) with bias
        "BmmBackward0",
        "BaddbmmBackward0",
        "MulBackward0",  # RMSNorm's weight * x (Qwen3, Gemma's q_norm / k_norm)
        "AddBackward0",
        "SubBackward0",
        "CloneBackward0",
        "ToCopyBackward0",
        "CatBackward0",
    }
)
# Nodes whose output shares memory with their input without being a view
# (matmul's result reshaped by _unsafe_view): the producer is behind them.
PASS_THROUGH = frozenset({"UnsafeViewBackward0"})


def _produced_fresh(t: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether t's memory (that of its base) was last written by a PRODUCERS
    node (through PASS_THROUGH nodes): t is a non-leaf whose history saved
    nothing that shares its memory."""
    if base is not t and torch._C._autograd._get_creation_meta(t) != torch._C._autograd.CreationMeta.DEFAULT:
        return False
    node = base.grad_fn
    while node is not None and type(node).__name__ in PASS_THROUGH:
        nexts = node.next_functions
        node = nexts[0][0] if len(nexts) == 1 else None
    return node is not None and type(node).__name__ in PRODUCERS


def rotates_in_place(q: torch.Tensor, k: torch.Tensor | None) -> bool:
    """Whether ``rope_in_place_or_not`` rotates q and k in place.

    True only where autograd's own records say nothing else holds their
    pre-rotation values for backward, so the in-place rotation gives the
    out-of-place path's values and gradients:

    * eager, grad mode on, no torch.func transform, forward-mode AD or
      dispatch mode active (under torch.compile the compiler decides memory:
      out of place);
    * q and k (when given) plain dense tensors that require grad and are
      not leaves, each a view autograd lets be modified in place (or no view);
    * each one's memory last written by a projection-like node (PRODUCERS,
      possibly behind matmul's _unsafe_view), none of which saves its output,
      and the whole of that memory (q's elements are all of the projection's,
      not a slice of a fused QKV buffer: there the backward would copy it);
    * q and k on different memory, neither overlapping itself.

    A consumer that saved q or k before this call is not visible from here;
    rope_ bumps their version counters, so backward then raises "modified by
    an inplace operation" rather than returning a wrong gradient.
    """
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return False
    if torch._C._are_functorch_transforms_active() or torch._C._len_torch_dispatch_stack() > 0:
        return False
    tensors = (q,) if k is None else (q, k)
    for t in tensors:
        if type(t) is not torch.Tensor or not t.requires_grad or t.grad_fn is None or t.is_inference():
            return False
        base = t._base if t._is_view() else t
        if t.numel() != base.numel() or not _produced_fresh(t, base) or overlap.self_overlapping(t):
            return False
    if forward_ad._current_level >= 0 and any(forward_ad.unpack_dual(t).tangent is not None for t in tensors):
        return False
    if k is not None:
        q_base = q._base if q._is_view() else q
        k_base = k._base if k._is_view() else k
        if q_base is k_base:
            return False
        same_memory = q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
        if same_memory and overlap.overlapping(q, k):
            return False
    return True


# _viewed_again's view of a base, per (shape, strides) of the tensor it stands for: the shape the
# base is viewed as and the permutation back (None where there is none).  Bounded: models have few.
_REVIEWS: dict[tuple, tuple | None] = {}
MAX_REVIEWS = 64


def _review(t: torch.Tensor) -> tuple | None:
    """(shape, permutation) with contiguous memory of t's numel viewed as shape and permuted giving
    t's shape and strides, or None; it depends on t's shape and strides alone."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    permuted = t.permute(order)
    if not permuted.is_contiguous():
        return None
    back = [order.index(d) for d in range(t.dim())]
    again = torch.empty(permuted.shape, device="meta").permute(back)
    return (permuted.shape, back) if again.shape == t.shape and again.stride() == t.stride() else None


def _viewed_again(t: torch.Tensor) -> torch.Tensor:
    """t's elements as a view of its base made by view and permute, where t
    is a permutation of its contiguous base (a model's transposed q / k);
    else t.  rope_ marks the base modified, after which autograd rebuilds
    t's own history as an as_strided of the base, whose backward fills a
    base-sized zero gradient and copies into it (two passes more than the
    rotation's own); view and permute pass the gradient through as views."""
    if not t._is_view():
        return t
    base = t._base
    if not base.is_contiguous() or t.storage_offset() != base.storage_offset() or t.numel() != base.numel():
        return t
    key = (t.shape, t.stride())
    review = _REVIEWS.get(key, _MISSING)
    if review is _MISSING:
        if len(_REVIEWS) >= MAX_REVIEWS:
            _REVIEWS.clear()
        review = _REVIEWS[key] = _review(t)
    return t if review is None else base.view(review[0]).permute(review[1])


def rope_in_place_or_not(
    q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, **options
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """torch.ops.liger.rope(q, k, cos, sin, **options), computed in place on
    q and k (``rope_``) where ``rotates_in_place`` says that is safe; then
    q and k's memory comes back, holding the rotation, with q and k's
    shapes and strides (``_viewed_again``)."""
    if rotates_in_place(q, k):
        _ROPE_(q, k, cos, sin, **options)
        return _viewed_again(q), None if k is None else _viewed_again(k)
    return _ROPE(q, k, cos, sin, **options)


def apply_rotary_pos_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q*cos + rotate_half(q)*sin, k*cos + rotate_half(k)*sin), as in transformers.

    cos, sin: (B, S, R), (1, S, R) or (S, R) in q's dtype; R < head_dim
    rotates the first R dims and passes the rest through (partial rotary).
    unsqueeze_dim=1 means q, k are (B, H, S, D); 2 means (B, S, H, D).
    position_ids is unused, as in current transformers (cos and sin are
    already gathered per position).  Gradients flow to q and k only.
    Where ``rotates_in_place`` allows (a model's fresh projections in
    training), q and k are rotated in place and returned.
    """
    if unsqueeze_dim in _HEADS_FIRST:
        return rope_in_place_or_not(q, k, cos, sin)
    if unsqueeze_dim in _SEQ_FIRST:
        q_out, k_out = rope_in_place_or_not(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    raise ValueError(
        f"apply_rotary_pos_emb: unsqueeze_dim must be 1 (B, H, S, D) or 2 (B, S, H, D), got {unsqueeze_dim}"
    )
