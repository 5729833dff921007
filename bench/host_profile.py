"""What the host does during one training step (``python -m bench.steps --host-profile``).

A step whose wall time is well above its GPU kernel time is held up on the
host: either the Python step takes longer to enqueue than the GPU takes to
run it, or something in it waits for the GPU (a synchronize, a device-to-host
copy such as ``.item()``).  ``profile(step, device, steps)`` tells the two
apart:

* ``host_ms``: median time for ``step()`` to return, without synchronizing
  after it (each step starts on an idle GPU, so a full launch queue never
  blocks it); close to the wall time per step means the host is the limit,
  unless the step itself waits for the GPU (next two);
* ``sync_calls_per_step``: CUDA runtime/driver calls that block the host
  (``*Synchronize``, the synchronous ``cudaMemcpy``) and ``cudaMemcpyAsync``
  calls (synchronous for pageable memory), per step, from one torch.profiler
  run with CPU and CUDA activities; only calls inside a step are counted;
* ``dtoh_copies_per_step``: device-side ``Memcpy DtoH`` events per step;
* ``launches_per_step``: kernel launches (runtime and driver API) per step;
* ``top_self_cpu``: the 15 ops with the most self CPU time, per step.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

HOST_STEPS = 5
TOP = 15
STEP_LABEL = "bench.steps:step"
SYNC_NAMES = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpyAsync",
    "cudaMemcpy2D",
    "cudaMemcpy2DAsync",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuMemcpyDtoH",
    "cuMemcpyDtoHAsync",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoHAsync_v2",
)
LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def host_ms(step: Callable[[], Any], device: str, steps: int = HOST_STEPS) -> list[float]:
    """Time for ``step()`` to return, per step, each started on an idle device."""
    samples = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        step()
        samples.append((time.perf_counter() - t0) * 1e3)
    _sync(device)
    return samples


def profile(step: Callable[[], Any], device: str, steps: int) -> dict[str, Any]:
    """``host_ms`` samples, then one torch.profiler run over ``steps`` steps; see the module docstring."""
    samples = host_ms(step, device)
    result: dict[str, Any] = {"host_ms": statistics.median(samples), "host_ms_samples": samples}
    try:
        result.update(_profiled(step, device, steps))
    except Exception as e:  # noqa: BLE001 - a profiler failure must not cost the host timing
        result["profiler_error"] = f"{type(e).__name__}: {e}"
    return result


def _profiled(step: Callable[[], Any], device: str, steps: int) -> dict[str, Any]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    _sync(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            with record_function(STEP_LABEL):
                step()
        _sync(device)
    events = list(prof.events())
    ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == STEP_LABEL]

    def in_step(e) -> bool:
        return any(a <= e.time_range.start and e.time_range.end <= b for a, b in ranges)

    host_side = [e for e in events if e.device_type != DeviceType.CUDA and in_step(e)]
    syncs = Counter(e.name for e in host_side if e.name in SYNC_NAMES)
    launches = sum(1 for e in host_side if e.name in LAUNCH_NAMES)
    dtoh = sum(1 for e in events if e.device_type == DeviceType.CUDA and e.name.startswith("Memcpy DtoH"))
    top = sorted(
        (a for a in prof.key_averages() if a.key != STEP_LABEL), key=lambda a: a.self_cpu_time_total, reverse=True
    )[:TOP]
    return {
        "host_ms_profiled": statistics.mean((b - a) / 1e3 for a, b in ranges) if ranges else None,
        "sync_calls_per_step": {name: n / steps for name, n in sorted(syncs.items())},
        "dtoh_copies_per_step": dtoh / steps,
        "launches_per_step": launches / steps,
        "top_self_cpu": [
            {
                "name": a.key,
                "self_cpu_ms_per_step": a.self_cpu_time_total / 1e3 / steps,
                "calls_per_step": a.count / steps,
            }
            for a in top
        ],
    }


def summary(label: str, host: dict[str, Any]) -> str:
    """A few lines for the log: the host numbers, then the top ops by self CPU time."""
    syncs = host.get("sync_calls_per_step") or {}
    sync_text = ", ".join(f"{name} {n:g}" for name, n in syncs.items()) or "none"
    lines = [
        f"  host {label} {host['host_ms']:.2f} ms/step to enqueue"
        + (f" ({host['host_ms_profiled']:.2f} profiled)" if host.get("host_ms_profiled") else "")
        + f"; per step: sync-like calls {sync_text}; DtoH copies {host.get('dtoh_copies_per_step', '–')}; "
        f"launches {host.get('launches_per_step', '–')}"
    ]
    if "profiler_error" in host:
        lines.append(f"    torch.profiler failed: {host['profiler_error']}")
    for a in host.get("top_self_cpu", []):
        lines.append(f"    {a['self_cpu_ms_per_step']:8.3f} ms  {a['calls_per_step']:7g}x  {a['name']}")
    return "\n".join(lines)
