"""Pure-PyTorch rotary embedding: the ground truth for tests and the CPU
fallback, for every variant the op takes.

Rotation pair p (p < h = R/2) holds (x_lo, x_hi) = (x[p], x[p + h]) in the
"halves" layout (HF's rotate_half), (x[2p], x[2p+1]) in the "interleaved"
one (GPT-J's rotate_every_two).  With cos and sin laid out like the output's
rotary dims (HF builds them so: cat(freqs, freqs) for halves,
repeat_interleave(freqs, 2) for interleaved pairs), the formula
out = x'*cos + rotate(x')*sin, x' being x rearranged into the output's
layout, reads per pair

    y_lo = x_lo*cos_lo - x_hi*sin_lo
    y_hi = x_hi*cos_hi + x_lo*sin_hi

and the backward is its transpose (the inverse rotation when cos_lo ==
cos_hi and sin_lo == sin_hi, as HF builds them), reading dy in the output's
layout and writing dx in the input's:

    dx_lo = dy_lo*cos_lo + dy_hi*sin_hi
    dx_hi = dy_hi*cos_hi - dy_lo*sin_lo

``pairs``: "halves" and "interleaved" keep the input's layout;
"interleaved_to_halves" (DeepSeek-V3's rope_interleave) reads interleaved
pairs and writes halves.  Dims R..D pass through.

cos/sin rows: given per (batch, position) (gathered), or looked up in a
(max_pos, R) table at position_ids, or at each token's offset in its
sequence of cu_seqlens (``RopeOptions``).  M-RoPE looks each pair up at its own stream's
position (``pair_streams``).  Math runs in float32, float64 when the data is
float64; outputs come back in each input's dtype and memory layout.
"""

from __future__ import annotations

import torch

from csrc_free_ops.rope import DEFAULT_OPTIONS, RopeOptions

Pair = tuple[torch.Tensor | None, torch.Tensor | None]

PAIRS = ("halves", "interleaved", "interleaved_to_halves")


def compute_dtype(*data: torch.Tensor | None) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in data) else torch.float32


def interleaved(pairs: str) -> tuple[bool, bool]:
    """(input, output) in the interleaved layout, for a ``pairs`` value."""
    return {"halves": (False, False), "interleaved": (True, True), "interleaved_to_halves": (True, False)}[pairs]


def pair_streams(half: int, mrope_section: list[int], mrope_interleaved: bool) -> torch.Tensor:
    """The position stream (0 = t, 1 = h, 2 = w) of each of the ``half``
    rotation pairs.  Sections (Qwen2-VL): the first mrope_section[0] pairs
    take t, the next mrope_section[1] h, the rest w.  Interleaved (Qwen3-VL):
    pair p takes h when p % 3 == 1 and p < 3*mrope_section[1], w when
    p % 3 == 2 and p < 3*mrope_section[2], else t."""
    p = torch.arange(half)
    t, h, w = mrope_section
    if mrope_interleaved:
        return ((p % 3 == 1) & (p < 3 * h)).long() + 2 * ((p % 3 == 2) & (p < 3 * w)).long()
    return (p >= t).long() + (p >= t + h).long()


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """(T, H, D) packed tokens as the (1, H, T, D) view the math is written for."""
    return x.unsqueeze(0).transpose(1, 2) if x.dim() == 3 else x


def _split(x: torch.Tensor, rot: int, is_interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if is_interleaved:
        return x[..., 0:rot:2], x[..., 1:rot:2]
    return x[..., : rot // 2], x[..., rot // 2 : rot]


def _join(lo: torch.Tensor, hi: torch.Tensor, is_interleaved: bool) -> torch.Tensor:
    if is_interleaved:
        return torch.stack((lo, hi), dim=-1).flatten(-2)
    return torch.cat((lo, hi), dim=-1)


def sequence_positions(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Each token's offset in its sequence: t - (the largest entry <= t)."""
    t = torch.arange(total, device=cu_seqlens.device)
    starts = cu_seqlens.long()
    idx = torch.searchsorted(starts, t, right=True) - 1
    return t - starts[idx.clamp(min=0)]


def _rows(table: torch.Tensor, batch: int, seq: int, options: RopeOptions, table_interleaved: bool) -> torch.Tensor:
    """The (B or 1, S, R) cos or sin rows of every (batch, position)."""
    position_ids, cu_seqlens, _, mrope_section, mrope_interleaved = options
    if position_ids is None and cu_seqlens is None:
        return table if table.dim() == 3 else table.unsqueeze(0)
    if cu_seqlens is not None:
        return table[sequence_positions(cu_seqlens, seq)].unsqueeze(0)
    ids = position_ids.long()
    if mrope_section is None:
        return table[ids if ids.dim() == 2 else ids.unsqueeze(0)]
    ids = ids if ids.dim() == 3 else ids.unsqueeze(1)  # (3, B or 1, S)
    rot = table.shape[-1]
    streams = pair_streams(rot // 2, mrope_section, mrope_interleaved).to(table.device)
    cols = torch.arange(rot, device=table.device)
    col_streams = streams[cols // 2] if table_interleaved else streams[cols % (rot // 2)]
    per_stream = table[ids]  # (3, B or 1, S, R)
    return per_stream.gather(0, col_streams.view(1, 1, 1, rot).expand(1, *per_stream.shape[1:])).squeeze(0)


def _rotate(x, cos, sin, ct, inverse: bool, options: RopeOptions):
    x_in, x_out = interleaved(options.pairs)
    if inverse:  # reads dy in the forward's output layout, writes dx in its input layout
        x_in, x_out = x_out, x_in
    table_interleaved = x_in if inverse else x_out
    x4 = _as_4d(x)
    batch, _, seq, _ = x4.shape
    rows = [_rows(t, batch, seq, options, table_interleaved) for t in (cos, sin)]
    c, s = (r.unsqueeze(1).to(ct) for r in rows)  # (B or 1, 1, S, R)
    rot = c.shape[-1]
    c_lo, c_hi = _split(c, rot, table_interleaved)
    s_lo, s_hi = _split(s, rot, table_interleaved)
    x1 = x4.to(ct)
    lo, hi = _split(x1, rot, x_in)
    if inverse:
        y_lo = lo * c_lo + hi * s_hi
        y_hi = hi * c_hi - lo * s_lo
    else:
        y_lo = lo * c_lo - hi * s_lo
        y_hi = hi * c_hi + lo * s_hi
    y = torch.cat((_join(y_lo, y_hi, x_out), x1[..., rot:]), dim=-1)
    return y.transpose(1, 2).squeeze(0) if x.dim() == 3 else y


def _like(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """values in x's dtype and memory layout (what the Triton launches return)."""
    out = torch.empty_like(x)
    out.copy_(values)
    return out


def _each(q, k, cos, sin, inverse: bool, options: RopeOptions):
    ct = compute_dtype(q, k)
    return tuple(None if x is None else _rotate(x, cos, sin, ct, inverse, options) for x in (q, k))


def forward(q, k, cos, sin, options: RopeOptions = DEFAULT_OPTIONS) -> Pair:
    outs = _each(q, k, cos, sin, False, options)
    return tuple(None if x is None else _like(x, y) for x, y in zip((q, k), outs, strict=True))


def backward(dq, dk, cos, sin, options: RopeOptions = DEFAULT_OPTIONS) -> Pair:
    outs = _each(dq, dk, cos, sin, True, options)
    return tuple(None if x is None else _like(x, y) for x, y in zip((dq, dk), outs, strict=True))


def forward_(q, k, cos, sin, options: RopeOptions = DEFAULT_OPTIONS) -> None:
    for x, y in zip((q, k), _each(q, k, cos, sin, False, options), strict=True):
        if x is not None:
            x.copy_(y)
