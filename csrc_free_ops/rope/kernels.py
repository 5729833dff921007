"""The Triton kernel of rope, shared by the CUDA and NPU launches, which differ
only in their Plan (plan.py: head blocks, grid, warps).

A "row" is one (batch, position) pair: its cos and sin are loaded once, then
every head of q and of k at that position is rotated as [BLOCK_H, BLOCK_HALF]
tiles, one per half.  GRID_STRIDE: programs walk the rows with a grid stride
(the NPU: one program per vector core); else one program per row, no loop
(CUDA).  HEADS_FIT: one tile holds every q head and every k head, so no heads
loop either.  Offsets are int64, so tensors beyond 2^31 elements address
correctly; masks cover head counts and widths that are not powers of two.

Math runs in COMPUTE (float32, or float64 for float64 data); every load is
converted to it, so cos and sin may have any float dtype.  With the pair
(lo, hi) of a rotated dim and its partner:

    forward:  y_lo = x_lo*cos_lo - x_hi*sin_lo,  y_hi = x_hi*cos_hi + x_lo*sin_hi
    backward: the transpose, dx_lo = dy_lo*cos_lo + dy_hi*sin_hi,
              dx_hi = dy_hi*cos_hi - dy_lo*sin_lo

The runtime arguments are listed once, in ``launch.KernelArgs`` (a test
holds it equal to ``rope_kernel.arg_names``).
"""

import triton
import triton.language as tl


@triton.jit
def _store(ptr, value, mask):
    """Store COMPUTE values in ptr's dtype.  float64 results reach 16-bit
    outputs through float32: the interpreter's direct float64 -> bfloat16
    cast gives garbage."""
    if ptr.dtype.element_ty != tl.float64:
        value = value.to(tl.float32)
    tl.store(ptr, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_cos_sin(cos, sin, cos_row, sin_row, stride_cos_r, stride_sin_r, half,
                  BLOCK_HALF: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """cos_lo, cos_hi, sin_lo, sin_hi of one row as COMPUTE [1, BLOCK_HALF]."""
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)
    mask = cols < half
    c_lo = tl.load(cos + cos_row + cols * stride_cos_r, mask=mask, other=0.0).to(COMPUTE)
    c_hi = tl.load(cos + cos_row + (cols + half) * stride_cos_r, mask=mask, other=0.0).to(COMPUTE)
    s_lo = tl.load(sin + sin_row + cols * stride_sin_r, mask=mask, other=0.0).to(COMPUTE)
    s_hi = tl.load(sin + sin_row + (cols + half) * stride_sin_r, mask=mask, other=0.0).to(COMPUTE)
    return c_lo[None, :], c_hi[None, :], s_lo[None, :], s_hi[None, :]


@triton.jit
def _rotate_pair(x_lo, x_hi, c_lo, c_hi, s_lo, s_hi, BACKWARD: tl.constexpr):
    if BACKWARD:
        y_lo = x_lo * c_lo + x_hi * s_hi
        y_hi = x_hi * c_hi - x_lo * s_lo
    else:
        y_lo = x_lo * c_lo - x_hi * s_lo
        y_hi = x_hi * c_hi + x_lo * s_hi
    return y_lo, y_hi


@triton.jit
def _rotate_block(
    x, y, x_row, y_row, h0, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, half,
    c_lo, c_hi, s_lo, s_hi,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Rotate heads h0 .. h0 + BLOCK_H - 1 (those below n_heads) of one row."""
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)[None, :]
    heads = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
    mask = (heads < n_heads) & (cols < half)
    x_lo_ptr = x + x_row + heads * stride_x_h + cols * stride_x_d
    y_lo_ptr = y + y_row + heads * stride_y_h + cols * stride_y_d
    x_lo = tl.load(x_lo_ptr, mask=mask, other=0.0).to(COMPUTE)
    x_hi = tl.load(x_lo_ptr + half * stride_x_d, mask=mask, other=0.0).to(COMPUTE)
    y_lo, y_hi = _rotate_pair(x_lo, x_hi, c_lo, c_hi, s_lo, s_hi, BACKWARD)
    _store(y_lo_ptr, y_lo, mask)
    _store(y_lo_ptr + half * stride_y_d, y_hi, mask)


@triton.jit
def _rotate_heads(
    x, y, x_row, y_row, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, half,
    c_lo, c_hi, s_lo, s_hi,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr, HEADS_FIT: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """HEADS_FIT: n_heads <= BLOCK_H, so one block without a loop (on an H200
    the loop cost ~1% of rope's time)."""
    if HEADS_FIT:
        _rotate_block(
            x, y, x_row, y_row, 0, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, half,
            c_lo, c_hi, s_lo, s_hi, BLOCK_H, BLOCK_HALF, BACKWARD, COMPUTE,
        )  # fmt: skip
    else:
        for h0 in tl.range(0, n_heads, BLOCK_H):
            _rotate_block(
                x, y, x_row, y_row, h0, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, half,
                c_lo, c_hi, s_lo, s_hi, BLOCK_H, BLOCK_HALF, BACKWARD, COMPUTE,
            )  # fmt: skip


@triton.jit
def _copy_pass(
    x, y, x_row, y_row, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, rot_dim, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """Copy the dims rot_dim..head_dim that partial rotary leaves unchanged."""
    cols = rot_dim + tl.arange(0, BLOCK_PASS).to(tl.int64)[None, :]
    col_mask = cols < head_dim
    for h0 in tl.range(0, n_heads, BLOCK_H):
        heads = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
        mask = (heads < n_heads) & col_mask
        v = tl.load(x + x_row + heads * stride_x_h + cols * stride_x_d, mask=mask)
        tl.store(y + y_row + heads * stride_y_h + cols * stride_y_d, v, mask=mask)


@triton.jit
def _rope_row(
    row, tensors, sizes, q_strides, q_out_strides, k_strides, k_out_strides, cos_strides, sin_strides,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    HEADS_FIT: tl.constexpr, COPY_PASS: tl.constexpr, BACKWARD: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Rotate every q and k head of one (batch, position) row; row is int64.
    Strides come as (batch, heads, seq, head_dim) and (batch, seq, col) tuples."""
    q, k, q_out, k_out, cos, sin = tensors
    seq_len, n_qh, n_kh, half, rot_dim, head_dim = sizes
    b = row // seq_len
    s = row - b * seq_len
    c_lo, c_hi, s_lo, s_hi = _load_cos_sin(
        cos, sin, b * cos_strides[0] + s * cos_strides[1], b * sin_strides[0] + s * sin_strides[1],
        cos_strides[2], sin_strides[2], half, BLOCK_HALF, COMPUTE,
    )  # fmt: skip
    q_row = b * q_strides[0] + s * q_strides[2]
    q_out_row = b * q_out_strides[0] + s * q_out_strides[2]
    k_row = b * k_strides[0] + s * k_strides[2]
    k_out_row = b * k_out_strides[0] + s * k_out_strides[2]
    _rotate_heads(
        q, q_out, q_row, q_out_row, n_qh, q_strides[1], q_strides[3], q_out_strides[1], q_out_strides[3], half,
        c_lo, c_hi, s_lo, s_hi, BLOCK_QH, BLOCK_HALF, BACKWARD, HEADS_FIT, COMPUTE,
    )  # fmt: skip
    _rotate_heads(
        k, k_out, k_row, k_out_row, n_kh, k_strides[1], k_strides[3], k_out_strides[1], k_out_strides[3], half,
        c_lo, c_hi, s_lo, s_hi, BLOCK_KH, BLOCK_HALF, BACKWARD, HEADS_FIT, COMPUTE,
    )  # fmt: skip
    if COPY_PASS:
        _copy_pass(q, q_out, q_row, q_out_row, n_qh, q_strides[1], q_strides[3], q_out_strides[1], q_out_strides[3],
                   rot_dim, head_dim, BLOCK_QH, BLOCK_PASS)  # fmt: skip
        _copy_pass(k, k_out, k_row, k_out_row, n_kh, k_strides[1], k_strides[3], k_out_strides[1], k_out_strides[3],
                   rot_dim, head_dim, BLOCK_KH, BLOCK_PASS)  # fmt: skip


@triton.jit
def rope_kernel(
    q, k, q_out, k_out, cos, sin,
    n_rows, seq_len, n_qh, n_kh, half, rot_dim, head_dim,
    stride_q_b, stride_q_h, stride_q_s, stride_q_d,
    stride_q_out_b, stride_q_out_h, stride_q_out_s, stride_q_out_d,
    stride_k_b, stride_k_h, stride_k_s, stride_k_d,
    stride_k_out_b, stride_k_out_h, stride_k_out_s, stride_k_out_d,
    stride_cos_b, stride_cos_s, stride_cos_r, stride_sin_b, stride_sin_s, stride_sin_r,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    GRID_STRIDE: tl.constexpr, HEADS_FIT: tl.constexpr, COPY_PASS: tl.constexpr, BACKWARD: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """Write the rotation of q and k (or its transpose, BACKWARD) into q_out
    and k_out, which may be q and k; COPY_PASS also copies dims rot_dim..head_dim."""
    tensors = (q, k, q_out, k_out, cos, sin)
    sizes = (seq_len, n_qh, n_kh, half, rot_dim, head_dim)
    q_strides = (stride_q_b, stride_q_h, stride_q_s, stride_q_d)
    q_out_strides = (stride_q_out_b, stride_q_out_h, stride_q_out_s, stride_q_out_d)
    k_strides = (stride_k_b, stride_k_h, stride_k_s, stride_k_d)
    k_out_strides = (stride_k_out_b, stride_k_out_h, stride_k_out_s, stride_k_out_d)
    cos_strides = (stride_cos_b, stride_cos_s, stride_cos_r)
    sin_strides = (stride_sin_b, stride_sin_s, stride_sin_r)
    if GRID_STRIDE:
        for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
            _rope_row(
                tl.cast(row, tl.int64), tensors, sizes, q_strides, q_out_strides, k_strides, k_out_strides,
                cos_strides, sin_strides,
                BLOCK_QH, BLOCK_KH, BLOCK_HALF, BLOCK_PASS, HEADS_FIT, COPY_PASS, BACKWARD, COMPUTE,
            )  # fmt: skip
    else:
        _rope_row(
            tl.program_id(0).to(tl.int64), tensors, sizes, q_strides, q_out_strides, k_strides, k_out_strides,
            cos_strides, sin_strides,
            BLOCK_QH, BLOCK_KH, BLOCK_HALF, BLOCK_PASS, HEADS_FIT, COPY_PASS, BACKWARD, COMPUTE,
        )  # fmt: skip
