"""Every kernel the launchers use compiles for a real GPU target, checked
without a GPU (see tests/cuda_compile_check.py): the interpreter that runs
the rest of the CPU suite accepts code the compiler rejects."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


NO_CUDA_BACKEND = importlib.util.find_spec("triton.backends.nvidia") is None


def _check(*options: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run(
        [sys.executable, "-m", "tests.cuda_compile_check", *options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the suite compiles every kernel it runs")
@pytest.mark.skipif(NO_CUDA_BACKEND, reason="Triton has no CUDA backend")
def test_every_launched_kernel_compiles_for_sm90():
    done = _check()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "compiled" in done.stdout and " of 0 " not in done.stdout, done.stdout


@pytest.mark.skipif(NO_CUDA_BACKEND, reason="Triton has no CUDA backend")
def test_float64_launches_take_float_scalars_as_float64():
    """Triton's JIT types a Python float argument fp32 unless the kernel's
    parameter is annotated: a float64 kernel would add eps rounded to
    float32.  Every float64 launch of every op, typed by Triton's own binder."""
    done = _check("--scalars")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "float64 launches: " in done.stdout and " of 0 " not in done.stdout, done.stdout
