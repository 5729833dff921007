"""How the harness times one call and measures its memory.

Timers (``--timer``):

* ``graph`` (default on CUDA): the call is captured once into a CUDA graph
  and ``triton.testing.do_bench`` times replays of that graph.  The number
  is the GPU time of the call's kernels and the gaps between them; the
  host's cost of issuing the call is left out (``bench.host_overhead``
  measures that).  The call runs on the capture stream from its first
  warm-up on, so a backward-only timing, whose forward ran before capture,
  records its autograd graph on that stream too: the autograd engine runs a
  node's backward on the stream of its forward.
* ``eager``: do_bench around the plain eager call, as a user makes it: the
  wall-clock time of the call in a steady loop.  Whenever the host takes
  longer to issue the call than the GPU takes to run it (small shapes, and
  any backward through the autograd engine), this is host time.
  ``events``, the name this timer had before, is accepted for it.

Both go through ``triton.testing.do_bench``, which zeroes a 256 MB buffer
(``driver.clear_cache``) before every timed call, so no call finds its
inputs in L2; ``check_l2_flush`` proves that of the triton in use.
On CPU (Triton interpreter) both are perf_counter medians of the eager call.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from typing import Any

TIMERS = ("graph", "eager")
# Earlier name of the eager timer (records with it, or with no timer, are eager).
ALIASES = {"events": "eager"}
# Eager calls on the capture stream before capture: compiles, autotuning,
# lazy allocations and the autograd engine's device threads happen here.
CAPTURE_WARMUP_CALLS = 2


class CaptureFailed(RuntimeError):
    """The call could not be captured into a CUDA graph."""


def quantile(sorted_vals: list[float], q: float) -> float:
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def _cpu_ms(fn: Callable[[], Any], rep_ms: float) -> tuple[float, float, float]:
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 1000):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return quantile(times, 0.5), quantile(times, 0.2), quantile(times, 0.8)


def canonical_timer(name: str) -> str:
    """The timer's current name ("events" -> "eager"); ValueError for an unknown one."""
    name = ALIASES.get(name, name)
    if name not in TIMERS:
        raise ValueError(f"unknown timer {name!r}; choose from {', '.join(TIMERS)}")
    return name


def _do_bench(fn: Callable[[], Any], warmup_ms: float, rep_ms: float) -> tuple[float, float, float]:
    from triton.testing import do_bench

    q50, q20, q80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    return float(q50), float(q20), float(q80)


class _FlushSpy:
    """The active Triton driver, with clear_cache (the L2 flush) logged."""

    def __init__(self, driver: Any, log: list[str]) -> None:
        self._driver, self._log = driver, log

    def clear_cache(self, cache: Any) -> None:
        self._log.append("flush")
        self._driver.clear_cache(cache)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._driver, name)


def check_l2_flush(fn: Callable[[], Any] | None = None) -> int:
    """Run do_bench once on a trivial call with the driver's L2 flush logged
    and check that a flush precedes every timed call: do_bench's timed loop
    is the run of flush-call pairs after its last warm-up call (two calls in
    a row).  Returns the number of timed calls; RuntimeError if any went
    unflushed (a triton whose do_bench does not flush L2)."""
    from triton.runtime import driver

    log: list[str] = []

    def call() -> Any:
        log.append("call")
        return fn() if fn is not None else None

    active = driver.active
    driver.set_active(_FlushSpy(active, log))
    try:
        _do_bench(call, 0.1, 0.5)
    finally:
        driver.set_active(active)
    last_pair = max((i for i in range(1, len(log)) if log[i - 1] == log[i] == "call"), default=0)
    timed = log[last_pair + 1 :]
    paired = timed == ["flush", "call"] * (len(timed) // 2)
    if not timed or not paired or log.count("flush") < 6:
        raise RuntimeError(
            "triton.testing.do_bench does not flush L2 before every timed call on this triton; "
            f"sequence tail: {' '.join(log[-8:])}"
        )
    return len(timed) // 2


# device index -> the memory pool every capture on that device shares.  With a
# private pool per capture, the full run on the H200 ended with ~129 GB
# reserved but unallocated (pools never handed back) and every later shape out
# of memory; in one shared pool a capture reuses the blocks the previous ones freed.
_POOLS: dict[int, tuple[int, int]] = {}


def _graph_pool(device_index: int) -> tuple[int, int]:
    import torch

    pool = _POOLS.get(device_index)
    if pool is None:
        pool = _POOLS[device_index] = torch.cuda.graph_pool_handle()
    return pool


def _abandon_pool(device_index: int) -> None:
    """Stop using the shared pool after a failed capture.  torch ends a
    capture's allocation to its pool only once cudaStreamEndCapture succeeds,
    so after a failure the pool stays "recording" and every later capture into
    it fails with "beginAllocateToPool: already recording" (the H200 run of
    2026-12-03 at bd54704 lost every rope row after one failure that way).  End the recording where
    this torch exposes it and let the next capture start a new pool.  The pool
    itself is left to the failed graph, whose reset releases it: releasing it
    here as well drove its use count below zero, an assert in a graph's
    destructor that ended the process (the H100 run of 2026-12-07 at 821e485,
    after upstream's cross_entropy failed to capture)."""
    import torch

    pool = _POOLS.pop(device_index, None)
    if pool is None:
        return
    # The end call's name differs across torch releases.
    end = getattr(torch._C, "_cuda_endAllocateToPool", None) or getattr(
        torch._C, "_cuda_endAllocateCurrentStreamToPool", None
    )
    if end is not None:
        try:
            end(device_index, pool)
        except RuntimeError:
            pass  # best effort: the pool is dropped either way


def _graph_ms(make: Callable[[], Callable[[], Any]], warmup_ms: float, rep_ms: float) -> tuple[float, float, float]:
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    out = None
    try:
        with torch.cuda.stream(stream):
            fn = make()
            for _ in range(CAPTURE_WARMUP_CALLS):
                fn()
        stream.synchronize()
        dev = torch.cuda.current_device()
        try:
            with torch.cuda.graph(graph, pool=_graph_pool(dev), stream=stream):
                out = fn()
        except Exception as e:
            _abandon_pool(dev)
            raise CaptureFailed(f"CUDA graph capture failed ({type(e).__name__}: {e}); try --timer eager") from e
        torch.cuda.current_stream().wait_stream(stream)
        return _do_bench(graph.replay, warmup_ms, rep_ms)
    finally:
        del out
        graph.reset()
        free("cuda")


def time_ms(
    make: Callable[[], Callable[[], Any]], device: str, timer: str, warmup_ms: float, rep_ms: float
) -> tuple[float, float, float]:
    """(median, 20th, 80th percentile) milliseconds of one call of ``make()``.

    ``make`` is called once, on the stream the timing uses, and returns the
    callable to time (a backward-only timer runs its forward there)."""
    timer = canonical_timer(timer)
    if not device.startswith("cuda"):
        return _cpu_ms(make(), rep_ms)
    if timer == "graph":
        return _graph_ms(make, warmup_ms, rep_ms)
    return _do_bench(make(), warmup_ms, rep_ms)


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def peak_mb(fn: Callable[[], Any], device: str) -> float | None:
    """Peak CUDA memory of one eager fn() call above what was allocated before it, in MB."""
    if not device.startswith("cuda"):
        return None
    import torch

    free(device)
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20
