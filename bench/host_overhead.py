"""Host cost of one forward + backward on a tiny input.

    python -m bench.host_overhead [--iters 200] [--repeats 7] [--device cuda|cpu]

On tiny inputs the device work is negligible, so the time per iteration is
the Python + dispatcher + autograd + kernel-launch cost.  Paths compared:

    liger         torch.ops.liger.* (custom op, torch.library autograd)
    liger_kernel  upstream's autograd.Function.apply (when importable)
    torch         the eager reference (several ATen kernels per op)

One iteration is the harness's full mode: forward, then
torch.autograd.grad of the outputs against fixed output gradients with
respect to every input that takes one (no .grad accumulation).  Each
repeat runs ``iters`` of them back to back with
one torch.cuda.synchronize() at the end; the table shows the median over
repeats in microseconds per iteration.  On CPU the numbers include the
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


def time_us(step: Callable[[], object], device: str, iters: int, repeats: int) -> float:
    import torch

    cuda = device.startswith("cuda")
    for _ in range(max(3, iters // 10)):
        step()
    if cuda:
        torch.cuda.synchronize()
    per_iter = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        if cuda:
            torch.cuda.synchronize()
        per_iter.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(per_iter)


def measure(device: str, iters: int, repeats: int, ops: Sequence[str]) -> dict[tuple[str, str], float | str]:
    from bench import providers

    results: dict[tuple[str, str], float | str] = {}
    for op in ops:
        for path in PATHS:
            try:
                built = providers.build(op, path, TINY[op], device)
                built.prepare()
                results[(op, path)] = time_us(built.full, device, iters, repeats)
            except Exception as e:
                results[(op, path)] = f"skipped ({type(e).__name__})"
    return results


def table(results: dict[tuple[str, str], float | str], ops: Sequence[str]) -> str:
    head = ["op"] + [f"{p} us/iter" for p in PATHS] + ["liger / liger_kernel"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in ops:
        cells = []
        for p in PATHS:
            v = results.get((op, p))
            cells.append(f"{v:.1f}" if isinstance(v, float) else str(v))
        a, b = results.get((op, "liger")), results.get((op, "liger_kernel"))
        ratio = f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) and b > 0 else "-"
        lines.append("| " + " | ".join([op, *cells, ratio]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.host_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--ops", default="poly_norm,rope,group_norm")
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    ops = [o for o in args.ops.split(",") if o]
    print(f"host overhead of one forward+backward on tiny inputs, device {device}, torch {torch.__version__}")
    print(f"{args.iters} iterations x {args.repeats} repeats, median; shapes: {TINY}")
    if device == "cpu":
        print("(CPU: includes the compute, and the Triton interpreter for liger; meaningful on CUDA only)")
    print(table(measure(device, args.iters, args.repeats, ops), ops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
