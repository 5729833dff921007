"""Host cost of one forward + backward on a tiny input.

    python -m bench.host_overhead [--iters 200] [--repeats 15] [--device cuda|cpu]

On tiny inputs the device work is negligible, so the time per iteration is
the Python + dispatcher + autograd + kernel-launch cost.  Paths compared:

    liger         torch.ops.liger.* (custom op, torch.library autograd)
    liger_kernel  upstream's autograd.Function.apply (when importable)
    torch         the eager reference (several ATen kernels per op)

One iteration is the harness's full mode: forward, then
torch.autograd.grad of the outputs against fixed output gradients with
respect to every input that takes one (no .grad accumulation).  A round
times ``iters`` of them back to back for each path in turn (the order
rotates from round to round), with one torch.cuda.synchronize() at the end
of each; the table shows each path's median over the rounds in
microseconds per iteration, and the median over rounds of the per-round
ratio liger / liger_kernel.  Interleaving matters: the device machine's
host speed drifts by tens of percent within a minute, so paths timed one
after the other compare different hosts.  On CPU the numbers include the
compute (under TRITON_INTERPRET=1 the interpreter dominates), so they only
mean something on a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

TINY = {
    "poly_norm": {"M": 4, "H": 64, "dtype": "float32"},
    "rope": {"B": 1, "T": 4, "n_q_heads": 2, "n_kv_heads": 1, "head_dim": 8, "dtype": "float32"},
    "group_norm": {"M": 2, "C": 8, "H": 4, "num_groups": 2, "dtype": "float32"},
}
PATHS = ("liger", "liger_kernel", "torch")


def time_us(step: Callable[[], object], device: str, iters: int) -> float:
    """Microseconds per call of ``iters`` calls back to back (synchronized)."""
    import torch

    cuda = device.startswith("cuda")
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def interleaved(
    steps: dict[str, Callable[[], object]], device: str, iters: int, repeats: int
) -> dict[str, list[float]]:
    """Per path, its time in each of ``repeats`` rounds; every round times
    every path, starting one path further along each time."""
    names = list(steps)
    for name in names:
        time_us(steps[name], device, max(3, iters // 10))  # warm-up
    rounds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            rounds[name].append(time_us(steps[name], device, iters))
    return rounds


Results = dict[tuple[str, str], "float | str"]


def measure(device: str, iters: int, repeats: int, ops: Sequence[str]) -> Results:
    """Each path's median, plus ("ratio") the median of per-round liger / liger_kernel."""
    from bench import providers

    results: Results = {}
    for op in ops:
        steps = {}
        for path in PATHS:
            try:
                built = providers.build(op, path, TINY[op], device)
                built.prepare()
                steps[path] = built.full
            except Exception as e:
                results[(op, path)] = f"skipped ({type(e).__name__})"
        rounds = interleaved(steps, device, iters, repeats)
        for path, times in rounds.items():
            results[(op, path)] = statistics.median(times)
        if "liger" in rounds and "liger_kernel" in rounds:
            ratios = [a / b for a, b in zip(rounds["liger"], rounds["liger_kernel"], strict=True)]
            results[(op, "ratio")] = statistics.median(ratios)
    return results


def table(results: Results, ops: Sequence[str]) -> str:
    head = ["op"] + [f"{p} us/iter" for p in PATHS] + ["liger / liger_kernel (median of rounds)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in ops:
        cells = []
        for p in PATHS:
            v = results.get((op, p))
            cells.append(f"{v:.1f}" if isinstance(v, float) else str(v))
        ratio = results.get((op, "ratio"))
        ratio = f"{ratio:.2f}" if isinstance(ratio, float) else "-"
        lines.append("| " + " | ".join([op, *cells, ratio]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.host_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=15, help="rounds")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--ops", default="poly_norm,rope,group_norm")
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    ops = [o for o in args.ops.split(",") if o]
    print(f"host overhead of one forward+backward on tiny inputs, device {device}, torch {torch.__version__}")
    print(f"{args.iters} iterations x {args.repeats} interleaved rounds, median; shapes: {TINY}")
    if device == "cpu":
        print("(CPU: includes the compute, and the Triton interpreter for liger; meaningful on CUDA only)")
    print(table(measure(device, args.iters, args.repeats, ops), ops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
