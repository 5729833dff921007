"""The harness's records, in upstream Liger-Kernel's benchmark layout.

One record is one (op, provider, metric, mode, config) series over x:

    kernel_name, kernel_provider, metric_name, metric_unit, gpu_name, x_name,
    x_label, x_values, y_values_50, y_values_20, y_values_80, timestamp,
    kernel_operation_mode, extra_benchmark_config_str, liger_version

``extra_benchmark_config_str`` is the sweep's fixed shape config plus its
``set`` and the ``timer`` ("graph" or "eager"), as sorted JSON, so series
of different sets or timers never merge.  Older records name the eager
timer "events" (or "perf_counter" on CPU), or carry no timer; they read as
eager.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import shapes

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
TIMER_ALIASES = {"events": "eager", "perf_counter": "eager"}


def config_str(sweep: shapes.Sweep, timer: str) -> str:
    """The record's extra_benchmark_config_str: the sweep's fixed shape, its set and the timer."""
    return json.dumps({**sweep.config, "set": sweep.set_name, "timer": timer}, sort_keys=True)


def timer_of(config: dict[str, Any]) -> str:
    """The timer a record's config names, under its current name."""
    name = config.get("timer", "eager")
    return TIMER_ALIASES.get(name, name)


def base_config(config: dict[str, Any]) -> str:
    """The config without its timer (sorted JSON): records of one row under different timers share it."""
    return json.dumps({k: v for k, v in config.items() if k != "timer"}, sort_keys=True)


def make_record(
    sweep: shapes.Sweep,
    provider: str,
    metric: str,
    mode: str,
    timer: str,
    by_x: dict[int, tuple[float, float, float]],
    gpu: str,
    version: str,
    stamp: str,
) -> dict[str, Any]:
    xs = [x for x in sweep.x_values if x in by_x]
    return {
        "kernel_name": sweep.op,
        "kernel_provider": provider,
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


def _identity(r: dict[str, Any]) -> tuple:
    return (
        r["kernel_name"],
        r["kernel_provider"],
        r["metric_name"],
        r["kernel_operation_mode"],
        r["extra_benchmark_config_str"],
    )


def merge_records(path: Path, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records already in path that the new ones do not replace, then the new ones."""
    old: list[dict[str, Any]] = []
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = []
    replaced = {_identity(r) for r in new}
    return [r for r in old if _identity(r) not in replaced] + new


def _load_each_op(out: Path, suffix: str) -> list[dict[str, Any]]:
    """The entries of every ``<op><suffix>.json`` under out, in op order."""
    entries: list[dict[str, Any]] = []
    for op in shapes.OPS:
        path = out / f"{op}{suffix}.json"
        if path.exists():
            entries.extend(json.loads(path.read_text()))
    return entries


def load_records(out: Path) -> list[dict[str, Any]]:
    """Every ``<op>.json`` under out, in op order."""
    return _load_each_op(out, "")


def load_skips(out: Path) -> list[dict[str, Any]]:
    """Every ``<op>_skips.json`` under out, in op order."""
    return _load_each_op(out, "_skips")
