"""A PrivateUse1 test backend built only from PyTorch's Python APIs.

It stands in for torch_npu so tests can show that ``torch.ops.liger.*`` on
"npu" tensors dispatches to the NPU launchers.  An "npu" tensor here is a
tensor made by ``torch._C._acc.create_empty_tensor`` (it carries the
PrivateUse1 key directly, so autograd works) holding its data in a CPU tensor
``raw``.  A boxed fallback runs any aten op on the CPU data.

Installing renames the PrivateUse1 backend, which PyTorch allows once per
process, so use it in a subprocess: ``run_scenario("module", "function")``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

BACKEND = "npu"
_LIB: torch.library.Library | None = None


class NpuTensor(torch.Tensor):
    raw: torch.Tensor
    # Results of torch functions stay plain tensors (a .cpu() copy is a CPU tensor).
    __torch_function__ = torch._C._disabled_torch_function_impl


def to_npu(cpu: torch.Tensor) -> torch.Tensor:
    t = torch._C._acc.create_empty_tensor(cpu.shape, cpu.dtype)
    t.__class__ = NpuTensor
    t.raw = cpu
    return t


def to_cpu(t):
    """The CPU data of an "npu" tensor (anything else is returned as is)."""
    if isinstance(t, NpuTensor):
        return t.raw
    if isinstance(t, (list, tuple)):
        return type(t)(to_cpu(a) for a in t)
    return t


def _wrap(out):
    if isinstance(out, torch.Tensor) and out.device.type == "cpu":
        return to_npu(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap(o) for o in out)
    return out


def _fallback(op, *args, **kwargs):
    """Run any aten op on the CPU data; outputs become "npu" tensors unless
    the op was asked for a CPU result (``.cpu()``, ``.to("cpu")``)."""
    if op is torch.ops.aten._copy_from.default:
        src, dst = args[0], args[1]
        if isinstance(dst, NpuTensor):
            dst.raw = to_cpu(src).clone()
            return dst
        return dst.copy_(to_cpu(src))
    cpu_args = [to_cpu(a) for a in args]
    cpu_kwargs = {k: to_cpu(v) for k, v in kwargs.items()}
    target = cpu_kwargs.get("device")
    if target is not None:
        cpu_kwargs["device"] = "cpu"
    out = op(*cpu_args, **cpu_kwargs)
    if target is not None and torch.device(target).type == "cpu":
        return out
    return _wrap(out)


def install() -> None:
    """Register the backend under the name "npu" (once per process)."""
    global _LIB
    if _LIB is not None:
        return
    torch.utils.backend_registration._setup_privateuseone_for_python_backend(BACKEND)
    _LIB = torch.library.Library("_", "IMPL")
    _LIB.fallback(_fallback, "PrivateUse1")


def spy_on(module: ModuleType, name: str, calls: list[str], passthrough: bool = False) -> None:
    """Replace ``module.name`` by a wrapper that records the call and runs the
    real function on the CPU data (under the Triton interpreter), returning
    "npu" tensors (``passthrough``: arguments and result as they are, for a
    planning function).  The dispatcher reaching the wrapper is the evidence."""
    real: Callable = getattr(module, name)

    def launcher(*args, **kwargs):
        calls.append(f"{module.__name__}.{name}")
        if passthrough:
            return real(*args, **kwargs)
        out = real(*[to_cpu(a) for a in args], **{k: to_cpu(v) for k, v in kwargs.items()})
        return _wrap(out)

    setattr(module, name, launcher)


def run_scenario(module: str, function: str, env: dict[str, str] | None = None) -> str:
    """Run ``module.function()`` in a fresh interpreter; return its stdout."""
    root = Path(__file__).resolve().parent.parent
    full_env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root), **(env or {})}
    done = subprocess.run(
        [sys.executable, "-c", f"import {module} as m; m.{function}()"],
        cwd=root,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise AssertionError(f"scenario {module}.{function} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout
