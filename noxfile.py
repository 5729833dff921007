"""Sessions: tests (CPU, Triton interpreter), demo (the main job), gpu,
multigpu and bench (on a CUDA machine, in its existing environment;
multigpu also on CPU with gloo), lint, npu_compile (every NPU launch through
the Ascend compiler, on CPU; not run by CI)."""

from __future__ import annotations

import shutil
from pathlib import Path

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
# The Ascend compiler without CANN: triton-ascend installs as the `triton`
# package and needs pybind11 undeclared; ascendnpu-ir ships bishengir-compile.
# torch (the CPU wheel) is there because some kernel modules import it for their
# launchers; a torch build that pulls in standard triton would shadow triton-ascend
# (tests/npu_compile_check.py then stops, saying so).
ASCEND_PINS = ["triton-ascend==3.2.0", "pybind11", "ascendnpu-ir==1.2.0", "torch==2.13.0", "numpy"]


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
def multigpu(session: nox.Session) -> None:
    """The distributed checks under torchrun, 2 ranks, with this machine's torch:
    on 2 GPUs with NCCL (DTensor ops and backward ops against the single-GPU
    result, tensor-parallel tiny Llama eager and reduce-overhead compiled,
    FSDP2), then the test of tensors on a GPU that is not the current one.
    `nox -s multigpu -- --cpu` runs the same checks with gloo on CPU (also
    the default where no GPU is present); `-- --cpu --interpret` on the Triton
    interpreter; `-- -k NAME` selects cases."""
    args = list(session.posargs)
    if not _has_cuda() and "--cpu" not in args:
        args.append("--cpu")
    # NVLink SHARP / multicast off: not every lent multi-GPU machine allows it.
    env = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    torchrun = ("python", "-m", "torch.distributed.run", "--nproc-per-node", "2")
    session.run(*torchrun, "-m", "tests.dist.run", *args, env=env)
    if "--cpu" not in args:
        session.run("python", "-m", "pytest", "tests/test_cross_device.py", "tests/test_launcher.py", "-q", "-rs",
                    "-k", "device", env=env)  # fmt: skip


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """The benchmark (CUDA machine, its own torch/triton; see bench/README.md)."""
    session.run("python", "-m", "bench.run", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def npu_compile(session: nox.Session) -> None:
    """Every NPU launch plan's kernels compiled by triton-ascend and bishengir
    to HIVM, UB allocation included (docs/npu.md).  Recording the launches
    needs this project's torch and Triton, compiling them triton-ascend, which
    installs as `triton`: so a second venv beside this session's."""
    session.install(*CPU_PINS)
    out = Path(session.create_tmp())
    specs, report = out / "npu_specs.json", out / "npu_compile_report.json"
    session.run("python", "-m", "tests.npu_launch_specs", str(specs), env={"TRITON_INTERPRET": "0"})
    ascend = Path(f"{session.virtualenv.location}-ascend")
    python = str(ascend / "bin" / "python")
    if not (ascend / "bin" / "python").exists():
        session.run("python", "-m", "venv", str(ascend))
    session.run(python, "-m", "pip", "install", "-q", *ASCEND_PINS, external=True)
    session.run(python, "-m", "tests.npu_compile_check", str(specs), "--report", str(report), *session.posargs,
                external=True)  # fmt: skip
