"""Rotary position embedding in the HuggingFace convention (rotate_half):
out = x*cos + rotate_half(x)*sin over the first R dims of each head, the
remaining D - R dims passing through unchanged."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class RopeOptions(NamedTuple):
    """rope's options as one value, from the op's entries (registrations/rope.py bundles the
    schema's arguments, in this order) down to the plan and the reference.

    position_ids / cu_seqlens: where each row's cos/sin come from (both None: already gathered);
    pairs: "halves", "interleaved" or "interleaved_to_halves"; mrope_section [t, h, w] and
    mrope_interleaved: M-RoPE's sections over position_ids (3, ...)."""

    position_ids: Tensor | None = None
    cu_seqlens: Tensor | None = None
    pairs: str = "halves"
    mrope_section: list[int] | None = None
    mrope_interleaved: bool = False


# The op's defaults: cos and sin already gathered, rotate_half pairs, no M-RoPE.
DEFAULT_OPTIONS = RopeOptions()
