"""Every distributed case, by name."""

from __future__ import annotations

from tests.dist import model_cases, op_cases
from tests.dist.harness import Case


def all_cases(world_size: int) -> list[tuple[str, Case]]:
    """What the CPU suite runs (tests/test_dtensor.py)."""
    return op_cases.cases(world_size) + model_cases.cases(world_size)


def multigpu_cases(world_size: int) -> list[tuple[str, Case]]:
    """What nox -s multigpu runs under torchrun: everything, and the compiled TP model."""
    return all_cases(world_size) + model_cases.compiled_cases(world_size)
