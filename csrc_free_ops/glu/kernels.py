"""Every Triton kernel of the gated linear units, shared by the CUDA and NPU
launches, which differ only in their Plan (plan.py: tile shape, grid, warps).

The data is seen as (n_rows, n_cols) with unit column stride and a row
stride per input (the halves of a fused [gate | up] projection are read in
place); contiguous data is one row of every element.  A program takes
tiles of BLOCK_M x BLOCK_N elements, numbered row-block-major: one tile per
program (CUDA: no loop), or a grid stride over the tiles (GRID_STRIDE: the
NPU's one program per vector core).

Math runs in COMPUTE (float32, or float64 when gate or up is float64); every
load is converted to it.  The constants of GELU are made in COMPUTE with
``tl.full`` (exact in float64), never as float32 literals.  With
s = sigmoid(v) computed as 1 / (1 + exp(-v)):

    silu(g)      = g * s(g)                      silu'(g) = s * (1 + g * (1 - s))
    gelu_tanh(g) = g * s(2z), z = c0 * (g + c1 * g^3)     (0.5 * (1 + tanh(z)) = s(2z))
    gelu_tanh'(g) = s + 2 * g * s * (1 - s) * c0 * (1 + 3 * c1 * g^2)
    gelu(g)      = g * P, P = 0.5 * (1 + erf(g / sqrt(2)))   gelu'(g) = P + g * exp(-g^2 / 2) / sqrt(2 pi)

    y = act(g) * u;   dgate = dy * act'(g) * u;   dup = dy * act(g)

Stores sit in the kernels' bodies, addressed from the output pointer and
plain ints only: torch's wrap_triton analysis counts every pointer a stored
address depends on (helper arguments included) as written.
"""

import triton
import triton.language as tl

# c0 = sqrt(2/pi) and c1 of GELU's tanh approximation, as Python (double) floats.
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
GELU_CUBIC = tl.constexpr(0.044715)
# 1 / sqrt(2) and 1 / sqrt(2 pi) of the exact GELU and its derivative.
INV_SQRT_2 = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def _narrow(v, ty: tl.constexpr):
    """v converted to ty; float64 reaches 16-bit types through float32 (the
    interpreter's direct float64 -> bfloat16 cast gives garbage)."""
    if ty != tl.float64:
        v = v.to(tl.float32)
    return v.to(ty)


@triton.jit
def _sigmoid(v):
    return 1.0 / (1.0 + tl.exp(-v))


@triton.jit
def _gelu_inner(g, COMPUTE: tl.constexpr):
    """2z = 2 * c0 * (g + c1 * g^3) and dz/dg / c0 = 1 + 3 * c1 * g^2, constants in COMPUTE."""
    c0 = tl.full((), SQRT_2_OVER_PI, COMPUTE)
    c1 = tl.full((), GELU_CUBIC, COMPUTE)
    g2 = g * g
    return 2.0 * c0 * (g + c1 * g2 * g), c0 * (1.0 + 3.0 * c1 * g2)


@triton.jit
def _gelu_cdf(g, COMPUTE: tl.constexpr):
    """0.5 * (1 + erf(g / sqrt(2))), the normal CDF at g, its constant in COMPUTE."""
    return 0.5 * (1.0 + tl.math.erf(g * tl.full((), INV_SQRT_2, COMPUTE)))


@triton.jit
def _activate(g, ACTIVATION: tl.constexpr, COMPUTE: tl.constexpr):
    """act(g)."""
    if ACTIVATION == "silu":
        a = g * _sigmoid(g)
    elif ACTIVATION == "gelu":
        a = g * _gelu_cdf(g, COMPUTE)
    else:
        two_z, _ = _gelu_inner(g, COMPUTE)
        a = g * _sigmoid(two_z)
    return a


@triton.jit
def _activate_with_grad(g, ACTIVATION: tl.constexpr, COMPUTE: tl.constexpr):
    """(act(g), act'(g))."""
    if ACTIVATION == "silu":
        s = _sigmoid(g)
        a = g * s
        da = s * (1.0 + g * (1.0 - s))
    elif ACTIVATION == "gelu":
        cdf = _gelu_cdf(g, COMPUTE)
        a = g * cdf
        da = cdf + g * tl.full((), INV_SQRT_2PI, COMPUTE) * tl.exp(-0.5 * g * g)
    else:
        two_z, dz = _gelu_inner(g, COMPUTE)
        s = _sigmoid(two_z)
        a = g * s
        da = s + 2.0 * g * s * (1.0 - s) * dz
    return a, da


@triton.jit
def _tile(t, tiles_n, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows (BLOCK_M, 1) and columns (1, BLOCK_N), int64, of tile t, and their mask."""
    tm = t // tiles_n
    tn = t - tm * tiles_n
    rows = tl.cast(tm, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    cols = tl.cast(tn, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return rows, cols, (rows < n_rows) & (cols < n_cols)


@triton.jit
def _load(p, rows, cols, stride_row, mask, COMPUTE: tl.constexpr):
    return tl.load(p + rows * stride_row + cols, mask=mask, other=0.0).to(COMPUTE)


@triton.jit
def fwd_kernel(
    gate, up, y, stride_gate, stride_up, n_rows, n_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GRID_STRIDE: tl.constexpr, ACTIVATION: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """y (contiguous, n_rows x n_cols) = act(gate) * up.  GRID_STRIDE: programs
    walk the tiles; else one program per tile (the launch derives it from the
    grid, so no plan can leave tiles unwritten)."""
    tiles_n = tl.cdiv(n_cols, BLOCK_N)
    if GRID_STRIDE:
        for t in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M) * tiles_n, tl.num_programs(0)):
            rows, cols, mask = _tile(t, tiles_n, n_rows, n_cols, BLOCK_M, BLOCK_N)
            g = _load(gate, rows, cols, stride_gate, mask, COMPUTE)
            out = _activate(g, ACTIVATION, COMPUTE) * _load(up, rows, cols, stride_up, mask, COMPUTE)
            tl.store(y + rows * n_cols + cols, out.to(y.dtype.element_ty), mask=mask)
    else:
        rows, cols, mask = _tile(tl.program_id(0), tiles_n, n_rows, n_cols, BLOCK_M, BLOCK_N)
        g = _load(gate, rows, cols, stride_gate, mask, COMPUTE)
        out = _activate(g, ACTIVATION, COMPUTE) * _load(up, rows, cols, stride_up, mask, COMPUTE)
        tl.store(y + rows * n_cols + cols, out.to(y.dtype.element_ty), mask=mask)


@triton.jit
def bwd_kernel(
    grad_out, gate, up, dgate, dup, stride_dy, stride_gate, stride_up, n_rows, n_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GRID_STRIDE: tl.constexpr, ACTIVATION: tl.constexpr,
    COMPUTE: tl.constexpr,
):  # fmt: skip
    """dgate and dup (contiguous, n_rows x n_cols), act(gate) recomputed:
    one read of grad_out, gate and up, one write of each gradient."""
    tiles_n = tl.cdiv(n_cols, BLOCK_N)
    if GRID_STRIDE:
        for t in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M) * tiles_n, tl.num_programs(0)):
            rows, cols, mask = _tile(t, tiles_n, n_rows, n_cols, BLOCK_M, BLOCK_N)
            dy = _load(grad_out, rows, cols, stride_dy, mask, COMPUTE)
            a, da = _activate_with_grad(_load(gate, rows, cols, stride_gate, mask, COMPUTE), ACTIVATION, COMPUTE)
            u = _load(up, rows, cols, stride_up, mask, COMPUTE)
            at = rows * n_cols + cols
            tl.store(dgate + at, _narrow(dy * da * u, dgate.dtype.element_ty), mask=mask)
            tl.store(dup + at, _narrow(dy * a, dup.dtype.element_ty), mask=mask)
    else:
        rows, cols, mask = _tile(tl.program_id(0), tiles_n, n_rows, n_cols, BLOCK_M, BLOCK_N)
        dy = _load(grad_out, rows, cols, stride_dy, mask, COMPUTE)
        a, da = _activate_with_grad(_load(gate, rows, cols, stride_gate, mask, COMPUTE), ACTIVATION, COMPUTE)
        u = _load(up, rows, cols, stride_up, mask, COMPUTE)
        at = rows * n_cols + cols
        tl.store(dgate + at, _narrow(dy * da * u, dgate.dtype.element_ty), mask=mask)
        tl.store(dup + at, _narrow(dy * a, dup.dtype.element_ty), mask=mask)
