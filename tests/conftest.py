"""Test set-up: without a CUDA GPU the real Triton kernels run on CPU tensors
under the Triton interpreter, which must be switched on before any kernel
module is imported."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import registrations  # noqa: E402,F401  (defines torch.ops.liger.*)

# The interpreter is slow and its timing varies: bounded examples, no deadline.
settings.register_profile(
    "interpreter",
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)
settings.register_profile("gpu", max_examples=10, deadline=None)  # each new block size is a Triton compile
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gpu" if torch.cuda.is_available() else "interpreter"))


def pytest_configure(config: pytest.Config) -> None:
    # A rotary the patch cannot route warns (no quiet zero); a test that does not expect it fails.
    config.addinivalue_line("filterwarnings", "error::liger_nn.patching.LigerPatchWarning")


@pytest.fixture
def dev() -> str:
    """The device the kernels are tested on."""
    return "cuda" if torch.cuda.is_available() else "cpu"
