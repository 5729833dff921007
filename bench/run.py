"""The benchmark harness.

    python -m bench.run --ops poly_norm,rope,group_norm --sets seeds,large \\
        --modes forward,backward,full --providers liger,torch,compile,liger_kernel --out bench/out

For each (op, set, x, provider, mode): triton.testing.do_bench quantiles
(0.5, 0.2, 0.8) of the time, the achieved GB/s against the op's minimal
bytes (bench/bytes.py) and, in full mode, the peak memory of one eager call
above what was allocated before it.  By default the time is that of a
CUDA-graph replay of the call, i.e. its GPU time without the host's cost of
issuing it; ``--timer events`` times the eager call instead (bench/timing.py).
Writes, under --out:

* ``<op>.json``        records in upstream Liger-Kernel's benchmark layout
                       (merged with records already there for other sets)
* ``<op>_skips.json``  every provider failure of the last run of that op
* ``<op>_<set>.png``   time and GB/s against x, one line per provider
* ``summary.md``       one markdown table over every ``<op>.json`` in --out

and prints the summary last.  ``--summary-only`` rebuilds plots and summary
from the JSON already in --out.  ``--device cpu`` runs under the Triton
interpreter (use ``--sets tiny``); timings there are perf_counter medians.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import bytes as nbytes
from bench import shapes, timing

RECORD_FIELDS = (
    "kernel_name",
    "kernel_provider",
    "metric_name",
    "metric_unit",
    "gpu_name",
    "x_name",
    "x_label",
    "x_values",
    "y_values_50",
    "y_values_20",
    "y_values_80",
    "timestamp",
    "kernel_operation_mode",
    "extra_benchmark_config_str",
    "liger_version",
)
METRIC_UNITS = {"speed": "ms", "bandwidth": "GB/s", "memory": "MB"}
PROVIDER_ORDER = ("liger", "liger_kernel", "compile", "torch")
# Targets of issue #5 for the large set (minimal bytes / median time, GB/s).
BW_TARGETS = {"forward": 3600.0, "backward": 3200.0}
# Providers liger must beat (time) and not exceed (full-mode peak memory).
RIVALS = ("liger_kernel", "compile")


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from bench.providers import PROVIDERS

    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(shapes.OPS), help="comma list of " + ", ".join(shapes.OPS))
    p.add_argument("--sets", default=None, help="comma list of seeds, large, tiny (default seeds,large; cpu: tiny)")
    p.add_argument("--modes", default=",".join(nbytes.MODES), help="comma list of forward, backward, full")
    p.add_argument("--providers", default=",".join(PROVIDERS), help="comma list of " + ", ".join(PROVIDERS))
    p.add_argument("--out", default="bench/out", help="output folder (default bench/out)")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu (Triton interpreter)")
    p.add_argument(
        "--timer",
        default="graph",
        choices=timing.TIMERS,
        help="graph: GPU time of a CUDA-graph replay of the call (default); events: do_bench around the eager call",
    )
    p.add_argument("--quick", action="store_true", help="fewer x values, short warmup/rep")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (default 10; quick 5)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (default 50; quick 20)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--summary-only", action="store_true", help="rebuild plots and summary.md from --out")
    args = p.parse_args(argv)
    args.ops = _split(args.ops)
    args.modes = _split(args.modes)
    args.providers = _split(args.providers)
    for op in args.ops:
        if op not in shapes.OPS:
            p.error(f"unknown op {op!r}")
    for mode in args.modes:
        if mode not in nbytes.MODES:
            p.error(f"unknown mode {mode!r}")
    for prov in args.providers:
        if prov not in PROVIDERS:
            p.error(f"unknown provider {prov!r}")
    return args


def _reason(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:240]}"


# --------------------------------------------------------------------------
# The run


class Results:
    """Measurements keyed by (op, set, sweep index, provider, mode, metric) -> {x: (y50, y20, y80)}."""

    def __init__(self) -> None:
        self.values: dict[tuple, dict[int, tuple[float, float, float]]] = {}
        self.skips: list[dict[str, Any]] = []
        self.warnings: list[str] = []

    def add(self, key: tuple, x: int, ys: tuple[float, float, float]) -> None:
        self.values.setdefault(key, {})[x] = ys

    def skip(self, op: str, sweep: shapes.Sweep, x: int, provider: str, mode: str, reason: str) -> None:
        self.skips.append(
            {"op": op, "set": sweep.set_name, "config": sweep.config, "x": x, "provider": provider, "mode": mode}
            | {"reason": reason}
        )
        print(f"  SKIP {op} {sweep.set_name} {sweep.x_name}={x} {provider} {mode}: {reason}", flush=True)


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


def run_point(
    args: argparse.Namespace, res: Results, sweep: shapes.Sweep, idx: int, x: int, warmup: float, rep: float
) -> None:
    from bench import providers

    op, device, shape = sweep.op, args.device, sweep.shape(x)
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
            try:
                if mode == "full":
                    mb = timing.peak_mb(built.full, device)
                    if mb is not None:
                        res.add((*key, "memory"), x, (mb, mb, mb))
                with providers.retained_backward_context(prov if mode == "backward" else ""):
                    if mode == "backward" and prov == "compile":
                        # A second compile with donated buffers off (retain_graph needs it).
                        built = None
                        built = _rebuilt(op, prov, shape, device)
                    try:
                        t50, t20, t80 = timing.time_ms(_timer(built, mode), device, args.timer, warmup, rep)
                    except timing.CaptureFailed:
                        # Seen once per process for rope's backward on torch 2.11: capturing
                        # the same call again failed too, while a capture on freshly built
                        # inputs went through.
                        built = None
                        built = _rebuilt(op, prov, shape, device)
                        t50, t20, t80 = timing.time_ms(_timer(built, mode), device, args.timer, warmup, rep)
                res.add((*key, "speed"), x, (t50, t20, t80))
                b = nbytes.min_bytes(op, shape, mode)
                # The 20th percentile of bandwidth comes from the 80th of time.
                res.add((*key, "bandwidth"), x, (nbytes.gbps(b, t50), nbytes.gbps(b, t80), nbytes.gbps(b, t20)))
                print(
                    f"  {op:<10} {sweep.set_name:<5} {sweep.tag:<8} {sweep.x_name}={x:<6} {prov:<12} {mode:<8} "
                    f"{t50:9.4f} ms {nbytes.gbps(b, t50):8.1f} GB/s",
                    flush=True,
                )
            except Exception as e:
                res.skip(op, sweep, x, prov, mode, _reason(e))
            finally:
                timing.free(device)
        del built
        timing.free(device)
    del ref
    timing.free(device)


def estimate_seconds(args: argparse.Namespace, all_sweeps: list[shapes.Sweep], warmup: float, rep: float) -> float:
    """Rough wall time on a GPU (cold Inductor cache): every timing costs
    about warmup + rep plus ~0.1 s of set-up; the compile provider compiles
    each shape twice (the backward mode needs donated buffers off), ~5 s a
    compile; ~1 s per shape for inputs and the reference check."""
    points = sum(len(s.x_values) for s in all_sweeps)
    timings = points * len(args.providers) * len(args.modes)
    compiles = (1 + ("backward" in args.modes)) if "compile" in args.providers else 0
    return timings * ((warmup + rep) / 1e3 + 0.1) + 5.0 * compiles * points + points * 1.0 + 15.0


# --------------------------------------------------------------------------
# Records, plots, summary


def _gpu_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()})"


def _liger_version() -> str:
    import csrc_free_ops

    return csrc_free_ops.__version__


def timer_label(args: argparse.Namespace) -> str:
    return args.timer if args.device.startswith("cuda") else "perf_counter"


def config_str(sweep: shapes.Sweep, timer: str) -> str:
    """The record's extra_benchmark_config_str: the sweep's fixed shape, its
    set and the timer (so records of different timers never merge)."""
    return json.dumps({**sweep.config, "set": sweep.set_name, "timer": timer}, sort_keys=True)


def make_records(
    res: Results, sweeps_by_key: dict[tuple, shapes.Sweep], device: str, timer: str
) -> list[dict[str, Any]]:
    gpu, version = _gpu_name(device), _liger_version()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    records = []
    for (op, set_name, idx, prov, mode, metric), by_x in res.values.items():
        sweep = sweeps_by_key[(op, set_name, idx)]
        xs = [x for x in sweep.x_values if x in by_x]
        rec = {
            "kernel_name": op,
            "kernel_provider": prov,
            "metric_name": metric,
            "metric_unit": METRIC_UNITS[metric],
            "gpu_name": gpu,
            "x_name": sweep.x_name,
            "x_label": sweep.x_label,
            "x_values": xs,
            "y_values_50": [by_x[x][0] for x in xs],
            "y_values_20": [by_x[x][1] for x in xs],
            "y_values_80": [by_x[x][2] for x in xs],
            "timestamp": stamp,
            "kernel_operation_mode": mode,
            "extra_benchmark_config_str": config_str(sweep, timer),
            "liger_version": version,
        }
        records.append(rec)
    return records


def _record_key(r: dict[str, Any]) -> tuple:
    return (r["kernel_name"], r["kernel_provider"], r["metric_name"], r["kernel_operation_mode"])


def merge_records(path: Path, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records already in path that the new ones do not replace, then the new ones."""
    old: list[dict[str, Any]] = []
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = []
    replaced = {(*_record_key(r), r["extra_benchmark_config_str"]) for r in new}
    kept = []
    for r in old:
        if (*_record_key(r), r["extra_benchmark_config_str"]) in replaced:
            continue
        kept.append(r)
    return kept + new


def load_records(out: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for op in shapes.OPS:
        path = out / f"{op}.json"
        if path.exists():
            records.extend(json.loads(path.read_text()))
    return records


def _series(records: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """(op, config_str, provider, mode, metric) -> record."""
    return {
        (r["kernel_name"], r["extra_benchmark_config_str"], r["kernel_provider"], r["kernel_operation_mode"])
        + (r["metric_name"],): r
        for r in records
    }


def _value(rec: dict[str, Any] | None, x: Any) -> float | None:
    if rec is None or x not in rec["x_values"]:
        return None
    return rec["y_values_50"][rec["x_values"].index(x)]


def _providers_in(records: list[dict[str, Any]]) -> list[str]:
    present = {r["kernel_provider"] for r in records}
    return [p for p in PROVIDER_ORDER if p in present] + sorted(present - set(PROVIDER_ORDER))


def _configs(records: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(op, config_str, config) in op order, then set order, then first appearance."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        key = (r["kernel_name"], r["extra_benchmark_config_str"])
        if key not in seen:
            seen[key] = json.loads(r["extra_benchmark_config_str"])
    set_rank = {s: i for i, s in enumerate(shapes.SETS)}
    order = sorted(
        seen.items(),
        key=lambda kv: (
            shapes.OPS.index(kv[0][0]) if kv[0][0] in shapes.OPS else 99,
            set_rank.get(kv[1].get("set"), 99),
        ),
    )
    return [(op, cs, cfg) for (op, cs), cfg in order]


def _fmt(v: float | None, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}g}"


_TIMER_NOTE = (
    "graph: GPU time of a CUDA-graph replay; events: the eager call, host issue time included; "
    "perf_counter: CPU wall time; records without a timer are events"
)


def _set_cell(cfg: dict[str, Any], timers: list[str]) -> str:
    """The set name, and the timer when the table mixes timers."""
    name = cfg.get("set", "")
    return f"{name} ({cfg.get('timer', 'events')})" if len(timers) > 1 else name


def summarize(records: list[dict[str, Any]]) -> str:
    provs = _providers_in(records)
    series = _series(records)
    head = (
        ["op", "set", "x", "mode"]
        + [f"{p} ms" for p in provs]
        + ["liger GB/s", "liger vs best other", "peak MB (full) " + " / ".join(provs), "checks"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    configs = _configs(records)
    timers = sorted({cfg.get("timer", "events") for _, _, cfg in configs})
    for op, cs, cfg in configs:
        modes = [m for m in nbytes.MODES if any(k[0] == op and k[1] == cs and k[3] == m for k in series)]
        xs: list[Any] = []
        x_name = ""
        for k, r in series.items():
            if k[0] == op and k[1] == cs:
                x_name = r["x_name"]
                xs.extend(x for x in r["x_values"] if x not in xs)
        xs.sort()
        tag = cfg.get("dtype", "")
        for x in xs:
            for mode in modes:
                ms = {p: _value(series.get((op, cs, p, mode, "speed")), x) for p in provs}
                if all(v is None for v in ms.values()):
                    continue
                bw = _value(series.get((op, cs, "liger", mode, "bandwidth")), x)
                others = [v for p, v in ms.items() if p != "liger" and v is not None]
                ratio = (min(others) / ms["liger"]) if (others and ms["liger"]) else None
                checks = []
                mem_cell = "-"
                if mode == "full":
                    mb = {p: _value(series.get((op, cs, p, mode, "memory")), x) for p in provs}
                    mem_cell = " / ".join(_fmt(mb[p], 4) for p in provs)
                    rival_mb = [mb[p] for p in RIVALS if mb.get(p) is not None]
                    if mb.get("liger") is not None and rival_mb:
                        checks.append("mem ok" if mb["liger"] <= min(rival_mb) + 1e-6 else "MEM OVER")
                rival_ms = {p: ms[p] for p in RIVALS if ms.get(p) is not None}
                if ms.get("liger") is not None and rival_ms:
                    slower = [p for p, v in rival_ms.items() if v <= ms["liger"]]
                    checks.append("faster" if not slower else "SLOWER than " + ",".join(slower))
                if cfg.get("set") == "large" and mode in BW_TARGETS and bw is not None:
                    checks.append("bw ok" if bw >= BW_TARGETS[mode] else f"BW < {BW_TARGETS[mode]:.0f}")
                row = (
                    [op, _set_cell(cfg, timers), f"{x_name}={x} {tag}".strip(), mode]
                    + [_fmt(ms[p]) for p in provs]
                    + [_fmt(bw, 5), (_fmt(ratio, 3) + "x") if ratio else "-", mem_cell, ", ".join(checks) or "-"]
                )
                lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        f"ms: do_bench median; timer: {', '.join(timers)} ({_TIMER_NOTE}).  "
        "GB/s: minimal bytes (bench/bytes.py) / median time.  "
        "liger vs best other: fastest other provider's ms / liger's ms (>1: liger faster).  "
        f"checks: liger against {', '.join(RIVALS)} (time, full-mode peak memory) and, on the large set, "
        f"the bandwidth targets (forward {BW_TARGETS['forward']:.0f}, backward {BW_TARGETS['backward']:.0f} GB/s)."
    )
    return "\n".join(lines) + "\n"


def skips_text(skips: list[dict[str, Any]]) -> str:
    if not skips:
        return ""
    grouped: dict[tuple, list[str]] = {}
    for s in skips:
        key = (s["op"], s["set"], s["provider"], s["reason"])
        grouped.setdefault(key, []).append(f"{s['x']}/{s['mode']}")
    lines = ["", "Skipped (op, set, provider: x/mode ...: reason):", ""]
    for (op, set_name, prov, reason), where in grouped.items():
        shown = " ".join(dict.fromkeys(where))
        lines.append(f"- {op} {set_name} {prov}: {shown}: {reason}")
    return "\n".join(lines) + "\n"


def plot(records: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per (op, set): time (top) and GB/s (bottom) against x per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(records)
    written = []
    groups: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    for op, cs, cfg in _configs(records):
        groups.setdefault((op, cfg.get("set", "all")), []).append((cs, cfg))
    for (op, set_name), cfgs in groups.items():
        modes = [m for m in nbytes.MODES if any(k[0] == op and k[3] == m for k in series)]
        if not modes:
            continue
        fig, axes = plt.subplots(2, len(modes), figsize=(5.5 * len(modes), 8), squeeze=False)
        for col, mode in enumerate(modes):
            for row, metric in enumerate(("speed", "bandwidth")):
                ax = axes[row][col]
                for cs, cfg in cfgs:
                    for prov in _providers_in(records):
                        rec = series.get((op, cs, prov, mode, metric))
                        if rec is None or not rec["x_values"]:
                            continue
                        label = prov + (f" {cfg['dtype']}" if len(cfgs) > 1 else "")
                        ax.plot(rec["x_values"], rec["y_values_50"], marker="o", label=label)
                        ax.fill_between(rec["x_values"], rec["y_values_20"], rec["y_values_80"], alpha=0.2)
                        ax.set_xlabel(rec["x_label"])
                if metric == "bandwidth":
                    if any("H200" in r["gpu_name"] for r in records):
                        ax.axhline(nbytes.H200_COPY_CEILING / 1e9, color="gray", linestyle="--", linewidth=1)
                    ax.set_ylabel("GB/s (minimal bytes)")
                else:
                    ax.set_ylabel("ms (median, log)")
                    if ax.has_data():
                        ax.set_yscale("log")
                xs = sorted({x for k, r in series.items() if k[0] == op for x in r["x_values"]})
                if len(xs) > 1 and xs[0] > 0:
                    ax.set_xscale("log", base=2)
                ax.set_title(f"{op} {set_name} {mode} {metric}")
                ax.grid(True, alpha=0.3)
                if ax.has_data():
                    ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{op}_{set_name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def write_outputs(out: Path, records_by_op: dict[str, list[dict[str, Any]]], res: Results | None, plots: bool) -> str:
    out.mkdir(parents=True, exist_ok=True)
    for op, recs in records_by_op.items():
        path = out / f"{op}.json"
        path.write_text(json.dumps(merge_records(path, recs), indent=1) + "\n")
        if res is not None:
            op_skips = [s for s in res.skips if s["op"] == op]
            (out / f"{op}_skips.json").write_text(json.dumps(op_skips, indent=1) + "\n")
    records = load_records(out)
    if plots and records:
        try:
            for p in plot(records, out):
                print(f"wrote {p}")
        except Exception as e:  # a plotting problem must not lose the numbers
            print(f"plots failed: {_reason(e)}")
    all_skips: list[dict[str, Any]] = []
    for op in shapes.OPS:
        sp = out / f"{op}_skips.json"
        if sp.exists():
            all_skips.extend(json.loads(sp.read_text()))
    text = "# Benchmark summary\n\n"
    if records:
        text += f"GPU: {records[0]['gpu_name']}; csrc_free_ops {records[0]['liger_version']}\n\n"
    text += summarize(records) + skips_text(all_skips)
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
    set_names = _split(args.sets) if args.sets else (["seeds", "large"] if on_cuda else ["tiny"])
    warmup = args.warmup if args.warmup is not None else (5.0 if args.quick else 10.0)
    rep = args.rep if args.rep is not None else (20.0 if args.quick else 50.0)

    # Enough recompiles for every shape in case a reset is skipped somewhere.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)

    from bench import providers

    all_sweeps = [s for op in args.ops for sn in set_names for s in shapes.sweeps(op, sn, args.quick)]
    print(
        f"device {args.device} ({_gpu_name(args.device)}), torch {torch.__version__}, "
        f"liger_kernel {providers.upstream_version() or 'not installed'}; "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}"
    )
    print(
        f"{sum(len(s.x_values) for s in all_sweeps)} shapes x {len(args.providers)} providers x {len(args.modes)} "
        f"modes; warmup {warmup:g} ms, rep {rep:g} ms; estimated GPU time "
        f"~{estimate_seconds(args, all_sweeps, warmup, rep) / 60:.1f} min",
        flush=True,
    )
    res = Results()
    sweeps_by_key: dict[tuple, shapes.Sweep] = {}
    t0 = time.time()
    text = ""
    for op in args.ops:
        for set_name in set_names:
            for idx, sweep in enumerate(shapes.sweeps(op, set_name, args.quick)):
                sweeps_by_key[(op, set_name, idx)] = sweep
                for x in sweep.x_values:
                    run_point(args, res, sweep, idx, x, warmup, rep)
        # Written after every op, so a run cut short keeps what it measured.
        records = [
            r for r in make_records(res, sweeps_by_key, args.device, timer_label(args)) if r["kernel_name"] == op
        ]
        text = write_outputs(out, {op: records}, res, not args.no_plots)
    print(f"\nfinished in {time.time() - t0:.0f} s; wrote {out}/<op>.json, <op>_<set>.png, summary.md\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
