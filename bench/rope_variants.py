"""rope's keyword options in the benchmark: inputs and providers per variant op.

One op key per option (shapes.ROPE_VARIANTS); the sweep's ``variant`` names
the model convention where an op has two.  Every provider of one shape gets
the same values (same seed), dtype and memory layout: q and k are views of
HF's (B, S, H, D) projection output, or (T, H, D) packed tokens; cos/sin
are (max_pos, R) tables looked up at position ids, or (1, S, R) rows
already gathered where the variant is about something else (pairs, partial
rotary).  ``liger`` passes the option to torch.ops.liger.rope, which
gathers table rows in the kernel; the references do in torch what the op
does in the kernel (``table[position_ids]``, M-RoPE's per-stream choice of
rows), so that work is part of their time.

    op                 liger option                   torch (HF reference)           liger_kernel
    rope_position_ids  position_ids (B, S)            llama apply_rotary_pos_emb     gather, LigerRopeFunction
    rope_interleaved   pairs="interleaved" (+ R < D)  cohere's (full) / glm4's (R<D)  LigerLlama4RopeFunction
                                                                                     (full) / none (R < D)
    rope_partial       (1, S, R) rows, R < D          phi3 apply_rotary_pos_emb      LigerRopeFunction
    rope_k_only        rope(k, None, ..., pos)        k*cos + llama rotate_half(k)*sin  none
    rope_mrope         mrope_section (+ interleaved)  gather, HF's recomposition      LigerQwen2VLMRopeFunction
                                                      (qwen2_vl / qwen3_vl rotary)   (qwen2_vl) / gather,
                                                                                     recompose, LigerRopeFunction
                                                                                     (qwen3_vl, as its patch does)
    rope_packed        cu_seqlens, or (T,) ids        gather at restarting ids,      the same, LigerRopeFunction
                                                      llama apply on (1, H, T, D)

``compile`` is torch.compile of the torch column.  Where upstream has no
equivalent the sweep's config says why (``no_upstream``) and liger_kernel
is recorded as a skip; the summary then leaves it out of the rivals.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

ROPE_BASE = 10000.0


# --------------------------------------------------------------------------
# Inputs


def _dtype(shape: dict[str, Any]) -> torch.dtype:
    return getattr(torch, shape["dtype"])


def _generator(device: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(0)


def _freqs(positions: int, rot: int, device: str) -> torch.Tensor:
    inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, rot, 2, device=device, dtype=torch.float32) / rot))
    return torch.outer(torch.arange(positions, device=device, dtype=torch.float32), inv_freq)


def angle_tables(positions: int, rot: int, device: str, dtype: torch.dtype, pairs: str = "halves"):
    """(positions, R) cos and sin, laid out as HF's rotary builds them: cat(freqs, freqs) for
    halves, repeat_interleave(freqs, 2) for interleaved pairs (Cohere's)."""
    f = _freqs(positions, rot, device)
    emb = f.repeat_interleave(2, dim=-1) if pairs == "interleaved" else torch.cat((f, f), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _heads(g: torch.Generator, lead: tuple[int, ...], heads: int, d: int, device: str, dtype: torch.dtype):
    return torch.randn(*lead, heads, d, device=device, generator=g).to(dtype).requires_grad_(True)


def hf_view(store: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) storage as HF's (B, H, S, D) view; (T, H, D) packed tokens as (1, H, T, D)."""
    return store.transpose(1, 2) if store.dim() == 4 else store[None].transpose(1, 2)


def packed_back(out: torch.Tensor) -> torch.Tensor:
    """(1, H, T, D) back to the packed (T, H, D) view of the same memory."""
    return out.transpose(1, 2)[0]


def mrope_position_ids(shape: dict[str, Any], device: str) -> torch.Tensor:
    """(3, B, T) temporal/height/width ids as Qwen2-VL's get_rope_index lays out one image of
    grid (gh, gw) followed by text: image tokens (0, row, col), text tokens all three at
    max(gh, gw) + i."""
    gh, gw = shape["grid"]
    b, t = shape["B"], shape["T"]
    n_text = t - gh * gw
    if n_text < 0:
        raise ValueError(f"grid {gh}x{gw} does not fit in T={t}")
    rows = torch.arange(gh, device=device).repeat_interleave(gw)
    cols = torch.arange(gw, device=device).repeat(gh)
    text = max(gh, gw) + torch.arange(n_text, device=device)
    ids = torch.stack(
        (
            torch.cat((torch.zeros_like(rows), text)),
            torch.cat((rows, text)),
            torch.cat((cols, text)),
        )
    )
    return ids[:, None, :].expand(3, b, t).contiguous()


def packed_positions(doc_lens: list[int], device: str) -> torch.Tensor:
    """(T,) ids restarting at 0 at each document (HF's DataCollatorWithFlattening)."""
    return torch.cat([torch.arange(n, device=device) for n in doc_lens])


def cu_seqlens(doc_lens: list[int], device: str) -> torch.Tensor:
    lens = torch.tensor([0, *doc_lens], device=device, dtype=torch.int32)
    return lens.cumsum(0, dtype=torch.int32)


# --------------------------------------------------------------------------
# HF's functions, looked up when a provider is built (transformers costs seconds to import;
# resolving them outside the timed function keeps Dynamo off functools.cache)


@functools.cache
def _hf(model: str) -> types.ModuleType:
    import importlib

    return importlib.import_module(f"transformers.models.{model}.modeling_{model}")


def _recompose(interleaved: bool) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """The Qwen2-VL (sections) or Qwen3-VL (interleaved) rotary's recomposition_frequencies:
    (3, B, S, R/2) per-stream rows -> (B, S, R), each pair from its stream."""
    if interleaved:
        return _hf("qwen3_vl").Qwen3VLTextRotaryEmbedding.recomposition_frequencies
    return _hf("qwen2_vl").Qwen2VLRotaryEmbedding.recomposition_frequencies


def mrope_rows(recompose, table: torch.Tensor, position_ids: torch.Tensor, section: list[int]) -> torch.Tensor:
    """HF's M-RoPE rows: each stream's half-width rows at its ids, recomposed per pair."""
    half = table[:, : table.shape[-1] // 2][position_ids]  # (3, B, S, R/2)
    return recompose(types.SimpleNamespace(mrope_section=list(section)), half)


def hf_gathered() -> Callable[..., Any]:
    """Llama: cos/sin rows at position_ids (what HF's rotary embedding hands over), then
    apply_rotary_pos_emb on HF's (B, H, S, D) views; packed stores come back packed."""
    apply_rope = _hf("llama").apply_rotary_pos_emb

    def fn(q_store, k_store, cos_table, sin_table, position_ids):
        cos, sin = cos_table[position_ids], sin_table[position_ids]
        q_out, k_out = apply_rope(hf_view(q_store), hf_view(k_store), cos, sin)
        if q_store.dim() == 3:
            return packed_back(q_out), packed_back(k_out)
        return q_out, k_out

    return fn


def hf_k_only() -> Callable[..., Any]:
    """One tensor (a KV-cache append): k*cos + rotate_half(k)*sin with gathered rows."""
    rotate_half = _hf("llama").rotate_half

    def fn(k_store, cos_table, sin_table, position_ids):
        k = hf_view(k_store)
        cos, sin = cos_table[position_ids].unsqueeze(1), sin_table[position_ids].unsqueeze(1)
        return k * cos + rotate_half(k) * sin

    return fn


def hf_mrope(section: list[int], interleaved: bool) -> Callable[..., Any]:
    """Qwen2-VL / Qwen3-VL: the rotary's per-stream rows, then the model's apply_rotary_pos_emb."""
    recompose = _recompose(interleaved)
    apply_rope = _hf("qwen3_vl" if interleaved else "qwen2_vl").apply_rotary_pos_emb

    def fn(q_store, k_store, cos_table, sin_table, position_ids):
        cos = mrope_rows(recompose, cos_table, position_ids, section)
        sin = mrope_rows(recompose, sin_table, position_ids, section)
        return apply_rope(hf_view(q_store), hf_view(k_store), cos, sin)

    return fn


def hf_rows(model: str) -> Callable[..., Any]:
    """``model``'s apply_rotary_pos_emb on HF views with already gathered (1, S, R) rows."""
    apply_rope = _hf(model).apply_rotary_pos_emb

    def fn(q_store, k_store, cos, sin):
        return apply_rope(hf_view(q_store), hf_view(k_store), cos, sin)

    return fn


# --------------------------------------------------------------------------
# Upstream (liger_kernel) paths: the same inputs as the references


def upstream_gathered(ops) -> Callable[..., Any]:
    """Rows gathered in torch (upstream's rope ignores position_ids), then LigerRopeFunction."""
    fn_cls = ops.LigerRopeFunction

    def fn(q_store, k_store, cos_table, sin_table, position_ids):
        out = fn_cls.apply(hf_view(q_store), hf_view(k_store), cos_table[position_ids], sin_table[position_ids])
        return tuple(packed_back(o) for o in out) if q_store.dim() == 3 else out

    return fn


def upstream_rows(ops) -> Callable[..., Any]:
    fn_cls = ops.LigerRopeFunction
    return lambda q_store, k_store, cos, sin: fn_cls.apply(hf_view(q_store), hf_view(k_store), cos, sin)


def upstream_llama4(ops) -> Callable[..., Any]:
    """liger_llama4_text_rotary_pos_emb: interleaved pairs as complex numbers, on HF's (B, S, H, D)
    storage itself, with Llama 4's (S, D/2) complex freqs_cis."""
    fn_cls = ops.LigerLlama4RopeFunction

    def fn(q_store, k_store, freqs_cis):
        return tuple(o.transpose(1, 2) for o in fn_cls.apply(q_store, k_store, freqs_cis))

    return fn


def upstream_mrope(ops, section: list[int], interleaved: bool) -> Callable[..., Any]:
    """Qwen2-VL: liger_multimodal_rotary_pos_emb's LigerQwen2VLMRopeFunction on (3, B, S, D) rows.
    Qwen3-VL: what apply_liger_kernel_to_qwen3_vl runs, HF's rotary rows, then LigerRopeFunction."""
    if interleaved:
        recompose, fn_cls = _recompose(True), ops.LigerRopeFunction

        def fn(q_store, k_store, cos_table, sin_table, position_ids):
            cos = mrope_rows(recompose, cos_table, position_ids, section)
            sin = mrope_rows(recompose, sin_table, position_ids, section)
            return fn_cls.apply(hf_view(q_store), hf_view(k_store), cos, sin)

        return fn
    mrope_cls = ops.LigerQwen2VLMRopeFunction

    def fn(q_store, k_store, cos_table, sin_table, position_ids):
        cos, sin = cos_table[position_ids], sin_table[position_ids]
        return mrope_cls.apply(hf_view(q_store), hf_view(k_store), cos, sin, list(section))

    return fn


# --------------------------------------------------------------------------
# Ours


def liger(**options) -> Callable[..., Any]:
    """torch.ops.liger.rope on HF's views, the tensors after the tables passed on (position_ids)."""

    def fn(q_store, k_store, cos, sin, *tensors):
        return torch.ops.liger.rope(hf_view(q_store), hf_view(k_store), cos, sin, *tensors, **options)

    return fn


def liger_packed(**options) -> Callable[..., Any]:
    """torch.ops.liger.rope on the packed (T, H, D) tokens themselves."""
    return lambda q_store, k_store, cos, sin, *tensors: torch.ops.liger.rope(
        q_store, k_store, cos, sin, *tensors, **options
    )


def liger_k_only(k_store, cos, sin, position_ids):
    return torch.ops.liger.rope(hf_view(k_store), None, cos, sin, position_ids)[0]


# --------------------------------------------------------------------------
# The builder


@dataclass
class Plan:
    """One variant at one shape: the stores gradients are taken for, our call and its
    arguments, the reference and its arguments (compile and upstream take the reference's),
    and upstream's path (a function of liger_kernel.ops) where there is one."""

    stores: tuple[torch.Tensor, ...]
    liger: Callable[..., Any]
    liger_args: tuple[Any, ...]
    reference: Callable[[], Callable[..., Any]]
    reference_args: tuple[Any, ...]
    upstream: Callable[[Any], Callable[..., Any]] | None = None
    upstream_args: tuple[Any, ...] | None = None  # where upstream takes other inputs than the reference


def plan(op: str, shape: dict[str, Any], device: str) -> Plan:
    dt, g = _dtype(shape), _generator(device)
    b, t, d = shape["B"], shape["T"], shape["head_dim"]
    rot = shape.get("rotary_dim", d)
    packed = op == "rope_packed"
    if packed and sum(shape["doc_lens"]) != t:
        raise ValueError(f"doc_lens {shape['doc_lens']} do not sum to T={t}")
    lead = (t,) if packed else (b, t)
    k_store = _heads(g, lead, shape["n_kv_heads"], d, device, dt)
    if op == "rope_k_only":
        pos = (shape["cache_len"] + torch.arange(t, device=device)).expand(b, t).contiguous()
        cos, sin = angle_tables(shape["max_pos"], rot, device, dt)
        args = (k_store, cos, sin, pos)
        return Plan((k_store,), liger_k_only, args, hf_k_only, args)
    # q drawn after k keeps k's values those of rope_k_only at the same seed; nothing depends on it.
    q_store = _heads(g, lead, shape["n_q_heads"], d, device, dt)
    stores = (q_store, k_store)
    variant = shape.get("variant")
    if op in ("rope_interleaved", "rope_partial"):  # (1, S, R) rows, gathered once per forward
        if op == "rope_partial":
            cos, sin = (x[None] for x in angle_tables(t, rot, device, dt))
            return Plan(
                stores, liger(), (*stores, cos, sin), lambda: hf_rows("phi3"), (*stores, cos, sin), upstream_rows
            )
        if variant == "glm":  # GLM-4 takes cat(freqs, freqs) rows and interleaves them itself
            cos, sin = (x[None] for x in angle_tables(t, rot, device, dt))
            ours = tuple(x[..., : rot // 2].repeat_interleave(2, dim=-1).contiguous() for x in (cos, sin))
            return Plan(
                stores, liger(pairs="interleaved"), (*stores, *ours), lambda: hf_rows("glm4"), (*stores, cos, sin)
            )
        cos, sin = (x[None] for x in angle_tables(t, rot, device, dt, "interleaved"))  # Cohere's layout
        args = (*stores, cos, sin)
        # Upstream's interleaved pairs are Llama 4's: cos + i*sin per pair, made once per forward by
        # Llama 4's rotary as Cohere's makes its cos/sin rows (complex64: the bytes of bf16 cos and sin).
        freqs_cis = torch.complex(cos[0, :, ::2].float(), sin[0, :, ::2].float())
        plan = Plan(stores, liger(pairs="interleaved"), args, lambda: hf_rows("cohere"), args, upstream_llama4)
        plan.upstream_args = (*stores, freqs_cis)
        return plan
    cos, sin = angle_tables(shape["max_pos"], rot, device, dt)
    if op == "rope_mrope":
        section, il = list(shape["mrope_section"]), bool(shape.get("mrope_interleaved", False))
        args = (*stores, cos, sin, mrope_position_ids(shape, device))
        return Plan(
            stores,
            liger(mrope_section=section, mrope_interleaved=il),
            args,
            lambda: hf_mrope(section, il),
            args,
            lambda ops: upstream_mrope(ops, section, il),
        )
    if packed:  # the references take HF's (1, T) ids restarting at each document
        pos = packed_positions(shape["doc_lens"], device)
        if variant == "cu_seqlens":
            ours = liger_packed(cu_seqlens=cu_seqlens(shape["doc_lens"], device)), (*stores, cos, sin)
        else:
            ours = liger_packed(), (*stores, cos, sin, pos)
        return Plan(stores, *ours, hf_gathered, (*stores, cos, sin, pos[None]), upstream_gathered)
    if op == "rope_position_ids":
        pos = torch.arange(t, device=device).expand(b, t).contiguous()
        args = (*stores, cos, sin, pos)
        return Plan(stores, liger(), args, hf_gathered, args, upstream_gathered)
    raise ValueError(f"unknown rope variant {op!r}")


def build(op: str, provider: str, shape: dict[str, Any], device: str, compiled, upstream, unavailable):
    """(fn, args, grad_inputs) of ``provider`` for the variant ``op`` at ``shape``.  ``compiled(fn)``
    wraps a reference in torch.compile, ``upstream()`` returns liger_kernel.ops, ``unavailable(why)``
    is the exception for a provider that cannot run here."""
    if provider == "liger_kernel" and "no_upstream" in shape:
        raise unavailable(shape["no_upstream"])
    p = plan(op, shape, device)
    if provider == "liger":
        import registrations  # noqa: F401  (defines torch.ops.liger.*)

        return p.liger, p.liger_args, p.stores
    if provider == "torch":
        return p.reference(), p.reference_args, p.stores
    if provider == "compile":
        return compiled(p.reference()), p.reference_args, p.stores
    if provider == "liger_kernel":
        if p.upstream is None:
            raise unavailable(f"no liger_kernel equivalent of {op}")
        return p.upstream(upstream()), p.upstream_args or p.reference_args, p.stores
    raise ValueError(provider)
