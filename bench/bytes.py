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

rope, q (B, Hq, T, D), k (B, Hkv, T, D), cos and sin (Bc, T, R) with Bc = 1
(HF's (1, T, R) table) and R = D:
    forward   read q, k, write q_out, k_out        2*B*T*(Hq+Hkv)*D*e
              read cos, sin                        + 2*Bc*T*R*e
    backward  read dq, dk, write dq_in, dk_in,     same as forward
              read cos, sin
    full      forward + backward                   2 * forward

group_norm, x (N, C, L) (L = product of the spatial dims), weight / bias (C,):
    forward   read x, write y                      2*N*C*L*e
              read weight, bias                    + 2*C*p
    backward  read x, dy, write dx                 3*N*C*L*e
              read weight, write dweight, dbias    + 3*C*p
    full      forward + backward                   5*N*C*L*e + 5*C*p

The H200's copy ceiling (read + write, large contiguous copy) is about
4.25 TB/s; the HBM3e peak is 4.8 TB/s.
"""

from __future__ import annotations

from typing import Any

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


_BYTES = {"poly_norm": poly_norm_bytes, "rope": rope_bytes, "group_norm": group_norm_bytes}


def min_bytes(op: str, shape: dict[str, Any], mode: str) -> int:
    """Minimal HBM bytes of one call of ``op`` in ``mode`` at ``shape``."""
    return _BYTES[op](shape, mode)


def gbps(nbytes: int, ms: float) -> float:
    """Achieved GB/s (1e9 bytes per second) of moving nbytes in ms milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9 if ms > 0 else float("nan")
