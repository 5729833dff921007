"""The cross-entropy launch sequence, one for every backend, taking a Plan as
data, and the entry of each dispatch key (registrations/cross_entropy.py
binds them):

* ``cuda_forward`` / ``cuda_backward``: ``plan.cuda`` (also the CPU
  interpreter path);
* ``npu_forward`` / ``npu_backward``: ``plan.npu`` for the Ascend profile;
  float64 runs the reference there (triton-ascend compiles no float64).

The row pieces (``forward_rows``, ``backward_rows``, ``reduce_rows``,
``row_scales``) are what fused_linear_cross_entropy runs on each chunk.

Targets are checked around the forward's launches (targets.py): the host
reads one value, the only synchronization of the op, after the kernels are
enqueued.  Where a read is impossible (while torch.compile traces the
launches, or during CUDA graph capture) the check is skipped and a bad
target's row yields NaN (kernels.py), never a read out of bounds.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from csrc_free_ops import device
from csrc_free_ops.cross_entropy import kernels, plan, reference
from csrc_free_ops.cross_entropy.plan import Plan
from csrc_free_ops.cross_entropy.reference import Options, Rows
from csrc_free_ops.cross_entropy.targets import check_targets, checked_targets
from csrc_free_ops.launcher import Launcher, placeholder


def _compute(t: torch.Tensor) -> tuple[tl.dtype, torch.dtype]:
    return (tl.float64, torch.float64) if t.dtype == torch.float64 else (tl.float32, torch.float32)


def _meta(o: Options, has_weight: bool, block_n: int, compute: tl.dtype, num_warps: int | None) -> dict:
    meta = {
        "LABEL_SMOOTHING": float(o.label_smoothing),
        "LSE_SQUARE_SCALE": float(o.lse_square_scale),
        "SOFTCAP": 1.0 if o.softcap is None else float(o.softcap),
        "HAS_SOFTCAP": o.softcap is not None,
        "HAS_WEIGHT": has_weight,
        "BLOCK_N": block_n,
        "COMPUTE": compute,
    }
    if num_warps is not None:
        meta["num_warps"] = num_warps
    return meta


@functools.lru_cache(maxsize=256)
def _forward_launcher(o: Options, has_weight: bool, p: Plan, compute: tl.dtype) -> Launcher:
    return Launcher(kernels.forward_kernel, **_meta(o, has_weight, p.block_n, compute, p.num_warps))


@functools.lru_cache(maxsize=256)
def _backward_launcher(o: Options, has_weight: bool, in_place: bool, p: Plan, compute: tl.dtype) -> Launcher:
    meta = _meta(o, has_weight, p.block_n, compute, p.num_warps)
    return Launcher(kernels.backward_kernel, IN_PLACE=in_place, **meta)


def _kernel_options(o: Options) -> Options:
    """o with the fields the kernels do not read (ignore_index: a runtime
    argument; reduction: applied by torch ops) set to their defaults, so
    launchers are shared across them."""
    return o._replace(ignore_index=-100, reduction="mean")


def weight_sum(weight: torch.Tensor | None, o: Options, ct: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """sum(weight) as a (1,) tensor in ct where label smoothing needs it, else a placeholder."""
    if weight is None or o.label_smoothing <= 0:
        return placeholder(like)
    return weight.sum(dtype=ct).reshape(1)


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 2 and t.stride(-1) == 1 else t.contiguous()


def forward_rows(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, w_sum: torch.Tensor, o: Options,
    p: Plan, loss: torch.Tensor, z_loss: torch.Tensor, lse: torch.Tensor, first_row: int = 0,
) -> None:  # fmt: skip
    """Each row's loss, z-loss and lse (COMPUTE, ignored rows 0) into the given buffers: logits row r
    is row first_row + r of target, loss, z_loss and lse."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    compute = _compute(logits)[0]
    w = weight if weight is not None else placeholder(lse)
    _forward_launcher(_kernel_options(o), weight is not None, p, compute)(
        p.programs, logits, target, w, w_sum, loss, z_loss, lse, logits.stride(0), first_row, n_rows, n_cols,
        o.ignore_index,
    )  # fmt: skip


def _target_weights(
    weight: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """weight[y] per row in dtype, 0 where ignored.  A bad target reads a clamped class, never out of
    bounds: its row is NaN (the kernels), and the check raises once the op's launches are queued."""
    index = torch.where(valid, target, 0).clamp_(0, weight.shape[0] - 1)
    return torch.where(valid, weight.to(dtype)[index], 0.0)


def row_scales(
    grad_loss: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, o: Options, ct: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(ce_scale, z_scale, stride) of the backward kernel: d total / d loss_row
    and d total / d z_row per row (stride 1, reduction none) or for every row
    (stride 0).  Two tensors always: a traced launch needs each parameter's own."""
    g = grad_loss.to(ct)
    if o.reduction == "none":
        g = g.contiguous()
        return g, g.clone(), 1
    g = g.reshape(1)
    if o.reduction == "sum":
        return g, g.clone(), 0
    valid = target != o.ignore_index
    n = valid.sum().to(ct)
    if weight is None:
        return g / n, g / n, 0
    w_y = _target_weights(weight, target, valid, ct)
    return g / w_y.sum(), g / n, 0


def backward_rows(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, w_sum: torch.Tensor,
    lse: torch.Tensor, ce_scale: torch.Tensor, z_scale: torch.Tensor, stride_scale: int, o: Options, p: Plan,
    grad_logits: torch.Tensor | None, classes: tuple[int, int] | None = None,
) -> None:  # fmt: skip
    """The logits' gradient into grad_logits, or over logits when it is None.  classes: (offset,
    count) where logits' columns are the classes offset.. of count (a slice of the vocabulary);
    None: all of them."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    class_offset, n_classes = (0, n_cols) if classes is None else classes
    compute = _compute(logits)[0]
    in_place = grad_logits is None
    out = placeholder(logits) if in_place else grad_logits
    w = weight if weight is not None else placeholder(lse)
    _backward_launcher(_kernel_options(o), weight is not None, in_place, p, compute)(
        p.programs, logits, target, w, w_sum, lse, ce_scale, z_scale, out,
        logits.stride(0), out.stride(0) if not in_place else 0, stride_scale, n_rows, n_cols, class_offset,
        n_classes, o.ignore_index,
    )  # fmt: skip


def reduce_rows(
    loss: torch.Tensor, z_loss: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, o: Options,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(loss, z_loss) reduced as o.reduction says (reference.reduce), in dtype."""
    valid = target != o.ignore_index
    if weight is None or o.reduction != "mean":
        w_y = valid.to(loss.dtype)
    else:
        w_y = _target_weights(weight, target, valid, loss.dtype)
    return reference.reduce(Rows(loss, z_loss, loss, valid, w_y), o, dtype)


def forward(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, o: Options, p: Plan
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, target = _unit_stride(logits), target.contiguous()
    ct = _compute(logits)[1]
    n_rows = logits.shape[0]
    loss, z_loss, lse = (torch.empty(n_rows, dtype=ct, device=logits.device) for _ in range(3))
    forward_rows(logits, target, weight, weight_sum(weight, o, ct, lse), o, p, loss, z_loss, lse)
    out_loss, out_z = reduce_rows(loss, z_loss, target, weight, o, logits.dtype)
    return out_loss, out_z, lse


def backward(
    grad_loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
    weight: torch.Tensor | None, o: Options, p: Plan,
) -> torch.Tensor:  # fmt: skip
    logits, target = _unit_stride(logits), target.contiguous()
    ct = _compute(logits)[1]
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    ce_scale, z_scale, stride = row_scales(grad_loss, target, weight, o, ct)
    backward_rows(logits, target, weight, weight_sum(weight, o, ct, lse), lse, ce_scale, z_scale, stride, o, p, grad)
    return grad


# --- The entries of the dispatch keys

OP = "liger.cross_entropy"


def _options(ignore_index, label_smoothing, reduction, lse_square_scale, softcap) -> Options:
    return Options(ignore_index, label_smoothing, reduction, lse_square_scale, softcap)


def cuda_forward(logits, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap):
    o = _options(ignore_index, label_smoothing, reduction, lse_square_scale, softcap)
    with checked_targets(OP, target, logits.shape[1], ignore_index):
        return forward(logits, target, weight, o, plan.cuda(*logits.shape))


def cuda_backward(
    grad_loss, logits, target, lse, weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap
):
    o = _options(ignore_index, label_smoothing, reduction, lse_square_scale, softcap)
    return backward(grad_loss, logits, target, lse, weight, o, plan.cuda(*logits.shape))


def npu_plan(logits: torch.Tensor, has_weight: bool) -> Plan:
    n_rows, n_cols = logits.shape
    return plan.npu(n_rows, n_cols, logits.element_size(), has_weight, device.npu_ub_bytes(), device.npu_vector_cores())


def npu_forward(logits, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap):
    o = _options(ignore_index, label_smoothing, reduction, lse_square_scale, softcap)
    if logits.dtype == torch.float64:
        check_targets(OP, target, logits.shape[1], ignore_index)
        return reference.forward(logits, target, weight, o)
    with checked_targets(OP, target, logits.shape[1], ignore_index):
        return forward(logits, target, weight, o, npu_plan(logits, weight is not None))


def npu_backward(
    grad_loss, logits, target, lse, weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap
):
    o = _options(ignore_index, label_smoothing, reduction, lse_square_scale, softcap)
    if logits.dtype == torch.float64:
        return reference.backward(grad_loss, logits, target, lse, weight, o)
    return backward(grad_loss, logits, target, lse, weight, o, npu_plan(logits, weight is not None))


def reference_forward(logits, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap):
    o = _options(ignore_index, label_smoothing, reduction, lse_square_scale, softcap)
    check_targets(OP, target, logits.shape[1], ignore_index)
    return reference.forward(logits, target, weight, o)


def reference_backward(
    grad_loss, logits, target, lse, weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap
):
    o = _options(ignore_index, label_smoothing, reduction, lse_square_scale, softcap)
    return reference.backward(grad_loss, logits, target, lse, weight, o)
