"""The torch.library handle of the ``liger`` namespace and the routing from
a backend's dispatch key to the launcher module that serves it."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

import torch

from csrc_free_ops import device

LIB = torch.library.Library("liger", "DEF")

# Each op's kernel is registered under these keys; PrivateUse1 is where
# torch_npu puts Ascend NPU tensors.
BACKEND_KEYS = ("CUDA", "PrivateUse1", "CPU")


class Launchers(NamedTuple):
    """The per-backend launcher modules of one op."""

    cuda: ModuleType
    npu: ModuleType
    reference: ModuleType


def triton_interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def pick(t: torch.Tensor, launchers: Launchers) -> ModuleType:
    """The module serving t's backend.  CPU tensors run the CUDA Triton
    launchers under the Triton interpreter, else the pure-PyTorch reference."""
    backend = device.backend_of(t)
    if backend == "cuda":
        return launchers.cuda
    if backend == "npu":
        return launchers.npu
    return launchers.cuda if triton_interpreter_on() else launchers.reference


def define(schema: str, kernel: Callable) -> str:
    """Define ``liger::<name>`` from its schema, register ``kernel`` for every
    backend key, and return the qualified name."""
    LIB.define(schema)
    name = schema.split("(", 1)[0]
    for key in BACKEND_KEYS:
        LIB.impl(name, kernel, key)
    return "liger::" + name
