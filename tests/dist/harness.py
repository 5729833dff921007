"""Running named cases in every rank of a process group and collecting what
each rank saw.

A case is a function ``case(ctx)`` that raises AssertionError (or anything
else) when it fails.  Every rank runs the cases in the same order (the cases
hold collectives); a rank records each case's traceback or None, and stops
at its first failure: a case that raised may have left collectives that its
peers are still in, and gloo matches a rank's next collective to whatever
its peers issue at that point, so a rank that went on would feed another
case's data into them (gloo then aborts the process on the size mismatch,
SIGABRT, and every rank's results are lost).  Its peers instead fail that
case themselves (a collective timeout, or the connection closing) and stop
too.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# A failing rank leaves the others waiting in a collective: fail after this
# instead of the default 30 minutes.
TIMEOUT = timedelta(seconds=120)


@dataclass(frozen=True)
class Context:
    rank: int
    world_size: int
    device: torch.device

    def mesh(self, shape: tuple[int, ...] | None = None, names: tuple[str, ...] | None = None):
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, shape or (self.world_size,), mesh_dim_names=names)


Case = Callable[[Context], None]


def init(rank: int, world_size: int, init_method: str | None = None) -> Context:
    """Join the process group: NCCL on CUDA devices, else gloo on CPU."""
    cuda = torch.cuda.is_available() and os.environ.get("LIGER_DIST_CPU") != "1"
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=TIMEOUT,
        **({"device_id": device} if cuda else {}),
    )
    return Context(rank, world_size, device)


def run_cases(ctx: Context, cases: Iterable[tuple[str, Case]]) -> dict[str, str | None]:
    """Each case in order; its traceback, or None when it passed.  After
    this rank's first failure the remaining cases are not run (the module
    docstring says why) and say so."""
    results: dict[str, str | None] = {}
    failed = None
    for name, case in cases:
        if failed is not None:
            results[name] = f"not run: case {failed} failed on rank {ctx.rank} before it"
            continue
        start, cpu = time.perf_counter(), time.process_time()
        try:
            case(ctx)
            results[name] = None
        except Exception:
            results[name] = traceback.format_exc()
            failed = name
        if os.environ.get("LIGER_DIST_TIMES"):
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            print(f"rank {ctx.rank} {name}: {wall:.2f} s wall, {cpu:.2f} s cpu", flush=True)
    return results


def spawn_worker(rank: int, world_size: int, store: str, out_dir: str, names: list[str], interpret: bool) -> None:
    """torch.multiprocessing.spawn entry: one rank of a gloo group on CPU
    running the named cases of tests/dist/suites.py, with the CPU ops on
    the Triton interpreter (interpret) or on the pure-PyTorch reference;
    writes {"interpreter": ..., "results": ...} to out_dir/rank<r>.json."""
    # Before the kernels are imported (tests.dist.suites imports registrations).
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    os.environ["LIGER_DIST_CPU"] = "1"
    torch.set_num_threads(1)  # world_size processes share the cores

    from registrations import _library
    from tests.dist import suites

    ctx = init(rank, world_size, f"file://{store}")
    try:
        by_name = dict(suites.all_cases(world_size))
        results = run_cases(ctx, [(name, by_name[name]) for name in names])
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"interpreter": _library.INTERPRETER, "results": results}, f)
    end_without_finalizing()


def gloo_threads() -> list[str]:
    """The names of this process's gloo threads (Linux; [] elsewhere)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    names = []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(n for n in names if "gloo" in n)


def end_without_finalizing() -> None:
    """End a spawned rank once its results are written, without finalizing
    the interpreter.  destroy_process_group leaves the gloo group alive when
    anything still references it, and DTensor's sharding and redistribution
    caches keep the DeviceMesh and its group: its worker and I/O threads run
    on (``gloo_threads``) until the process ends.  A worker thread drops its
    last collective's work, tensors included, after completing it, so under
    load it can still hold them when the main thread is done; released while
    the interpreter finalizes, they need a GIL that is being torn down and the
    process aborts (SIGABRT).  Ending with os._exit, the threads end with the
    process and nothing of Python is torn down under them."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
