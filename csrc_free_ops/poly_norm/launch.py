"""The PolyNorm launch sequence, one for every backend, taking a Plan as data,
and the entry of each dispatch key (registrations/poly_norm.py binds them):

* ``cuda_forward`` / ``cuda_backward``: ``plan.cuda`` for the tensors' GPU
  (also the CPU interpreter path, which sizes grids by ``device.CPU_PROGRAMS``);
* ``npu_forward`` / ``npu_backward``: ``plan.npu`` for the Ascend profile;
* ``prepare_*``: each entry's prepared form (registrations/eager.py), the
  same launches with the plan, launchers and scalars fixed for every call
  with the arguments' signature.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton.language as tl

from csrc_free_ops import device
from csrc_free_ops.alloc import empty_like_maker, empty_maker
from csrc_free_ops.host_math import next_pow2
from csrc_free_ops.launcher import Launcher, placeholder
from csrc_free_ops.poly_norm import kernels, plan, reference
from csrc_free_ops.poly_norm.plan import Plan
from csrc_free_ops.row_views import output_like, rows, sizes

# Most partial rows the reduction reads per step.
MAX_REDUCE_BLOCK = 1024


def _compute(x: torch.Tensor) -> tuple[tl.dtype, torch.dtype]:
    """The math dtype for x, in Triton and torch terms: float64 for float64 x, else float32."""
    return (tl.float64, torch.float64) if x.dtype == torch.float64 else (tl.float32, torch.float32)


def _options(num_warps: int | None) -> dict:
    """Launch options: num_warps where the plan sets it (never on the NPU)."""
    return {} if num_warps is None else {"num_warps": num_warps}


@functools.lru_cache(maxsize=256)
def _launcher(backward: bool, p: Plan, grid_stride: bool, compute: tl.dtype) -> Launcher:
    meta = {"COMPUTE": compute, **_options(p.num_warps)}
    if backward:
        meta["DIRECT_GRADS"] = p.programs == 1
    if not p.whole_rows:
        kernel = kernels.bwd_blocked_kernel if backward else kernels.fwd_blocked_kernel
        return Launcher(kernel, BLOCK_N=p.block_n, **meta)
    tile = {"BLOCK_M": p.block_m, "BLOCK_N": p.block_n}
    if backward:
        return Launcher(kernels.bwd_tile_kernel, **tile, LOOP_STAGES=p.loop_stages, **meta)
    return Launcher(kernels.fwd_tile_kernel, **tile, GRID_STRIDE=grid_stride, **meta)


@functools.lru_cache(maxsize=64)
def _reduce_launcher(block_p: int, num_warps: int | None) -> Launcher:
    return Launcher(kernels.reduce_param_grads_kernel, BLOCK_P=block_p, **_options(num_warps))


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, p: Plan) -> torch.Tensor:
    n_rows, n_cols = sizes(x)
    src, stride_row, stride_col = rows(x)
    y = output_like(x, stride_col == 1 and src is x)
    if n_rows == 0:
        return y
    args = (src, _contiguous(weight), bias, y, stride_row, stride_col, n_cols, n_rows, n_cols, eps)
    _launcher(False, p, p.walks_row_blocks(n_rows), _compute(x)[0])(p.programs, *args)
    return y


def backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, p: Plan
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight (3,), dbias (1,)); dx in x's dtype, dweight and dbias in weight's."""
    n_rows, n_cols = sizes(x)
    src, x_row, x_col = rows(x)
    dx = output_like(x, x_col == 1 and src is x)
    # Separate allocations: views of one buffer would make the op's outputs alias each other.
    dweight = torch.empty(3, dtype=weight.dtype, device=x.device)
    dbias = torch.empty(1, dtype=weight.dtype, device=x.device)
    if n_rows == 0:
        return dx, dweight.zero_(), dbias.zero_()
    compute, partial_dtype = _compute(x)
    dy, dy_row, dy_col = rows(grad_out)
    # Every program stores its row, so the buffer needs no zeroing; one program writes the gradients itself.
    direct = p.programs == 1
    partials = placeholder(dweight) if direct else torch.empty((p.programs, kernels.N_PARTIALS.value),
                                                               dtype=partial_dtype, device=x.device)  # fmt: skip
    args = (dy, src, _contiguous(weight), dx, partials, dweight, dbias,
            dy_row, dy_col, x_row, x_col, n_cols, n_rows, n_cols, eps)  # fmt: skip
    _launcher(True, p, True, compute)(p.programs, *args)
    if not direct:
        block_p = min(next_pow2(p.programs), MAX_REDUCE_BLOCK)
        _reduce_launcher(block_p, p.num_warps)(1, partials, dweight, dbias, p.programs)
    return dx, dweight, dbias


# --- Prepared calls: what forward and backward work out from a signature, done once.
# A prepared run keeps no tensor: only sizes, the plan and bound launches.


def _prepared_forward(x: torch.Tensor, weight: torch.Tensor, eps: float, p: Plan) -> Callable:
    n_rows, n_cols = sizes(x)
    if n_rows == 0 or not (x.is_contiguous() and weight.is_contiguous()):
        return lambda x, weight, bias, eps: forward(x, weight, bias, eps, p)
    scalars = (n_cols, 1, n_cols, n_rows, n_cols, eps)
    launch = _launcher(False, p, p.walks_row_blocks(n_rows), _compute(x)[0]).bind(p.programs, scalars)
    new_y = empty_like_maker(x)

    def run(x, weight, bias, eps):
        y = new_y()
        launch(x, weight, bias, y)
        return y

    return run


def _prepared_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, p: Plan) -> Callable:
    n_rows, n_cols = sizes(x)
    if n_rows == 0 or not (x.is_contiguous() and grad_out.is_contiguous() and weight.is_contiguous()):
        return lambda grad_out, x, weight, eps: backward(grad_out, x, weight, eps, p)
    compute, partial_dtype = _compute(x)
    programs, device_, weight_dtype = p.programs, x.device, weight.dtype
    scalars = (n_cols, 1, n_cols, 1, n_cols, n_rows, n_cols, eps)
    tile = _launcher(True, p, True, compute).bind(programs, scalars)
    # One program writes the parameter gradients itself: one launch.
    reduce = None if programs == 1 else _reduce_launcher(min(next_pow2(programs), MAX_REDUCE_BLOCK), p.num_warps)
    reduce = None if reduce is None else reduce.bind(1, (programs,))
    new_dx = empty_like_maker(x)
    new_dweight = empty_maker((3,), weight_dtype, device_)
    new_dbias = empty_maker((1,), weight_dtype, device_)
    new_partials = empty_maker((programs, kernels.N_PARTIALS.value), partial_dtype, device_)

    def run(grad_out, x, weight, eps):
        dx = new_dx()
        dweight = new_dweight()
        dbias = new_dbias()
        if reduce is None:
            tile(grad_out, x, weight, dx, dweight, dweight, dbias)
        else:
            partials = new_partials()
            tile(grad_out, x, weight, dx, partials, dweight, dbias)
            reduce(partials, dweight, dbias)
        return dx, dweight, dbias

    return run


def prepare_cuda_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> Callable:
    n_rows, n_cols = sizes(x)
    return _prepared_forward(x, weight, eps, plan.cuda(n_rows, n_cols, False, device.sms_of(x)))


def prepare_cuda_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> Callable:
    n_rows, n_cols = sizes(x)
    return _prepared_backward(grad_out, x, weight, eps, plan.cuda(n_rows, n_cols, True, device.sms_of(x)))


def prepare_npu_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> Callable | None:
    if x.dtype == torch.float64 or x.stride(-1) != 1:
        return None
    return _prepared_forward(x, weight, eps, _npu_plan(x, False))


def prepare_npu_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> Callable | None:
    if x.dtype == torch.float64 or x.stride(-1) != 1 or grad_out.stride(-1) != 1:
        return None
    return _prepared_backward(grad_out, x, weight, eps, _npu_plan(x, True))


# --- The entries of the dispatch keys


def cuda_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    n_rows, n_cols = sizes(x)
    return forward(x, weight, bias, eps, plan.cuda(n_rows, n_cols, False, device.sms_of(x)))


def cuda_backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n_rows, n_cols = sizes(x)
    return backward(grad_out, x, weight, eps, plan.cuda(n_rows, n_cols, True, device.sms_of(x)))


def _npu_plan(x: torch.Tensor, backward: bool) -> Plan:
    n_rows, n_cols = sizes(x)
    return plan.npu(n_rows, n_cols, x.element_size(), backward, device.npu_ub_bytes(), device.npu_vector_cores())


def _unit_column_stride(t: torch.Tensor) -> torch.Tensor:
    """t, copied when its last dim is not unit-stride: triton-ascend then compiles
    the row loads as gathers that need several times the UB the plan budgets (bishengir:
    ub overflow at every planned tile), where a stride of 1 is specialized away."""
    return t if t.stride(-1) == 1 else t.contiguous()


# triton-ascend compiles no float64 ("[fp8, fp64] is unsupported on Ascend", the Ascend compile
# check): float64 on the NPU runs the pure-PyTorch reference there instead.


def npu_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float64:
        return reference.forward(x, weight, bias, eps)
    return forward(_unit_column_stride(x), weight, bias, eps, _npu_plan(x, False))


def npu_backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.dtype == torch.float64:
        return reference.backward(grad_out, x, weight, eps)
    return backward(_unit_column_stride(grad_out), _unit_column_stride(x), weight, eps, _npu_plan(x, True))
