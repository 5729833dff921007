"""Tensors on a CUDA device that is not the current one (device_map="auto"
puts layers on cuda:1 while cuda:0 is current): every op and backward op
launches on the tensors' device; outputs and gradients stay there and equal
the results on cuda:0.  Needs two GPUs (nox -s multigpu runs it)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices"
)
liger = torch.ops.liger


def _run(dev: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, grad=False):
        t = torch.randn(*shape, generator=gen).to(dev)
        return t.requires_grad_() if grad else t

    x, w, b = rand(64, 256, grad=True), rand(3, grad=True), rand(1, grad=True)
    q, k = rand(2, 4, 16, 32, grad=True), rand(2, 2, 16, 32, grad=True)
    cos, sin = rand(16, 32), rand(16, 32)
    xg, gw, gb = rand(4, 64, 96, grad=True), rand(64, grad=True), rand(64, grad=True)
    outs = {"poly_norm": liger.poly_norm(x, w, b, 1e-6), "group_norm": liger.group_norm(xg, 8, gw, gb, 1e-5)}
    outs["q_out"], outs["k_out"] = liger.rope(q, k, cos, sin)
    inputs = {"x": x, "w": w, "b": b, "q": q, "k": k, "xg": xg, "gw": gw, "gb": gb}
    grads = torch.autograd.grad(list(outs.values()), list(inputs.values()), [torch.ones_like(o) for o in outs.values()])
    q2, k2 = q.detach().clone(), k.detach().clone()
    liger.rope_(q2, k2, cos, sin)
    return {**outs, **{f"d{n}": g for n, g in zip(inputs, grads, strict=True)}, "q_in_place": q2, "k_in_place": k2}


def test_every_op_runs_on_the_tensors_device():
    torch.cuda.set_device(0)
    on_current = _run("cuda:0")
    on_other = _run("cuda:1")
    assert torch.cuda.current_device() == 0, "an op changed the current device"
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    for name, got in on_other.items():
        assert got.device == torch.device("cuda:1"), f"{name} is on {got.device}"
        assert torch.equal(got.cpu(), on_current[name].cpu()), f"{name} differs from the cuda:0 result"
