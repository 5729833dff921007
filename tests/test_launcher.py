"""csrc_free_ops.launcher: the direct launch of a cached compiled kernel must
pick exactly the kernel Triton's own launch would pick, for every property
Triton specializes on, and compute the same results; where it cannot be
used it must fall back to ``kernel[grid]``."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
import triton
import triton.language as tl

from csrc_free_ops import launcher as launcher_mod
from csrc_free_ops.launcher import Launcher
from tests.helpers import DEVICE

CUDA = torch.cuda.is_available()


@triton.jit
def _scaled_gather(X, Y, n, stride, offset, scale, BLOCK: tl.constexpr):
    """Y[i] = X[i * stride] * scale + offset % 5, for i < n."""
    i = tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(X + i * stride, mask=mask, other=0.0)
    tl.store(Y + i, x * scale + (offset % 5) * 1.0, mask=mask)  # offset may be the constexpr 1


@triton.jit
def _constexpr_default(Y, n, BLOCK: tl.constexpr, SCALE: tl.constexpr = 2):
    i = tl.arange(0, BLOCK)
    tl.store(Y + i, i.to(tl.float32) * SCALE, mask=i < n)


def _expected(x: torch.Tensor, n: int, stride: int, offset: int, scale: float) -> torch.Tensor:
    return x[: n * stride : stride] * scale + float(offset % 5)


# Values on both sides of every specialization boundary: 1, multiples of 16,
# and ints past int32.
SIZES = (1, 16, 17)
STRIDES = (1, 2, 16)
OFFSETS = (1, 3, 16, 2**31 + 1, 2**32)


@pytest.mark.skipif(not CUDA, reason="the direct launch exists on CUDA builds of Triton only")
@pytest.mark.skipif(
    ".".join(triton.__version__.split(".")[:2]) not in launcher_mod.DIRECT_LAUNCH_TRITON,
    reason="this Triton version always takes kernel[grid]",
)
def test_direct_launch_selects_tritons_kernel_and_matches_it():
    run = Launcher(_scaled_gather, BLOCK=32)
    base = torch.randn(32 * 16 + 8, device=DEVICE)
    for n, stride, offset, aligned in itertools.product(SIZES, STRIDES, OFFSETS, (True, False)):
        x = base if aligned else base[1:]  # 4 bytes past a 16-byte boundary
        first, second = torch.full((32,), float("nan"), device=DEVICE), torch.full((32,), float("nan"), device=DEVICE)
        run(1, x, first, n, stride, offset, 0.5)  # compiles (or finds) and caches
        run(1, x, second, n, stride, offset, 0.5)  # direct launch
        expected = _expected(x, n, stride, offset, 0.5)
        torch.testing.assert_close(first[:n], expected)
        torch.testing.assert_close(second[:n], expected)
        assert torch.isnan(second[n:]).all()
        cached = run.compiled_for(x, second, n, stride, offset, 0.5)
        assert cached is not None
        selected = _scaled_gather[(1,)](x, second, n, stride, offset, 0.5, BLOCK=32)
        assert cached is selected, (n, stride, offset, aligned)


def test_launcher_computes_what_the_kernel_does(dev):
    """On every backend (the interpreter on CPU), repeated calls give the kernel's results."""
    run = Launcher(_scaled_gather, BLOCK=32)
    x = torch.randn(64, device=dev)
    for n, stride in ((17, 2), (16, 1), (1, 3)):
        for _ in range(2):
            y = torch.full((32,), float("nan"), device=dev)
            run(1, x, y, n, stride, 7, 2.0)
            torch.testing.assert_close(y[:n], _expected(x, n, stride, 7, 2.0))


def test_constexprs_left_to_their_defaults_take_the_regular_launch(dev):
    """The direct path appends the constexprs from meta; one it does not hold disables it."""
    run = Launcher(_constexpr_default, BLOCK=8)
    y = torch.full((8,), float("nan"), device=dev)
    run(1, y, 5)
    run(1, y, 5)
    if CUDA:
        assert run.compiled_for(y, 5) is None
    torch.testing.assert_close(y[:5], 2 * torch.arange(5, dtype=torch.float32, device=dev))


@pytest.mark.skipif(CUDA, reason="checks the interpreter's fallback")
def test_interpreter_never_takes_the_direct_path():
    assert not launcher_mod._direct_launch_supported(_scaled_gather)


class _OnDevice1(torch.Tensor):
    """A CPU tensor claiming to live on device 1 (for the guard's logic on any machine)."""

    def get_device(self) -> int:
        return 1


def test_launches_switch_to_the_tensors_device(monkeypatch):
    entered = []
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "device_index", lambda i: entered.append(i) or contextlib.nullcontext())
    with launcher_mod.on_device_of(torch.empty(1).as_subclass(_OnDevice1)):
        pass
    assert entered == [1]
    with launcher_mod.on_device_of(torch.empty(1)):  # CPU: nothing to switch
        pass
    with launcher_mod.on_device_of(None):
        pass
    assert entered == [1]


TWO_GPUS = CUDA and torch.cuda.device_count() >= 2


@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA devices")
def test_ops_on_a_device_that_is_not_current():
    """device_map="auto" hands layers tensors on cuda:1 while cuda:0 is current:
    every op, forward and backward, must give there what it gives on cuda:0."""
    import registrations  # noqa: F401

    def run(dev: str) -> list[torch.Tensor]:
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(64, 256, generator=g).to(dev).requires_grad_()
        w, b = torch.randn(3, generator=g).to(dev), torch.randn(1, generator=g).to(dev)
        q = torch.randn(2, 4, 16, 32, generator=g).to(dev).requires_grad_()
        k = torch.randn(2, 2, 16, 32, generator=g).to(dev).requires_grad_()
        cos, sin = torch.randn(16, 32, generator=g).to(dev), torch.randn(16, 32, generator=g).to(dev)
        xg = torch.randn(4, 64, 512, generator=g).to(dev).requires_grad_()
        outs = [
            torch.ops.liger.poly_norm(x, w, b),
            *torch.ops.liger.rope(q, k, cos, sin),
            torch.ops.liger.group_norm(xg, 8),
        ]
        grads = torch.autograd.grad(outs, [x, q, k, xg], [torch.ones_like(o) for o in outs])
        return [t.cpu() for t in (*outs, *grads)]

    torch.cuda.set_device(0)
    on_current = run("cuda:0")
    on_other = run("cuda:1")
    assert torch.cuda.current_device() == 0
    for a, b in zip(on_current, on_other, strict=True):
        assert torch.equal(a, b)


def test_launch_with_cached_scalars_matches_the_plain_call(dev):
    """Launcher.launch (callers that keep the scalars' specialization) runs the
    same kernel as Launcher(...)(grid, *args)."""
    run = Launcher(_scaled_gather, BLOCK=32)
    x = torch.randn(64, device=dev)
    for n, stride in ((17, 2), (16, 1), (1, 3)):
        scalars = (n, stride, 7, 2.0)
        y = torch.full((32,), float("nan"), device=dev)
        for _ in range(2):
            run.launch(1, (x, y), scalars, launcher_mod.scalar_specialization(scalars))
        torch.testing.assert_close(y[:n], _expected(x, n, stride, 7, 2.0))
        assert torch.isnan(y[n:]).all()


def test_scalar_specializations_tell_equal_values_of_other_types_apart():
    spec = launcher_mod.scalar_specialization
    assert len({spec((1,)), spec((1.0,)), spec((True,))}) == 3
    assert spec((16, 1)) == spec((32, 1)) != spec((17, 1))
    assert spec((2**31,)) != spec((2**31 - 16,))
    with pytest.raises(TypeError, match="tensor arguments must all come before"):
        spec((torch.empty(1),))


def test_imports_and_reads_launch_hooks_on_a_triton_without_knobs(monkeypatch):
    """triton-ascend's Triton (3.2) has no triton.knobs: its launch hooks are CompiledKernel's class
    attributes.  The module must import there, and a hook installed there must be seen."""
    import importlib.util

    import triton.compiler

    monkeypatch.delattr(triton, "knobs")
    monkeypatch.setattr(triton.compiler.CompiledKernel, "launch_enter_hook", None, raising=False)
    spec = importlib.util.spec_from_file_location("launcher_without_knobs", launcher_mod.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)  # a second copy of the module, so the package's own is untouched
    assert not fresh._launch_hooks_installed()
    monkeypatch.setattr(triton.compiler.CompiledKernel, "launch_enter_hook", lambda *a: None)
    assert fresh._launch_hooks_installed()
