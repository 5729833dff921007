"""Time two source trees side by side in one device run: new / old per row.

    python -m bench.lab.compare_trees OLD_DIR NEW_DIR --out /tmp/cmp [--ops ...] [--sets ...]
    python -m bench.lab.compare_trees --table-only --out /tmp/cmp     # the table again from /tmp/cmp

Two versions of the package cannot share a process (both define the
``liger`` op namespace), so every (tree, op) is one ``python -m bench.run``
process.  Each process runs *this* harness (a copy of the bench/ folder
above this lab, put first on the path) against one tree's
``registrations`` / ``csrc_free_ops`` (the tree second on the path, then
whatever PYTHONPATH held, e.g. the liger_kernel wheel), so both trees are
timed by the same harness code at the same shapes.  The trees alternate per
op (old first for the first op, new first for the next, ...), so a drift of
the machine's speed over the run does not favour one tree.

The old tree runs ``--old-providers`` (default liger and torch: torch
eager's new / old ratio shows how much the machine drifted between the two
processes); the new tree runs ``--new-providers`` (default all four), so
``OUT/new`` is also a complete harness run of the new tree (its summary.md
and JSON are what bench/results/current/ holds).

``--deadline-s`` (default 540) bounds the whole driver, so a device command
with a 10-minute limit still gets to print the table: no run starts once too
little time is left, and a run still going at the deadline is stopped (the
harness writes its JSON after every set, so the sets it finished are kept).

Writes OUT/old/ and OUT/new/ (each: <op>.json, <op>_skips.json,
summary.md, <op>.log, the run's stdout) and OUT/compare.md, printed last:
per row, shape, mode and timer, liger's old and new medians and new / old,
rows slower by more than ``--tolerance`` flagged, and the drift control.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import records as rec
from bench import shapes, timing
from bench.summary import build_rows

HARNESS = Path(__file__).resolve().parent.parent
TREES = ("old", "new")
# A run is not started with less than this left before the deadline.
MIN_RUN_S = 30.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.lab.compare_trees", description=__doc__.split("\n\n")[0])
    p.add_argument("old", nargs="?", help="the old tree (a folder holding registrations/ and csrc_free_ops/)")
    p.add_argument("new", nargs="?", help="the new tree")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--ops", default=",".join(shapes.DEFAULT_OPS))
    p.add_argument("--sets", default=",".join(shapes.DEFAULT_SETS))
    p.add_argument("--modes", default="forward,backward,full")
    p.add_argument("--timer", default=",".join(timing.TIMERS))
    p.add_argument("--old-providers", default="liger,torch", help="default liger,torch (torch: drift control)")
    p.add_argument("--new-providers", default="liger,torch,compile,liger_kernel")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup, ms (harness default 10)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep, ms (harness default 50)")
    p.add_argument("--quick", action="store_true", help="the harness's --quick (first/middle/last x)")
    p.add_argument("--deadline-s", type=float, default=540.0, help="stop starting / stop runs after this (s)")
    p.add_argument("--tolerance", type=float, default=0.02, help="flag new / old above 1 + this")
    p.add_argument("--python", default=sys.executable, help="the interpreter for the runs")
    p.add_argument("--dry-run", action="store_true", help="print the runs and the time estimate only")
    p.add_argument("--table-only", action="store_true", help="rebuild compare.md from --out")
    args = p.parse_args(argv)
    if not args.table_only:
        if not args.old or not args.new:
            p.error("OLD_DIR and NEW_DIR are required (or --table-only)")
        for tree in (args.old, args.new):
            missing = [d for d in ("registrations", "csrc_free_ops") if not (Path(tree) / d).is_dir()]
            if missing:
                p.error(f"{tree} holds no {' or '.join(missing)}/: not a tree of this project")
    return args


def run_argv(args: argparse.Namespace, op: str, tree: str, out: Path) -> list[str]:
    """The bench.run arguments of one (tree, op) run."""
    providers = args.old_providers if tree == "old" else args.new_providers
    argv = ["--ops", op, "--sets", args.sets, "--modes", args.modes, "--timer", args.timer]
    argv += ["--providers", providers, "--out", str(out / tree), "--no-plots"]
    if args.warmup is not None:
        argv += ["--warmup", str(args.warmup)]
    if args.rep is not None:
        argv += ["--rep", str(args.rep)]
    if args.quick:
        argv.append("--quick")
    return argv


def schedule(ops: Sequence[str]) -> list[tuple[str, str]]:
    """(op, tree) in run order: the trees alternate which goes first, op by op."""
    order = []
    for i, op in enumerate(ops):
        order += [(op, t) for t in (TREES if i % 2 == 0 else TREES[::-1])]
    return order


def estimate(args: argparse.Namespace, out: Path) -> float:
    """Seconds the runs should take on an H200 (bench.run's estimate, cold caches; the second
    tree of each op finds torch.compile's and Triton's caches warm, so this is an upper bound)."""
    from bench import run

    total = 0.0
    for op, tree in schedule(_split(args.ops)):
        run_args = run.parse_args(run_argv(args, op, tree, out))
        sweeps = [s for sn in run_args.sets for s in shapes.sweeps(op, sn, run_args.quick)]
        if not sweeps:
            continue
        warmup = run_args.warmup if run_args.warmup is not None else (5.0 if args.quick else 10.0)
        rep = run_args.rep if run_args.rep is not None else (20.0 if args.quick else 50.0)
        total += run.estimate_seconds(run_args, sweeps, warmup, rep)
    return total


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def stage_harness() -> Path:
    """A folder holding only a copy of this harness's bench/ package, to put first on the path."""
    stage = Path(tempfile.mkdtemp(prefix="bench-harness-"))
    shutil.copytree(HARNESS, stage / "bench", ignore=shutil.ignore_patterns("lab", "results", "out", "__pycache__"))
    return stage


def run_one(
    args: argparse.Namespace, stage: Path, op: str, tree: str, out: Path, time_left: float
) -> tuple[str, float]:
    """Run one (tree, op) process; (what happened, seconds)."""
    tree_dir = Path(args.old if tree == "old" else args.new).resolve()
    (out / tree).mkdir(parents=True, exist_ok=True)
    log = out / tree / f"{op}.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(stage), str(tree_dir)] + _split_path(env.get("PYTHONPATH", "")))
    env["PYTHONUNBUFFERED"] = "1"
    argv = [args.python, "-m", "bench.run", *run_argv(args, op, tree, out.resolve())]
    t0 = time.time()
    with log.open("w") as f:
        f.write(f"# {tree} tree {tree_dir}\n# {' '.join(argv)}\n")
        f.flush()
        proc = subprocess.Popen(argv, cwd=stage, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=time_left)
            status = "ok" if rc == 0 else f"exit {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = "stopped at the deadline (sets finished before it are kept)"
    return status, time.time() - t0


def _split_path(value: str) -> list[str]:
    return [v for v in value.split(os.pathsep) if v]


# --------------------------------------------------------------------------
# The table


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def compare_table(out: Path, tolerance: float) -> str:
    """compare.md: liger's new / old per row and timer, flags, and the drift control."""
    old_rows = {(r.op, r.set_name, r.shape, r.mode): r for r in build_rows(rec.load_records(out / "old"))}
    new_rows = build_rows(rec.load_records(out / "new"))
    head = ["op", "set", "shape", "mode", "timer", "liger old ms", "liger new ms", "new / old", "flag"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios: dict[tuple[str, str], list[float]] = {}
    flagged: dict[str, int] = {}
    unmatched = 0
    for row in new_rows:
        old = old_rows.get((row.op, row.set_name, row.shape, row.mode))
        for timer, ms in row.ms.items():
            old_ms = old.ms.get(timer, {}) if old else {}
            for prov in ms:
                if ms[prov] is not None and old_ms.get(prov) is not None:
                    ratios.setdefault((prov, timer), []).append(ms[prov] / old_ms[prov])
            a, b = old_ms.get("liger"), ms.get("liger")
            if a is None or b is None:
                unmatched += b is not None
                continue
            ratio = b / a
            flag = f"SLOWER (> {1 + tolerance:.2f})" if ratio > 1 + tolerance else ""
            flagged[timer] = flagged.get(timer, 0) + bool(flag)
            cells = [row.op, row.set_name, row.shape, row.mode, timer, f"{a:.4g}", f"{b:.4g}", f"{ratio:.3f}", flag]
            lines.append("| " + " | ".join(cells) + " |")
    text = ["# New / old, liger's median per row", ""]
    counts = [f"{t}: {len(ratios.get(('liger', t), []))} rows, {flagged.get(t, 0)} slower" for t in sorted(flagged)]
    text.append("liger: " + "; ".join(counts) + f" (flag: new / old > {1 + tolerance:.2f}).")
    for (prov, timer), values in sorted(ratios.items()):
        g = _geomean(values)
        role = " (drift control: same code in both runs)" if prov != "liger" else ""
        text.append(f"- {prov} {timer}: geometric mean of new / old {g:.3f} over {len(values)} rows{role}")
    if unmatched:
        text.append(f"- {unmatched} new liger rows have no old counterpart (not run, or skipped, in the old tree)")
    return "\n".join(text + ["", *lines]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.table_only:
        text = compare_table(out, args.tolerance)
        (out / "compare.md").write_text(text)
        print(text)
        return 0
    t_start = time.time()
    plan = schedule(_split(args.ops))
    print(f"old {Path(args.old).resolve()}  new {Path(args.new).resolve()}  harness {HARNESS}")
    print(f"{len(plan)} runs: " + ", ".join(f"{op}/{tree}" for op, tree in plan))
    print(f"estimated ~{estimate(args, out) / 60:.1f} min (cold caches); deadline {args.deadline_s:.0f} s", flush=True)
    if args.dry_run:
        for op, tree in plan:
            print("python -m bench.run " + " ".join(run_argv(args, op, tree, out)))
        return 0
    stage = stage_harness()
    try:
        for op, tree in plan:
            left = args.deadline_s - (time.time() - t_start)
            if left < MIN_RUN_S:
                print(f"{op}/{tree}: not started, {left:.0f} s left before the deadline", flush=True)
                continue
            status, took = run_one(args, stage, op, tree, out, left)
            print(f"{op}/{tree}: {status} in {took:.0f} s (log {out / tree / (op + '.log')})", flush=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    text = compare_table(out, args.tolerance)
    (out / "compare.md").write_text(text)
    print(f"\nall runs in {time.time() - t_start:.0f} s\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
