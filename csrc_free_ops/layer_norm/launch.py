"""LayerNorm's dispatch-key entries (registrations/layer_norm.py binds them)
over the row-norm launch sequence of ``csrc_free_ops/rms_norm/launch.py``,
with the mean subtracted:

* ``cuda_forward`` / ``cuda_backward``: the CUDA plan for the tensors' GPU
  (also the CPU interpreter path);
* ``npu_forward`` / ``npu_backward``: the NPU plan for the Ascend profile;
* ``prepare_cuda_*``: the CUDA entries' prepared forms (registrations/eager.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from csrc_free_ops.layer_norm import reference
from csrc_free_ops.rms_norm import launch as row_norm
from csrc_free_ops.rms_norm.launch import RowNorm


def _norm(eps: float) -> RowNorm:
    return RowNorm(float(eps), 0.0, True, False)


def cuda_forward(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return row_norm.forward(x, weight, bias, _norm(eps), row_norm.cuda_plan(x, False))


def cuda_backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    return row_norm.backward(grad_out, x, weight, bias, _norm(eps), row_norm.cuda_plan(x, True))


def prepare_cuda_forward(x, weight, bias, eps) -> Callable | None:
    run = row_norm.prepared_forward(x, weight, bias, _norm(eps), row_norm.cuda_plan(x, False))
    return None if run is None else (lambda x, weight, bias, eps: run(x, weight, bias))


def prepare_cuda_backward(grad_out, x, weight, bias, eps) -> Callable | None:
    run = row_norm.prepared_backward(grad_out, x, weight, bias, _norm(eps), row_norm.cuda_plan(x, True))
    return None if run is None else (lambda grad_out, x, weight, bias, eps: run(grad_out, x, weight, bias))


# triton-ascend compiles no float64: float64 on the NPU runs the pure-PyTorch reference there instead.


def npu_forward(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    if x.dtype == torch.float64:
        return reference.forward(x, weight, bias, eps)
    return row_norm.forward(row_norm.unit_column_stride(x), weight, bias, _norm(eps), row_norm.npu_plan(x, False))


def npu_backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    if x.dtype == torch.float64:
        return reference.backward(grad_out, x, weight, bias, eps)
    return row_norm.backward(row_norm.unit_column_stride(grad_out), row_norm.unit_column_stride(x), weight, bias,
                             _norm(eps), row_norm.npu_plan(x, True))  # fmt: skip
