"""What the kernels need to know about the device they run on.

Every query has an environment override so tests can simulate an Ascend
profile on a machine without one:

* ``CSRC_FREE_OPS_NPU_PROFILE``: a name from ``ASCEND_PROFILES`` (e.g.
  ``Ascend910B4``); sets both the UB size and the vector-core count.
* ``CSRC_FREE_OPS_NPU_UB_BYTES``: unified-buffer bytes per vector core.
* ``CSRC_FREE_OPS_NPU_VECTOR_CORES``: number of vector cores.
* ``CSRC_FREE_OPS_NUM_SMS``: number of CUDA streaming multiprocessors.

The specific variables win over the profile.  The NPU variables are read on
every call so a test can change them between launches; the SM count the
launch entries use (``sms_of``) is read once per device.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

KIB = 1024


@dataclass(frozen=True)
class AscendProfile:
    ub_bytes: int
    vector_cores: int


# UB per vector core and vector cores per chip (2 vector cores per AI core).
# bishengir-compile allows 192 KiB of UB on every 910B target (tests/npu_compile_check.py).
ASCEND_PROFILES: dict[str, AscendProfile] = {
    "Ascend910B1": AscendProfile(ub_bytes=192 * KIB, vector_cores=48),
    "Ascend910B2": AscendProfile(ub_bytes=192 * KIB, vector_cores=48),
    "Ascend910B3": AscendProfile(ub_bytes=192 * KIB, vector_cores=40),
    "Ascend910B4": AscendProfile(ub_bytes=192 * KIB, vector_cores=40),
}
# Used when torch_npu reports a chip this table does not know.
DEFAULT_ASCEND_PROFILE = ASCEND_PROFILES["Ascend910B4"]

# Interpreter runs (CPU tensors) still need a program count for launchers
# that size persistent grids; a small one keeps the interpreter fast.
CPU_PROGRAMS = 4


def backend_of(t: torch.Tensor) -> str:
    """'cuda', 'npu' (any PrivateUse1 backend) or 'cpu'."""
    kind = t.device.type
    if kind == "cuda":
        return "cuda"
    if kind == torch._C._get_privateuse1_backend_name() or kind == "privateuseone":
        return "npu"
    return "cpu"


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return value


def _profile_from_env() -> AscendProfile | None:
    name = os.environ.get("CSRC_FREE_OPS_NPU_PROFILE")
    if not name:
        return None
    try:
        return ASCEND_PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(ASCEND_PROFILES))
        raise ValueError(f"CSRC_FREE_OPS_NPU_PROFILE={name!r} is not a known Ascend profile ({known})") from None


@functools.cache
def _detected_ascend_profile() -> AscendProfile:
    """The profile of the real NPU (needs torch_npu), else the default."""
    try:
        import torch_npu  # noqa: F401

        name = torch.npu.get_device_name()
    except Exception:
        return DEFAULT_ASCEND_PROFILE
    for key, profile in ASCEND_PROFILES.items():
        if name.startswith(key):
            return profile
    return DEFAULT_ASCEND_PROFILE


@functools.cache
def _detected_vector_cores() -> int:
    try:
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties("npu")
        return int(props["num_vectorcore"])
    except Exception:
        return _detected_ascend_profile().vector_cores


def npu_ub_bytes() -> int:
    """Unified-buffer bytes available to one NPU vector core."""
    value = _env_int("CSRC_FREE_OPS_NPU_UB_BYTES")
    if value is not None:
        return value
    profile = _profile_from_env()
    return (profile or _detected_ascend_profile()).ub_bytes


def npu_vector_cores() -> int:
    """Number of NPU vector cores (the upper bound of a 1-D Ascend grid)."""
    value = _env_int("CSRC_FREE_OPS_NPU_VECTOR_CORES")
    if value is not None:
        return value
    profile = _profile_from_env()
    return profile.vector_cores if profile is not None else _detected_vector_cores()


@functools.cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_SMS_OF_INDEX: dict[int, int] = {}


def sms_of(t: torch.Tensor) -> int:
    """``num_sms`` of t's device, kept per device index after the first call
    (so CSRC_FREE_OPS_NUM_SMS is read once per device): launch entries call
    this on every call, and an environment read costs microseconds."""
    index = t.get_device()
    sms = _SMS_OF_INDEX.get(index)
    if sms is None:
        sms = _SMS_OF_INDEX[index] = num_sms(t.device)
    return sms


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (CPU_PROGRAMS off-GPU)."""
    value = _env_int("CSRC_FREE_OPS_NUM_SMS")
    if value is not None:
        return value
    if device.type != "cuda":
        return CPU_PROGRAMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_sms(index)


def free_bytes(t: torch.Tensor) -> int | None:
    """Memory a new allocation on t's device can take: the driver's free
    bytes plus what the caching allocator holds unused; None off CUDA and
    the NPU (no limit the planning should heed).  CSRC_FREE_OPS_FREE_BYTES
    overrides it (tests)."""
    value = _env_int("CSRC_FREE_OPS_FREE_BYTES")
    if value is not None:
        return value
    kind = backend_of(t)
    if kind == "cpu":
        return None
    module = torch.cuda if kind == "cuda" else getattr(torch, t.device.type, None)
    if module is None or not hasattr(module, "mem_get_info"):
        return None
    free, _ = module.mem_get_info(t.device)
    return free + module.memory_reserved(t.device) - module.memory_allocated(t.device)


# Ascend limit on the number of programs in one launch.
NPU_MAX_GRID = 65535
