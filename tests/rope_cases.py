"""Inputs and float64 references shared by the rope tests."""

from __future__ import annotations

import torch

from csrc_free_ops.rope import RopeOptions, reference
from tests.helpers import DEVICE

HEAD_LAYOUTS = ("contiguous", "transposed", "strided", "cache_slice")
TABLE_LAYOUTS = ("SR", "1SR", "BSR", "expanded")


def make_heads(batch, heads, seq, dim, dtype, layout, device=DEVICE) -> torch.Tensor:
    """A (batch, heads, seq, dim) tensor with the requested memory layout."""
    if layout == "contiguous":
        return torch.randn(batch, heads, seq, dim, dtype=dtype, device=device)
    if layout == "transposed":  # what HF hands over: a view of a (B, S, H, D) buffer
        return torch.randn(batch, seq, heads, dim, dtype=dtype, device=device).transpose(1, 2)
    if layout == "strided":  # head_dim stride 2: not dense
        return torch.randn(batch, heads, seq, 2 * dim, dtype=dtype, device=device)[..., ::2]
    if layout == "cache_slice":  # positions 1..seq of a longer KV-cache buffer
        return torch.randn(batch, heads, seq + 3, dim, dtype=dtype, device=device)[:, :, 1 : seq + 1]
    raise ValueError(layout)


def make_table(batch, seq, rot, dtype, layout, device=DEVICE) -> torch.Tensor:
    """A random cos or sin table (halves need not repeat) in one of the accepted shapes."""
    if layout == "SR":
        return torch.randn(seq, rot, dtype=dtype, device=device)
    if layout == "1SR":
        return torch.randn(1, seq, rot, dtype=dtype, device=device)
    if layout == "BSR":
        return torch.randn(batch, seq, rot, dtype=dtype, device=device)
    if layout == "expanded":  # (B, S, R) with batch stride 0
        return torch.randn(1, seq, rot, dtype=dtype, device=device).expand(batch, seq, rot)
    raise ValueError(layout)


def hf_tables(batch, seq, rot, dtype, device=DEVICE, base=10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, S, R) as HF's rotary embedding builds them (repeated halves)."""
    inv_freq = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    positions = torch.arange(seq, dtype=torch.float64)[None, :].expand(batch, seq)
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


def reference_outputs_and_grads(q, k, cos, sin, dq_out, dk_out):
    """Float64 (q_out, k_out) and (dq, dk) by autograd through the reference forward."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k)]
    outs = reference.forward(*leaves, cos.double(), sin.double())
    grads = torch.autograd.grad(outs, leaves, (dq_out.double(), dk_out.double()))
    return tuple(o.detach() for o in outs), grads


def angle_table(max_pos, rot, dtype, pairs="halves", device=DEVICE, base=10000.0):
    """(max_pos, R) cos and sin tables for position lookups, laid out like the
    output's rotary dims: cat(freqs, freqs) for halves (HF's default rotary),
    repeat_interleave(freqs, 2) for interleaved pairs (Cohere's, GPT-J's)."""
    inv_freq = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq
    emb = freqs.repeat_interleave(2, dim=-1) if pairs == "interleaved" else torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


def reference_variant_grads(q, k, cos, sin, dq_out, dk_out, **options):
    """Float64 outputs and gradients through the reference forward; q or k may be None."""
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (q, k)]
    outs = reference.forward(*leaves, cos.double(), sin.double(), RopeOptions(**options))
    pairs = [(o, g.double(), x) for o, g, x in zip(outs, (dq_out, dk_out), leaves, strict=True) if x is not None]
    grads = torch.autograd.grad([o for o, _, _ in pairs], [x for _, _, x in pairs], [g for _, g, _ in pairs])
    it = iter(grads)
    return tuple(None if o is None else o.detach() for o in outs), tuple(
        None if x is None else next(it) for x in leaves
    )
