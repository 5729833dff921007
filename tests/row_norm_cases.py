"""Float64 expectations and error bounds shared by the rms_norm and
layer_norm tests (test_rms_norm, test_layer_norm, test_fuzz).

The expectation is computed in float64 from the op's definition, with
Llama's casting kept: the normalized x is rounded to x's own dtype before
the weight multiplies it (a cast the float64 reference of a float64 copy
of x would not make), its gradient passing straight through as autograd's
does for ``.to()``.
"""

from __future__ import annotations

import torch

from tests.helpers import assert_close_to_ref, assert_close_to_scale, compute_dtype


def _normalized64(x: torch.Tensor, eps: float, center: bool) -> tuple[torch.Tensor, torch.Tensor]:
    x64 = x.detach().double() if not x.requires_grad else x.double()
    if center:
        x64 = x64 - x64.mean(-1, keepdim=True)
    rstd = torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)
    return x64 * rstd, rstd


def expected(x, weight, bias, dy, eps, offset=0.0, center=False, round_normed=False):
    """(y, (dx, dweight, dbias)) in float64; None for an absent parameter's gradient."""
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (x, weight, bias)]
    x64, w64, b64 = leaves
    xc = x64 - x64.mean(-1, keepdim=True) if center else x64
    xhat = xc * torch.rsqrt(xc.square().mean(-1, keepdim=True) + eps)
    if round_normed and x.dtype != torch.float64:
        xhat = xhat + (xhat.detach().to(x.dtype).double() - xhat.detach())
    y = xhat
    if w64 is not None:
        y = y * (offset + w64)
    if b64 is not None:
        y = y + b64
    present = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(y, present, dy.detach().double()))
    return y.detach(), tuple(None if t is None else next(grads) for t in leaves)


def term_scales(x, weight, bias, dy, eps, offset=0.0, center=False):
    """Per gradient element, the summed magnitudes of the terms the kernel
    adds up into it (assert_close_to_scale): dx = rstd * (g - xhat * mean(g
    xhat) - mean(g)) cancels on short rows; dweight and dbias sum over rows."""
    xhat, rstd = _normalized64(x.detach(), eps, center)
    d = dy.detach().double()
    g = (d * (offset + weight.detach().double())).abs() if weight is not None else d.abs()
    dx = g + xhat.abs() * (g * xhat.abs()).mean(-1, keepdim=True)
    if center:
        dx = dx + g.mean(-1, keepdim=True)
    h = x.shape[-1]
    dw = (d * xhat).abs().reshape(-1, h).sum(0) if weight is not None else None
    db = d.abs().reshape(-1, h).sum(0) if bias is not None else None
    return rstd * dx, dw, db


def assert_matches(y, grads, x, weight, bias, dy, eps, offset=0.0, center=False, round_normed=False):
    """y and (dx, dweight, dbias) (None where absent) against ``expected``,
    each in its tensor's dtype's bound plus the compute dtype's on its terms."""
    y_ref, refs = expected(x, weight, bias, dy, eps, offset, center, round_normed)
    assert y.dtype == x.dtype and y.shape == x.shape
    compute = compute_dtype(x.dtype)
    if center:
        # x - mean(x) cancels on near-constant rows (exactly 0 on a constant one in float64): the
        # compute dtype bounds it relative to |x| + |mean(x)|, scaled as y scales xhat.
        x64 = x.detach().double()
        mean = x64.mean(-1, keepdim=True)
        scale = (x64.abs() + mean.abs()) * torch.rsqrt((x64 - mean).square().mean(-1, keepdim=True) + eps)
        if weight is not None:
            scale = scale * (offset + weight.detach().double()).abs()
        assert_close_to_scale(y, y_ref, scale, x.dtype, "y", compute)
    else:
        assert_close_to_ref(y, y_ref, x.dtype, "y")
    scales = term_scales(x, weight, bias, dy, eps, offset, center)
    for got, ref, scale, param, what in zip(grads, refs, scales, (x, weight, bias), ("dx", "dweight", "dbias"),
                                            strict=True):  # fmt: skip
        if param is None:
            assert got is None, f"{what}: a gradient for an absent parameter"
            continue
        assert got.dtype == param.dtype and got.shape == param.shape, what
        # Under Llama's casting each dweight term holds xhat rounded to x's dtype, where the kernel's
        # float32 xhat and the float64 one can round to neighbours: x's dtype bounds those terms.
        terms = x.dtype if what == "dweight" and round_normed else compute
        assert_close_to_scale(got, ref, scale, got.dtype, what, terms)
