"""The benchmark harness and the demo, smoke-run on CPU (Triton interpreter)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import bytes as nbytes
from bench import demo, run, shapes

RECORD_KEYS = set(run.RECORD_FIELDS)


def test_min_bytes_formulas():
    assert nbytes.min_bytes("poly_norm", {"M": 2, "H": 8, "dtype": "bfloat16"}, "forward") == 2 * 16 * 2
    assert nbytes.min_bytes("poly_norm", {"M": 2, "H": 8, "dtype": "bfloat16"}, "full") == 5 * 16 * 2
    rope = {"B": 1, "T": 4, "n_q_heads": 2, "n_kv_heads": 1, "head_dim": 8, "dtype": "float32"}
    assert nbytes.min_bytes("rope", rope, "backward") == (2 * 4 * 3 * 8 + 2 * 4 * 8) * 4
    gn = {"M": 2, "C": 8, "H": 4, "num_groups": 2, "dtype": "float32"}
    assert nbytes.min_bytes("group_norm", gn, "full") == 5 * 64 * 4 + 5 * 8 * 4


def test_shape_sets():
    for op in shapes.OPS:
        for set_name in ("seeds", "large"):
            for sweep in shapes.sweeps(op, set_name):
                assert sweep.x_values and sweep.x_name and sweep.x_label
                quick = shapes.sweeps(op, set_name, quick=True)
                assert all(len(s.x_values) <= 3 for s in quick)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke run; the GPU run is python -m bench.run")
def test_harness_cpu_smoke(tmp_path, capsys):
    rc = run.main(
        ["--device", "cpu", "--sets", "tiny", "--providers", "liger,torch", "--rep", "1", "--out", str(tmp_path)]
    )
    assert rc == 0
    for op in shapes.OPS:
        records = json.loads((tmp_path / f"{op}.json").read_text())
        assert records, op
        for r in records:
            assert set(r) == RECORD_KEYS
            assert r["kernel_name"] == op
            assert r["kernel_provider"] in ("liger", "torch")
            assert r["metric_name"] in ("speed", "bandwidth")  # no memory records off CUDA
            assert r["metric_unit"] == run.METRIC_UNITS[r["metric_name"]]
            assert r["kernel_operation_mode"] in nbytes.MODES
            assert len(r["x_values"]) == len(r["y_values_50"]) == len(r["y_values_20"]) == len(r["y_values_80"])
            assert json.loads(r["extra_benchmark_config_str"])["set"] == "tiny"
        got = {(r["kernel_provider"], r["kernel_operation_mode"], r["metric_name"]) for r in records}
        assert len(got) == 2 * 3 * 2, got  # every provider, mode and metric measured
        assert json.loads((tmp_path / f"{op}_skips.json").read_text()) == []
        assert (tmp_path / f"{op}_tiny.png").stat().st_size > 0
    summary = (tmp_path / "summary.md").read_text()
    assert "| poly_norm | tiny |" in summary and "| group_norm | tiny |" in summary
    assert "WARNING" not in capsys.readouterr().out


def test_summary_only_rebuilds(tmp_path):
    record = {
        "kernel_name": "poly_norm",
        "kernel_provider": "liger",
        "metric_name": "speed",
        "metric_unit": "ms",
        "gpu_name": "x",
        "x_name": "H",
        "x_label": "hidden size",
        "x_values": [256],
        "y_values_50": [1.0],
        "y_values_20": [0.9],
        "y_values_80": [1.1],
        "timestamp": "t",
        "kernel_operation_mode": "forward",
        "extra_benchmark_config_str": json.dumps({"M": 2048, "dtype": "bfloat16", "set": "seeds"}),
        "liger_version": "0",
    }
    (tmp_path / "poly_norm.json").write_text(json.dumps([record, {**record, "kernel_provider": "torch"}]))
    assert run.main(["--summary-only", "--no-plots", "--out", str(tmp_path)]) == 0
    assert "| poly_norm | seeds | H=256 bfloat16 | forward | 1 | 1 |" in (tmp_path / "summary.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA demo is the nox demo session's job")
def test_demo_cpu():
    assert demo.main([]) == 0


def test_host_overhead_interleaves_paths_and_reports_per_round_ratios(monkeypatch):
    """Every round times every path, starting one path further along each
    time; the ratio column is the median of per-round ratios (2.0 here),
    not the ratio of medians (4 / 3)."""
    from bench import host_overhead, providers

    order: list[str] = []
    scripted = {"liger": iter([0.0, 4.0, 2.0, 9.0]), "liger_kernel": iter([0.0, 2.0, 8.0, 3.0])}  # warm-up first

    class Fake:
        def __init__(self, path: str):
            self.path = path

        def prepare(self) -> None:
            pass

        def full(self) -> float:
            order.append(self.path)
            return next(scripted[self.path])

    def build(op, path, shape, device):
        if path == "torch":
            raise RuntimeError("not this one")
        return Fake(path)

    monkeypatch.setattr(providers, "build", build)
    monkeypatch.setattr(host_overhead, "time_us", lambda step, device, iters: step())
    results = host_overhead.measure("cpu", 1, 3, ["rope"])
    assert order == ["liger", "liger_kernel", "liger", "liger_kernel", "liger_kernel", "liger", "liger", "liger_kernel"]
    assert results[("rope", "liger")] == 4.0 and results[("rope", "liger_kernel")] == 3.0
    assert results[("rope", "ratio")] == 2.0
    assert results[("rope", "torch")] == "skipped (RuntimeError)"
    assert host_overhead.table(results, ["rope"]).splitlines()[-1].endswith("| 2.00 |")


def test_timing_rejects_an_unknown_timer_and_times_make_once_on_cpu():
    from bench import timing

    made: list[int] = []

    def make():
        made.append(1)
        return lambda: None

    with pytest.raises(ValueError, match="unknown timer 'wall'"):
        timing.time_ms(make, "cuda", "wall", 1.0, 1.0)
    t50, t20, t80 = timing.time_ms(make, "cpu", "graph", 1.0, 1.0)
    assert made == [1]
    assert 0.0 <= t20 <= t50 <= t80


def test_a_failed_capture_ends_and_drops_the_shared_pool(monkeypatch):
    """After a failed capture the shared pool is left recording by torch; the
    harness ends and releases it and hands the next capture a new pool."""
    from bench import timing

    handles = iter([(0, 1), (0, 2)])
    calls: list[tuple[str, int, tuple[int, int]]] = []
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(handles))
    for name in ("_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool", "_cuda_releasePool"):
        monkeypatch.delattr(torch._C, name, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", lambda d, p: calls.append(("end", d, p)), raising=False)
    monkeypatch.setattr(torch._C, "_cuda_releasePool", lambda d, p: calls.append(("release", d, p)), raising=False)
    monkeypatch.setattr(timing, "_POOLS", {})
    first = timing._graph_pool(3)
    assert timing._graph_pool(3) == first == (0, 1)
    timing._abandon_pool(3)
    assert calls == [("end", 3, (0, 1)), ("release", 3, (0, 1))]
    assert timing._graph_pool(3) == (0, 2)
    timing._abandon_pool(5)  # nothing to drop
    assert len(calls) == 2


def test_summary_names_the_timer_and_separates_timers(tmp_path):
    base = {
        "kernel_name": "rope",
        "metric_name": "speed",
        "metric_unit": "ms",
        "gpu_name": "x",
        "x_name": "T",
        "x_label": "sequence length",
        "x_values": [1024],
        "y_values_50": [2.0],
        "y_values_20": [1.9],
        "y_values_80": [2.1],
        "timestamp": "t",
        "kernel_operation_mode": "forward",
        "liger_version": "0",
    }
    graph = json.dumps({"B": 1, "set": "seeds", "timer": "graph"})
    events = json.dumps({"B": 1, "set": "seeds", "timer": "events"})
    records = [
        {**base, "kernel_provider": "liger", "extra_benchmark_config_str": graph},
        {**base, "kernel_provider": "liger", "extra_benchmark_config_str": events, "y_values_50": [5.0]},
    ]
    text = run.summarize(records[:1])
    assert "| rope | seeds | T=1024 | forward | 2 |" in text and "timer: graph" in text
    both = run.summarize(records)
    assert "| rope | seeds (graph) | T=1024 | forward | 2 |" in both
    assert "| rope | seeds (events) | T=1024 | forward | 5 |" in both
