"""``<op>_<set>.png``: time (top row) and GB/s (bottom row) against x, one
column per mode, one line per provider (and dtype, and timer: graph solid,
eager dashed); band = p20..p80, time on a log axis, the H200 copy ceiling
dashed on H200 runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import bytes as nbytes
from bench import records as rec
from bench.summary import providers_in

LINE_STYLES = {"graph": "-", "eager": "--"}


def plot(records: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        cfg = json.loads(r["extra_benchmark_config_str"])
        groups.setdefault((r["kernel_name"], cfg.get("set", "all")), []).append(r)
    provs = providers_in(records)
    on_h200 = any("H200" in r["gpu_name"] for r in records)
    written = []
    for (op, set_name), group in groups.items():
        modes = [m for m in nbytes.MODES if any(r["kernel_operation_mode"] == m for r in group)]
        configs = {json.loads(r["extra_benchmark_config_str"]).get("dtype", "") for r in group}
        variants = {json.loads(r["extra_benchmark_config_str"]).get("variant", "") for r in group}
        timers = {rec.timer_of(json.loads(r["extra_benchmark_config_str"])) for r in group}
        fig, axes = plt.subplots(2, len(modes), figsize=(5.5 * len(modes), 8), squeeze=False)
        for col, mode in enumerate(modes):
            for row, metric in enumerate(("speed", "bandwidth")):
                ax = axes[row][col]
                series = [r for r in group if r["kernel_operation_mode"] == mode and r["metric_name"] == metric]
                series.sort(key=lambda r: provs.index(r["kernel_provider"]))
                for r in series:
                    if not r["x_values"]:
                        continue
                    cfg = json.loads(r["extra_benchmark_config_str"])
                    timer = rec.timer_of(cfg)
                    label = r["kernel_provider"]
                    label += f" {cfg.get('variant', '')}" if len(variants) > 1 else ""
                    label += f" {cfg.get('dtype', '')}" if len(configs) > 1 else ""
                    label += f" {timer}" if len(timers) > 1 else ""
                    style = LINE_STYLES.get(timer, ":")
                    ax.plot(r["x_values"], r["y_values_50"], marker="o", linestyle=style, label=label)
                    ax.fill_between(r["x_values"], r["y_values_20"], r["y_values_80"], alpha=0.2)
                    ax.set_xlabel(r["x_label"])
                if metric == "bandwidth":
                    if on_h200:
                        ax.axhline(nbytes.H200_COPY_CEILING / 1e9, color="gray", linestyle="--", linewidth=1)
                    ax.set_ylabel("GB/s (minimal bytes)")
                else:
                    ax.set_ylabel("ms (median, log)")
                    if ax.has_data():
                        ax.set_yscale("log")
                xs = sorted({x for r in group for x in r["x_values"]})
                if len(xs) > 1 and xs[0] > 0:
                    ax.set_xscale("log", base=2)
                ax.set_title(f"{op} {set_name} {mode} {metric}")
                ax.grid(True, alpha=0.3)
                if ax.has_data():
                    ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"{op}_{set_name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
