"""Sessions: tests (CPU, Triton interpreter), demo (the main job), gpu and
bench (on a CUDA machine, in its existing environment), lint."""

from __future__ import annotations

import shutil

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

# On a machine without a GPU a bare `torch` requirement pulls a multi-GB CUDA
# build; these pins take the CPU wheel and a Triton whose interpreter runs the
# kernels on CPU tensors.
CPU_PINS = ["torch==2.13.0", "triton==3.7.1", "numpy"]
RUFF = "ruff==0.17.6"
# The transformers version liger_nn.apply_liger_ops is tested with (the CUDA machine has the same).
TRANSFORMERS = "transformers==5.17.0"


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU suite: the real Triton kernels under TRITON_INTERPRET=1."""
    session.install(*CPU_PINS, TRANSFORMERS)
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "tests", "-q", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session
def demo(session: nox.Session) -> None:
    """Every op forward and backward on the best device present, checked
    against the reference and timed."""
    if _has_cuda():
        session.install("torch>=2.11", "triton>=3.6", "numpy")
    else:
        session.install(*CPU_PINS)
    session.install("-e", ".")
    session.run("python", "-m", "bench.demo", *session.posargs)


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """The suite on a CUDA machine, with that machine's torch and triton."""
    session.run("python", "-m", "pytest", "tests", "-q", *session.posargs)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """The benchmark (CUDA machine, its own torch/triton; see bench/README.md)."""
    session.run("python", "-m", "bench.run", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
