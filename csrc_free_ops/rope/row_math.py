"""Triton device functions shared by the CUDA and NPU rotary kernels.

A "row" is one (batch, position) pair: cos and sin are loaded for it once,
then every head of q and of k at that position is rotated, a block of
BLOCK_H heads at a time, as a [BLOCK_H, BLOCK_HALF] tile per half.  All
offsets are int64 so tensors beyond 2^31 elements address correctly.
Masks cover head counts and half widths that are not powers of two.
"""

import triton
import triton.language as tl


@triton.jit
def load_cos_sin(COS, SIN, b, s, sc_b, sc_s, sc_r, ss_b, ss_s, ss_r, half, BLOCK_HALF: tl.constexpr):
    """cos_lo, cos_hi, sin_lo, sin_hi of one row as float32 [1, BLOCK_HALF]."""
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)
    mask = cols < half
    c_row = COS + b * sc_b + s * sc_s
    s_row = SIN + b * ss_b + s * ss_s
    c_lo = tl.load(c_row + cols * sc_r, mask=mask, other=0.0).to(tl.float32)
    c_hi = tl.load(c_row + (cols + half) * sc_r, mask=mask, other=0.0).to(tl.float32)
    s_lo = tl.load(s_row + cols * ss_r, mask=mask, other=0.0).to(tl.float32)
    s_hi = tl.load(s_row + (cols + half) * ss_r, mask=mask, other=0.0).to(tl.float32)
    return c_lo[None, :], c_hi[None, :], s_lo[None, :], s_hi[None, :]


@triton.jit
def rotate_pair(x_lo, x_hi, c_lo, c_hi, s_lo, s_hi, BACKWARD: tl.constexpr):
    """HF's x*cos + rotate_half(x)*sin on the two halves, or its transpose."""
    if BACKWARD:
        y_lo = x_lo * c_lo + x_hi * s_hi
        y_hi = x_hi * c_hi - x_lo * s_lo
    else:
        y_lo = x_lo * c_lo - x_hi * s_lo
        y_hi = x_hi * c_hi + x_lo * s_hi
    return y_lo, y_hi


@triton.jit
def _rotate_block(
    X, Y, x_row, y_row, h0, n_heads, sx_h, sx_d, sy_h, sy_d, half,
    c_lo, c_hi, s_lo, s_hi,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr,
):  # fmt: skip
    """Rotate heads h0 .. h0 + BLOCK_H - 1 (those below n_heads)."""
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)[None, :]
    heads = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
    mask = (heads < n_heads) & (cols < half)
    x_lo_ptr = X + x_row + heads * sx_h + cols * sx_d
    y_lo_ptr = Y + y_row + heads * sy_h + cols * sy_d
    x_lo = tl.load(x_lo_ptr, mask=mask, other=0.0).to(tl.float32)
    x_hi = tl.load(x_lo_ptr + half * sx_d, mask=mask, other=0.0).to(tl.float32)
    y_lo, y_hi = rotate_pair(x_lo, x_hi, c_lo, c_hi, s_lo, s_hi, BACKWARD)
    tl.store(y_lo_ptr, y_lo.to(Y.dtype.element_ty), mask=mask)
    tl.store(y_lo_ptr + half * sy_d, y_hi.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def rotate_heads(
    X, Y, x_row, y_row, n_heads, sx_h, sx_d, sy_h, sy_d, half,
    c_lo, c_hi, s_lo, s_hi,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr, ONE_BLOCK: tl.constexpr,
):  # fmt: skip
    """ONE_BLOCK: the launcher guarantees n_heads <= BLOCK_H, so one block
    without a loop (on an H200 the loop cost ~1% of rope's time)."""
    if ONE_BLOCK:
        _rotate_block(
            X, Y, x_row, y_row, 0, n_heads, sx_h, sx_d, sy_h, sy_d, half,
            c_lo, c_hi, s_lo, s_hi, BLOCK_H, BLOCK_HALF, BACKWARD,
        )  # fmt: skip
    else:
        for h0 in tl.range(0, n_heads, BLOCK_H):
            _rotate_block(
                X, Y, x_row, y_row, h0, n_heads, sx_h, sx_d, sy_h, sy_d, half,
                c_lo, c_hi, s_lo, s_hi, BLOCK_H, BLOCK_HALF, BACKWARD,
            )  # fmt: skip


@triton.jit
def copy_pass(
    X, Y, x_row, y_row, n_heads, sx_h, sx_d, sy_h, sy_d, rot_dim, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """Copy the dims rot_dim..head_dim that partial rotary leaves unchanged."""
    cols = rot_dim + tl.arange(0, BLOCK_PASS).to(tl.int64)[None, :]
    col_mask = cols < head_dim
    for h0 in tl.range(0, n_heads, BLOCK_H):
        heads = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
        mask = (heads < n_heads) & col_mask
        x = tl.load(X + x_row + heads * sx_h + cols * sx_d, mask=mask)
        tl.store(Y + y_row + heads * sy_h + cols * sy_d, x, mask=mask)


@triton.jit
def rope_row(
    Q, K, QO, KO, COS, SIN, row,
    seq_len, n_qh, n_kh, half, rot_dim, head_dim,
    sq_b, sq_h, sq_s, sq_d, sqo_b, sqo_h, sqo_s, sqo_d,
    sk_b, sk_h, sk_s, sk_d, sko_b, sko_h, sko_s, sko_d,
    sc_b, sc_s, sc_r, ss_b, ss_s, ss_r,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BACKWARD: tl.constexpr, COPY_PASS: tl.constexpr, HEADS_FIT: tl.constexpr,
):  # fmt: skip
    """Rotate every q and k head of one (batch, position) row; row is int64.
    HEADS_FIT: BLOCK_QH >= n_qh and BLOCK_KH >= n_kh (see ``heads_fit``)."""
    b = row // seq_len
    s = row - b * seq_len
    c_lo, c_hi, s_lo, s_hi = load_cos_sin(COS, SIN, b, s, sc_b, sc_s, sc_r, ss_b, ss_s, ss_r, half, BLOCK_HALF)
    q_row = b * sq_b + s * sq_s
    qo_row = b * sqo_b + s * sqo_s
    k_row = b * sk_b + s * sk_s
    ko_row = b * sko_b + s * sko_s
    rotate_heads(
        Q, QO, q_row, qo_row, n_qh, sq_h, sq_d, sqo_h, sqo_d, half,
        c_lo, c_hi, s_lo, s_hi, BLOCK_QH, BLOCK_HALF, BACKWARD, HEADS_FIT,
    )  # fmt: skip
    rotate_heads(
        K, KO, k_row, ko_row, n_kh, sk_h, sk_d, sko_h, sko_d, half,
        c_lo, c_hi, s_lo, s_hi, BLOCK_KH, BLOCK_HALF, BACKWARD, HEADS_FIT,
    )  # fmt: skip
    if COPY_PASS:
        copy_pass(Q, QO, q_row, qo_row, n_qh, sq_h, sq_d, sqo_h, sqo_d, rot_dim, head_dim, BLOCK_QH, BLOCK_PASS)
        copy_pass(K, KO, k_row, ko_row, n_kh, sk_h, sk_d, sko_h, sko_d, rot_dim, head_dim, BLOCK_KH, BLOCK_PASS)


def heads_fit(n_qh: int, n_kh: int, block_qh: int, block_kh: int) -> bool:
    """The HEADS_FIT constexpr of ``rope_row``: one tile holds every q head and every k head."""
    return block_qh >= n_qh and block_kh >= n_kh
