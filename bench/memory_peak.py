"""What is alive at a step's memory peak (``python -m bench.steps --memory-peak``).

One step runs with the CUDA caching allocator's history recorded
(``torch.cuda.memory._record_memory_history``).  Its trace is then replayed
(``live_at_peak``): allocations are added, frees removed, and the set of
blocks alive when their total was highest is kept.  ``summary`` lists the
largest of them with the innermost frame of the model's or our code that
made each, so two providers' peaks can be compared block by block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

# Frames from these files say nothing about which layer allocated a block.
_PLUMBING = ("torch/", "/autograd/", "bench/steps.py", "bench/memory_peak.py", "<frozen", "threading.py")
MAX_ENTRIES = 200_000


def live_at_peak(events: Iterable[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """(peak bytes, the alloc events alive at the peak) of one device's
    allocator trace: ``alloc`` adds a block, ``free_completed`` removes it
    (a block freed while a stream still uses it stays counted until then)."""
    live: dict[int, dict[str, Any]] = {}
    total = peak = 0
    at_peak: list[dict[str, Any]] = []
    for e in events:
        action = e.get("action")
        if action == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > peak:
                peak, at_peak = total, list(live.values())
        elif action == "free_completed":
            gone = live.pop(e["addr"], None)
            if gone is not None:
                total -= gone["size"]
    return peak, at_peak


def origin(frames: list[dict[str, Any]]) -> str:
    """The innermost frame outside torch and the harness: file:line function."""
    for f in frames:
        name = f.get("filename", "")
        if not any(p in name for p in _PLUMBING):
            return f"{'/'.join(name.split('/')[-2:])}:{f.get('line')} {f.get('name')}"
    return "torch internals" if frames else "no stack recorded"


def summary(peak: int, blocks: list[dict[str, Any]], top: int = 15) -> dict[str, Any]:
    """The peak and its ``top`` largest blocks grouped by origin and size."""
    groups: dict[tuple[str, int], int] = {}
    for b in blocks:
        key = (origin(b.get("frames", [])), b["size"])
        groups[key] = groups.get(key, 0) + 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[0][1] * kv[1])[:top]
    return {
        "peak_mb": round(peak / 2**20, 1),
        "largest": [{"origin": o, "mb_each": round(size / 2**20, 2), "count": n} for (o, size), n in ranked],
    }


def record(step: Callable[[], Any], device: str) -> dict[str, Any] | None:
    """Run ``step`` once with the allocator's history on; the summary of its peak (None off CUDA).
    The peak counts the allocations made during the step only, not what was alive before it."""
    if not device.startswith("cuda"):
        return None
    import torch

    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    try:
        step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    index = torch.cuda.current_device()
    traces = snapshot.get("device_traces", [])
    events = traces[index] if index < len(traces) else []
    return summary(*live_at_peak(events))


def describe(got: dict[str, Any], top: int = 6) -> str:
    """One line: the step's peak and its largest blocks."""
    blocks = "; ".join(f"{b['count']} x {b['mb_each']} MB at {b['origin']}" for b in got["largest"][:top])
    return f"peak {got['peak_mb']} MB in the step; largest: {blocks}"
