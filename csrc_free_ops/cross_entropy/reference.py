"""Pure-PyTorch cross-entropy: the ground truth for tests and the CPU fallback.

Math runs in float32 (float64 for float64 logits).  ``forward`` returns
(loss, z_loss, lse); ``backward`` the logits' gradient from the closed form,
built from differentiable torch ops so that second-order gradients through it
are exact.  Reductions (``Options.reduction``):

* ``none``: per row, loss_row + z_row and z_row; ignored rows 0;
* ``sum``: the sums over rows;
* ``mean``: sum(loss_row) / sum(w[y]) + sum(z_row) / n, over the n rows whose
  target is not ignore_index (upstream's z-loss is not weighted).  With no
  such row both are 0 / 0 = NaN, as torch's F.cross_entropy gives.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

REDUCTIONS = ("mean", "sum", "none")


class Options(NamedTuple):
    """The loss's options, one value from the schema boundary to the kernels."""

    ignore_index: int = -100
    label_smoothing: float = 0.0
    reduction: str = "mean"
    lse_square_scale: float = 0.0
    softcap: float | None = None


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def capped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return logits if softcap is None else softcap * torch.tanh(logits / softcap)


class Rows(NamedTuple):
    """Per-row terms, in the compute dtype."""

    loss: torch.Tensor  # loss_row, 0 where ignored
    z_loss: torch.Tensor  # z_row, 0 where ignored
    lse: torch.Tensor
    valid: torch.Tensor  # target != ignore_index
    target_weight: torch.Tensor  # w[y] (1 without weights), 0 where ignored


def rows(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, o: Options) -> Rows:
    ct = compute_dtype(logits)
    s = capped(logits.to(ct), o.softcap)
    n_classes = s.shape[-1]
    valid = target != o.ignore_index
    safe = torch.where(valid, target, 0).long()
    lse = torch.logsumexp(s, -1)
    s_y = s.gather(1, safe[:, None]).squeeze(1)
    if weight is None:
        w_y = torch.ones_like(lse)
        smooth = n_classes * lse - s.sum(-1)
    else:
        w = weight.to(ct)
        w_y = w[safe]
        smooth = w.sum() * lse - (s * w).sum(-1)
    ls = o.label_smoothing
    loss = (1.0 - ls) * w_y * (lse - s_y) + (ls / n_classes) * smooth
    zero = torch.zeros_like(lse)
    return Rows(
        torch.where(valid, loss, zero),
        torch.where(valid, o.lse_square_scale * lse * lse, zero),
        lse,
        valid,
        torch.where(valid, w_y, zero),
    )


def reduce(r: Rows, o: Options, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, z_loss) reduced as ``o.reduction`` says, in ``dtype``."""
    if o.reduction == "none":
        return (r.loss + r.z_loss).to(dtype), r.z_loss.to(dtype)
    loss, z = r.loss.sum(), r.z_loss.sum()
    if o.reduction == "mean":
        loss = loss / r.target_weight.sum()
        z = z / r.valid.sum()
    return (loss + z).to(dtype), z.to(dtype)


def scales(grad_loss: torch.Tensor, r_valid: torch.Tensor, target_weight: torch.Tensor, o: Options, ct: torch.dtype):
    """(scale of the loss term, scale of the z-loss term) per row, from the
    incoming gradient: d total / d loss_row and d total / d z_row."""
    g = grad_loss.to(ct)
    if o.reduction == "none":
        return g, g
    ones = torch.ones_like(target_weight)
    if o.reduction == "sum":
        return g * ones, g * ones
    return g / target_weight.sum() * ones, g / r_valid.sum() * ones


def forward(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, o: Options
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r = rows(logits, target, weight, o)
    loss, z = reduce(r, o, logits.dtype)
    return loss, z, torch.where(r.valid, r.lse, torch.zeros_like(r.lse))  # 0 where ignored, as the kernels store


def backward(
    grad_loss: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    weight: torch.Tensor | None,
    o: Options,
) -> torch.Tensor:
    """d total / d logits.  ``lse`` (the forward's) is not read: lse is
    recomputed from logits, so a gradient of this backward sees its
    dependence on them."""
    del lse
    ct = compute_dtype(logits)
    raw = logits.to(ct)
    s = capped(raw, o.softcap)
    n_classes = s.shape[-1]
    r = rows(logits, target, weight, o)
    p = torch.exp(s - r.lse[:, None])
    onehot = torch.nn.functional.one_hot(torch.where(r.valid, target, 0).long(), n_classes).to(ct)
    a, b = scales(grad_loss, r.valid, r.target_weight, o, ct)
    ls = o.label_smoothing
    if weight is None:
        smooth = n_classes * p - 1.0
    else:
        w = weight.to(ct)
        smooth = w.sum() * p - w[None, :]
    g = a[:, None] * ((1.0 - ls) * r.target_weight[:, None] * (p - onehot) + (ls / n_classes) * smooth)
    g = g + b[:, None] * (2.0 * o.lse_square_scale) * r.lse[:, None] * p
    if o.softcap is not None:
        t = torch.tanh(raw / o.softcap)
        g = g * (1.0 - t * t)
    g = torch.where(r.valid[:, None], g, torch.zeros_like(g))
    return g.to(logits.dtype)
