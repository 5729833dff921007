"""The benchmark harness.

    python -m bench.run --ops poly_norm,rope,group_norm --sets seeds,large,diffusion \\
        --modes forward,backward,full --providers liger,torch,compile,liger_kernel \\
        --timer graph,eager --out bench/out

For each (op, set, x, provider, mode, timer): triton.testing.do_bench
quantiles (0.5, 0.2, 0.8) of the time, the achieved GB/s against the op's
minimal bytes (bench/bytes.py) and, in full mode, the peak memory of one
eager call above what was allocated before it.  Two timers (bench/timing.py),
both by default, each on the same built inputs one after the other:
``graph`` times a CUDA-graph replay of the call (its GPU time, no host
cost), ``eager`` the plain eager call as a user makes it (host cost
included wherever the host is the slower side).  do_bench flushes L2 before
every timed call in both; the run checks that at start.  Writes, under --out:

* ``<op>.json``        records in upstream Liger-Kernel's benchmark layout
                       (merged with records already there for other sets or
                       timers; the timer is in extra_benchmark_config_str)
* ``<op>_skips.json``  every provider failure of the last run of that op
* ``<op>_<set>.png``   time and GB/s against x, one line per provider and timer
* ``summary.md``       one markdown table over every ``<op>.json`` in --out:
                       both timers side by side per row, "won" = faster than
                       every rival under both

and prints the summary last.  ``--summary-only`` rebuilds plots and summary
from the JSON already in --out.  ``--device cpu`` runs under the Triton
interpreter (use ``--sets tiny``); timings there are perf_counter medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import bytes as nbytes
from bench import records as rec
from bench import shapes, timing
from bench.summary import skips_text, summarize


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from bench.providers import PROVIDERS

    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--ops",
        default=",".join(shapes.DEFAULT_OPS),
        help=f"comma list of {', '.join(shapes.OPS)}, or rope_variants for every rope_* op "
        f"(default {','.join(shapes.DEFAULT_OPS)})",
    )
    p.add_argument(
        "--sets",
        default=None,
        help=f"comma list of {', '.join(shapes.SETS)} (default {','.join(shapes.DEFAULT_SETS)}; cpu: tiny)",
    )
    p.add_argument("--modes", default=",".join(nbytes.MODES), help="comma list of forward, backward, full")
    p.add_argument("--providers", default=",".join(PROVIDERS), help="comma list of " + ", ".join(PROVIDERS))
    p.add_argument(
        "--out",
        default="bench/out",
        help="output folder (default bench/out, git-ignored; bench/results/current holds the current results)",
    )
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu (Triton interpreter)")
    p.add_argument(
        "--timer",
        default=",".join(timing.TIMERS),
        help="comma list: graph (GPU time of a CUDA-graph replay of the call), eager (do_bench of the plain "
        "eager call; 'events' is its old name); default graph,eager",
    )
    p.add_argument("--quick", action="store_true", help="fewer x values, short warmup/rep")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (default 10; quick 5)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (default 50; quick 20)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--archive",
        default=None,
        help="also write every file of --out into this one .tar.gz (a device returns few files: e.g. "
        "--out /tmp/rope_variants --archive $OUT/rope_variants.tar.gz)",
    )
    p.add_argument("--summary-only", action="store_true", help="rebuild plots and summary.md from --out")
    args = p.parse_args(argv)
    args.ops = list(dict.fromkeys(op for name in _split(args.ops) for op in shapes.OP_GROUPS.get(name, (name,))))
    args.modes = _split(args.modes)
    args.providers = _split(args.providers)
    args.sets = _split(args.sets) if args.sets else None
    try:
        args.timers = list(dict.fromkeys(timing.canonical_timer(t) for t in _split(args.timer)))
    except ValueError as e:
        p.error(str(e))
    if not args.timers:
        p.error("--timer names no timer")
    for kind, values, known in (
        ("op", args.ops, shapes.OPS),
        ("set", args.sets or [], shapes.SETS),
        ("mode", args.modes, nbytes.MODES),
        ("provider", args.providers, PROVIDERS),
    ):
        for v in values:
            if v not in known:
                p.error(f"unknown {kind} {v!r}; choose from {', '.join(known)}")
    return args


def _reason(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:240]}"


# --------------------------------------------------------------------------
# The run


class Results:
    """Measurements keyed by (op, set, sweep index, provider, mode, timer, metric) -> {x: (y50, y20, y80)}."""

    def __init__(self) -> None:
        self.values: dict[tuple, dict[int, tuple[float, float, float]]] = {}
        self.skips: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        # (op, provider) -> why its call could not be captured, even rebuilt: its later graph timings are
        # skipped, since every failed capture risks the process (bench/timing.py _abandon_pool).
        self.uncapturable: dict[tuple[str, str], str] = {}

    def add(self, key: tuple, x: int, ys: tuple[float, float, float]) -> None:
        self.values.setdefault(key, {})[x] = ys

    def skip(
        self, op: str, sweep: shapes.Sweep, x: int, provider: str, mode: str, reason: str, timer: str = ""
    ) -> None:
        where = {"op": op, "set": sweep.set_name, "config": sweep.config, "x": x, "provider": provider}
        self.skips.append(where | {"mode": mode, "timer": timer, "reason": reason})
        print(f"  SKIP {op} {sweep.set_name} {sweep.x_name}={x} {provider} {mode} {timer}: {reason}", flush=True)


def _reference_outputs(op: str, shape: dict[str, Any], device: str):
    from bench import providers

    built = providers.build(op, "torch", shape, device)
    outs = tuple(o.detach() for o in built.forward())
    del built
    return outs


def _rebuilt(op: str, prov: str, shape: dict[str, Any], device: str):
    from bench import providers

    timing.free(device)
    built = providers.build(op, prov, shape, device)
    built.prepare()
    return built


def _timer(built, mode: str):
    return {"forward": built.forward_timer, "full": built.full_timer, "backward": built.backward_timer}[mode]


# Timers in the order they run on one built provider: eager first, so a
# failed capture (which can leave state behind) never touches an eager timing.
TIMER_RUN_ORDER = ("eager", "graph")


def _time_one(args, built, op, prov, shape, mode, timer, warmup, rep):
    """One timing, rebuilding once after a failed capture.  Returns (quantiles, built)."""
    try:
        return timing.time_ms(_timer(built, mode), args.device, timer, warmup, rep), built
    except timing.CaptureFailed:
        # Seen once per process for rope's backward on torch 2.11: capturing the same
        # call again failed too, while a capture on freshly built inputs went through.
        built = None
        built = _rebuilt(op, prov, shape, args.device)
        return timing.time_ms(_timer(built, mode), args.device, timer, warmup, rep), built


def run_point(
    args: argparse.Namespace, res: Results, sweep: shapes.Sweep, idx: int, x: int, warmup: float, rep: float
) -> None:
    from bench import providers

    op, device, shape = sweep.op, args.device, sweep.shape(x)
    timers = sorted(args.timers, key=TIMER_RUN_ORDER.index)
    try:
        ref = _reference_outputs(op, shape, device)
    except Exception as e:  # the check is a guard only; go on without it
        ref = None
        print(f"  (no reference output for the check: {_reason(e)})", flush=True)
    tol = providers.CHECK_TOLERANCE.get(shape["dtype"], 1e-3)
    for prov in args.providers:
        built = None
        try:
            built = providers.build(op, prov, shape, device)
            # Check on fresh inputs: upstream's rope rotates q and k in place.
            if ref is not None and prov != "torch":
                err = providers.rel_error(built.forward(), ref)
                if not err <= tol:
                    where = f"{op} {sweep.set_name} {sweep.x_name}={x} {prov}"
                    msg = f"WARNING {where}: forward rel error {err:.3e} > {tol:g}"
                    res.warnings.append(msg)
                    print("  " + msg, flush=True)
            built.prepare()
        except Exception as e:
            for mode in args.modes:
                res.skip(op, sweep, x, prov, mode, _reason(e))
            del built
            timing.free(device)
            continue
        # backward last: for compile it swaps in a non-donating instance.
        for mode in sorted(args.modes, key=("forward", "full", "backward").index):
            key = (op, sweep.set_name, idx, prov, mode)
            if mode == "full":
                try:
                    mb = timing.peak_mb(built.full, device)
                except Exception as e:
                    mb = None
                    res.skip(op, sweep, x, prov, mode, "peak memory: " + _reason(e))
                if mb is not None:
                    for timer in timers:  # one eager measurement, filed with every timer's records
                        res.add((*key, timer, "memory"), x, (mb, mb, mb))
            with providers.retained_backward_context(prov if mode == "backward" else ""):
                if mode == "backward" and prov == "compile":
                    # A second compile with donated buffers off (retain_graph needs it).
                    built = None
                    try:
                        built = _rebuilt(op, prov, shape, device)
                    except Exception as e:
                        for timer in timers:
                            res.skip(op, sweep, x, prov, mode, _reason(e), timer)
                        continue
                for timer in timers:
                    earlier = res.uncapturable.get((op, prov)) if timer == "graph" else None
                    if earlier is not None:
                        reason = f"not captured: an earlier capture failed ({earlier})"
                        res.skip(op, sweep, x, prov, mode, reason, timer)
                        continue
                    try:
                        (t50, t20, t80), built = _time_one(args, built, op, prov, shape, mode, timer, warmup, rep)
                    except Exception as e:
                        if isinstance(e, timing.CaptureFailed):
                            res.uncapturable[(op, prov)] = f"{sweep.x_name}={x} {mode}"
                        res.skip(op, sweep, x, prov, mode, _reason(e), timer)
                        continue
                    finally:
                        timing.free(device)
                    res.add((*key, timer, "speed"), x, (t50, t20, t80))
                    b = nbytes.min_bytes(op, shape, mode)
                    # The 20th percentile of bandwidth comes from the 80th of time.
                    gb = (nbytes.gbps(b, t50), nbytes.gbps(b, t80), nbytes.gbps(b, t20))
                    res.add((*key, timer, "bandwidth"), x, gb)
                    print(
                        f"  {op:<10} {sweep.set_name:<9} {sweep.tag:<8} {sweep.x_name}={x:<6} {prov:<12} "
                        f"{mode:<8} {timer:<5} {t50:9.4f} ms {gb[0]:8.1f} GB/s",
                        flush=True,
                    )
        del built
        timing.free(device)
    del ref
    timing.free(device)


# Calibrated on the H200 logs of the 2026-12-03 harness runs at bd54704 (graph timer only, cold caches): group_norm's
# 9 shapes took 154 s, poly_norm's 8 took 139 s.
SECONDS_PER_TIMING = 0.1  # set-up, capture and gc around each do_bench
SECONDS_PER_COMPILE = 5.0  # torch.compile of the reference at one shape, cold Inductor cache
SECONDS_PER_TRITON_SHAPE = 1.25  # liger / liger_kernel: Triton compiles at a new shape
SECONDS_PER_POINT = 1.0  # inputs and the reference check
SECONDS_START = 15.0  # imports, the L2-flush check


def estimate_seconds(args: argparse.Namespace, all_sweeps: list[shapes.Sweep], warmup: float, rep: float) -> float:
    """Rough wall time on an H200 with cold caches: every timing costs
    warmup + rep plus set-up; the compile provider compiles each shape twice
    (the backward mode needs donated buffers off); liger and liger_kernel
    compile Triton kernels at each new shape."""
    points = sum(len(s.x_values) for s in all_sweeps)
    timings = points * len(args.providers) * len(args.modes) * len(args.timers)
    compiles = (1 + ("backward" in args.modes)) if "compile" in args.providers else 0
    tritons = sum(p in ("liger", "liger_kernel") for p in args.providers)
    return (
        timings * ((warmup + rep) / 1e3 + SECONDS_PER_TIMING)
        + points * (SECONDS_PER_COMPILE * compiles + SECONDS_PER_TRITON_SHAPE * tritons + SECONDS_PER_POINT)
        + SECONDS_START
    )


# --------------------------------------------------------------------------
# Records and outputs


def _gpu_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()})"


def _liger_version() -> str:
    try:
        import csrc_free_ops

        return str(csrc_free_ops.__version__)
    except (ImportError, AttributeError):  # a tree without a version (bench.lab.compare_trees runs any tree)
        return "unknown"


def make_records(res: Results, sweeps_by_key: dict[tuple, shapes.Sweep], device: str) -> list[dict[str, Any]]:
    gpu, version = _gpu_name(device), _liger_version()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return [
        rec.make_record(sweeps_by_key[(op, set_name, idx)], prov, metric, mode, timer, by_x, gpu, version, stamp)
        for (op, set_name, idx, prov, mode, timer, metric), by_x in res.values.items()
    ]


def write_outputs(out: Path, records_by_op: dict[str, list[dict[str, Any]]], res: Results | None, plots: bool) -> str:
    out.mkdir(parents=True, exist_ok=True)
    for op, recs in records_by_op.items():
        path = out / f"{op}.json"
        path.write_text(json.dumps(rec.merge_records(path, recs), indent=1) + "\n")
        if res is not None:
            op_skips = [s for s in res.skips if s["op"] == op]
            (out / f"{op}_skips.json").write_text(json.dumps(op_skips, indent=1) + "\n")
    records = rec.load_records(out)
    if plots and records:
        from bench.plots import plot

        try:
            for p in plot(records, out):
                print(f"wrote {p}")
        except Exception as e:  # a plotting problem must not lose the numbers
            print(f"plots failed: {_reason(e)}")
    text = "# Benchmark summary\n\n"
    if records:
        text += f"GPU: {records[0]['gpu_name']}; csrc_free_ops {records[0]['liger_version']}\n\n"
    text += summarize(records) + skips_text(rec.load_skips(out))
    if res is not None and res.warnings:
        text += "\nCorrectness warnings (forward vs the torch provider):\n\n" + "\n".join(
            f"- {w}" for w in res.warnings
        )
        text += "\n"
    (out / "summary.md").write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.summary_only:
        print(write_outputs(out, {}, None, not args.no_plots))
        return 0

    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu":
        # Must precede the first import of a kernel module (registrations, liger_kernel).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        print(f"--device {args.device} asked for but CUDA is not available", file=sys.stderr)
        return 2
    on_cuda = args.device.startswith("cuda")
    set_names = args.sets or (list(shapes.DEFAULT_SETS) if on_cuda else ["tiny"])
    warmup = args.warmup if args.warmup is not None else (5.0 if args.quick else 10.0)
    rep = args.rep if args.rep is not None else (20.0 if args.quick else 50.0)

    if "compile" in args.providers:  # (importing dynamo costs seconds; only the compile provider needs it)
        # Enough recompiles for every shape in case a reset is skipped somewhere.
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)

    from bench import providers

    if on_cuda:
        timed = timing.check_l2_flush()
        print(f"L2 flush checked: do_bench zeroed its cache buffer before each of {timed} timed calls")
    all_sweeps = [s for op in args.ops for sn in set_names for s in shapes.sweeps(op, sn, args.quick)]
    print(
        f"device {args.device} ({_gpu_name(args.device)}), torch {torch.__version__}, "
        f"liger_kernel {providers.upstream_version() or 'not installed'}; "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}"
    )
    print(
        f"{sum(len(s.x_values) for s in all_sweeps)} shapes x {len(args.providers)} providers x {len(args.modes)} "
        f"modes x {len(args.timers)} timers ({','.join(args.timers)}); warmup {warmup:g} ms, rep {rep:g} ms; "
        f"estimated GPU time ~{estimate_seconds(args, all_sweeps, warmup, rep) / 60:.1f} min",
        flush=True,
    )
    res = Results()
    sweeps_by_key: dict[tuple, shapes.Sweep] = {}
    t0 = time.time()
    text = ""
    for op in args.ops:
        for set_name in set_names:
            op_sweeps = shapes.sweeps(op, set_name, args.quick)
            for idx, sweep in enumerate(op_sweeps):
                sweeps_by_key[(op, set_name, idx)] = sweep
                for x in sweep.x_values:
                    run_point(args, res, sweep, idx, x, warmup, rep)
            if not op_sweeps:
                continue
            # Written after every set, so a run cut short keeps what it measured.
            records = [r for r in make_records(res, sweeps_by_key, args.device) if r["kernel_name"] == op]
            text = write_outputs(out, {op: records}, res, not args.no_plots)
    print(f"\nfinished in {time.time() - t0:.0f} s; wrote {out}/<op>.json, <op>_<set>.png, summary.md\n")
    if args.archive:
        write_archive(out, Path(args.archive))
    print(text)
    return 0


def write_archive(out: Path, archive: Path) -> None:
    """Every file under ``out`` in one gzipped tar, under ``out``'s folder name."""
    import tarfile

    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    print(f"wrote {archive}")


if __name__ == "__main__":
    sys.exit(main())
