"""transformers' rotary functions other than Llama's, backed by torch.ops.liger.rope.

Each function has the signature and the math of the transformers function it
is named after, and rotates in place where ``liger_nn.rope.rotates_in_place``
allows; ``liger_nn.apply_rotary_pos_emb`` (``liger_nn/rope.py``) is
Llama's ``rotate_half`` one, partial rotary included.  Gradients flow to q
and k only.  The tables may be float32 with half-precision q and k: the math
runs in float32 and each output keeps its input's dtype.

================================  ============================  ===================================
function                          transformers 5.17             op options
================================  ============================  ===================================
apply_rotary_pos_emb_interleaved  Cohere (GPT-J pairs)          pairs="interleaved"
apply_rotary_pos_emb_glm          GLM-4 (and GLM: same code),   pairs="interleaved", the tables'
                                  partial rotary                first half repeat-interleaved
apply_rotary_pos_emb_interleave   DeepSeek-V3, rope_interleave  pairs="interleaved_to_halves"
apply_rotary_pos_emb_vision       Qwen2-VL, Qwen2.5-VL vision   packed tokens (T, H, D)
================================  ============================  ===================================
"""

from __future__ import annotations

import torch

from liger_nn.rope import rope_in_place_or_not

# unsqueeze_dim values that put heads at dim 1, (B, H, S, D), or at dim 2, (B, S, H, D).
_HEADS_FIRST = (1, -3)
_SEQ_FIRST = (2, -2)


def _rope(name: str, q, k, cos, sin, unsqueeze_dim: int, pairs: str) -> tuple[torch.Tensor, torch.Tensor]:
    if unsqueeze_dim in _HEADS_FIRST:
        return rope_in_place_or_not(q, k, cos, sin, pairs=pairs)
    if unsqueeze_dim in _SEQ_FIRST:
        q_out, k_out = rope_in_place_or_not(q.transpose(1, 2), k.transpose(1, 2), cos, sin, pairs=pairs)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    raise ValueError(f"{name}: unsqueeze_dim must be 1 (B, H, S, D) or 2 (B, S, H, D), got {unsqueeze_dim}")


def _first_half(table: torch.Tensor) -> torch.Tensor:
    return table[..., : table.shape[-1] // 2]


def apply_rotary_pos_emb_interleaved(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cohere's apply_rotary_pos_emb: GPT-J pairs (x[2p], x[2p+1]), with
    cos/sin laid out alike (``repeat_interleave(freqs, 2)``), over all of
    head_dim; (B, S, R) or (S, R) tables, R = head_dim."""
    return _rope("apply_rotary_pos_emb_interleaved", q, k, cos, sin, unsqueeze_dim, "interleaved")


def apply_rotary_pos_emb_glm(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """GLM's apply_rotary_pos_emb: the tables come in the halves layout
    (``cat(freqs, freqs)``, width R <= head_dim); their first half, each
    entry repeated twice, rotates GPT-J pairs of the first R dims, and dims
    R..head_dim pass through (GLM-4's partial rotary)."""
    cos = _first_half(cos).repeat_interleave(2, dim=-1)
    sin = _first_half(sin).repeat_interleave(2, dim=-1)
    return _rope("apply_rotary_pos_emb_glm", q, k, cos, sin, unsqueeze_dim, "interleaved")


def apply_rotary_pos_emb_interleave(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's apply_rotary_pos_emb_interleave (``rope_interleave``):
    reads GPT-J pairs (x[2p], x[2p+1]) and writes pair p to (p, p + R/2),
    each pair rotated by the first half of the (halves-layout) tables.
    position_ids is unused, as in transformers."""
    # The original reads only the tables' first half; so does the op, given it twice.
    cos = torch.cat((_first_half(cos),) * 2, dim=-1)
    sin = torch.cat((_first_half(sin),) * 2, dim=-1)
    return _rope("apply_rotary_pos_emb_interleave", q, k, cos, sin, unsqueeze_dim, "interleaved_to_halves")


def apply_rotary_pos_emb_vision(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL's and Qwen2.5-VL's vision rotary: packed tokens q (T, H, D)
    and k (T, Hk, D) with (T, R) tables (float32 in transformers, whatever q's
    dtype), rotate_half pairs."""
    return rope_in_place_or_not(q, k, cos, sin)
