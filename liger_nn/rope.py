"""HuggingFace's apply_rotary_pos_emb, backed by torch.ops.liger.rope."""

from __future__ import annotations

import torch

# unsqueeze_dim values that put heads at dim 1, (B, H, S, D), or at dim 2, (B, S, H, D).
_HEADS_FIRST = (1, -3)
_SEQ_FIRST = (2, -2)


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
    """
    del position_ids
    if unsqueeze_dim in _HEADS_FIRST:
        return torch.ops.liger.rope(q, k, cos, sin)
    if unsqueeze_dim in _SEQ_FIRST:
        q_out, k_out = torch.ops.liger.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    raise ValueError(
        f"apply_rotary_pos_emb: unsqueeze_dim must be 1 (B, H, S, D) or 2 (B, S, H, D), got {unsqueeze_dim}"
    )
