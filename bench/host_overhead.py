"""Host cost of one call on a tiny input, every path side by side.

    python -m bench.host_overhead [--iters 300] [--repeats 15] [--ops ...] [--paths ...] [--steps on|off]
    python -m bench.host_overhead --profile group_norm [--profile-mode backward] [--profile-iters 500]

On tiny inputs the device work is negligible, so the time per iteration is
the Python + dispatcher + autograd + allocation + kernel-launch cost.  For
each op, every path below is timed forward-only ("fwd": the forward on
inputs that require grad, so autograd records its graph, as in training)
and forward+backward ("fwd+bwd": the forward, then torch.autograd.grad of
the outputs against fixed output gradients with respect to every input that
takes one; no .grad accumulation):

    liger         torch.ops.liger.* (custom op, torch.library autograd)
    fast          the entry liger_nn calls (registrations.eager.eager_call):
                  the op's autograd formula without the dispatcher's crossing
    liger_kernel  upstream Liger-Kernel's autograd.Function.apply (when importable)
    compile       torch.compile of the eager reference
    torch         the eager reference (several ATen kernels for poly_norm and rope)
    native        torch's native F.group_norm on group_norm's tiny input, whatever
                  the op: the cost of one native op through autograd, the
                  yardstick of the torch.ops.liger target
    floor         a torch.autograd.Function whose forward and backward each
                  allocate their output and launch one empty Triton kernel: the
                  least a Python autograd formula costs on this host
    floor_pair    the same with two inputs and two outputs (two allocations
                  and one launch each way): the least a formula shaped like
                  rope's (q, k in; q_out, k_out out) costs, for context

A round times ``iters`` calls of each (path, fwd | fwd+bwd) back to back,
with one synchronize at the end, in an order that starts one step further
along every round; the device machine's host speed drifts by tens of
percent within a minute, so only steps timed in the same round compare.
The table shows each step's median over the rounds (us per call) and, as
ratios, the median over rounds of the per-round ratio: fwd against native
fwd and against floor fwd, fwd+bwd against native fwd+bwd and against
floor fwd+bwd.  Below it, the targets: the fast path (what liger_nn and
apply_liger_ops call) within FAST_FLOOR_FACTOR of the floor in both
kinds, and torch.ops.liger's fwd+bwd within LIGER_NATIVE_FACTOR of
native's.  On CPU the numbers include the compute (the
Triton interpreter dominates), so they mean something on a GPU only.

Then, with ``--steps on`` (the default on CUDA), small compiled training
steps (bench/compiled_steps.py: 8 GroupNorm -> SiLU layers, and an attention
block with rope), each with torch's layers (native), liger ops kept opaque
in the graph, and liger ops decomposed into their kernels, compiled in
default and reduce-overhead mode; timed in interleaved rounds of their own
(``--step-iters`` steps each), printed as the last table, with each
provider's median per-round ratio to native.

``--profile OP`` instead runs one path of one op (``--profile-path``,
default liger; ``--profile-mode`` forward, backward (the backward alone,
on a retained graph; default) or full) ``--profile-iters`` times under
cProfile and torch.profiler and prints the top entries of each: where the
host time goes.  On CUDA the autograd engine runs the backward on its
device thread; cProfile sees that thread from Python 3.12 on (it is built
on sys.monitoring there), torch.profiler always does.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

# Each op's tiny input (dtype from --dtype): a few rows, so the device work is negligible.
TINY = {
    "poly_norm": {"M": 4, "H": 64},
    "rope": {"B": 1, "T": 16, "n_q_heads": 4, "n_kv_heads": 2, "head_dim": 64},
    "group_norm": {"M": 2, "C": 8, "H": 16, "num_groups": 4},
    "rms_norm": {"M": 4, "H": 64},
    "layer_norm": {"M": 4, "H": 64},
    "swiglu": {"T": 4, "F": 64},
    "geglu": {"T": 4, "F": 64},
    "geglu_exact": {"T": 4, "F": 64},
}
PROVIDER_PATHS = ("liger", "fast", "liger_kernel", "compile", "torch")
YARDSTICKS = ("native", "floor", "floor_pair")
PATHS = PROVIDER_PATHS + YARDSTICKS
KINDS = ("fwd", "fwd+bwd")
# The targets: the fast path's fwd and fwd+bwd within this factor of the floor's ...
FAST_FLOOR_FACTOR = 1.25
# ... and torch.ops.liger's fwd+bwd within this factor of native's (one dispatcher crossing more).
LIGER_NATIVE_FACTOR = 1.2


def tiny_shape(op: str, dtype: str) -> dict[str, Any]:
    return {**TINY[op], "dtype": dtype}


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
    """Per step, its time in each of ``repeats`` rounds; every round times
    every step, starting one step further along each time."""
    names = list(steps)
    for name in names:
        time_us(steps[name], device, max(3, iters // 10))  # warm-up
    rounds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            rounds[name].append(time_us(steps[name], device, iters))
    return rounds


# --------------------------------------------------------------------------
# The yardsticks


@functools.cache
def floor_function(n: int = 1) -> type:
    """An autograd.Function that costs what any Python autograd formula of n
    inputs and n outputs costs: forward and backward each allocate their n
    outputs and launch one empty Triton kernel.  Built on first use, after
    TRITON_INTERPRET is settled."""
    import torch
    import triton

    @triton.jit
    def empty_kernel(out_ptr):
        pass

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *xs):
            ys = tuple(torch.empty_like(x) for x in xs)
            empty_kernel[(1,)](ys[0])
            return ys if n > 1 else ys[0]

        @staticmethod
        def backward(ctx, *dys):
            dxs = tuple(torch.empty_like(dy) for dy in dys)
            empty_kernel[(1,)](dxs[0])
            return dxs if n > 1 else dxs[0]

    return Floor


def build_path(op: str, path: str, device: str, dtype: str) -> Any:
    """A prepared providers.Built for one path at op's tiny shape (native and
    floor at group_norm's tiny shape, whatever op)."""
    import torch.nn.functional as F

    from bench import providers

    if path == "fast":
        built = _fast(op, providers.build(op, "liger", tiny_shape(op, dtype), device))
    elif path in PROVIDER_PATHS:
        built = providers.build(op, path, tiny_shape(op, dtype), device)
    elif path == "native":
        shape = tiny_shape("group_norm", dtype)
        x, w, b = providers.group_norm_inputs(shape, device)
        groups, eps = shape["num_groups"], providers.GROUP_NORM_EPS
        built = providers.Built(lambda x, w, b: F.group_norm(x, groups, w, b, eps), (x, w, b), (x, w, b))
    elif path == "floor":
        x, _, _ = providers.group_norm_inputs(tiny_shape("group_norm", dtype), device)
        built = providers.Built(floor_function().apply, (x,), (x,))
    elif path == "floor_pair":
        x, _, _ = providers.group_norm_inputs(tiny_shape("group_norm", dtype), device)
        y = x.detach().clone().requires_grad_()
        built = providers.Built(floor_function(2).apply, (x, y), (x, y))
    else:
        raise ValueError(f"unknown path {path!r}; choose from {', '.join(PATHS)}")
    built.prepare()
    return built


def _fast(op: str, liger: Any) -> Any:
    """The liger provider's call, made through eager_call (what liger_nn calls)."""
    import torch

    from bench import providers
    from registrations.eager import eager_call

    call = eager_call(getattr(torch.ops.liger, op))
    if op == "poly_norm":
        fn = lambda x, w, b: call(x, w, b, providers.POLY_NORM_EPS)  # noqa: E731
    elif op == "group_norm":
        groups = TINY["group_norm"]["num_groups"]
        fn = lambda x, w, b: call(x, groups, w, b, providers.GROUP_NORM_EPS)  # noqa: E731
    elif op == "rms_norm":
        fn = lambda x, w: call(x, w, providers.ROW_NORM_EPS)  # noqa: E731
    elif op == "layer_norm":
        fn = lambda x, w, b: call(x, w, b, providers.ROW_NORM_EPS)  # noqa: E731
    else:
        fn = call
    return providers.Built(fn, liger.args, liger.grad_inputs)


# --------------------------------------------------------------------------
# Measurement and table

Results = dict[tuple[str, str], Any]


def _median_ratio(rounds: dict[str, list[float]], num: str, den: str) -> float | None:
    if num not in rounds or den not in rounds:
        return None
    return statistics.median(a / b for a, b in zip(rounds[num], rounds[den], strict=True))


def measure(
    device: str, iters: int, repeats: int, ops: Sequence[str], paths: Sequence[str] = PATHS, dtype: str = "float32"
) -> Results:
    """Per op: (op, "path kind") -> median us, or "skipped (...)" for a path that could not be
    built; (op, "ratios") -> {(num_step, den_step): median of per-round num / den}."""
    results: Results = {}
    for op in ops:
        steps: dict[str, Callable[[], object]] = {}
        for path in paths:
            try:
                built = build_path(op, path, device, dtype)
            except Exception as e:
                results[(op, path)] = f"skipped ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
                continue
            steps[f"{path} fwd"] = built.forward
            steps[f"{path} fwd+bwd"] = built.full
        rounds = interleaved(steps, device, iters, repeats)
        for name, times in rounds.items():
            results[(op, name)] = statistics.median(times)
        ratios = {}
        for path in paths:
            for num, den in (("fwd", "native fwd"), ("fwd+bwd", "native fwd+bwd"), ("fwd", "floor fwd"),
                             ("fwd+bwd", "floor fwd+bwd"), ("fwd", "floor_pair fwd"),
                             ("fwd+bwd", "floor_pair fwd+bwd")):  # fmt: skip
                ratios[(f"{path} {num}", den)] = _median_ratio(rounds, f"{path} {num}", den)
            for rival in ("liger_kernel", "compile"):
                for kind in KINDS:
                    ratios[(f"{path} {kind}", f"{rival} {kind}")] = _median_ratio(
                        rounds, f"{path} {kind}", f"{rival} {kind}"
                    )
        results[(op, "ratios")] = ratios
    return results


def _us(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, float) else "-"


def _x(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def table(results: Results, ops: Sequence[str], paths: Sequence[str] = PATHS) -> str:
    head = ["op", "path", "fwd us", "fwd+bwd us", "fwd / native fwd", "fwd+bwd / native fwd+bwd"]
    head += ["fwd / floor fwd", "fwd+bwd / floor fwd+bwd", "fwd / floor_pair fwd", "fwd+bwd / floor_pair fwd+bwd"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in ops:
        ratios = results.get((op, "ratios"), {})
        for path in paths:
            skipped = results.get((op, path))
            if isinstance(skipped, str):
                lines.append("| " + " | ".join([op, path, skipped, *("-",) * (len(head) - 3)]) + " |")
                continue
            cells = [op, path, _us(results.get((op, f"{path} fwd"))), _us(results.get((op, f"{path} fwd+bwd")))]
            cells += [
                _x(ratios.get((f"{path} fwd", "native fwd"))),
                _x(ratios.get((f"{path} fwd+bwd", "native fwd+bwd"))),
                _x(ratios.get((f"{path} fwd", "floor fwd"))),
                _x(ratios.get((f"{path} fwd+bwd", "floor fwd+bwd"))),
                _x(ratios.get((f"{path} fwd", "floor_pair fwd"))),
                _x(ratios.get((f"{path} fwd+bwd", "floor_pair fwd+bwd"))),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _verdict(value: float | None, limit: float, strict: bool = False) -> str:
    if value is None:
        return "not measured"
    ok = value < limit if strict else value <= limit
    return f"{value:.2f}x {'ok' if ok else 'MISSED'}"


def targets(results: Results, ops: Sequence[str]) -> str:
    """The host-path targets per op, from the per-round ratios."""
    lines = []
    for op in ops:
        r = results.get((op, "ratios"), {})
        parts = [
            f"fast {kind} / floor {_verdict(r.get((f'fast {kind}', f'floor {kind}')), FAST_FLOOR_FACTOR)}"
            f" (<= {FAST_FLOOR_FACTOR})"
            for kind in KINDS
        ]
        parts.append(
            f"liger fwd+bwd / native {_verdict(r.get(('liger fwd+bwd', 'native fwd+bwd')), LIGER_NATIVE_FACTOR)}"
            f" (<= {LIGER_NATIVE_FACTOR})"
        )
        for rival in ("liger_kernel", "compile"):
            for kind in KINDS:
                parts.append(f"fast {kind} / {rival} {_verdict(r.get((f'fast {kind}', f'{rival} {kind}')), 1.0, True)}")
        lines.append(f"- {op}: " + "; ".join(parts))
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Compiled steps


def measure_steps(device: str, iters: int, repeats: int) -> dict[str, Any]:
    """ "model provider mode" -> median us per step; ("ratios", name) -> median per-round ratio to native."""
    from bench import compiled_steps

    built = compiled_steps.steps(device)
    rounds = interleaved({name: s.run for name, s in built.items()}, device, iters, repeats)
    results: dict[str, Any] = {name: statistics.median(times) for name, times in rounds.items()}
    for name in rounds:
        model, provider, mode = name.split(" ")
        results[("ratios", name)] = _median_ratio(rounds, name, f"{model} native {mode}")
    return results


def steps_table(results: dict[str, Any]) -> str:
    from bench import compiled_steps

    head = ["model", "mode", *(f"{p} us" for p in compiled_steps.PROVIDERS)]
    head += [f"{p} / native" for p in compiled_steps.PROVIDERS if p != "native"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in compiled_steps.MODELS:
        for mode in compiled_steps.MODES:
            names = [f"{model} {p} {mode}" for p in compiled_steps.PROVIDERS]
            cells = [model, mode, *(_us(results.get(n)) for n in names)]
            cells += [_x(results.get(("ratios", n))) for n in names[1:]]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Profile


def profile(
    op: str, path: str, mode: str, iters: int, tools: Sequence[str], device: str, dtype: str, top: int = 30
) -> str:
    """Top entries of cProfile (by own time and by cumulative time) and of
    torch.profiler (by self CPU time) over ``iters`` calls of one step."""
    import torch

    built = build_path(op, path, device, dtype)
    step = {"forward": built.forward, "full": built.full, "backward": built.backward_timer()}[mode]
    per_call = time_us(step, device, max(20, iters // 10))  # also the warm-up
    per_call = time_us(step, device, iters)
    out = [f"{op} {path} {mode}: {per_call:.1f} us per call unprofiled ({iters} calls)"]
    if device.startswith("cuda"):
        # The autograd engine runs a CUDA backward on its device thread, not the caller's.
        seen = "every thread" if sys.version_info >= (3, 12) else "the calling thread only"
        out.append(
            f"(the backward runs on the autograd engine's device thread; cProfile on Python "
            f"{sys.version_info.major}.{sys.version_info.minor} sees {seen}; torch.profiler sees every thread)"
        )
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if "cprofile" in tools:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(iters):
            step()
        sync()
        prof.disable()
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
            out.append(f"\n== cProfile, sorted by {key} (seconds over {iters} calls)\n" + buf.getvalue())
    if "torch" in tools:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.startswith("cuda"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as tprof:
            for _ in range(iters):
                step()
            sync()
        table_text = tprof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
        out.append(f"\n== torch.profiler, sorted by self CPU time ({iters} calls)\n" + table_text)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.host_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=300, help="calls per step per round")
    p.add_argument("--repeats", type=int, default=15, help="rounds")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--dtype", default=None, help="input dtype (default bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--ops", default="poly_norm,rope,group_norm,rms_norm,layer_norm,swiglu,geglu")
    p.add_argument("--paths", default=",".join(PATHS), help="comma list of " + ", ".join(PATHS))
    p.add_argument("--steps", default=None, choices=("on", "off"), help="compiled steps (default: on with CUDA)")
    p.add_argument("--step-iters", type=int, default=50, help="compiled steps per step kind per round")
    p.add_argument("--profile", default=None, metavar="OP", help="profile one op instead of the table")
    p.add_argument("--profile-path", default="liger", choices=PATHS)
    p.add_argument("--profile-mode", default="backward", choices=("forward", "backward", "full"))
    p.add_argument("--profile-iters", type=int, default=500)
    p.add_argument("--profiler", default="cprofile,torch", help="comma list of cprofile, torch")
    p.add_argument("--top", type=int, default=30, help="entries per profile listing")
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    ops = [o for o in args.ops.split(",") if o]
    paths = [q for q in args.paths.split(",") if q]
    for name in [*ops, *([args.profile] if args.profile else [])]:
        if name not in TINY:
            p.error(f"unknown op {name!r}; choose from {', '.join(TINY)}")
    for path in paths:
        if path not in PATHS:
            p.error(f"unknown path {path!r}; choose from {', '.join(PATHS)}")
    print(f"host cost on tiny inputs, device {device}, torch {torch.__version__}, dtype {dtype}")
    if device == "cpu":
        print("(CPU: includes the compute, and the Triton interpreter for liger; meaningful on CUDA only)")
    if args.profile:
        tools = [t for t in args.profiler.split(",") if t]
        print(
            profile(
                args.profile, args.profile_path, args.profile_mode, args.profile_iters, tools, device, dtype, args.top
            )
        )
        return 0
    shown = {op: TINY[op] for op in ops}
    print(f"{args.iters} calls x {args.repeats} interleaved rounds, median; shapes: {shown}")
    results = measure(device, args.iters, args.repeats, ops, paths, dtype)
    print(table(results, ops, paths))
    print("\nthe host-path targets (medians of per-round ratios):")
    print(targets(results, ops))
    if (args.steps or ("on" if device.startswith("cuda") else "off")) == "on":
        print(f"\ncompiled steps, us per step (fwd + bwd), {args.step_iters} steps x {args.repeats} rounds:")
        print(steps_table(measure_steps(device, args.step_iters, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
