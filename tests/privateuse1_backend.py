"""A PrivateUse1 test backend built only from PyTorch's Python APIs.

It stands in for torch_npu so tests can show that ``torch.ops.liger.*`` on
"npu" tensors dispatches to the NPU launchers.  An "npu" tensor here is a
tensor made by ``torch._C._acc.create_empty_tensor`` (it carries the
PrivateUse1 key directly, so autograd works) holding its data in a CPU tensor
``raw``.  A boxed fallback runs any aten op on the CPU data.

Installing renames the PrivateUse1 backend, which PyTorch allows once per
process, so use it in a subprocess: ``scenario_output("module")`` runs every
op test module's ``dispatch_scenario`` in one subprocess (once per test
process) and returns the named module's output.
"""

from __future__ import annotations

import functools
import json
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
        return _same_kind(t, [to_cpu(a) for a in t])
    return t


def _same_kind(seq, items: list):
    """items as a sequence of seq's type (a NamedTuple, such as rope's options, takes them as fields)."""
    return type(seq)(*items) if hasattr(seq, "_fields") else type(seq)(items)


def _wrap(out):
    if isinstance(out, torch.Tensor) and out.device.type == "cpu":
        return to_npu(out)
    if isinstance(out, (list, tuple)):
        return _same_kind(out, [_wrap(o) for o in out])
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


# The op test modules whose dispatch_scenario() runs on the backend.  They share one interpreter: a fresh
# one costs ~14 s of imports and interpreter warm-up on 2 cores, which three separate ones paid thrice.
SCENARIO_MODULES = (
    "tests.test_poly_norm_npu",
    "tests.test_rope_npu",
    "tests.test_group_norm_npu",
    "tests.test_glu_npu",
)

_RUN_ALL = """
import contextlib, importlib, io, json, traceback
results = {}
for name in %r:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            importlib.import_module(name).dispatch_scenario()
        results[name] = [True, out.getvalue()]
    except Exception:
        results[name] = [False, out.getvalue() + traceback.format_exc()]
print(json.dumps(results), flush=True)
# Skip the interpreter's finalization: autograd's thread for the "npu" device can still be dropping a graph
# task's tensors when it starts, and taking the GIL then ends that thread inside a C++ destructor, which
# aborts the process ("terminate called without an active exception") after every scenario has passed.
import os
os._exit(0)
"""


@functools.cache
def _all_scenarios() -> dict[str, list]:
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    code = _RUN_ALL % (SCENARIO_MODULES,)
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"the PrivateUse1 scenarios failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def scenario_output(module: str) -> str:
    """The stdout of ``module.dispatch_scenario()`` run in a fresh interpreter beside the other
    SCENARIO_MODULES' (each scenario spies on its own op's modules only); AssertionError with its
    traceback if it raised."""
    ok, out = _all_scenarios()[module]
    if not ok:
        raise AssertionError(f"scenario {module}.dispatch_scenario failed:\n{out}")
    return out
