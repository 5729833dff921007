"""rope's convention table: which rotary function of which transformers architecture is
which convention, and which drop-in of liger_nn (with which options of the op) replaces it.

An architecture joins by an entry in ``ROPE_FUNCTIONS``; a new kind of rotary function by
an entry in ``ROPE_CONVENTIONS`` (its drop-in in liger_nn/hf_rotary.py).  The patch-time
check confirms each entry against the installed transformers before swapping."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from liger_nn import hf_rotary
from liger_nn.rope import apply_rotary_pos_emb

ROPE_PREFIX = "apply_rotary"  # the names of the rotary functions in modeling modules


@dataclass(frozen=True)
class RotaryConvention:
    """How one kind of transformers rotary function maps onto torch.ops.liger.rope.

    adapter: the liger function with that kind's math (liger_nn/rope.py,
    liger_nn/hf_rotary.py).  options: the op's options, for the report.
    partial: the original itself rotates only R = cos.shape[-1] < head_dim
    dims, so the patch-time check covers narrow tables too.  packed: (T, H, D)
    tokens with (T, R) tables and no unsqueeze_dim."""

    adapter: Callable
    options: str
    partial: bool = False
    packed: bool = False


ROPE_CONVENTIONS: dict[str, RotaryConvention] = {
    "halves": RotaryConvention(apply_rotary_pos_emb, "pairs='halves'"),
    "partial": RotaryConvention(apply_rotary_pos_emb, "pairs='halves', partial rotary", partial=True),
    "interleaved": RotaryConvention(hf_rotary.apply_rotary_pos_emb_interleaved, "pairs='interleaved'"),
    "glm": RotaryConvention(
        hf_rotary.apply_rotary_pos_emb_glm,
        "pairs='interleaved', partial rotary, tables' first half repeat-interleaved",
        partial=True,
    ),
    "interleaved_to_halves": RotaryConvention(
        hf_rotary.apply_rotary_pos_emb_interleave, "pairs='interleaved_to_halves'"
    ),
    "vision": RotaryConvention(
        hf_rotary.apply_rotary_pos_emb_vision, "packed tokens (T, H, D), pairs='halves'", packed=True
    ),
}

_LLAMA = (("apply_rotary_pos_emb", "halves"),)
_PARTIAL = (("apply_rotary_pos_emb", "partial"),)
_QWEN_VL = (("apply_rotary_pos_emb", "halves"), ("apply_rotary_pos_emb_vision", "vision"))

# transformers model types (the ``models/<name>/modeling_<name>.py`` modules)
# -> the module-level rotary functions their attention calls, each with its
# convention; the patch-time check confirms each against the installed
# version before swapping.  Read from transformers 5.17's modeling files:
ROPE_FUNCTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    # HF's rotate_half formula over all of head_dim.
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "mixtral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen2_moe": _LLAMA,
    "qwen3": _LLAMA,
    "qwen3_moe": _LLAMA,
    "gemma": _LLAMA,
    "gemma2": _LLAMA,
    "granite": _LLAMA,
    "olmo2": _LLAMA,  # casts the result back to q's dtype, as the op does anyway
    # Partial rotary done by the attention (slice, rotate, cat): the function sees the rotary dims only.
    "phi": _LLAMA,
    "stablelm": _LLAMA,
    # Partial rotary done by the function: dims cos.shape[-1]..head_dim pass through.
    "phi3": _PARTIAL,
    "gpt_neox": _PARTIAL,
    "qwen3_next": _PARTIAL,
    # GPT-J pairs: Cohere with interleaved tables, GLM-4 with halves tables (and partial rotary).
    "cohere": (("apply_rotary_pos_emb", "interleaved"),),
    "glm4": (("apply_rotary_pos_emb", "glm"),),
    # The text model composes M-RoPE's sections into gathered (B, S, R) tables
    # (Qwen2VLRotaryEmbedding) before the attention's rotate_half; the vision
    # tower rotates packed tokens.
    "qwen2_vl": _QWEN_VL,
    "qwen2_5_vl": _QWEN_VL,
    # MLA: the function used depends on config.rope_interleave.
    "deepseek_v3": (("apply_rotary_pos_emb", "halves"), ("apply_rotary_pos_emb_interleave", "interleaved_to_halves")),
}
# What an architecture added to the allow-list but unknown to ROPE_FUNCTIONS gets (still checked).
DEFAULT_ROPE_FUNCTIONS = _LLAMA
# The default allow-list.
ROPE_ARCHITECTURES: tuple[str, ...] = tuple(ROPE_FUNCTIONS)
