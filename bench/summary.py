"""summary.md: one row per (op, set, shape, mode), both timers side by side.

A row is **won** when liger's median is below every rival's (liger_kernel,
compile, torch eager; liger_kernel only where upstream has an equivalent:
a config with ``no_upstream`` says why not) under every timer of REQUIRED_TIMERS (graph and
eager).  A row missing a timer, liger or a rival is not won, and its cell
says what is missing.  In full mode the row also compares liger's peak
memory with torch.compile's (the target: no higher); liger_kernel's lower
peak for poly_norm and rope comes from writing over the caller's tensors,
which a functional op must not do, so the table marks it instead of judging
against it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from bench import bytes as nbytes
from bench import records as rec
from bench import shapes

PROVIDER_ORDER = ("liger", "liger_kernel", "compile", "torch")
RIVALS = ("liger_kernel", "compile", "torch")
REQUIRED_TIMERS = ("graph", "eager")
MEMORY_RIVAL = "compile"
# Targets of issue #5 for the large set (minimal bytes / median graph time, GB/s).
BW_TARGETS = {"forward": 3600.0, "backward": 3200.0}
# Why upstream's full-mode peak is below a functional op's, per op.
UPSTREAM_IN_PLACE = {
    "poly_norm": "LigerPolyNormFunction (in_place=True, its module's default) writes dx over the incoming dy",
    "rope": "LigerRopeFunction (and LigerQwen2VLMRopeFunction) rotates q and k in place, and dq and dk in backward",
}


def _in_place(op: str) -> bool:
    """Whether upstream's path for op overwrites the caller's tensors (the rope_* variants run
    LigerRopeFunction or LigerQwen2VLMRopeFunction, both in place like rope's)."""
    return (op.split("_")[0] if op.startswith("rope_") else op) in UPSTREAM_IN_PLACE


TIMER_NOTES = {
    "graph": "GPU time of a CUDA-graph replay of the call (no host cost)",
    "eager": "the plain eager call, host cost included wherever the host is slower than the GPU",
}


@dataclass
class Row:
    op: str
    set_name: str
    shape: str
    mode: str
    # timer -> provider -> median ms (None: not measured)
    ms: dict[str, dict[str, float | None]] = field(default_factory=dict)
    # timer -> liger's GB/s
    gbps: dict[str, float | None] = field(default_factory=dict)
    # provider -> full-mode peak MB
    peak_mb: dict[str, float | None] = field(default_factory=dict)
    # The providers liger must beat: RIVALS, less liger_kernel where upstream has no equivalent.
    rivals: tuple[str, ...] = RIVALS

    def faster(self, timer: str) -> tuple[bool | None, str]:
        """(liger faster than every rival under timer, what stands in the way: the rivals it is
        not faster than, the rivals not measured); None when liger itself was not measured."""
        ms = self.ms.get(timer, {})
        ours = ms.get("liger")
        if ours is None:
            return None, "liger not measured"
        lost = [p for p in self.rivals if ms.get(p) is not None and ms[p] <= ours]
        missing = [p for p in self.rivals if ms.get(p) is None]
        why = ([f"not faster than {','.join(lost)}"] if lost else []) + (
            [f"unmeasured {','.join(missing)}"] if missing else []
        )
        return (not why), "; ".join(why)

    def best_rival_ratio(self, timer: str) -> float | None:
        """Fastest rival's ms / liger's ms (> 1: liger faster)."""
        ms = self.ms.get(timer, {})
        rivals = [ms[p] for p in self.rivals if ms.get(p) is not None]
        if ms.get("liger") in (None, 0) or not rivals:
            return None
        return min(rivals) / ms["liger"]

    def won(self) -> tuple[bool, str]:
        """(won, the cell's text: "yes", or "NO (timer: why; ...)", timers with the same why merged)."""
        why_by_timer: dict[str, str] = {}
        for timer in REQUIRED_TIMERS:
            ok, why = self.faster(timer) if timer in self.ms else (False, "not run")
            if not ok:
                why_by_timer[timer] = why
        if not why_by_timer:
            return True, "yes"
        merged: dict[str, list[str]] = {}
        for timer, why in why_by_timer.items():
            merged.setdefault(why, []).append(timer)
        return False, "NO (" + " / ".join(f"{', '.join(ts)}: {why}" for why, ts in merged.items()) + ")"

    def peak_over_rival(self) -> float | None:
        """liger's full-mode peak minus MEMORY_RIVAL's, in MB (None: either missing)."""
        ours, theirs = self.peak_mb.get("liger"), self.peak_mb.get(MEMORY_RIVAL)
        if ours is None or theirs is None:
            return None
        return ours - theirs


def _config(r: dict[str, Any]) -> dict[str, Any]:
    return json.loads(r["extra_benchmark_config_str"])


def _timers(all_records: list[dict[str, Any]]) -> list[str]:
    present = {rec.timer_of(json.loads(r["extra_benchmark_config_str"])) for r in all_records}
    return [t for t in REQUIRED_TIMERS if t in present] + sorted(present - set(REQUIRED_TIMERS))


def providers_in(records: list[dict[str, Any]]) -> list[str]:
    present = {r["kernel_provider"] for r in records}
    return [p for p in PROVIDER_ORDER if p in present] + sorted(present - set(PROVIDER_ORDER))


def _value(r: dict[str, Any] | None, x: Any) -> float | None:
    if r is None or x not in r["x_values"]:
        return None
    v = r["y_values_50"][r["x_values"].index(x)]
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def build_rows(records: list[dict[str, Any]]) -> list[Row]:
    """Rows in op order, then set order, then config order of first appearance, x, mode."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    series: dict[tuple, dict[str, Any]] = {}
    for r in records:
        cfg = json.loads(r["extra_benchmark_config_str"])
        key = (r["kernel_name"], rec.base_config(cfg))
        group = groups.setdefault(key, {"config": cfg, "x_name": r["x_name"], "xs": set(), "modes": set()})
        group["xs"].update(r["x_values"])
        group["modes"].add(r["kernel_operation_mode"])
        timer = rec.timer_of(cfg)
        series[(*key, timer, r["kernel_provider"], r["kernel_operation_mode"], r["metric_name"])] = r
    set_rank = {s: i for i, s in enumerate(shapes.SETS)}
    order = sorted(
        groups,
        key=lambda k: (
            shapes.OPS.index(k[0]) if k[0] in shapes.OPS else 99,
            set_rank.get(groups[k]["config"].get("set"), 99),
        ),
    )
    timers = _timers(records)
    provs = providers_in(records)
    rows = []
    for key in order:
        group = groups[key]
        cfg, x_name = group["config"], group["x_name"]
        for x in sorted(group["xs"]):
            shape = shapes.point(cfg, x_name, x)
            label = f"{shapes.describe(shape, x_name)} {cfg.get('dtype', '')}".strip()
            for mode in [m for m in nbytes.MODES if m in group["modes"]]:
                rivals = tuple(p for p in RIVALS if not (p == "liger_kernel" and "no_upstream" in cfg))
                row = Row(key[0], cfg.get("set", ""), label, mode, rivals=rivals)
                for t in timers:
                    ms = {p: _value(series.get((*key, t, p, mode, "speed")), x) for p in provs}
                    if any(v is not None for v in ms.values()):
                        row.ms[t] = ms
                        row.gbps[t] = _value(series.get((*key, t, "liger", mode, "bandwidth")), x)
                if mode == "full":
                    for p in provs:
                        found = [_value(series.get((*key, t, p, mode, "memory")), x) for t in timers]
                        row.peak_mb[p] = next((v for v in found if v is not None), None)
                if row.ms:
                    rows.append(row)
    return rows


def _fmt(v: float | None, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}g}"


def _per_timer(values: list[str]) -> str:
    return " / ".join(values)


def _checks(row: Row) -> str:
    checks = []
    if row.mode == "full":
        over = row.peak_over_rival()
        if over is not None:
            checks.append(f"peak <= {MEMORY_RIVAL}" if over <= 1e-6 else f"PEAK +{over:.3g} MB over {MEMORY_RIVAL}")
    if row.set_name == "large" and row.mode in BW_TARGETS and row.gbps.get("graph") is not None:
        target = BW_TARGETS[row.mode]
        checks.append("bw ok" if row.gbps["graph"] >= target else f"BW < {target:.0f}")
    return ", ".join(checks) or "-"


def tally(rows: list[Row]) -> str:
    """Per (op, set): rows, rows won, rows faster under each timer, full rows at or under compile's peak."""
    head = ["op", "set", "rows", "won (faster in both)"] + [f"faster in {t}" for t in REQUIRED_TIMERS]
    head.append(f"full rows with peak <= {MEMORY_RIVAL}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.op, row.set_name), []).append(row)
    for (op, set_name), group in groups.items():
        cells = [op, set_name, str(len(group)), str(sum(r.won()[0] for r in group))]
        for t in REQUIRED_TIMERS:
            measured = [r for r in group if t in r.ms]
            cells.append(f"{sum(bool(r.faster(t)[0]) for r in measured)}" if measured else "not run")
        full = [r.peak_over_rival() for r in group if r.mode == "full"]
        full = [v for v in full if v is not None]
        cells.append(f"{sum(v <= 1e-6 for v in full)} of {len(full)}" if full else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarize(records: list[dict[str, Any]]) -> str:
    rows = build_rows(records)
    timers = _timers(records)
    provs = providers_in(records)
    per = f" ({' / '.join(timers)})"
    head = (
        ["op", "set", "shape", "mode"]
        + [f"{p} ms{per}" for p in provs]
        + [f"best rival / liger{per}", f"liger GB/s{per}", "peak MB (full) " + " / ".join(provs), "checks"]
        + [f"won ({' and '.join(REQUIRED_TIMERS)})"]
    )
    lines = [tally(rows), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        ms_cells = [_per_timer([_fmt(row.ms.get(t, {}).get(p)) for t in timers]) for p in provs]
        ratios = [row.best_rival_ratio(t) for t in timers]
        ratio_cell = _per_timer([(_fmt(v, 3) + "x") if v else "-" for v in ratios])
        gbps_cell = _per_timer([_fmt(row.gbps.get(t), 5) for t in timers])
        mem_cell = "-"
        if row.mode == "full" and any(v is not None for v in row.peak_mb.values()):
            marks = {p: "*" if p == "liger_kernel" and _in_place(row.op) else "" for p in provs}
            mem_cell = " / ".join(_fmt(row.peak_mb.get(p)) + marks[p] for p in provs)
        cells = [row.op, row.set_name, row.shape, row.mode, *ms_cells, ratio_cell, gbps_cell, mem_cell]
        cells += [_checks(row), row.won()[1]]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    notes = "; ".join(f"{t}: {TIMER_NOTES.get(t, t)}" for t in timers)
    lines.append(
        f"ms: do_bench median, L2 flushed before every timed call; cells read {' / '.join(timers)} ({notes}).  "
        f"Rivals: {', '.join(RIVALS)}.  best rival / liger: the fastest rival's ms over liger's (>1: liger "
        f"faster).  won: liger faster than every rival under {' and '.join(REQUIRED_TIMERS)}; a missing timer "
        "or rival (name?) is not a win.  GB/s: minimal bytes (bench/bytes.py) / median time.  checks: in "
        f"full mode liger's peak memory against {MEMORY_RIVAL}'s (the target: no higher); on the large set the "
        f"graph-time bandwidth targets (forward {BW_TARGETS['forward']:.0f}, backward "
        f"{BW_TARGETS['backward']:.0f} GB/s)."
    )
    if any(_in_place(r.op) and r.peak_mb.get("liger_kernel") is not None for r in rows):
        why = "; ".join(f"{op}: {text}" for op, text in UPSTREAM_IN_PLACE.items())
        lines.append(
            "\n\\* liger_kernel's lower peak for poly_norm and rope comes from overwriting the caller's inputs "
            f"and incoming gradients ({why}), which a functional op must not do; peak memory is judged "
            f"against {MEMORY_RIVAL} instead."
        )
    no_upstream = sorted({(r["kernel_name"], c["no_upstream"]) for r in records if "no_upstream" in (c := _config(r))})
    if no_upstream:
        lines.append(
            "\nNo liger_kernel equivalent, so not a rival in these rows: "
            + "; ".join(f"{op} ({why})" for op, why in no_upstream)
            + "."
        )
    if records and str(records[0].get("gpu_name", "")).startswith("cpu"):
        lines.append("\nCPU run (Triton interpreter): every timer is a perf_counter median of the eager call.")
    return "\n".join(lines) + "\n"


def skips_text(skips: list[dict[str, Any]]) -> str:
    if not skips:
        return ""
    grouped: dict[tuple, list[str]] = {}
    for s in skips:
        key = (s["op"], s["set"], s["provider"], s["reason"])
        where = f"{s['x']}/{s['mode']}" + (f"/{s['timer']}" if s.get("timer") else "")
        grouped.setdefault(key, []).append(where)
    lines = ["", "Skipped (op, set, provider: x/mode[/timer] ...: reason):", ""]
    for (op, set_name, prov, reason), where in grouped.items():
        lines.append(f"- {op} {set_name} {prov}: {' '.join(dict.fromkeys(where))}: {reason}")
    return "\n".join(lines) + "\n"
