"""The gated linear units' launch sequence, one for every backend, taking a
Plan as data, and the entry of each dispatch key (registrations/glu.py binds
them, with the op's activation):

* ``cuda_forward`` / ``cuda_backward`` / ``cuda_backward_``: ``plan.cuda``
  (also the CPU interpreter path);
* ``npu_forward`` / ``npu_backward`` / ``npu_backward_``: ``plan.npu`` for the
  Ascend profile;
* ``prepare_cuda_<direction>``: the CUDA entries' prepared forms
  (registrations/eager.py), for tensors read in place (contiguous, or rows
  of one stride each).

``backward_`` writes the gradients over gate and up (the in-place backward
op, which the ops' formulas call when nothing else holds the saved
projections: registrations/reuse.py).

Every tensor is read as (rows, last dim) with unit column stride and its
own row stride, so the halves of a fused [gate | up] projection
(``proj.chunk(2, -1)``) are read in place; one whose last dim is not
unit-stride (or whose rows do not collapse to one stride) is copied first.
When every tensor is contiguous, the problem is one row of every element.
Outputs are contiguous.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton.language as tl

from csrc_free_ops import device
from csrc_free_ops.alloc import empty_maker
from csrc_free_ops.glu import kernels, plan, reference
from csrc_free_ops.glu.plan import Plan
from csrc_free_ops.launcher import Launcher


def _compute(*tensors: torch.Tensor) -> tl.dtype:
    """float64 when gate or up is float64, else float32."""
    return tl.float64 if any(t.dtype == torch.float64 for t in tensors) else tl.float32


@functools.lru_cache(maxsize=256)
def _launcher(backward: bool, p: Plan, grid_stride: bool, activation: str, compute: tl.dtype) -> Launcher:
    meta = {"BLOCK_M": p.block_m, "BLOCK_N": p.block_n, "GRID_STRIDE": grid_stride, "ACTIVATION": activation,
            "COMPUTE": compute}  # fmt: skip
    if p.num_warps is not None:
        meta["num_warps"] = p.num_warps
    return Launcher(kernels.bwd_kernel if backward else kernels.fwd_kernel, **meta)


def _n_cols(t: torch.Tensor) -> int:
    return t.shape[-1] if t.dim() else 1


def problem(*tensors: torch.Tensor) -> tuple[int, int]:
    """(n_rows, n_cols) the kernels see: one row when every tensor is contiguous."""
    first = tensors[0]
    if all(t.is_contiguous() for t in tensors):
        return 1, first.numel()
    n_cols = _n_cols(first)
    return first.numel() // n_cols, n_cols


def _rows(t: torch.Tensor, n_rows: int, n_cols: int) -> tuple[torch.Tensor, int]:
    """t as (n_rows, n_cols) with unit column stride (a view where one exists, else a
    contiguous copy) and its row stride."""
    t2d = t.reshape(n_rows, n_cols)
    if n_cols > 1 and t2d.stride(1) != 1:
        t2d = t2d.contiguous()
    return t2d, t2d.stride(0) if n_rows > 1 else n_cols


def forward(gate: torch.Tensor, up: torch.Tensor, activation: str, p: Plan) -> torch.Tensor:
    y = torch.empty(gate.shape, dtype=reference.output_dtype(gate, up), device=gate.device)
    if gate.numel() == 0:
        return y
    n_rows, n_cols = problem(gate, up)
    g, stride_gate = _rows(gate, n_rows, n_cols)
    u, stride_up = _rows(up, n_rows, n_cols)
    launcher = _launcher(False, p, p.walks_tiles(n_rows, n_cols), activation, _compute(gate, up))
    launcher(p.programs, g, u, y, stride_gate, stride_up, n_rows, n_cols)
    return y


def backward(
    grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str, p: Plan
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup), contiguous, in gate's and up's dtypes."""
    dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    dup = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    _write_backward(grad_out, gate, up, dgate, dup, activation, p)
    return dgate, dup


def backward_(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str, p: Plan) -> None:
    """dgate written over gate and dup over up (both contiguous): each element is read before its
    gradient is stored at the same place, by the same program."""
    _write_backward(grad_out, gate, up, gate, up, activation, p)


def _write_backward(grad_out, gate, up, dgate, dup, activation: str, p: Plan) -> None:
    """dgate and dup (contiguous) of grad_out, gate and up."""
    if gate.numel() == 0:
        return
    n_rows, n_cols = problem(grad_out, gate, up)
    dy, stride_dy = _rows(grad_out, n_rows, n_cols)
    g, stride_gate = _rows(gate, n_rows, n_cols)
    u, stride_up = _rows(up, n_rows, n_cols)
    launcher = _launcher(True, p, p.walks_tiles(n_rows, n_cols), activation, _compute(gate, up))
    launcher(p.programs, dy, g, u, dgate, dup, stride_dy, stride_gate, stride_up, n_rows, n_cols)


# --- The entries of the dispatch keys (activation: one of reference.ACTIVATIONS, bound by the registration)


def cuda_forward(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    return forward(gate, up, activation, plan.cuda(*problem(gate, up)))


def cuda_backward(
    grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return backward(grad_out, gate, up, activation, plan.cuda(*problem(grad_out, gate, up)))


def cuda_backward_(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str) -> None:
    backward_(grad_out, gate, up, activation, plan.cuda(*problem(grad_out, gate, up)))


# --- Prepared calls, with the plan, launch and scalars fixed for every call with the arguments'
# signature: contiguous tensors as one row of every element, and tensors whose rows are views of one
# row stride each (the halves of a fused projection); None where the entry must run (a copy).


def _view_strides(tensors: tuple[torch.Tensor, ...], n_rows: int, n_cols: int) -> tuple[int, ...] | None:
    """Each tensor's row stride when every one is (n_rows, n_cols) with unit column stride without a
    copy (what ``_rows`` would read in place), else None."""
    strides = []
    for t in tensors:
        try:
            t2d = t.view(n_rows, n_cols)
        except RuntimeError:  # its rows do not collapse to one stride
            return None
        if n_cols > 1 and t2d.stride(1) != 1:
            return None
        strides.append(t2d.stride(0) if n_rows > 1 else n_cols)
    return tuple(strides)


def prepare_cuda_forward(gate: torch.Tensor, up: torch.Tensor, activation: str) -> Callable | None:
    if gate.numel() == 0:
        return None
    n_rows, n_cols = problem(gate, up)
    strides = _view_strides((gate, up), n_rows, n_cols)
    if strides is None:
        return None
    p = plan.cuda(n_rows, n_cols)
    launcher = _launcher(False, p, p.walks_tiles(n_rows, n_cols), activation, _compute(gate, up))
    launch = launcher.bind(p.programs, (*strides, n_rows, n_cols))
    new_y = empty_maker(gate.shape, reference.output_dtype(gate, up), gate.device)

    def run(gate, up):
        y = new_y()
        launch(gate, up, y)
        return y

    return run


def prepare_cuda_backward(
    grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> Callable | None:
    if gate.numel() == 0:
        return None
    n_rows, n_cols = problem(grad_out, gate, up)
    strides = _view_strides((grad_out, gate, up), n_rows, n_cols)
    if strides is None:
        return None
    p = plan.cuda(n_rows, n_cols)
    launcher = _launcher(True, p, p.walks_tiles(n_rows, n_cols), activation, _compute(gate, up))
    launch = launcher.bind(p.programs, (*strides, n_rows, n_cols))
    new_dgate = empty_maker(gate.shape, gate.dtype, gate.device)
    new_dup = empty_maker(up.shape, up.dtype, up.device)

    def run(grad_out, gate, up):
        dgate = new_dgate()
        dup = new_dup()
        launch(grad_out, gate, up, dgate, dup)
        return dgate, dup

    return run


def prepare_cuda_backward_(
    grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> Callable | None:
    if gate.numel() == 0 or not grad_out.is_contiguous():
        return None
    n = gate.numel()
    p = plan.cuda(1, n)
    launch = _launcher(True, p, p.walks_tiles(1, n), activation, _compute(gate, up)).bind(p.programs, (n, n, n, 1, n))

    def run(grad_out, gate, up):
        launch(grad_out, gate, up, gate, up)

    return run


def _npu_plan(tensors: tuple[torch.Tensor, ...], outputs: tuple[torch.dtype, ...], backward: bool) -> Plan:
    data_bytes = sum(t.element_size() for t in tensors) + sum(d.itemsize for d in outputs)
    compute_itemsize = 8 if any(t.dtype == torch.float64 for t in tensors) else 4
    return plan.npu(*problem(*tensors), data_bytes, compute_itemsize, backward, device.npu_ub_bytes(),
                    device.npu_vector_cores())  # fmt: skip


# triton-ascend compiles no float64 ("[fp8, fp64] is unsupported on Ascend", the Ascend compile
# check): float64 on the NPU runs the pure-PyTorch reference there instead.


def npu_forward(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    if torch.float64 in (gate.dtype, up.dtype):
        return reference.forward(gate, up, activation)
    return forward(gate, up, activation, _npu_plan((gate, up), (reference.output_dtype(gate, up),), False))


def npu_backward(
    grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor]:
    if torch.float64 in (grad_out.dtype, gate.dtype, up.dtype):
        return reference.backward(grad_out, gate, up, activation)
    return backward(grad_out, gate, up, activation, _npu_plan((grad_out, gate, up), (gate.dtype, up.dtype), True))


def npu_backward_(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str) -> None:
    if torch.float64 in (grad_out.dtype, gate.dtype, up.dtype):
        reference.backward_(grad_out, gate, up, activation)
        return
    backward_(grad_out, gate, up, activation, _npu_plan((grad_out, gate, up), (gate.dtype, up.dtype), True))
