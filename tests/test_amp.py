"""Automatic mixed precision: under torch.autocast (bfloat16), a model with
float32 parameters whose activations come out of autocast's bfloat16 matmuls
trains through the ops, its loss and gradients within bfloat16 tolerance of
the same model run in float64, as the model built from the torch / HF
reference layers (nn.GroupNorm, PolyNorm written in torch, transformers'
apply_rotary_pos_emb) under the same autocast is.

The ops take no Autocast kernel, by design: they compute in float32 whatever
the data's dtype, take parameters (and, with the dtype policy, rope's tables)
of any float dtype, and return the data's dtype.  So autocast passes them its
bfloat16 activations as they are (no float32 copy of the activations up
front); an Autocast kernel casting to float32 would add that copy and hand
float32 outputs to the next matmul, which autocast casts back.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from liger_nn import GroupNorm, PolyNorm
from tests.helpers import TorchPolyNorm

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_rope  # noqa: E402

STEPS = 2  # losses of both steps compared, gradients of the first
# Each bfloat16 run against the same model run in float64 without autocast:
# ||a - exact|| / ||exact|| per gradient, and the loss.  Two bfloat16 runs can
# sit on opposite sides of the exact value, so they are never compared with
# each other; the torch-layer model is held to the same bounds, which shows
# they are what bfloat16 autocast reaches (here the layers' models came within
# 0.8% of the float64 loss and 3.2% of its gradients, ops and torch alike).
GRAD_RTOL, LOSS_RTOL = 4e-2, 1e-2
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


class Net(nn.Module):
    """Linear -> GroupNorm over the features -> PolyNorm -> q/k projection -> rope -> scores."""

    def __init__(self, liger: bool, rope: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(16, 32)
        self.poly = PolyNorm() if liger else TorchPolyNorm()
        self.group = GroupNorm(4, 32) if liger else nn.GroupNorm(4, 32)
        self.qk = nn.Linear(32, 32)
        self.liger, self.rope = liger, rope
        with torch.no_grad():
            self.poly.weight.copy_(torch.tensor([0.5, -0.3, 0.8]))
            self.poly.bias.fill_(0.1)
            self.group.weight.normal_(1.0, 0.2)
            self.group.bias.normal_(0.0, 0.2)

    def forward(self, x, cos, sin):  # x (B, S, 16); cos/sin (S, 8) float32
        h = self.group(self.inp(x).transpose(1, 2)).transpose(1, 2)
        h = self.poly(h)
        if h.requires_grad:  # the sum of |incoming gradient|: the terms poly_norm's dbias adds up
            h.register_hook(lambda g: setattr(self, "dbias_terms", g.float().abs().sum().item()))
        q, k = self.qk(h).unflatten(-1, (4, 8)).transpose(1, 2).chunk(2, dim=1)  # (B, 2, S, 8) each
        if self.rope:
            if self.liger:
                q, k = torch.ops.liger.rope(q, k, cos, sin)
            else:  # HF's formula promotes to the tables' float32; the op keeps q's dtype (docs/ops.md)
                q_embed, k_embed = hf_rope(q, k, cos[None], sin[None], unsqueeze_dim=1)
                q, k = q_embed.to(q.dtype), k_embed.to(k.dtype)
        return (q @ k.transpose(-1, -2)).diagonal(dim1=-2, dim2=-1)  # (q * k).sum(-1), which CUDA autocasts to fp32


def _tables(seq: int, device: str):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device), emb.sin().to(device)  # float32, as HF's rotary embedding returns them


def _train(model: nn.Module, device: str, exact: bool = False):
    """Losses of STEPS SGD steps and the parameters' gradients, under
    bfloat16 autocast, or (exact) in float64 without autocast."""
    model = model.to(device, torch.float64 if exact else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # AdamW turns bf16 noise in tiny grads into lr-sized steps
    gen = torch.Generator().manual_seed(1)
    cos, sin = _tables(6, device)
    dtype = torch.float64 if exact else torch.float32
    cos, sin = cos.to(dtype), sin.to(dtype)
    losses, grads = [], []
    for _ in range(STEPS):
        x = torch.randn(2, 6, 16, generator=gen).to(device, dtype)
        target = torch.randn(2, 2, 6, generator=gen).to(device, dtype)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=not exact):
            out = model(x, cos, sin)
            assert out.dtype == (torch.float64 if exact else torch.bfloat16), "autocast's matmuls give bfloat16 here"
            loss = (out.to(dtype) - target).pow(2).mean()
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.detach().double().clone() for n, p in model.named_parameters()})
        grads[-1]["dbias_terms"] = model.dbias_terms
        assert all(p.dtype == dtype for p in model.parameters())
        opt.step()
        opt.zero_grad()
    return losses, grads


def _assert_near_exact(got, exact, who: str):
    for step, (loss, ref) in enumerate(zip(got[0], exact[0], strict=True)):
        assert abs(loss - ref) <= LOSS_RTOL * abs(ref), f"{who}, step {step}: loss {loss} vs float64's {ref}"
        if step > 0:  # after a step the parameters differ by the first step's rounding too
            continue
        terms = exact[1][step]["dbias_terms"]
        for name, ref_grad in exact[1][step].items():
            if name == "dbias_terms":
                continue
            grad = got[1][step][name]
            if name == "poly.bias":
                # A sum of bfloat16 gradients that cancel far below its terms: the
                # rounding is relative to the terms (2 ulp of bfloat16).
                err = (grad - ref_grad).abs().item()
                assert err <= 2 * 2**-8 * terms, f"{who}, step {step}: poly.bias gradient off by {err:.2e} ({terms=})"
                continue
            assert torch.isfinite(grad).all(), f"{who}, step {step}: non-finite gradient of {name}"
            assert ref_grad.norm() > 0, f"step {step}: float64 gradient of {name} is zero"
            err = ((grad - ref_grad).norm() / ref_grad.norm()).item()
            assert err <= GRAD_RTOL, f"{who}, step {step}: gradient of {name} off float64's by {err:.2e}"


def _check(device: str, rope: bool) -> None:
    exact = _train(Net(liger=False, rope=rope), device, exact=True)
    _assert_near_exact(_train(Net(liger=True, rope=rope), device), exact, "the ops")
    _assert_near_exact(_train(Net(liger=False, rope=rope), device), exact, "the torch layers")


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_trains_through_the_norms(device):
    _check(device, rope=False)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_trains_through_rope_with_float32_tables(device):
    _check(device, rope=True)
