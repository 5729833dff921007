"""One-pass residency, and why its barrier cannot deadlock.  A team's
programs wait for each other, so every program of the grid must be
resident at once.  A one-pass plan's grid is an upper bound (one team per
row); before the first launch of each compiled one-pass kernel the launch
sequence caps it at whole teams of what that kernel keeps resident -- its
registers per thread, warps and shared memory against the SM's limits
(``resident_ctas``) times the SM count -- and runs ``Plan.fallback`` (a
two-walk plan) instead when not one team fits or the rows would take more
than ``Plan.max_rounds`` rounds.  Each team takes rows t, t + teams, ...
and its members wait only for each other, at the same row, so once all
are resident every barrier completes.  The launch is also a cooperative
one (``launch_cooperative_grid``): the driver refuses a grid that cannot be
co-resident rather than starting it, so a wrong count fails loudly instead
of hanging.  Barrier counters are one int32 per row, zeroed for every call
and reached only by that call's launch: repeated launches, CUDA-graph
replays (the zeroing is captured too) and launches on other streams (the
caching allocator does not hand one stream's live block to another) never
share one.  The Triton interpreter runs programs one after another, so a
team of more than one program would wait forever there:
``CudaDevice.cooperative`` is False off a real GPU, and the CPU tests run
one-program teams.  The planner picks tiles with ``estimated_registers``;
only the compiled kernel's count sizes the grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from csrc_free_ops.host_math import cdiv

if TYPE_CHECKING:
    from csrc_free_ops.group_norm.plan import Problem

# Registers per thread of a one-pass member, for planning only: a fit to
# sm_90 compiles of the kernels (cuobjdump -res-usage; 4 warps, tiles that
# stay in their group): about 64 plus 1 per fp32 value it holds forward, 3
# backward (x and dy), twice that with PREFETCH, more for masked tiles.
ONE_PASS_BASE_REGS = 64
ONE_PASS_MASKED_REGS = 64
# Shared memory of a one-pass kernel for planning (reduction scratch; sm_90
# compiles use 16-256 bytes); the launch uses the compiled kernel's figure.
ONE_PASS_SHARED_ESTIMATE = 1024
# Shared memory the driver reserves per CTA (sm_80 and later).
SHARED_RESERVED_PER_CTA = 1024


@dataclass(frozen=True)
class CudaDevice:
    """What CUDA planning needs of the GPU.  ``cooperative``: one-pass plans
    may run (a real GPU; False under the interpreter, which runs programs
    one at a time)."""

    sms: int
    cooperative: bool = False
    regs_per_sm: int = 65536
    shared_per_sm: int = 233472
    threads_per_sm: int = 2048
    ctas_per_sm: int = 32


def resident_ctas(dev: CudaDevice, warps: int, regs_per_thread: int, shared: int) -> int:
    """Programs an SM holds at once, from their registers per thread, warps
    and shared memory (the occupancy calculator's limits; registers are
    allocated per warp in units of 256)."""
    regs_per_warp = cdiv(regs_per_thread * 32, 256) * 256
    return min(
        dev.regs_per_sm // (regs_per_warp * warps),
        dev.threads_per_sm // (32 * warps),
        dev.ctas_per_sm,
        dev.shared_per_sm // (shared + SHARED_RESERVED_PER_CTA),
    )


def resident_teams(dev: CudaDevice, warps: int, regs_per_thread: int, shared: int, team: int, most: int) -> int:
    """Whole teams of ``team`` programs the device holds at once (at most ``most``)."""
    return min(most, resident_ctas(dev, warps, regs_per_thread, shared) * dev.sms // team)


def estimated_registers(pb: Problem, tile: int, warps: int, prefetch: bool, even: bool) -> int:
    values = tile // (32 * warps) * (3 if pb.backward else 1) * (2 if prefetch else 1)
    return min(255, ONE_PASS_BASE_REGS + values + (0 if even else ONE_PASS_MASKED_REGS))
