"""The row-norm launch sequence, one for every backend, taking a Plan as data
(``forward`` / ``backward``, shared with LayerNorm through ``RowNorm``), and
the entry of each RMSNorm dispatch key (registrations/rms_norm.py binds them):

* ``cuda_forward`` / ``cuda_backward``: ``plan.cuda`` for the tensors' GPU
  (also the CPU interpreter path, which sizes grids by ``device.CPU_PROGRAMS``);
* ``npu_forward`` / ``npu_backward``: ``plan.npu`` for the Ascend profile;
* ``prepare_*``: each entry's prepared form (registrations/eager.py), the
  same launches with the plan, launchers and scalars fixed for every call
  with the arguments' signature (``prepared_forward`` / ``prepared_backward``,
  shared with LayerNorm).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton.language as tl

from csrc_free_ops import device
from csrc_free_ops.alloc import empty_like_maker, empty_maker
from csrc_free_ops.host_math import cdiv, next_pow2
from csrc_free_ops.launcher import Launcher, placeholder
from csrc_free_ops.rms_norm import kernels, plan, reference
from csrc_free_ops.rms_norm.options import Options
from csrc_free_ops.rms_norm.plan import Plan
from csrc_free_ops.row_views import output_like, rows, sizes

# Most partial rows the reduction reads per step, and the columns each of its programs sums.
MAX_REDUCE_BLOCK = 64
REDUCE_COLUMNS = 256


class RowNorm(NamedTuple):
    """What a row-norm kernel computes, as its constexprs take it."""

    eps: float
    offset: float
    center: bool  # subtract the mean (LayerNorm)
    round_normed: bool  # Llama's casting

    @classmethod
    def rms(cls, options: Options) -> RowNorm:
        return cls(float(options.eps), float(options.offset), False, options.round_normed)


def _compute(x: torch.Tensor) -> tuple[tl.dtype, torch.dtype]:
    """The math dtype for x, in Triton and torch terms: float64 for float64 x, else float32."""
    return (tl.float64, torch.float64) if x.dtype == torch.float64 else (tl.float32, torch.float32)


def _options(num_warps: int | None) -> dict:
    """Launch options: num_warps where the plan sets it (never on the NPU)."""
    return {} if num_warps is None else {"num_warps": num_warps}


@functools.lru_cache(maxsize=256)
def _launcher(backward: bool, p: Plan, grid_stride: bool, compute: tl.dtype, norm: RowNorm, has_weight: bool,
              has_bias: bool, direct: bool) -> Launcher:  # fmt: skip
    meta = {"EPS": norm.eps, "OFFSET": norm.offset, "CENTER": norm.center, "ROUND_NORMED": norm.round_normed,
            "HAS_WEIGHT": has_weight, "HAS_BIAS": has_bias, "COMPUTE": compute, **_options(p.num_warps)}  # fmt: skip
    if not p.whole_rows:
        kernel = kernels.bwd_blocked_kernel if backward else kernels.fwd_blocked_kernel
        return Launcher(kernel, BLOCK_N=p.block_n, **meta)
    tile = {"BLOCK_M": p.block_m, "BLOCK_N": p.block_n}
    if backward:
        return Launcher(kernels.bwd_tile_kernel, **tile, LOOP_STAGES=p.loop_stages, DIRECT_GRADS=direct, **meta)
    return Launcher(kernels.fwd_tile_kernel, **tile, GRID_STRIDE=grid_stride, **meta)


@functools.lru_cache(maxsize=64)
def _reduce_launcher(has_weight: bool, has_bias: bool, block_p: int, num_warps: int | None) -> Launcher:
    return Launcher(kernels.reduce_param_grads_kernel, HAS_WEIGHT=has_weight, HAS_BIAS=has_bias, BLOCK_P=block_p,
                    BLOCK_C=REDUCE_COLUMNS, **_options(num_warps))  # fmt: skip


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.is_contiguous() else t.contiguous()


def forward(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, norm: RowNorm, p: Plan
) -> torch.Tensor:
    n_rows, n_cols = sizes(x)
    src, stride_row, stride_col = rows(x)
    y = output_like(x, stride_col == 1 and src is x)
    if n_rows == 0:
        return y
    w = _contiguous(weight) if weight is not None else placeholder(y)
    b = _contiguous(bias) if bias is not None else placeholder(y)
    launch = _launcher(False, p, p.walks_row_blocks(n_rows), _compute(x)[0], norm, weight is not None,
                       bias is not None, False)  # fmt: skip
    launch(p.programs, src, w, b, y, stride_row, stride_col, n_cols, n_rows, n_cols)
    return y


def _partials(p: Plan, n_cols: int, present: bool, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """One partial row per program: BLOCK_N wide for the tile kernel, n_cols
    wide and zeroed for the blocked one (which adds into it)."""
    if not present:
        return placeholder(like)
    if p.whole_rows:
        return torch.empty((p.programs, p.block_n), dtype=dtype, device=like.device)
    return torch.zeros((p.programs, n_cols), dtype=dtype, device=like.device)


def backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    norm: RowNorm,
    p: Plan,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight, dbias); dx in x's dtype, dweight / dbias in weight's / bias's, None where absent."""
    n_rows, n_cols = sizes(x)
    src, x_row, x_col = rows(x)
    dx = output_like(x, x_col == 1 and src is x)
    # Separate allocations: views of one buffer would make the op's outputs alias each other.
    dweight = None if weight is None else torch.empty(n_cols, dtype=weight.dtype, device=x.device)
    dbias = None if bias is None else torch.empty(n_cols, dtype=bias.dtype, device=x.device)
    if n_rows == 0:
        return dx, None if dweight is None else dweight.zero_(), None if dbias is None else dbias.zero_()
    compute, partial_dtype = _compute(x)
    dy, dy_row, dy_col = rows(grad_out)
    has_w, has_b = weight is not None, bias is not None
    direct = p.whole_rows and p.programs == 1
    w = _contiguous(weight) if has_w else placeholder(dx)
    dw_partials = placeholder(dx) if direct else _partials(p, n_cols, has_w, partial_dtype, x)
    db_partials = placeholder(dx) if direct else _partials(p, n_cols, has_b, partial_dtype, x)
    launch = _launcher(True, p, True, compute, norm, has_w, has_b, direct)
    strides = (dy_row, dy_col, x_row, x_col, n_cols, n_rows, n_cols)
    if p.whole_rows:
        outs = (placeholder(dx) if dweight is None else dweight, placeholder(dx) if dbias is None else dbias)
        launch(p.programs, dy, src, w, dx, dw_partials, db_partials, *outs, *strides)
    else:
        launch(p.programs, dy, src, w, dx, dw_partials, db_partials, *strides)
    if not direct and (has_w or has_b):
        block_p = min(next_pow2(p.programs), MAX_REDUCE_BLOCK)
        outs = (placeholder(dx) if dweight is None else dweight, placeholder(dx) if dbias is None else dbias)
        stride = p.block_n if p.whole_rows else n_cols
        _reduce_launcher(has_w, has_b, block_p, p.num_warps)(
            cdiv(n_cols, REDUCE_COLUMNS), dw_partials, db_partials, *outs, p.programs, n_cols, stride
        )
    return dx, dweight, dbias


# --- Prepared calls: what forward and backward work out from a signature, done once.
# A prepared run keeps no tensor: only sizes, the plan and bound launches.  It takes the
# sequence's own arguments (x, weight, bias): each op's entry adapts its schema to them.


def _all_contiguous(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or t.is_contiguous() for t in tensors)


def _copied_rows(x: torch.Tensor, n_cols: int) -> bool | None:
    """How a prepared run reads x: as it is (False: contiguous), or through reshape's contiguous
    copy (True: rows no one stride apart, e.g. diffusers' (B, H*W, C) view of an NCHW activation,
    which ``rows`` copies in the general sequence too); None where the general sequence must run
    (a strided 2-D view, whose strides it passes to the kernel).  It depends on x's shape and
    strides alone."""
    if x.is_contiguous():
        return False
    return True if x.reshape(-1, n_cols).is_contiguous() else None


def _output_maker(x: torch.Tensor, copied: bool) -> Callable[[], torch.Tensor]:
    """``output_like``'s tensor (contiguous, of x's shape) for a prepared run."""
    return empty_maker(x.shape, x.dtype, x.device) if copied else empty_like_maker(x)


def prepared_forward(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, norm: RowNorm,
                     p: Plan) -> Callable | None:  # fmt: skip
    """run(x, weight, bias) -> y, or None where the general sequence must run (no rows, strided rows,
    strided parameters)."""
    n_rows, n_cols = sizes(x)
    copied = _copied_rows(x, n_cols)
    if n_rows == 0 or copied is None or not _all_contiguous(weight, bias):
        return None
    has_w, has_b = weight is not None, bias is not None
    launcher = _launcher(False, p, p.walks_row_blocks(n_rows), _compute(x)[0], norm, has_w, has_b, False)
    launch = launcher.bind(p.programs, (n_cols, 1, n_cols, n_rows, n_cols))
    new_y = _output_maker(x, copied)

    def run(x, weight, bias):
        y = new_y()
        launch(x.reshape(-1, n_cols) if copied else x, weight if has_w else y, bias if has_b else y, y)
        return y

    return run


def prepared_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                      bias: torch.Tensor | None, norm: RowNorm, p: Plan) -> Callable | None:  # fmt: skip
    """run(grad_out, x, weight, bias) -> (dx, dweight, dbias), or None as ``prepared_forward``.
    Tile plans only: the blocked kernel's zeroed partials stay with the general sequence."""
    n_rows, n_cols = sizes(x)
    copied = _copied_rows(x, n_cols)
    if n_rows == 0 or not p.whole_rows or copied is None or not _all_contiguous(grad_out, weight, bias):
        return None
    compute, partial_dtype = _compute(x)
    has_w, has_b = weight is not None, bias is not None
    w_dtype, b_dtype, device_ = weight.dtype if has_w else None, bias.dtype if has_b else None, x.device
    direct = p.programs == 1
    tile = _launcher(True, p, True, compute, norm, has_w, has_b, direct).bind(
        p.programs, (n_cols, 1, n_cols, 1, n_cols, n_rows, n_cols)
    )
    reduce = None
    if not direct and (has_w or has_b):
        block_p = min(next_pow2(p.programs), MAX_REDUCE_BLOCK)
        reduce = _reduce_launcher(has_w, has_b, block_p, p.num_warps).bind(
            cdiv(n_cols, REDUCE_COLUMNS), (p.programs, n_cols, p.block_n)
        )
    new_dx = _output_maker(x, copied)
    new_dweight = empty_maker((n_cols,), w_dtype, device_) if has_w else None
    new_dbias = empty_maker((n_cols,), b_dtype, device_) if has_b else None
    new_partials = empty_maker((p.programs, p.block_n), partial_dtype, device_)

    def run(grad_out, x, weight, bias):
        x = x.reshape(-1, n_cols) if copied else x
        dx = new_dx()
        dweight = new_dweight() if has_w else None
        dbias = new_dbias() if has_b else None
        outs = (dx if dweight is None else dweight, dx if dbias is None else dbias)
        if direct:
            tile(grad_out, x, weight if has_w else dx, dx, dx, dx, *outs)
            return dx, dweight, dbias
        dw_partials = new_partials() if has_w else dx
        db_partials = new_partials() if has_b else dx
        tile(grad_out, x, weight if has_w else dx, dx, dw_partials, db_partials, *outs)
        if reduce is not None:
            reduce(dw_partials, db_partials, *outs)
        return dx, dweight, dbias

    return run


# --- Device entries shared with LayerNorm


def cuda_plan(x: torch.Tensor, backward: bool) -> Plan:
    n_rows, n_cols = sizes(x)
    return plan.cuda(n_rows, n_cols, backward, device.sms_of(x), x.element_size())


def npu_plan(x: torch.Tensor, backward: bool) -> Plan:
    n_rows, n_cols = sizes(x)
    return plan.npu(n_rows, n_cols, x.element_size(), backward, device.npu_ub_bytes(), device.npu_vector_cores())


def unit_column_stride(t: torch.Tensor) -> torch.Tensor:
    """t, copied when its last dim is not unit-stride: triton-ascend then compiles
    the row loads as gathers that need several times the UB the plan budgets
    (poly_norm's finding, docs/npu.md), where a stride of 1 is specialized away."""
    return t if t.stride(-1) == 1 else t.contiguous()


# --- The entries of the dispatch keys


def cuda_forward(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, casting_mode: str
) -> torch.Tensor:
    return forward(x, weight, None, RowNorm.rms(Options(eps, offset, casting_mode)), cuda_plan(x, False))


def cuda_backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, casting_mode: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    norm = RowNorm.rms(Options(eps, offset, casting_mode))
    dx, dweight, _ = backward(grad_out, x, weight, None, norm, cuda_plan(x, True))
    return dx, dweight


def prepare_cuda_forward(x, weight, eps, offset, casting_mode) -> Callable | None:
    run = prepared_forward(x, weight, None, RowNorm.rms(Options(eps, offset, casting_mode)), cuda_plan(x, False))
    return None if run is None else (lambda x, weight, eps, offset, casting_mode: run(x, weight, None))


def prepare_cuda_backward(grad_out, x, weight, eps, offset, casting_mode) -> Callable | None:
    norm = RowNorm.rms(Options(eps, offset, casting_mode))
    run = prepared_backward(grad_out, x, weight, None, norm, cuda_plan(x, True))
    return (
        None
        if run is None
        else (lambda grad_out, x, weight, eps, offset, casting_mode: run(grad_out, x, weight, None)[:2])
    )


# triton-ascend compiles no float64 ("[fp8, fp64] is unsupported on Ascend", the Ascend compile
# check): float64 on the NPU runs the pure-PyTorch reference there instead.


def npu_forward(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, casting_mode: str
) -> torch.Tensor:
    if x.dtype == torch.float64:
        return reference.forward(x, weight, eps, offset, casting_mode)
    norm = RowNorm.rms(Options(eps, offset, casting_mode))
    return forward(unit_column_stride(x), weight, None, norm, npu_plan(x, False))


def npu_backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, casting_mode: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if x.dtype == torch.float64:
        return reference.backward(grad_out, x, weight, eps, offset, casting_mode)
    norm = RowNorm.rms(Options(eps, offset, casting_mode))
    dx, dweight, _ = backward(unit_column_stride(grad_out), unit_column_stride(x), weight, None, norm,
                              npu_plan(x, True))  # fmt: skip
    return dx, dweight
