"""rope_ (in place) under autograd: torch's in-place semantics, recorded on the bases of q and k."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch.autograd import forward_ad

from csrc_free_ops.rope import RopeOptions
from registrations import overlap
from registrations._library import LIB, register_version_bumps
from registrations.autograd import bump, c_apply
from registrations.eager import DIRECT_KERNELS
from registrations.rope import OP, ROPE_, ROPE_BACKWARD, call, refuse_table_grad, save_options, transpose_with

# --- rope_ under autograd: torch's in-place semantics
#
# ADInplaceOrView bumps the version counters (as torch.library.custom_op does
# for ops that mutate), so a saved tensor rotated afterwards fails backward's
# version check, grad mode or not.  The Autograd kernel records the rotation
# as an autograd.Function on the *bases* of q and k (a tensor that is no view
# is its own base), which it marks dirty: a leaf requiring grad raises, the
# bases take the rotation into their history (gradient: rope_backward on the
# regions q and k cover), and q, k, as views of their bases, see it through
# autograd's view replay.  Recording it on q and k themselves would fail for
# HF's q and k, which are views (transposes of the projections): autograd
# refuses a Function that modifies a view in place and returns two tensors,
# and for one it would route the gradient through CopySlices, which copies
# the whole base twice more.


# The schema positions rope_ writes: q and k.
MUTATED = (0, 1)


class _Region(NamedTuple):
    """Where a rotated tensor lies in its base: which base, its geometry
    (size, stride, storage offset relative to the base's), and whether it is
    the whole base (the same elements)."""

    base: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    whole: bool


def _base_of(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._is_view() else t


def _check_view_creation(name: str, t: torch.Tensor) -> None:
    """The views autograd forbids modifying in place (torch's own rule for its in-place ops)."""
    if not t._is_view():
        return
    meta = torch._C._autograd._get_creation_meta(t)
    if meta != torch._C._autograd.CreationMeta.DEFAULT:
        raise RuntimeError(
            f"{OP}_: {name} is a view autograd does not allow modifying in place ({meta}: the output of a "
            "function returning several views, or a view made under no_grad or inference mode); use liger.rope"
        )


def _regions(q, k) -> tuple[list[torch.Tensor], list[_Region | None]]:
    bases: list[torch.Tensor] = []
    regions: list[_Region | None] = []
    for t in (q, k):
        if t is None:
            regions.append(None)
            continue
        base = _base_of(t)
        index = next((i for i, b in enumerate(bases) if b is base), None)
        if index is None:
            index = len(bases)
            bases.append(base)
        whole = t.numel() == base.numel() and not overlap.self_overlapping(t)
        regions.append(_Region(index, tuple(t.shape), t.stride(), t.storage_offset() - base.storage_offset(), whole))
    if regions[0] is not None and regions[1] is not None and regions[0].base == regions[1].base:
        regions = [r._replace(whole=False) for r in regions]  # one base holding both: neither is all of it
    return bases, regions


def _in_region(t: torch.Tensor, region: _Region) -> torch.Tensor:
    return t.as_strided(region.size, region.stride, t.storage_offset() + region.offset)


class _RopeInPlace(torch.autograd.Function):
    """``rotate()`` (the rotation of q and k in place) recorded on their bases; ``options`` are
    cos, sin and the other options in the schema's order."""

    @staticmethod
    def forward(ctx, rotate, options, regions, *bases):
        rotate()
        ctx.mark_dirty(*bases)
        save_options(ctx, *options)
        ctx.bases = [(b.shape, b.stride()) for b in bases]
        ctx.regions = regions
        return bases if len(bases) > 1 else bases[0]

    @staticmethod
    def backward(ctx, *dbases):
        needs = ctx.needs_input_grad[3:]
        # Incoming gradients in their bases' layouts, so that q's and k's geometry addresses them.
        owned = [False] * len(dbases)
        laid_out = []
        for i, (g, (shape, stride)) in enumerate(zip(dbases, ctx.bases, strict=True)):
            if g is not None and g.stride() != stride:
                g = torch.empty_strided(shape, stride, dtype=g.dtype, device=g.device).copy_(g)
                owned[i] = True
            laid_out.append(g)
        dq, dk = (
            None if r is None or laid_out[r.base] is None or not needs[r.base] else _in_region(laid_out[r.base], r)
            for r in ctx.regions
        )
        grads = list(transpose_with(ROPE_BACKWARD, ctx, dq, dk, needs=(dq is not None, dk is not None))[:2])
        out: list[torch.Tensor | None] = [None] * len(dbases)
        for region, g in zip(ctx.regions, grads, strict=True):
            if g is None:
                continue
            shape, stride = ctx.bases[region.base]
            if region.whole and g.stride() == region.stride:
                out[region.base] = g.as_strided(shape, stride, g.storage_offset() - region.offset)
                continue
            if out[region.base] is None:  # the parts q and k leave alone pass through
                base_grad = laid_out[region.base]
                out[region.base] = base_grad if owned[region.base] else base_grad.clone()
            _in_region(out[region.base], region).copy_(g)
        return (None, None, None, *out)


def _refuse_forward_ad(q, k, cos, sin) -> None:
    if forward_ad._current_level >= 0 and any(
        t is not None and forward_ad.unpack_dual(t).tangent is not None for t in (q, k, cos, sin)
    ):
        raise NotImplementedError(
            f"{OP}_: forward-mode AD (torch.func.jvp / jacfwd, torch.autograd.forward_ad) does not go through the "
            "in-place rotation (its tangent would be left unrotated); use liger.rope (out of place)"
        )


def _records_gradient(q, k, cos, sin) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, cos, sin))


def _recorded_on_bases(q, k, cos, sin) -> tuple[list[torch.Tensor], list[_Region | None]]:
    """The bases the rotation is recorded on and q's and k's regions in them, after the checks that
    make a recorded in-place rotation an error."""
    refuse_table_grad(OP + "_", cos, sin)
    for name, t in (("q", q), ("k", k)):
        if t is not None:
            _check_view_creation(name, t)
    return _regions(q, k)


def _rotate_below_autograd(q, k, cos, sin, options: RopeOptions) -> None:
    with torch._C._AutoDispatchBelowAutograd():
        call(ROPE_, q, k, cos, sin, options)


def _rope_inplace_autograd(
    q, k, cos, sin, position_ids=None, cu_seqlens=None, *, pairs="halves", mrope_section=None, mrope_interleaved=False
) -> None:
    options = RopeOptions(position_ids, cu_seqlens, pairs, mrope_section, mrope_interleaved)
    _refuse_forward_ad(q, k, cos, sin)
    if _records_gradient(q, k, cos, sin):
        if torch._C._are_functorch_transforms_active():
            raise NotImplementedError(
                f"{OP}_: gradients through the in-place rotation under torch.func transforms are not supported; "
                "use liger.rope (out of place)"
            )
        bases, regions = _recorded_on_bases(q, k, cos, sin)
        rotate = functools.partial(_rotate_below_autograd, q, k, cos, sin, options)
        _RopeInPlace.apply(rotate, (cos, sin, *options), regions, *bases)
        return None
    return _rotate_below_autograd(q, k, cos, sin, options)


_apply_in_plain_calls = c_apply(_RopeInPlace)


def _rope_inplace_direct(run, args: tuple) -> None:
    """``_rope_inplace_autograd(*args)`` (every schema argument) for a plain call whose prepared run
    (its checks passed) is ``run`` (registrations/eager.py): the rotation runs without the
    dispatcher, and its version bumps are the Function's (mark_dirty) or, with no gradient
    recorded, made here."""
    q, k, cos, sin = args[:4]
    _refuse_forward_ad(q, k, cos, sin)
    if _records_gradient(q, k, cos, sin):
        bases, regions = _recorded_on_bases(q, k, cos, sin)
        _apply_in_plain_calls(functools.partial(run, *args), args[2:], regions, *bases)
        return None
    run(*args)
    bump(args, MUTATED)
    return None


register_version_bumps(ROPE_, MUTATED)
LIB.impl("rope_", _rope_inplace_autograd, "Autograd")
DIRECT_KERNELS[ROPE_] = _rope_inplace_direct
