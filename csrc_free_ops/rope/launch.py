"""The rope launch sequence, one for every backend, taking a Plan as data,
and the entry of each dispatch key (registrations/rope.py binds them):

* ``cuda_forward`` / ``cuda_backward`` / ``cuda_forward_``: ``plan.cuda``
  (also the CPU interpreter path);
* ``npu_forward`` / ``npu_backward`` / ``npu_forward_``: ``plan.npu`` for
  the Ascend profile (``csrc_free_ops.device``).

``KernelArgs`` is the kernel's runtime argument list, written once: the
sequence builds it by name and launches it in its order.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton.language as tl
from torch import Tensor

from csrc_free_ops import device
from csrc_free_ops.launcher import Launcher, scalar_specialization
from csrc_free_ops.rope import kernels, plan
from csrc_free_ops.rope.plan import Plan, Problem

# Layouts whose kernel arguments are kept (a bound on the cache's memory).
MAX_LAYOUTS = 1024


class KernelArgs(NamedTuple):
    """``kernels.rope_kernel``'s runtime arguments, in its order: the tensors,
    then sizes, then strides.  q, k, q_out, k_out are (B, H, S, D); cos and
    sin (B, S, R) with batch stride 0 when shared by the batch."""

    q: Tensor
    k: Tensor
    q_out: Tensor
    k_out: Tensor
    cos: Tensor
    sin: Tensor
    n_rows: int
    seq_len: int
    n_qh: int
    n_kh: int
    half: int
    rot_dim: int
    head_dim: int
    stride_q_b: int
    stride_q_h: int
    stride_q_s: int
    stride_q_d: int
    stride_q_out_b: int
    stride_q_out_h: int
    stride_q_out_s: int
    stride_q_out_d: int
    stride_k_b: int
    stride_k_h: int
    stride_k_s: int
    stride_k_d: int
    stride_k_out_b: int
    stride_k_out_h: int
    stride_k_out_s: int
    stride_k_out_d: int
    stride_cos_b: int
    stride_cos_s: int
    stride_cos_r: int
    stride_sin_b: int
    stride_sin_s: int
    stride_sin_r: int


N_TENSORS = 6  # KernelArgs' leading tensor fields


def _strides(name: str, t: Tensor) -> dict[str, int]:
    """q-like (B, H, S, D) strides as KernelArgs fields."""
    return dict(zip((f"stride_{name}_{d}" for d in "bhsd"), t.stride(), strict=True))


def _table_strides(name: str, t: Tensor) -> dict[str, int]:
    """cos/sin (batch, seq, col) strides; batch stride 0 when the batch shares the table."""
    if t.dim() == 2:
        strides = (0, *t.stride())
    else:
        strides = (0 if t.shape[0] == 1 else t.stride(0), t.stride(1), t.stride(2))
    return dict(zip((f"stride_{name}_{d}" for d in "bsr"), strides, strict=True))


def kernel_args(q: Tensor, k: Tensor, q_out: Tensor, k_out: Tensor, cos: Tensor, sin: Tensor) -> KernelArgs:
    batch, n_qh, seq_len, head_dim = q.shape
    rot_dim = cos.shape[-1]
    return KernelArgs(
        q=q, k=k, q_out=q_out, k_out=k_out, cos=cos, sin=sin,
        n_rows=batch * seq_len, seq_len=seq_len, n_qh=n_qh, n_kh=k.shape[1], half=rot_dim // 2, rot_dim=rot_dim,
        head_dim=head_dim,
        **_strides("q", q), **_strides("q_out", q_out), **_strides("k", k), **_strides("k_out", k_out),
        **_table_strides("cos", cos), **_table_strides("sin", sin),
    )  # fmt: skip


class Layout(NamedTuple):
    """A call's scalar kernel arguments (KernelArgs after the tensors) and
    their Triton specialization."""

    scalars: tuple
    scalar_key: int

    def arg(self, name: str) -> int:
        return self.scalars[KernelArgs._fields.index(name) - N_TENSORS]


_LAYOUTS: dict[tuple, Layout] = {}


def layout(q: Tensor, k: Tensor, q_out: Tensor, k_out: Tensor, cos: Tensor, sin: Tensor) -> Layout:
    """The Layout of these tensors, cached by the shapes and strides it is
    made from (training repeats them call after call)."""
    key = (q.shape, q.stride(), k.shape, k.stride(), q_out.stride(), k_out.stride(),
           cos.shape, cos.stride(), sin.shape, sin.stride())  # fmt: skip
    found = _LAYOUTS.get(key)
    if found is None:
        if len(_LAYOUTS) >= MAX_LAYOUTS:
            _LAYOUTS.clear()
        scalars = tuple(kernel_args(q, k, q_out, k_out, cos, sin)[N_TENSORS:])
        found = _LAYOUTS[key] = Layout(scalars, scalar_specialization(scalars))
    return found


def _compute(*data: Tensor) -> tl.dtype:
    """float64 math when any data tensor is float64, else float32."""
    return tl.float64 if any(t.dtype == torch.float64 for t in data) else tl.float32


@functools.lru_cache(maxsize=256)
def _launcher(
    block_qh: int, block_kh: int, num_warps: int | None, block_half: int, block_pass: int,
    grid_stride: bool, heads_fit: bool, copy_pass: bool, backward: bool, compute: tl.dtype,
) -> Launcher:  # fmt: skip
    """The kernel with its compile-time arguments: a Plan's choices (not its
    grid: plans that differ only in their grid share one Launcher and its
    compiled kernels) and what the sizes decide."""
    options = {} if num_warps is None else {"num_warps": num_warps}
    return Launcher(
        kernels.rope_kernel, BLOCK_QH=block_qh, BLOCK_KH=block_kh, BLOCK_HALF=block_half, BLOCK_PASS=block_pass,
        GRID_STRIDE=grid_stride, HEADS_FIT=heads_fit, COPY_PASS=copy_pass, BACKWARD=backward, COMPUTE=compute,
        **options,
    )  # fmt: skip


def rotate(q: Tensor, k: Tensor, q_out: Tensor, k_out: Tensor, cos: Tensor, sin: Tensor, p: Plan, *,
           backward: bool) -> None:  # fmt: skip
    """Write the rotation of q and k (its transpose, backward) into q_out and
    k_out, which may be q and k themselves.  Out of place, partial rotary
    also copies the dims it leaves unchanged."""
    lay = layout(q, k, q_out, k_out, cos, sin)
    n_rows, n_qh, n_kh = lay.arg("n_rows"), lay.arg("n_qh"), lay.arg("n_kh")
    if n_rows == 0 or n_qh + n_kh == 0:
        return
    rot_dim, head_dim = lay.arg("rot_dim"), lay.arg("head_dim")
    copy_pass = q_out is not q and rot_dim < head_dim
    run = _launcher(
        p.block_qh, p.block_kh, p.num_warps, plan.block_half(rot_dim), plan.block_pass(head_dim, rot_dim),
        p.walks_rows(n_rows), p.heads_fit(n_qh, n_kh), copy_pass, backward, _compute(q, k),
    )  # fmt: skip
    run.launch(p.programs, (q, k, q_out, k_out, cos, sin), lay.scalars, lay.scalar_key)


def forward(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, p: Plan) -> tuple[Tensor, Tensor]:
    """(q_out, k_out), each in its input's dtype and memory layout."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    rotate(q, k, q_out, k_out, cos, sin, p, backward=False)
    return q_out, k_out


def backward(dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor, p: Plan) -> tuple[Tensor, Tensor]:
    """The transposed rotation of the incoming gradients dq, dk."""
    dq_in, dk_in = torch.empty_like(dq), torch.empty_like(dk)
    rotate(dq, dk, dq_in, dk_in, cos, sin, p, backward=True)
    return dq_in, dk_in


def forward_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, p: Plan) -> None:
    rotate(q, k, q, k, cos, sin, p, backward=False)


# --- The entries of the dispatch keys


def problem(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, copy_pass: bool) -> Problem:
    """What the planning functions need to know of a call."""
    batch, n_qh, seq_len, head_dim = q.shape
    compute = 8 if torch.float64 in (q.dtype, k.dtype) else 4
    return Problem(
        batch * seq_len, n_qh, k.shape[1], head_dim, cos.shape[-1], q.element_size(), k.element_size(),
        max(cos.element_size(), sin.element_size()), compute, copy_pass,
    )  # fmt: skip


def _partial(q: Tensor, cos: Tensor) -> bool:
    return cos.shape[-1] < q.shape[-1]


def _cuda_plan(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, copy_pass: bool) -> Plan:
    return plan.cuda(problem(q, k, cos, sin, copy_pass))


def _npu_plan(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, copy_pass: bool) -> Plan:
    return plan.npu(problem(q, k, cos, sin, copy_pass), device.npu_ub_bytes(), device.npu_vector_cores())


def cuda_forward(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    return forward(q, k, cos, sin, _cuda_plan(q, k, cos, sin, _partial(q, cos)))


def cuda_backward(dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    return backward(dq, dk, cos, sin, _cuda_plan(dq, dk, cos, sin, _partial(dq, cos)))


def cuda_forward_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> None:
    forward_(q, k, cos, sin, _cuda_plan(q, k, cos, sin, False))


def npu_forward(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    return forward(q, k, cos, sin, _npu_plan(q, k, cos, sin, _partial(q, cos)))


def npu_backward(dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    return backward(dq, dk, cos, sin, _npu_plan(dq, dk, cos, sin, _partial(dq, cos)))


def npu_forward_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> None:
    forward_(q, k, cos, sin, _npu_plan(q, k, cos, sin, False))
