"""The Triton kernel of rope, shared by the CUDA and NPU launches, which
differ only in their Plan (plan.py: head blocks, grid, warps, how interleaved
pairs are read).

A "row" is one (batch, position) pair: its cos and sin are loaded once, then
every head of q and of k at that position is rotated as [BLOCK_H, BLOCK_HALF]
tiles of rotation pairs.  GRID_STRIDE: programs walk the rows with a grid
stride (the NPU: one program per vector core); else each program takes ROWS
consecutive rows, unrolled (CUDA; 1: no loop).  HEADS_FIT: one tile holds
every q head and every k head, so no heads loop either.  A tensor that is absent (single-tensor form) has 0 heads.
Offsets are int64, so tensors beyond 2^31 elements address correctly; masks
cover head counts and widths that are not powers of two.

Math runs in COMPUTE (float32, or float64 for float64 data); every load is
converted to it, so cos and sin may have any float dtype.  Rotation pair p
(p < half = rot_dim / 2) holds (x_lo, x_hi) = (x[p], x[p + half]) in the
halves layout, (x[2p], x[2p+1]) in the interleaved one; X_PAIRS / Y_PAIRS /
TABLE_PAIRS say which layout the input, the output and cos/sin are in.

    forward:  y_lo = x_lo*cos_lo - x_hi*sin_lo,  y_hi = x_hi*cos_hi + x_lo*sin_hi
    backward: the transpose, dx_lo = dy_lo*cos_lo + dy_hi*sin_hi,
              dx_hi = dy_hi*cos_hi - dy_lo*sin_lo

Where the table row of a (batch, position) row comes from (POSITIONS):
GATHERED, cos/sin hold it at (b, s); POSITION_IDS, row position_ids[b, s]
of a (max_pos, R) table; CU_SEQLENS, row s - (start of s's sequence), the
starts being the entries of cu_seqlens.  M-RoPE (MROPE) gives each pair its
own position stream (t, h or w): position_ids[stream(p), b, s].  A position
outside [0, max_pos) is never read: its cos/sin are NaN, so its row's rotated
dims come out NaN.

The runtime arguments are listed once, in ``launch.KernelArgs`` (a test
holds it equal to this kernel's runtime parameters).
"""

import triton
import triton.language as tl

# POSITIONS: where each row's cos/sin come from.
GATHERED = tl.constexpr(0)
POSITION_IDS = tl.constexpr(1)
CU_SEQLENS = tl.constexpr(2)
# MROPE: how rotation pairs map to the three position streams.
NO_MROPE = tl.constexpr(0)
MROPE_SECTIONS = tl.constexpr(1)  # Qwen2-VL: consecutive sections t, h, w
MROPE_INTERLEAVED = tl.constexpr(2)  # Qwen3-VL: t, h, w, t, h, w, ... then t


@triton.jit
def _store(ptr, value, mask):
    """Store COMPUTE values in ptr's dtype.  float64 results reach 16-bit
    outputs through float32: the interpreter's direct float64 -> bfloat16
    cast gives garbage."""
    if ptr.dtype.element_ty != tl.float64:
        value = value.to(tl.float32)
    tl.store(ptr, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pair_streams(pairs, mrope_section_t, mrope_section_h, mrope_section_w, MROPE: tl.constexpr):
    """The position stream (0 = t, 1 = h, 2 = w) of each rotation pair."""
    if MROPE == MROPE_SECTIONS:
        return (pairs >= mrope_section_t).to(tl.int64) + (pairs >= mrope_section_t + mrope_section_h).to(tl.int64)
    else:
        m = pairs % 3
        h = (m == 1) & (pairs < 3 * mrope_section_h)
        w = (m == 2) & (pairs < 3 * mrope_section_w)
        return h.to(tl.int64) + 2 * w.to(tl.int64)


@triton.jit
def _sequence_start(cu_seqlens, s, n_cu_seqlens, BLOCK_SEQS: tl.constexpr):
    """The largest entry of cu_seqlens that is <= s (0 if none)."""
    start = tl.zeros([], dtype=tl.int64)
    for c0 in range(0, n_cu_seqlens, BLOCK_SEQS):
        idx = c0 + tl.arange(0, BLOCK_SEQS)
        bounds = tl.load(cu_seqlens + idx, mask=idx < n_cu_seqlens, other=0).to(tl.int64)
        start = tl.maximum(start, tl.max(tl.where(bounds <= s, bounds, 0), axis=0))
    return start


@triton.jit
def _positions(
    position_ids, cu_seqlens, b, s, half, max_pos, n_cu_seqlens, mrope_section_t, mrope_section_h, mrope_section_w,
    stride_position_ids_t, stride_position_ids_b, stride_position_ids_s,
    BLOCK_HALF: tl.constexpr, BLOCK_SEQS: tl.constexpr, POSITIONS: tl.constexpr, MROPE: tl.constexpr,
):  # fmt: skip
    """(table row, whether it lies in the table) of one (batch, position) row:
    scalars, or one per rotation pair [BLOCK_HALF] under M-RoPE."""
    if POSITIONS == POSITION_IDS:
        ids = position_ids + b * stride_position_ids_b + s * stride_position_ids_s
        if MROPE == NO_MROPE:
            pos = tl.load(ids).to(tl.int64)
        else:
            pairs = tl.arange(0, BLOCK_HALF)
            streams = _pair_streams(pairs, mrope_section_t, mrope_section_h, mrope_section_w, MROPE)
            pos = tl.load(ids + streams * stride_position_ids_t, mask=pairs < half, other=0).to(tl.int64)
    else:
        pos = s - _sequence_start(cu_seqlens, s, n_cu_seqlens, BLOCK_SEQS)
    return pos, (pos >= 0) & (pos < max_pos)


@triton.jit
def _load_table(table, row, valid, stride_r, half, BLOCK_HALF: tl.constexpr, TABLE_PAIRS: tl.constexpr,
                POSITIONS: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """(lo, hi) values of one cos or sin row as COMPUTE [1, BLOCK_HALF]; with
    looked-up positions, NaN where the row is not in the table (never read)."""
    pairs = tl.arange(0, BLOCK_HALF).to(tl.int64)
    mask = pairs < half
    if POSITIONS != GATHERED:
        mask = mask & ((pairs * 0 + valid) != 0)  # a vector compare: Triton 3.9's interpreter gives a scalar's int32
    if TABLE_PAIRS:
        lo_cols = 2 * pairs
        hi_cols = lo_cols + 1
    else:
        lo_cols = pairs
        hi_cols = pairs + half
    lo = tl.load(table + row + lo_cols * stride_r, mask=mask, other=0.0).to(COMPUTE)
    hi = tl.load(table + row + hi_cols * stride_r, mask=mask, other=0.0).to(COMPUTE)
    if POSITIONS != GATHERED:
        lo = tl.where(valid, lo, float("nan"))
        hi = tl.where(valid, hi, float("nan"))
    return lo[None, :], hi[None, :]


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
def _load_pairs(x, heads_mask, stride_d, half, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                PAIRS: tl.constexpr, SPLIT_PAIRS: tl.constexpr, COMPUTE: tl.constexpr):  # fmt: skip
    """(x_lo, x_hi) [BLOCK_H, BLOCK_HALF] of the heads at x (pointers [BLOCK_H, 1])."""
    if PAIRS and SPLIT_PAIRS:  # one contiguous tile, pairs split in registers
        cols = tl.arange(0, 2 * BLOCK_HALF).to(tl.int64)[None, :]
        v = tl.load(x + cols * stride_d, mask=heads_mask & (cols < 2 * half), other=0.0).to(COMPUTE)
        return tl.split(tl.reshape(v, [BLOCK_H, BLOCK_HALF, 2]))
    pairs = tl.arange(0, BLOCK_HALF).to(tl.int64)[None, :]
    mask = heads_mask & (pairs < half)
    if PAIRS:  # strided loads (the NPU plan)
        lo_ptr = x + 2 * pairs * stride_d
        hi_offset = stride_d
    else:
        lo_ptr = x + pairs * stride_d
        hi_offset = half * stride_d
    lo = tl.load(lo_ptr, mask=mask, other=0.0).to(COMPUTE)
    hi = tl.load(lo_ptr + hi_offset, mask=mask, other=0.0).to(COMPUTE)
    return lo, hi


@triton.jit
def _store_pairs(y, lo, hi, heads_mask, stride_d, half, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 PAIRS: tl.constexpr, SPLIT_PAIRS: tl.constexpr):  # fmt: skip
    if PAIRS and SPLIT_PAIRS:
        cols = tl.arange(0, 2 * BLOCK_HALF).to(tl.int64)[None, :]
        v = tl.reshape(tl.join(lo, hi), [BLOCK_H, 2 * BLOCK_HALF])
        _store(y + cols * stride_d, v, heads_mask & (cols < 2 * half))
    elif PAIRS:
        # Stride-2 stores (the NPU plan), each masked by its own columns: with the pairs' mask
        # (pairs < half) on both, triton-ascend 3.2 takes them for an interleave it fails an
        # assertion on ("InterleaveStatusWithMaskOptimization", docs/npu.md).
        lo_cols = 2 * tl.arange(0, BLOCK_HALF).to(tl.int64)[None, :]
        hi_cols = lo_cols + 1
        _store(y + lo_cols * stride_d, lo, heads_mask & (lo_cols < 2 * half))
        _store(y + hi_cols * stride_d, hi, heads_mask & (hi_cols < 2 * half))
    else:
        pairs = tl.arange(0, BLOCK_HALF).to(tl.int64)[None, :]
        mask = heads_mask & (pairs < half)
        lo_ptr = y + pairs * stride_d
        _store(lo_ptr, lo, mask)
        _store(lo_ptr + half * stride_d, hi, mask)


@triton.jit
def _rotate_block(
    x, y, h0, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, half, c_lo, c_hi, s_lo, s_hi,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr, X_PAIRS: tl.constexpr,
    Y_PAIRS: tl.constexpr, SPLIT_PAIRS: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Rotate heads h0 .. h0 + BLOCK_H - 1 (those below n_heads) of one row
    (x and y point at the row) by the row's cos and sin pairs."""
    heads = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
    heads_mask = heads < n_heads
    x_lo, x_hi = _load_pairs(x + heads * stride_x_h, heads_mask, stride_x_d, half, BLOCK_H, BLOCK_HALF, X_PAIRS,
                             SPLIT_PAIRS, COMPUTE)  # fmt: skip
    y_lo, y_hi = _rotate_pair(x_lo, x_hi, c_lo, c_hi, s_lo, s_hi, BACKWARD)
    if X_PAIRS != Y_PAIRS and SPLIT_PAIRS:
        # In place (rope_), the store of pair p lands where other lanes loaded
        # other pairs: every load of the tile is done before any store.
        tl.debug_barrier()
    _store_pairs(y + heads * stride_y_h, y_lo, y_hi, heads_mask, stride_y_d, half, BLOCK_H, BLOCK_HALF, Y_PAIRS,
                 SPLIT_PAIRS)  # fmt: skip


@triton.jit
def _rotate_heads(
    x, y, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, half, c_lo, c_hi, s_lo, s_hi,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr, HEADS_FIT: tl.constexpr,
    X_PAIRS: tl.constexpr, Y_PAIRS: tl.constexpr, SPLIT_PAIRS: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """HEADS_FIT: n_heads <= BLOCK_H, so one block without the loop's overhead."""
    if HEADS_FIT:
        _rotate_block(
            x, y, 0, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, half, c_lo, c_hi, s_lo, s_hi,
            BLOCK_H, BLOCK_HALF, BACKWARD, X_PAIRS, Y_PAIRS, SPLIT_PAIRS, COMPUTE,
        )  # fmt: skip
    else:
        for h0 in tl.range(0, n_heads, BLOCK_H):
            _rotate_block(
                x, y, h0, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, half, c_lo, c_hi, s_lo, s_hi,
                BLOCK_H, BLOCK_HALF, BACKWARD, X_PAIRS, Y_PAIRS, SPLIT_PAIRS, COMPUTE,
            )  # fmt: skip


@triton.jit
def _copy_pass(
    x, y, n_heads, stride_x_h, stride_x_d, stride_y_h, stride_y_d, rot_dim, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """Copy the dims rot_dim..head_dim that partial rotary leaves unchanged."""
    cols = rot_dim + tl.arange(0, BLOCK_PASS).to(tl.int64)[None, :]
    col_mask = cols < head_dim
    for h0 in tl.range(0, n_heads, BLOCK_H):
        heads = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
        mask = (heads < n_heads) & col_mask
        v = tl.load(x + heads * stride_x_h + cols * stride_x_d, mask=mask)
        tl.store(y + heads * stride_y_h + cols * stride_y_d, v, mask=mask)


@triton.jit
def _rope_row(
    row, q, k, q_out, k_out, cos, sin, position_ids, cu_seqlens,
    seq_len, n_qh, n_kh, half, rot_dim, head_dim, max_pos, n_cu_seqlens,
    mrope_section_t, mrope_section_h, mrope_section_w,
    stride_q_b, stride_q_h, stride_q_s, stride_q_d,
    stride_q_out_b, stride_q_out_h, stride_q_out_s, stride_q_out_d,
    stride_k_b, stride_k_h, stride_k_s, stride_k_d,
    stride_k_out_b, stride_k_out_h, stride_k_out_s, stride_k_out_d,
    stride_cos_b, stride_cos_s, stride_cos_r, stride_sin_b, stride_sin_s, stride_sin_r,
    stride_position_ids_t, stride_position_ids_b, stride_position_ids_s,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BLOCK_SEQS: tl.constexpr, HEADS_FIT: tl.constexpr, COPY_PASS: tl.constexpr, BACKWARD: tl.constexpr,
    X_PAIRS: tl.constexpr, Y_PAIRS: tl.constexpr, TABLE_PAIRS: tl.constexpr, SPLIT_PAIRS: tl.constexpr,
    POSITIONS: tl.constexpr, MROPE: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Rotate every q and k head of one (batch, position) row; row is int64.
    The kernel's arguments are passed on one by one: triton-ascend 3.2's
    frontend takes no tuple arguments (docs/npu.md, "Language level")."""
    b = row // seq_len
    s = row - b * seq_len
    if POSITIONS == GATHERED:
        cos_row = b * stride_cos_b + s * stride_cos_s
        sin_row = b * stride_sin_b + s * stride_sin_s
        valid = True
    else:
        pos, valid = _positions(
            position_ids, cu_seqlens, b, s, half, max_pos, n_cu_seqlens, mrope_section_t, mrope_section_h,
            mrope_section_w, stride_position_ids_t, stride_position_ids_b, stride_position_ids_s,
            BLOCK_HALF, BLOCK_SEQS, POSITIONS, MROPE,
        )  # fmt: skip
        cos_row = pos * stride_cos_s
        sin_row = pos * stride_sin_s
    c_lo, c_hi = _load_table(cos, cos_row, valid, stride_cos_r, half, BLOCK_HALF, TABLE_PAIRS, POSITIONS, COMPUTE)
    s_lo, s_hi = _load_table(sin, sin_row, valid, stride_sin_r, half, BLOCK_HALF, TABLE_PAIRS, POSITIONS, COMPUTE)
    q_row = q + b * stride_q_b + s * stride_q_s
    q_out_row = q_out + b * stride_q_out_b + s * stride_q_out_s
    k_row = k + b * stride_k_b + s * stride_k_s
    k_out_row = k_out + b * stride_k_out_b + s * stride_k_out_s
    _rotate_heads(
        q_row, q_out_row, n_qh, stride_q_h, stride_q_d, stride_q_out_h, stride_q_out_d, half, c_lo, c_hi, s_lo, s_hi,
        BLOCK_QH, BLOCK_HALF, BACKWARD, HEADS_FIT, X_PAIRS, Y_PAIRS, SPLIT_PAIRS, COMPUTE,
    )  # fmt: skip
    _rotate_heads(
        k_row, k_out_row, n_kh, stride_k_h, stride_k_d, stride_k_out_h, stride_k_out_d, half, c_lo, c_hi, s_lo, s_hi,
        BLOCK_KH, BLOCK_HALF, BACKWARD, HEADS_FIT, X_PAIRS, Y_PAIRS, SPLIT_PAIRS, COMPUTE,
    )  # fmt: skip
    if COPY_PASS:
        _copy_pass(q_row, q_out_row, n_qh, stride_q_h, stride_q_d, stride_q_out_h, stride_q_out_d,
                   rot_dim, head_dim, BLOCK_QH, BLOCK_PASS)  # fmt: skip
        _copy_pass(k_row, k_out_row, n_kh, stride_k_h, stride_k_d, stride_k_out_h, stride_k_out_d,
                   rot_dim, head_dim, BLOCK_KH, BLOCK_PASS)  # fmt: skip


@triton.jit
def rope_kernel(
    q, k, q_out, k_out, cos, sin, position_ids, cu_seqlens,
    n_rows, seq_len, n_qh, n_kh, half, rot_dim, head_dim, max_pos, n_cu_seqlens,
    mrope_section_t, mrope_section_h, mrope_section_w,
    stride_q_b, stride_q_h, stride_q_s, stride_q_d,
    stride_q_out_b, stride_q_out_h, stride_q_out_s, stride_q_out_d,
    stride_k_b, stride_k_h, stride_k_s, stride_k_d,
    stride_k_out_b, stride_k_out_h, stride_k_out_s, stride_k_out_d,
    stride_cos_b, stride_cos_s, stride_cos_r, stride_sin_b, stride_sin_s, stride_sin_r,
    stride_position_ids_t, stride_position_ids_b, stride_position_ids_s,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BLOCK_SEQS: tl.constexpr, GRID_STRIDE: tl.constexpr, ROWS: tl.constexpr, HEADS_FIT: tl.constexpr,
    COPY_PASS: tl.constexpr, BACKWARD: tl.constexpr, X_PAIRS: tl.constexpr, Y_PAIRS: tl.constexpr,
    TABLE_PAIRS: tl.constexpr, SPLIT_PAIRS: tl.constexpr, POSITIONS: tl.constexpr, MROPE: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """Write the rotation of q and k (or its transpose, BACKWARD) into q_out
    and k_out, which may be q and k; COPY_PASS also copies dims rot_dim..head_dim.
    position_ids / cu_seqlens are read only when POSITIONS says so.  Without
    GRID_STRIDE a program rotates ROWS consecutive rows (unrolled): in HF's
    (B, S, H, D) memory those tokens' heads are one run of memory."""
    if GRID_STRIDE:
        for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
            _rope_row(
                tl.cast(row, tl.int64), q, k, q_out, k_out, cos, sin, position_ids, cu_seqlens,
                seq_len, n_qh, n_kh, half, rot_dim, head_dim, max_pos, n_cu_seqlens,
                mrope_section_t, mrope_section_h, mrope_section_w,
                stride_q_b, stride_q_h, stride_q_s, stride_q_d,
                stride_q_out_b, stride_q_out_h, stride_q_out_s, stride_q_out_d,
                stride_k_b, stride_k_h, stride_k_s, stride_k_d,
                stride_k_out_b, stride_k_out_h, stride_k_out_s, stride_k_out_d,
                stride_cos_b, stride_cos_s, stride_cos_r, stride_sin_b, stride_sin_s, stride_sin_r,
                stride_position_ids_t, stride_position_ids_b, stride_position_ids_s,
                BLOCK_QH, BLOCK_KH, BLOCK_HALF, BLOCK_PASS, BLOCK_SEQS, HEADS_FIT, COPY_PASS, BACKWARD,
                X_PAIRS, Y_PAIRS, TABLE_PAIRS, SPLIT_PAIRS, POSITIONS, MROPE, COMPUTE,
            )  # fmt: skip
    elif ROWS > 1:
        first = tl.program_id(0).to(tl.int64) * ROWS
        for r in tl.static_range(ROWS):
            if first + r < n_rows:
                _rope_row(
                    first + r, q, k, q_out, k_out, cos, sin, position_ids, cu_seqlens,
                    seq_len, n_qh, n_kh, half, rot_dim, head_dim, max_pos, n_cu_seqlens,
                    mrope_section_t, mrope_section_h, mrope_section_w,
                    stride_q_b, stride_q_h, stride_q_s, stride_q_d,
                    stride_q_out_b, stride_q_out_h, stride_q_out_s, stride_q_out_d,
                    stride_k_b, stride_k_h, stride_k_s, stride_k_d,
                    stride_k_out_b, stride_k_out_h, stride_k_out_s, stride_k_out_d,
                    stride_cos_b, stride_cos_s, stride_cos_r, stride_sin_b, stride_sin_s, stride_sin_r,
                    stride_position_ids_t, stride_position_ids_b, stride_position_ids_s,
                    BLOCK_QH, BLOCK_KH, BLOCK_HALF, BLOCK_PASS, BLOCK_SEQS, HEADS_FIT, COPY_PASS, BACKWARD,
                    X_PAIRS, Y_PAIRS, TABLE_PAIRS, SPLIT_PAIRS, POSITIONS, MROPE, COMPUTE,
                )  # fmt: skip
    else:
        _rope_row(
            tl.program_id(0).to(tl.int64), q, k, q_out, k_out, cos, sin, position_ids, cu_seqlens,
            seq_len, n_qh, n_kh, half, rot_dim, head_dim, max_pos, n_cu_seqlens,
            mrope_section_t, mrope_section_h, mrope_section_w,
            stride_q_b, stride_q_h, stride_q_s, stride_q_d,
            stride_q_out_b, stride_q_out_h, stride_q_out_s, stride_q_out_d,
            stride_k_b, stride_k_h, stride_k_s, stride_k_d,
            stride_k_out_b, stride_k_out_h, stride_k_out_s, stride_k_out_d,
            stride_cos_b, stride_cos_s, stride_cos_r, stride_sin_b, stride_sin_s, stride_sin_r,
            stride_position_ids_t, stride_position_ids_b, stride_position_ids_s,
            BLOCK_QH, BLOCK_KH, BLOCK_HALF, BLOCK_PASS, BLOCK_SEQS, HEADS_FIT, COPY_PASS, BACKWARD,
            X_PAIRS, Y_PAIRS, TABLE_PAIRS, SPLIT_PAIRS, POSITIONS, MROPE, COMPUTE,
        )  # fmt: skip
