"""Minimal bytes each op must move through HBM, per mode.

e is the activation element size (2 for bf16/fp16, 4 for fp32), p the
parameter element size.  Every tensor the op must read is read once and
every tensor it must produce is written once; caches a kernel may keep
(rstd, mean) and re-reads of x by a two-pass kernel are not counted, so
achieved GB/s = minimal bytes / median time is a lower bound on the real
traffic rate and directly comparable between providers.

poly_norm, x of shape (M, H):
    forward   read x, write y                      2*M*H*e
    backward  read x, dy, write dx                 3*M*H*e
    full      forward + backward                   5*M*H*e
    (weight (3,) and bias (1,) and their grads: negligible, not counted)

rms_norm and layer_norm: poly_norm's counts (x read once, y written once;
backward x and dy read, dx written; the (H,) parameters and their
gradients, and any saved statistics, not counted).

rope, q (B, Hq, T, D), k (B, Hkv, T, D), cos and sin (Bc, T, R) with Bc = 1
(HF's (1, T, R) table) and R = D:
    forward   read q, k, write q_out, k_out        2*B*T*(Hq+Hkv)*D*e
              read cos, sin                        + 2*Bc*T*R*e
    backward  read dq, dk, write dq_in, dk_in,     same as forward
              read cos, sin
    full      forward + backward                   2 * forward

rope's variant ops (bench/rope_variants.py): q, k as above (k only: Hq = 0;
packed: B = 1, T tokens), read and written in full (dims R..D pass through
but are still copied), plus what the cos/sin rows must cost at least: every
distinct table entry the call needs, read once (ids of one (max_pos, R)
table repeat across batch rows and documents), and the ids:
    rope_interleaved, rope_partial   (1, T, R) rows        2*T*R*e
    rope_position_ids (B, T) ids 0..T-1                     2*T*R*e + B*T*8
    rope_k_only (B, T) ids c..c+T-1                         2*T*R*e + B*T*8
    rope_packed, documents L_1..L_n                         2*max(L)*R*e
              + T*8 (position ids) or (n+1)*4 (int32 cu_seqlens)
    rope_mrope, (3, B, T) ids; stream s owns n_s of the R/2 pairs (both
              dims of each) and takes P_s distinct positions   2*sum_s(2*n_s*P_s)*e + 3*B*T*8
              (one image of gh x gw tokens, then text: P_t = 1 + text,
              P_h = gh + text, P_w = gw + text)
    backward the same; full twice that.

group_norm, x (N, C, L) (L = product of the spatial dims), weight / bias (C,):
    forward   read x, write y                      2*N*C*L*e
              read weight, bias                    + 2*C*p
    backward  read x, dy, write dx                 3*N*C*L*e
              read weight, write dweight, dbias    + 3*C*p
    full      forward + backward                   5*N*C*L*e + 5*C*p

cross_entropy, logits (BT, V), int64 targets:
    forward   read logits, targets                 BT*V*e + 8*BT
    backward  read logits, write their gradient    2*BT*V*e + 8*BT
    full      forward + backward                   3*BT*V*e + 16*BT

fused_linear_cross_entropy, x (BT, H), the head (V, H) (matmul-bound: these
bytes are what the logits never cost, not a bandwidth target):
    forward   read x, the head                     (BT + V)*H*e + 8*BT
    backward  read x, the head, write their grads  2*(BT + V)*H*e + 8*BT
    full      forward + backward                   3*(BT + V)*H*e + 16*BT

The H200's copy ceiling (read + write, large contiguous copy) is about
4.25 TB/s; the HBM3e peak is 4.8 TB/s.
"""

from __future__ import annotations

import functools
from typing import Any

from bench.shapes import GLU_OPS, ROPE_VARIANTS

MODES = ("forward", "backward", "full")

ELEM_SIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}

# Read + write bandwidth of a large device-to-device copy on an H200 (bytes/s).
H200_COPY_CEILING = 4.25e12


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")


def poly_norm_bytes(shape: dict[str, Any], mode: str) -> int:
    _check_mode(mode)
    e = ELEM_SIZE[shape["dtype"]]
    n = int(shape["M"]) * int(shape["H"])
    return {"forward": 2, "backward": 3, "full": 5}[mode] * n * e


def glu_bytes(shape: dict[str, Any], mode: str) -> int:
    """swiglu / geglu: forward reads gate and up and writes y; backward reads dy, gate and up and
    writes dgate and dup."""
    _check_mode(mode)
    n = int(shape["T"]) * int(shape["F"]) * ELEM_SIZE[shape["dtype"]]
    return {"forward": 3, "backward": 5, "full": 8}[mode] * n


def rope_bytes(shape: dict[str, Any], mode: str) -> int:
    _check_mode(mode)
    e = ELEM_SIZE[shape["dtype"]]
    b, t, d = int(shape["B"]), int(shape["T"]), int(shape["head_dim"])
    heads = int(shape["n_q_heads"]) + int(shape["n_kv_heads"])
    rot = int(shape.get("rotary_dim", d))
    table_batch = int(shape.get("table_batch", 1))
    one = 2 * b * t * heads * d * e + 2 * table_batch * t * rot * e
    return one * (2 if mode == "full" else 1)


def group_norm_bytes(shape: dict[str, Any], mode: str, param_dtype: str | None = None) -> int:
    _check_mode(mode)
    e = ELEM_SIZE[shape["dtype"]]
    p = ELEM_SIZE[param_dtype or shape["dtype"]]
    n, c, length = int(shape["M"]), int(shape["C"]), int(shape["H"])
    act = n * c * length * e
    fwd = 2 * act + 2 * c * p
    bwd = 3 * act + 3 * c * p
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]


ID_SIZE = 8  # int64 position ids, as HF makes them
CU_SEQLENS_SIZE = 4  # int32, as flash-attn takes them


def mrope_pairs_per_stream(half: int, section: list[int], interleaved: bool) -> tuple[int, int, int]:
    """How many of the R/2 rotation pairs take their position from the t, h and w streams:
    consecutive sections (Qwen2-VL), or h at p % 3 == 1 below 3h and w at p % 3 == 2 below 3w,
    t elsewhere (Qwen3-VL)."""
    if not interleaved:
        return section[0], section[1], section[2]
    h = sum(1 for p in range(half) if p % 3 == 1 and p < 3 * section[1])
    w = sum(1 for p in range(half) if p % 3 == 2 and p < 3 * section[2])
    return half - h - w, h, w


def _variant_table_and_ids(op: str, shape: dict[str, Any], e: int) -> int:
    b, t = int(shape["B"]), int(shape["T"])
    rot = int(shape.get("rotary_dim", shape["head_dim"]))
    if op in ("rope_interleaved", "rope_partial"):
        return 2 * t * rot * e
    if op in ("rope_position_ids", "rope_k_only"):
        return 2 * t * rot * e + b * t * ID_SIZE
    if op == "rope_packed":
        docs = [int(n) for n in shape["doc_lens"]]
        ids = (len(docs) + 1) * CU_SEQLENS_SIZE if shape.get("variant") == "cu_seqlens" else t * ID_SIZE
        return 2 * max(docs) * rot * e + ids
    if op == "rope_mrope":
        gh, gw = (int(v) for v in shape["grid"])
        text = t - gh * gw
        pairs = mrope_pairs_per_stream(rot // 2, shape["mrope_section"], bool(shape.get("mrope_interleaved")))
        positions = (1 + text, gh + text, gw + text)
        return 2 * sum(2 * n * p for n, p in zip(pairs, positions, strict=True)) * e + 3 * b * t * ID_SIZE
    raise ValueError(f"no byte count for {op!r}")


def rope_variant_bytes(op: str, shape: dict[str, Any], mode: str) -> int:
    _check_mode(mode)
    e = ELEM_SIZE[shape["dtype"]]
    tokens = int(shape["B"]) * int(shape["T"])
    heads = int(shape.get("n_q_heads", 0)) + int(shape["n_kv_heads"])
    one = 2 * tokens * heads * int(shape["head_dim"]) * e + _variant_table_and_ids(op, shape, e)
    return one * (2 if mode == "full" else 1)


def cross_entropy_bytes(shape: dict[str, Any], mode: str) -> int:
    _check_mode(mode)
    rows, e = int(shape["BT"]), ELEM_SIZE[shape["dtype"]]
    logits = rows * int(shape["V"]) * e
    return {"forward": logits + 8 * rows, "backward": 2 * logits + 8 * rows, "full": 3 * logits + 16 * rows}[mode]


def fused_linear_cross_entropy_bytes(shape: dict[str, Any], mode: str) -> int:
    _check_mode(mode)
    rows, e = int(shape["BT"]), ELEM_SIZE[shape["dtype"]]
    inputs = (rows + int(shape["V"])) * int(shape["H"]) * e
    return {"forward": inputs + 8 * rows, "backward": 2 * inputs + 8 * rows, "full": 3 * inputs + 16 * rows}[mode]


_BYTES = {"poly_norm": poly_norm_bytes, "rope": rope_bytes, "group_norm": group_norm_bytes,
          "group_norm_silu": group_norm_bytes, "cross_entropy": cross_entropy_bytes,
          "fused_linear_cross_entropy": fused_linear_cross_entropy_bytes}  # fmt: skip
_BYTES.update({op: functools.partial(rope_variant_bytes, op) for op in ROPE_VARIANTS})
_BYTES.update(dict.fromkeys(GLU_OPS, glu_bytes))
_BYTES.update({"rms_norm": poly_norm_bytes, "layer_norm": poly_norm_bytes})


def min_bytes(op: str, shape: dict[str, Any], mode: str) -> int:
    """Minimal HBM bytes of one call of ``op`` in ``mode`` at ``shape``."""
    return _BYTES[op](shape, mode)


def gbps(nbytes: int, ms: float) -> float:
    """Achieved GB/s (1e9 bytes per second) of moving nbytes in ms milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9 if ms > 0 else float("nan")
