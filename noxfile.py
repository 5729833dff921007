"""Sessions (`python3 -m nox -s NAME`; `-R` reuses an environment made before).

In a virtual environment of their own, which they install into:
    tests         the CPU suite, the real Triton kernels under TRITON_INTERPRET=1
    demo          the main job: every op on the best device present
    transformers  the transformers-touching tests at the oldest release of the supported range, the CI pin
                  and the newest release
    newest        op, compile, opcheck, patcher and fuzz tests with the newest torch and Triton these
                  machines install (torch 2.14.1 + triton 3.8.0), and with triton 3.9.0 put beside it
    diffusers     the diffusers-touching tests at the oldest and newest release of the `diffusion` extra
    lint          ruff
    npu_compile   every NPU launch plan's kernels through the Ascend compiler, on the CPU (plus a
                  triton-ascend venv beside its own; not run by CI)
In the active environment (venv_backend="none": nothing installed, its torch and triton used):
    gpu           the suite on a CUDA machine, with a junit XML report into the results
    multigpu      the distributed checks under torchrun, 2 ranks (2 GPUs with NCCL; on CPU with gloo)
    bench         the benchmark (bench/README.md)
    steps         whole training steps of real models, `python -m bench.steps` (bench/README.md)
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

# The torch and triton the CPU suite and the CPU demo are known to pass with,
# installed on every machine by the sessions that use them.  Which torch build
# pip picks is up to its indexes: plain PyPI serves the CUDA build on Linux
# x86_64 (several GB, runs on the CPU too); with
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu it takes the
# 2.13.0+cpu wheel.  Triton 3.7.1's interpreter runs the kernels on CPU tensors.
CPU_PINS = ["torch==2.13.0", "triton==3.7.1"]
RUFF = "ruff==0.17.6"
# The transformers release of the CPU suite (the CUDA machine has the same);
# the supported range is the `hf` extra in pyproject.toml.
TRANSFORMERS = "transformers==5.17.0"
HF_RANGE = next(
    r for r in nox.project.load_toml("pyproject.toml")["project"]["optional-dependencies"]["hf"] if "transformers" in r
)
# The diffusers range (the `diffusion` extra) and the tests that import diffusers.
DIFFUSERS_RANGE = next(
    r
    for r in nox.project.load_toml("pyproject.toml")["project"]["optional-dependencies"]["diffusion"]
    if "diffusers" in r
)
DIFFUSERS_TESTS = ["tests/test_patching_diffusers.py"]
# The newest release of the range (5.25 brings the `kernels` package, whose hub decorators wrap the
# rotary functions): the `newest` end of `nox -s transformers`.
TRANSFORMERS_NEWEST = "transformers==5.25.0"
# The tests that import transformers (the patcher, the end-to-end training, the kernels hub layers).
HF_TESTS = [
    "tests/test_patching.py",
    "tests/test_patching_glu.py",
    "tests/test_patching_norms.py",
    "tests/test_patching_causal_lm_loss.py",
    "tests/test_e2e_training.py",
    "tests/test_hub.py",
]
# The newest torch and Triton these machines install: torch 2.14.1 (pip here is constrained to it;
# 2.15 is not run) requires triton~=3.8.0.  Triton 3.9.0 goes with torch 2.15; `newest(triton="3.9")`
# puts it beside torch 2.14.1 (pip install --target, first on PYTHONPATH), as a user upgrading Triton
# alone gets it.  CI keeps CPU_PINS.
NEWEST_PINS = ["torch==2.14.1", "triton==3.8.0"]
NEWEST_TRITON_BESIDE = "triton==3.9.0"
# The Ascend compiler without CANN: triton-ascend installs as the `triton`
# package and needs pybind11 undeclared; ascendnpu-ir ships bishengir-compile.
# torch (the CPU wheel) is there because some kernel modules import it for their
# launchers; a torch build that pulls in standard triton would shadow triton-ascend
# (tests/npu_compile_check.py then stops, saying so).
ASCEND_PINS = ["triton-ascend==3.2.0", "pybind11", "ascendnpu-ir==1.2.0", "torch==2.13.0", "numpy"]


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None


def _install(session: nox.Session, what: str, *args: str) -> None:
    """pip install, saying first what and why: pip prints nothing while it works.
    --no-compile: byte-compiling every module of torch and triton made their
    install 116 s instead of 40 s on a 2-core machine; Python compiles what is
    imported instead."""
    if _installs_skipped(session):
        session.log(f"reusing the environment: {what} installed before")
        return
    session.log(f"installing {what} ...")
    session.install("--no-compile", *args)


def _installs_skipped(session: nox.Session) -> bool:
    """True under -R (a reused environment and --no-install), where nox skips session.install silently."""
    config = getattr(getattr(session, "_runner", None), "global_config", None)
    return bool(getattr(config, "no_install", False) and getattr(session.virtualenv, "_reused", False))


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU suite: the real Triton kernels under TRITON_INTERPRET=1 (on any machine).
    Paths after -- run only those; without, pytest takes testpaths (tests/)."""
    _install(session, "the CPU suite's pins: " + ", ".join([*CPU_PINS, TRANSFORMERS]), *CPU_PINS, TRANSFORMERS)
    _install(session, "this project (editable) with its test extra", "-e", ".[test]")
    session.run("python", "-m", "pytest", "-q", *_workers(), *session.posargs, env={"TRITON_INTERPRET": "1"})


def _workers() -> list[str]:
    """pytest-xdist over this machine's cores, at most 4 (each worker holds torch and the interpreter's
    kernels); a test file stays on one worker, which spawns a DTensor group once."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return ["-n", str(min(cores, 4)), "--dist", "loadfile"] if cores > 1 else []


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: every op on the best device present, checked against the reference and timed."""
    if _has_cuda():
        _install(session, "torch and triton for CUDA (nvidia-smi found)", "torch>=2.11", "triton>=3.6")
        _install(session, "this project with upstream Liger-Kernel to compare with", "-e", ".[compare]")
    else:
        _install(session, "the CPU pins " + ", ".join(CPU_PINS) + " (no nvidia-smi: Triton interpreter)", *CPU_PINS)
        _install(session, "this project (editable)", "-e", ".")
    session.run("python", "-m", "bench.demo", *session.posargs)


@nox.session
@nox.parametrize("end", ["oldest", "pin", "newest"], ids=["oldest", "pin", "newest"])
def transformers(session: nox.Session, end: str) -> None:
    """The transformers-touching tests with the oldest release of the supported range, CI's pin
    or the newest release (CPU, interpreter)."""
    spec = {
        "oldest": "transformers==" + re.search(r">=\s*([\w.]+)", HF_RANGE).group(1),
        "pin": TRANSFORMERS,
        "newest": TRANSFORMERS_NEWEST,
    }[end]
    _install(session, f"the CPU pins and {spec} ({end}; range {HF_RANGE})", *CPU_PINS, spec, "-e", ".[test]")
    session.run("python", "-c", "import importlib.metadata as m; print('transformers', m.version('transformers'))")
    session.run("python", "-m", "pytest", *HF_TESTS, "-q", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session
@nox.parametrize("end", ["oldest", "newest"], ids=["oldest", "newest"])
def diffusers(session: nox.Session, end: str) -> None:
    """The diffusers-touching tests at one end of the supported range (CPU, interpreter)."""
    oldest = "diffusers==" + re.search(r">=\s*([\w.]+)", DIFFUSERS_RANGE).group(1)
    spec = oldest if end == "oldest" else DIFFUSERS_RANGE
    _install(session, f"the CPU pins and {spec} (the {end} of {DIFFUSERS_RANGE})", *CPU_PINS, spec, "-e", ".[test]")
    session.run("python", "-c", "import importlib.metadata as m; print('diffusers', m.version('diffusers'))")
    session.run("python", "-m", "pytest", *DIFFUSERS_TESTS, "-q", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session
@nox.parametrize("triton", ["3.8", "3.9"], ids=["triton38", "triton39"])
def newest(session: nox.Session, triton: str) -> None:
    """The whole CPU suite (or the paths after --) with torch 2.14.1 and Triton 3.8.0, or Triton
    3.9.0 beside them, on the CPU under the interpreter (the sm_90 compile check included)."""
    _install(session, "the newest torch and Triton: " + ", ".join([*NEWEST_PINS, TRANSFORMERS]),
             *NEWEST_PINS, TRANSFORMERS)  # fmt: skip
    _install(session, "this project (editable) with its test extra", "-e", ".[test]")
    env = {"TRITON_INTERPRET": "1"}
    if triton == "3.9":
        beside = Path(session.virtualenv.location) / "triton-beside"
        if not _installs_skipped(session):
            session.log(f"installing {NEWEST_TRITON_BESIDE} beside torch, into {beside} ...")
            session.install("--no-compile", "--no-deps", "--upgrade", "--target", str(beside), NEWEST_TRITON_BESIDE)
        env["PYTHONPATH"] = str(beside)
    session.run("python", "-c", "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)",
                env=env)  # fmt: skip
    session.run("python", "-m", "pytest", "-q", *session.posargs, env=env)


# Where `nox -s gpu` writes its junit XML report unless GPU_JUNIT_XML or a --junitxml argument says otherwise:
# beside the current results, so the report of which tests ran (and passed) on the GPU goes with them.
GPU_JUNIT_XML = "bench/results/current/gpu_tests.xml"


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """The suite on a CUDA machine, with the active environment's torch and triton.  pytest writes a
    junit XML report (every test with its outcome and time) to $GPU_JUNIT_XML, by default
    bench/results/current/gpu_tests.xml; a --junitxml=PATH among the arguments replaces it."""
    args = list(session.posargs)
    if not any(a.startswith("--junitxml") or a.startswith("--junit-xml") for a in args):
        report = Path(os.environ.get("GPU_JUNIT_XML", GPU_JUNIT_XML))
        report.parent.mkdir(parents=True, exist_ok=True)
        session.log(f"junit XML report: {report}")
        args = [f"--junitxml={report}", *args]
    session.run("python", "-m", "pytest", "-q", *args)


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
    """The benchmark (CUDA machine, the active environment; see bench/README.md)."""
    session.run("python", "-m", "bench.run", *session.posargs)


@nox.session(venv_backend="none")
def steps(session: nox.Session) -> None:
    """Whole training steps (UNet, VAE, ResNet stack, Llama, Qwen2) per provider and
    mode, `python -m bench.steps` (CUDA machine, the active environment with the
    `diffusion` extra; see bench/README.md)."""
    session.run("python", "-m", "bench.steps", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    _install(session, RUFF, RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def npu_compile(session: nox.Session) -> None:
    """Every NPU launch plan's kernels compiled by triton-ascend and bishengir
    to HIVM, UB allocation included (docs/npu.md).  Recording the launches
    needs this project's torch and Triton, compiling them triton-ascend, which
    installs as `triton`: so a second venv beside this nox session's venv."""
    _install(session, "the CPU pins and numpy, to record the launches", *CPU_PINS, "numpy")
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
