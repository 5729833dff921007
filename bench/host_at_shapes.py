"""Host cost of one call at a model's own shapes, native against ours.

    python -m bench.host_at_shapes [--model unet] [--iters 40] [--repeats 7] [--dtype bfloat16]

bench.host_overhead times tiny inputs, where the device work is nothing.  A
model's step calls the same ops at its own shapes and layouts, where a plan
may take more launches, workspaces or another kernel path (channels-last
group_norm's nhwc plan, a looped group), and the eager step is host-bound
when the sum of those calls' host time passes its kernel time.  This times,
per call at each shape of the model, two things side by side:

* ``host``: the time for the call to return, started on an idle GPU (one
  synchronize before each call, outside the timing), so a full launch queue
  never blocks it: what the call costs the host;
* ``wall``: the time per call of calls back to back with one synchronize at
  the end: the larger of host and GPU time.

Paths, each forward only ("fwd", inputs requiring grad so autograd records)
and forward + backward ("fwd+bwd", torch.autograd.grad against a fixed
output gradient):

    native  torch's layer as the model runs it (F.group_norm, F.group_norm
            then F.silu for the fused pair, F.layer_norm, diffusers' GEGLU
            after its projection: up * F.gelu(gate) of the projection's halves)
    fast    the entry liger_nn calls (registrations.eager.eager_call)
    liger   torch.ops.liger.* through the dispatcher

Rounds interleave every (shape, path, kind), starting one step further along
each round; the table gives medians over rounds and the median per-round
ratio of fast to native.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any, NamedTuple

from bench import host_overhead, host_profile

KINDS = ("fwd", "fwd+bwd")
PATHS = ("native", "fast", "liger")


class Shape(NamedTuple):
    """One op call of a model: op ("group_norm", "group_norm_silu", "layer_norm", "geglu_exact"), x's
    size (geglu_exact: the projection's, both halves), groups (group_norm) and whether x is
    channels-last."""

    op: str
    size: tuple[int, ...]
    groups: int = 0
    channels_last: bool = False

    def label(self) -> str:
        layout = ", channels_last" if self.channels_last else ""
        groups = f", {self.groups} groups" if self.groups else ""
        return f"{self.op} {self.size}{groups}{layout}"


def _unet_shapes(tiny: bool) -> list[Shape]:
    """SD 1.5's UNet at batch 4, 64x64 latents: its ResnetBlock2D norms (norm1's -> SiLU pair fused in
    ours), its transformer blocks' LayerNorms over (B, HW, C) and GEGLU projections (B, HW, 8C), in both
    layouts for the convolutional ones."""
    if tiny:
        sizes, rows, projections = [(2, 8, 4, 4)], [(2, 16, 8)], [(2, 16, 16)]
    else:
        sizes = [(4, 320, 64, 64), (4, 640, 32, 32), (4, 1280, 16, 16), (4, 2560, 8, 8), (4, 960, 64, 64)]
        rows = [(4, 4096, 320), (4, 1024, 640), (4, 256, 1280)]
        projections = [(4, 4096, 2560), (4, 1024, 5120), (4, 256, 10240)]
    groups = 4 if tiny else 32
    shapes = [
        Shape(op, size, groups, cl)
        for cl in (False, True)
        for size in sizes
        for op in ("group_norm", "group_norm_silu")
    ]
    return shapes + [Shape("layer_norm", size) for size in rows] + [Shape("geglu_exact", s) for s in projections]


MODELS: dict[str, Callable[[bool], list[Shape]]] = {"unet": _unet_shapes}


def _inputs(shape: Shape, device: str, dtype: Any) -> tuple:
    import torch

    x = torch.randn(shape.size, device=device, dtype=dtype)
    if shape.op == "geglu_exact":
        return (x.requires_grad_(),)
    if shape.channels_last:
        x = x.to(memory_format=torch.channels_last)
    channels = shape.size[1] if shape.op != "layer_norm" else shape.size[-1]
    w = torch.randn(channels, device=device, dtype=dtype)
    b = torch.randn(channels, device=device, dtype=dtype)
    return tuple(t.requires_grad_() for t in (x, w, b))


def _call(shape: Shape, path: str) -> Callable:
    """The forward of ``path`` at ``shape``: (x, w, b) -> y, or (projection,) -> y for geglu_exact."""
    import torch
    import torch.nn.functional as F

    from registrations.eager import eager_call

    eps = 1e-5
    if shape.op == "geglu_exact":
        if path == "native":
            return lambda h: (lambda up, gate: up * F.gelu(gate))(*h.chunk(2, -1))
        op = torch.ops.liger.geglu_exact
        call = eager_call(op) if path == "fast" else op
        return lambda h: (lambda up, gate: call(gate, up))(*h.chunk(2, -1))
    if shape.op == "layer_norm":
        if path == "native":
            return lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps)
        op = torch.ops.liger.layer_norm
        call = eager_call(op) if path == "fast" else op
        return lambda x, w, b: call(x, w, b, eps)
    g = shape.groups
    silu = shape.op == "group_norm_silu"
    if path == "native":
        if silu:
            return lambda x, w, b: F.silu(F.group_norm(x, g, w, b, eps))
        return lambda x, w, b: F.group_norm(x, g, w, b, eps)
    op = torch.ops.liger.group_norm
    call = eager_call(op) if path == "fast" else op
    if silu:
        return lambda x, w, b: call(x, g, w, b, eps, activation="silu")
    return lambda x, w, b: call(x, g, w, b, eps)


def _step(shape: Shape, path: str, kind: str, device: str, dtype: Any) -> Callable[[], object]:
    import torch

    args = _inputs(shape, device, dtype)
    fn = _call(shape, path)
    if kind == "fwd":
        return lambda: fn(*args)
    dy = torch.randn_like(fn(*args))
    return lambda: torch.autograd.grad(fn(*args), args, dy)


def host_us(step: Callable[[], object], device: str, iters: int) -> float:
    """Median microseconds for one call to return, each started on an idle device."""
    return statistics.median(host_profile.host_ms(step, device, iters)) * 1e3


# Microseconds per call of calls back to back, synchronized at the end (host_us leaves the device idle).
wall_us = host_overhead.time_us


def measure(shapes: list[Shape], device: str, dtype: Any, iters: int, repeats: int) -> dict[tuple, list[float]]:
    """(shape, path, kind, "host" | "wall") -> the per-round times, rounds interleaved."""
    steps = {
        (shape, path, kind): _step(shape, path, kind, device, dtype)
        for shape in shapes
        for path in PATHS
        for kind in KINDS
    }
    names = list(steps)
    for name in names:  # warm-up: compiles, plans, prepared runs
        for _ in range(3):
            steps[name]()
    rounds: dict[tuple, list[float]] = {}
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            rounds.setdefault((*name, "host"), []).append(host_us(steps[name], device, iters))
            rounds.setdefault((*name, "wall"), []).append(wall_us(steps[name], device, iters))
    return rounds


def _ratio(rounds: dict[tuple, list[float]], num: tuple, den: tuple) -> str:
    value = statistics.median(a / b for a, b in zip(rounds[num], rounds[den], strict=True))
    return f"{value:.2f}x"


def table(rounds: dict[tuple, list[float]], shapes: list[Shape]) -> str:
    head = ["call", "kind"]
    head += [f"{p} {t} us" for t in ("host", "wall") for p in PATHS]
    head += ["fast / native host", "fast / native wall"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes:
        for kind in KINDS:
            cells = [shape.label(), kind]
            cells += [f"{statistics.median(rounds[(shape, p, kind, t)]):.1f}" for t in ("host", "wall") for p in PATHS]
            cells += [_ratio(rounds, (shape, "fast", kind, t), (shape, "native", kind, t)) for t in ("host", "wall")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="unet", choices=sorted(MODELS))
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--tiny", action="store_true", help="one tiny shape per op (a smoke run on the CPU)")
    args = p.parse_args(argv)

    import torch

    import csrc_free_ops  # noqa: F401  (registers the ops)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    shapes = MODELS[args.model](args.tiny)
    rounds = measure(shapes, device, getattr(torch, args.dtype), args.iters, args.repeats)
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "none"
    text = (
        f"# Host cost per call at {args.model}'s shapes\n\n"
        f"torch {torch.__version__}, device {device} ({gpu}), dtype {args.dtype}, "
        f"{args.iters} calls x {args.repeats} rounds\n\n"
        + table(rounds, shapes)
        + "\n\nhost: median time for a call to return, started on an idle device; wall: per call, back to back; "
        "ratios: median of per-round ratios.\n"
    )
    print(text)
    return text


if __name__ == "__main__":
    main()
