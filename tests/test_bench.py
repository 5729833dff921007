"""The benchmark harness, its drivers and the demo, on CPU (Triton interpreter)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import torch

from bench import bytes as nbytes
from bench import demo, run, shapes, summary, timing
from bench import records as rec
from bench.lab import compare_trees

RECORD_KEYS = set(rec.RECORD_FIELDS)
ON_CPU = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU run; the GPU run is python -m bench.run")


def test_min_bytes_formulas():
    assert nbytes.min_bytes("poly_norm", {"M": 2, "H": 8, "dtype": "bfloat16"}, "forward") == 2 * 16 * 2
    assert nbytes.min_bytes("poly_norm", {"M": 2, "H": 8, "dtype": "bfloat16"}, "full") == 5 * 16 * 2
    rope = {"B": 1, "T": 4, "n_q_heads": 2, "n_kv_heads": 1, "head_dim": 8, "dtype": "float32"}
    assert nbytes.min_bytes("rope", rope, "backward") == (2 * 4 * 3 * 8 + 2 * 4 * 8) * 4
    gn = {"M": 2, "C": 8, "H": 4, "num_groups": 2, "dtype": "float32"}
    assert nbytes.min_bytes("group_norm", gn, "full") == 5 * 64 * 4 + 5 * 8 * 4


def test_diffusion_set_is_the_issue_list_and_counts_its_bytes_from_the_image():
    """GroupNorm(32) at the five UNet / VAE shapes, bf16 and fp32; each x is
    C and the point gives N and the image, whose pixels the bytes count."""
    sweeps = shapes.sweeps("group_norm", "diffusion")
    assert [s.config["dtype"] for s in sweeps] == ["bfloat16", "float32"]
    assert shapes.sweeps("poly_norm", "diffusion") == shapes.sweeps("rope", "diffusion") == []
    seen = set()
    for sweep in sweeps:
        for c in sweep.x_values:
            shape = sweep.shape(c)
            assert shape["num_groups"] == 32 and "points" not in shape
            n, (h, w) = shape["M"], shape["spatial"]
            seen.add((n, c, h, w))
            e = nbytes.ELEM_SIZE[shape["dtype"]]
            act = n * c * h * w * e
            assert nbytes.min_bytes("group_norm", shape, "forward") == 2 * act + 2 * c * e
            assert nbytes.min_bytes("group_norm", shape, "backward") == 3 * act + 3 * c * e
            assert nbytes.min_bytes("group_norm", shape, "full") == 5 * act + 5 * c * e
    assert seen == {(2, 320, 64, 64), (8, 640, 32, 32), (16, 1280, 16, 16), (4, 512, 128, 128), (1, 128, 512, 512)}
    # (2, 320, 64x64) bf16 forward by hand: read x and write y (2 x 5,242,880 bytes), read weight and bias.
    bf16 = sweeps[0].shape(320)
    assert nbytes.min_bytes("group_norm", bf16, "forward") == 10_485_760 + 1_280
    assert shapes.describe(bf16, "C") == "(2, 320, 64x64)"
    assert [s.x_values for s in shapes.sweeps("group_norm", "diffusion", quick=True)] == [(128, 512, 1280)] * 2


def test_diffusion_inputs_are_four_dimensional_and_match_the_byte_count():
    from bench import providers

    sweep = shapes.sweeps("group_norm", "tiny_diffusion")[0]
    for c in sweep.x_values:
        shape = sweep.shape(c)
        x, w, b = providers.group_norm_inputs(shape, "cpu")
        assert x.shape == (shape["M"], c, *shape["spatial"]) and w.shape == b.shape == (c,)
        moved = 2 * x.numel() * x.element_size() + (w.numel() + b.numel()) * w.element_size()
        assert nbytes.min_bytes("group_norm", shape, "forward") == moved


def test_shape_sets():
    for op in shapes.OPS:
        for set_name in shapes.DEFAULT_SETS:
            for sweep in shapes.sweeps(op, set_name):
                assert sweep.x_values and sweep.x_name and sweep.x_label
            quick = shapes.sweeps(op, set_name, quick=True)
            assert all(len(s.x_values) <= 3 for s in quick)
    with pytest.raises(ValueError, match="unknown set 'huge'"):
        shapes.sweeps("rope", "huge")


def _check_records(records, op, providers, timers, set_name):
    for r in records:
        assert set(r) == RECORD_KEYS
        assert r["kernel_name"] == op and r["kernel_provider"] in providers
        assert r["metric_name"] in ("speed", "bandwidth")  # no memory records off CUDA
        assert r["metric_unit"] == rec.METRIC_UNITS[r["metric_name"]]
        assert r["kernel_operation_mode"] in nbytes.MODES
        assert len(r["x_values"]) == len(r["y_values_50"]) == len(r["y_values_20"]) == len(r["y_values_80"])
        cfg = json.loads(r["extra_benchmark_config_str"])
        assert cfg["set"] == set_name and cfg["timer"] in timers


@ON_CPU
def test_harness_cpu_smoke_runs_both_timers(tmp_path, capsys):
    rc = run.main(
        ["--device", "cpu", "--sets", "tiny", "--providers", "liger,torch", "--rep", "1", "--out", str(tmp_path)]
    )
    assert rc == 0
    for op in shapes.DEFAULT_OPS:
        records = json.loads((tmp_path / f"{op}.json").read_text())
        _check_records(records, op, ("liger", "torch"), ("graph", "eager"), "tiny")
        got = {
            (r["kernel_provider"], r["kernel_operation_mode"], r["metric_name"], r["extra_benchmark_config_str"])
            for r in records
        }
        assert len(got) == 2 * 3 * 2 * 2, got  # every provider, mode, metric and timer measured
        assert json.loads((tmp_path / f"{op}_skips.json").read_text()) == []
        assert (tmp_path / f"{op}_tiny.png").stat().st_size > 0
    text = (tmp_path / "summary.md").read_text()
    assert "liger ms (graph / eager)" in text
    assert "| poly_norm | tiny | H=64 float32 | forward |" in text and "| group_norm | tiny |" in text
    out = capsys.readouterr().out
    assert "WARNING" not in out and "L2 flush checked" not in out  # the flush check is a CUDA step


# --------------------------------------------------------------------------
# rope's options (the rope_* variant ops)


def _variant_sweeps(set_name):
    return [s for op in shapes.ROPE_VARIANTS for s in shapes.sweeps(op, set_name)]


def test_rope_variant_set_holds_the_issue_shapes_and_counts_their_bytes():
    from csrc_free_ops.rope.reference import pair_streams  # the op's own definition of M-RoPE's streams

    by_name = {(s.op, s.config.get("variant")): s for s in _variant_sweeps("variants")}
    packed = [by_name[("rope_packed", v)] for v in ("cu_seqlens", "position_ids")]
    for sweep in packed:
        cfg = sweep.config
        assert len(cfg["doc_lens"]) == 8 and len(set(cfg["doc_lens"])) == 8 and sweep.x_values == (16384,)
        assert sum(cfg["doc_lens"]) == 16384 and (cfg["n_q_heads"], cfg["n_kv_heads"], cfg["head_dim"]) == (32, 8, 128)
    qwen2, qwen3 = by_name[("rope_mrope", "qwen2_vl")].config, by_name[("rope_mrope", "qwen3_vl")].config
    assert qwen2["mrope_section"] == [16, 24, 24] and not qwen2["mrope_interleaved"] and qwen2["head_dim"] == 128
    assert qwen3["mrope_section"] == [24, 20, 20] and qwen3["mrope_interleaved"] and qwen3["head_dim"] == 128
    llama = by_name[("rope_position_ids", "llama")].config
    assert (llama["n_q_heads"], llama["n_kv_heads"], llama["head_dim"]) == (32, 8, 128)
    assert by_name[("rope_partial", "phi3")].config["rotary_dim"] < 128
    assert {by_name[("rope_interleaved", v)].config["rotary_dim"] for v in ("cohere", "glm")} == {128, 64}
    assert "n_q_heads" not in by_name[("rope_k_only", None)].config
    # No variant sweep in the other sets, and the original rope sweeps are untouched.
    assert all(shapes.sweeps(op, "seeds") == [] for op in shapes.ROPE_VARIANTS)
    assert shapes.sweeps("rope", "variants") == []
    # By hand: 16384 tokens x 40 heads x 128 dims, read and written in bf16; cos and sin rows
    # 0..4095 (the longest document); 9 int32 cu_seqlens, or 16384 int64 position ids.
    shape = packed[0].shape(16384)
    act = 2 * 16384 * 40 * 128 * 2
    assert nbytes.min_bytes("rope_packed", shape, "forward") == act + 2 * 4096 * 128 * 2 + 9 * 4
    assert nbytes.min_bytes("rope_packed", shape, "full") == 2 * (act + 2 * 4096 * 128 * 2 + 9 * 4)
    assert nbytes.min_bytes("rope_packed", packed[1].shape(16384), "backward") == act + 2 * 4096 * 128 * 2 + 16384 * 8
    # Qwen3-VL's interleaving over 64 pairs: h at 1, 4, ..., 58 (20), w at 2, 5, ..., 59 (20), t the other 24.
    assert nbytes.mrope_pairs_per_stream(64, [24, 20, 20], True) == (24, 20, 20)
    assert nbytes.mrope_pairs_per_stream(4, [2, 1, 1], True) == (2, 1, 1)
    for half, section in ((8, [2, 3, 3]), (8, [4, 2, 2]), (64, [16, 24, 24]), (64, [24, 20, 20])):
        for il in (False, True):
            counts = tuple(pair_streams(half, section, il).bincount(minlength=3).tolist())
            assert nbytes.mrope_pairs_per_stream(half, section, il) == counts, (half, section, il)
    assert shapes.describe(packed[0].shape(16384), "T") == "T=16384 cu_seqlens"


def _used_table_entries(op, shape, args):
    """Distinct (row, column) entries of one table the call reads, counted from its own ids."""
    rot = shape.get("rotary_dim", shape["head_dim"])
    if op in ("rope_interleaved", "rope_partial"):
        return shape["T"] * rot
    if op == "rope_packed" and shape["variant"] == "cu_seqlens":
        return max(shape["doc_lens"]) * rot
    ids = args[-1]
    if op != "rope_mrope":
        return ids.unique().numel() * rot
    section, il = shape["mrope_section"], shape["mrope_interleaved"]
    streams = nbytes.mrope_pairs_per_stream(rot // 2, section, il)
    return sum(2 * n * ids[s].unique().numel() for s, n in enumerate(streams))


def test_rope_variant_bytes_match_what_the_inputs_hold():
    from bench import rope_variants

    for sweep in _variant_sweeps("tiny"):
        shape = sweep.shape(sweep.x_values[0])
        plan = rope_variants.plan(sweep.op, shape, "cpu")
        e = plan.stores[0].element_size()
        data = sum(2 * x.numel() * e for x in plan.stores)
        ids = sum(t.numel() * t.element_size() for t in plan.liger_args[len(plan.stores) + 2 :])
        if sweep.op == "rope_packed" and shape["variant"] == "cu_seqlens":
            ids = (len(shape["doc_lens"]) + 1) * 4
        moved = data + 2 * _used_table_entries(sweep.op, shape, plan.liger_args) * e + ids
        assert nbytes.min_bytes(sweep.op, shape, "forward") == moved, sweep
        assert nbytes.min_bytes(sweep.op, shape, "full") == 2 * moved


def test_rope_variant_providers_agree_with_hf_in_float64():
    """Every provider's outputs and gradients (float32) against the torch provider, HF's functions
    run in float64 on the same values (the tiny inputs are float32, exactly representable)."""
    from bench import providers
    from tests.helpers import DEVICE, assert_close_to_ref

    provs = ["liger", "torch"]
    try:
        providers._upstream()
        provs.append("liger_kernel")
    except providers.ProviderUnavailable:
        pass
    for sweep in _variant_sweeps("tiny"):
        shape = sweep.shape(sweep.x_values[0])
        ref = providers.build(sweep.op, "torch", {**shape, "dtype": "float64"}, DEVICE)
        ref_out = ref.forward()
        g = torch.Generator(device=DEVICE).manual_seed(5)
        grads_out = [torch.randn(o.shape, generator=g, device=DEVICE, dtype=torch.float64) for o in ref_out]
        ref_grads = torch.autograd.grad(ref_out, ref.grad_inputs, grads_out)
        for prov in provs:
            where = f"{sweep.op} {sweep.tag} {prov}"
            if prov == "liger_kernel" and "no_upstream" in shape:
                with pytest.raises(providers.ProviderUnavailable, match=re.escape(shape["no_upstream"])):
                    providers.build(sweep.op, prov, shape, DEVICE)
                continue
            built = providers.build(sweep.op, prov, shape, DEVICE)
            out = built.forward()
            grads = torch.autograd.grad(out, built.grad_inputs, [x.float() for x in grads_out])
            assert len(out) == len(ref_out) and len(grads) == len(ref_grads), where
            for got, want in zip((*out, *grads), (*ref_out, *ref_grads), strict=True):
                assert_close_to_ref(got, want, torch.float32, where)


@ON_CPU
def test_harness_runs_the_rope_variants(tmp_path, capsys):
    """Two of the variant ops end to end (each variant's builder runs in the test above): one
    without an upstream equivalent and one output, one with two variants per op."""
    from bench.plots import plot

    ops = ("rope_k_only", "rope_packed")
    argv = ["--device", "cpu", "--ops", ",".join(ops), "--sets", "tiny", "--modes", "forward", "--timer", "eager"]
    argv += ["--providers", "liger,torch,liger_kernel", "--rep", "1", "--no-plots", "--out", str(tmp_path)]
    assert run.main(argv) == 0
    for op in ops:
        records = json.loads((tmp_path / f"{op}.json").read_text())
        _check_records(records, op, ("liger", "torch"), ("eager",), "tiny")
        assert {r["kernel_provider"] for r in records} == {"liger", "torch"}
        skips = json.loads((tmp_path / f"{op}_skips.json").read_text())
        assert {s["provider"] for s in skips} == {"liger_kernel"}
    skips = json.loads((tmp_path / "rope_k_only_skips.json").read_text())
    assert {s["reason"] for s in skips} == {f"ProviderUnavailable: {shapes.NO_SINGLE}"}
    text = (tmp_path / "summary.md").read_text()
    for label in ("T=8 cu_seqlens", "T=8 position_ids"):
        assert f"| rope_packed | tiny | {label} float32 | forward |" in text, label
    k_only = next(line for line in text.splitlines() if line.startswith("| rope_k_only | tiny | T=3 float32 |"))
    assert k_only.endswith("unmeasured compile) |") and "liger_kernel" not in k_only  # not a rival there
    packed = next(line for line in text.splitlines() if line.startswith("| rope_packed | tiny | T=8 cu"))
    assert "unmeasured liger_kernel,compile" in packed
    assert "No liger_kernel equivalent, so not a rival in these rows: rope_k_only" in text
    assert "WARNING" not in capsys.readouterr().out
    (png,) = plot(json.loads((tmp_path / "rope_packed.json").read_text()), tmp_path)
    assert png.name == "rope_packed_tiny.png" and png.stat().st_size > 0


def test_the_rope_variant_gpu_command_fits_in_four_minutes():
    """The command bench/README.md gives for the variants alone, by the harness's own estimate."""
    args = run.parse_args(["--ops", "rope_variants", "--sets", "variants", "--timer", "graph,eager"])
    assert args.ops == list(shapes.ROPE_VARIANTS)
    sweeps = [s for op in args.ops for s in shapes.sweeps(op, "variants")]
    assert run.estimate_seconds(args, sweeps, 10.0, 50.0) < 240


@ON_CPU
def test_harness_runs_the_image_shaped_set(tmp_path):
    argv = ["--device", "cpu", "--ops", "group_norm,group_norm_silu", "--sets", "tiny_diffusion", "--modes", "forward"]
    argv += ["--timer", "events", "--providers", "liger,torch", "--rep", "1", "--no-plots", "--out", str(tmp_path)]
    assert run.main(argv) == 0
    text = (tmp_path / "summary.md").read_text()
    for op in ("group_norm", "group_norm_silu"):
        records = json.loads((tmp_path / f"{op}.json").read_text())
        _check_records(records, op, ("liger", "torch"), ("eager",), "tiny_diffusion")
        assert {tuple(r["x_values"]) for r in records} == {(8, 16)}
        assert f"| {op} | tiny_diffusion | (2, 8, 4x4) float32 | forward |" in text
        assert f"| {op} | tiny_diffusion | (1, 16, 2x3) float32 | forward |" in text
    assert "no graph run" not in text and "graph: not run" in text  # won needs both timers


def test_channels_last_set_builds_channels_last_inputs_and_the_fused_pair_agrees():
    from bench import providers

    sweep = shapes.sweeps("group_norm_silu", "diffusion_cl")[0]
    assert sweep.config["layout"] == "channels_last"
    shape = {**sweep.shape(320), "M": 1, "spatial": [3, 4], "H": 12, "C": 64, "dtype": "float32"}  # CPU-sized
    x, _, _ = providers.group_norm_inputs(shape, "cpu")
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    assert shapes.describe(shape, "C") == "(1, 64, 3x4) channels_last"
    ours = providers.build("group_norm_silu", "liger", shape, "cpu")
    ref = providers.build("group_norm_silu", "torch", shape, "cpu")
    assert providers.rel_error(_as_outputs(ours.fn(*ours.args)), _as_outputs(ref.fn(*ref.args))) < 1e-4


def _as_outputs(out):
    return out if isinstance(out, tuple) else (out,)


def test_parse_args_rejects_unknown_names():
    with pytest.raises(SystemExit):
        run.parse_args(["--timer", "graph,wall"])
    with pytest.raises(SystemExit):
        run.parse_args(["--sets", "seeds,huge"])
    assert run.parse_args(["--timer", "events,graph,eager"]).timers == ["eager", "graph"]
    assert run.parse_args([]).timers == ["graph", "eager"]


# --------------------------------------------------------------------------
# Summary


def _record(op, provider, mode, timer, ys, metric="speed", x=(256,), set_name="seeds", **cfg):
    config = {"M": 2048, "dtype": "bfloat16", "set": set_name, **cfg}
    if timer is not None:
        config["timer"] = timer
    return {
        "kernel_name": op,
        "kernel_provider": provider,
        "metric_name": metric,
        "metric_unit": rec.METRIC_UNITS[metric],
        "gpu_name": "NVIDIA H200",
        "x_name": "H",
        "x_label": "hidden size",
        "x_values": list(x),
        "y_values_50": list(ys),
        "y_values_20": list(ys),
        "y_values_80": list(ys),
        "timestamp": "t",
        "kernel_operation_mode": mode,
        "extra_benchmark_config_str": json.dumps(config, sort_keys=True),
        "liger_version": "0",
    }


def _row(text, mode):
    start = f"| poly_norm | seeds | H=256 bfloat16 | {mode} |"
    return next(line for line in text.splitlines() if line.startswith(start))


def test_summary_puts_both_timers_side_by_side_and_wins_only_when_faster_in_both():
    ms = {  # provider -> (graph, eager) ms
        "forward": {"liger": (1.0, 2.0), "liger_kernel": (1.5, 3.0), "compile": (1.2, 4.0), "torch": (5.0, 2.5)},
        "backward": {"liger": (1.0, 2.0), "liger_kernel": (1.5, 3.0), "compile": (1.2, 4.0), "torch": (5.0, 1.9)},
    }
    records = [
        _record("poly_norm", p, mode, timer, [v[i]])
        for mode, by_p in ms.items()
        for p, v in by_p.items()
        for i, timer in enumerate(("graph", "eager"))
    ]
    text = summary.summarize(records)
    assert "| liger ms (graph / eager) | liger_kernel ms (graph / eager) |" in text
    forward = _row(text, "forward")
    assert "| 1 / 2 | 1.5 / 3 | 1.2 / 4 | 5 / 2.5 | 1.2x / 1.25x |" in forward
    assert forward.endswith("| yes |")
    # torch eager's 1.9 ms beats liger's 2.0 in eager mode only: not won.
    assert _row(text, "backward").endswith("| NO (eager: not faster than torch) |")
    assert "| poly_norm | seeds | 2 | 1 | 2 | 1 | - |" in text  # tally: rows, won, faster in graph / eager
    # Drop the eager records: nothing can be won, and the cell says why.
    graph_only = summary.summarize([r for r in records if "graph" in r["extra_benchmark_config_str"]])
    assert _row(graph_only, "forward").endswith("| NO (eager: not run) |")
    # A tie is not a win, and a rival that was not measured is named.
    tie = [r for r in records if r["kernel_operation_mode"] == "forward" and r["kernel_provider"] != "compile"]
    tie = [{**r, "y_values_50": [1.0]} if r["kernel_provider"] == "liger_kernel" else r for r in tie]
    assert _row(summary.summarize(tie), "forward").endswith(
        "| NO (graph, eager: not faster than liger_kernel; unmeasured compile) |"
    )


def test_summary_judges_peak_memory_against_compile_and_explains_upstreams_lower_peak():
    records = []
    for timer in ("graph", "eager"):
        for p, (t, mb) in {"liger": (1.0, 2.017), "liger_kernel": (2.0, 1.028), "compile": (3.0, 2.013)}.items():
            records.append(_record("poly_norm", p, "full", timer, [t]))
            records.append(_record("poly_norm", p, "full", timer, [mb], metric="memory"))
        records.append(_record("poly_norm", "torch", "full", timer, [4.0]))
    text = summary.summarize(records)
    row = _row(text, "full")
    assert "| 2.017 / 1.028* / 2.013 / - |" in row
    assert "PEAK +0.004 MB over compile" in row
    assert "overwriting the caller's inputs and incoming gradients" in text
    assert "| poly_norm | seeds | 1 | 1 | 1 | 1 | 0 of 1 |" in text
    under = [
        {**r, "y_values_50": [2.0]} if r["metric_name"] == "memory" and r["kernel_provider"] == "liger" else r
        for r in records
    ]
    assert "peak <= compile" in _row(summary.summarize(under), "full")


def test_summary_reads_old_records_as_eager_and_large_rows_against_the_bandwidth_targets(tmp_path):
    old = [
        _record("poly_norm", "liger", "forward", "events", [5.0]),
        _record("poly_norm", "torch", "forward", None, [6.0]),
        _record("poly_norm", "liger", "forward", "graph", [2.0]),
    ]
    text = summary.summarize(old)
    assert "| 2 / 5 | - / 6 |" in _row(text, "forward")
    large = _record("poly_norm", "liger", "forward", "graph", [0.001], set_name="large")
    large_bw = _record("poly_norm", "liger", "forward", "graph", [3000.0], metric="bandwidth", set_name="large")
    assert "BW < 3600" in summary.summarize([large, large_bw])
    (tmp_path / "poly_norm.json").write_text(json.dumps(old))
    assert run.main(["--summary-only", "--no-plots", "--out", str(tmp_path)]) == 0
    assert "| 2 / 5 | - / 6 |" in (tmp_path / "summary.md").read_text()


# --------------------------------------------------------------------------
# Timing


def test_timing_rejects_an_unknown_timer_and_times_make_once_on_cpu():
    made: list[int] = []

    def make():
        made.append(1)
        return lambda: None

    with pytest.raises(ValueError, match="unknown timer 'wall'"):
        timing.time_ms(make, "cuda", "wall", 1.0, 1.0)
    t50, t20, t80 = timing.time_ms(make, "cpu", "eager", 1.0, 1.0)
    assert made == [1]
    assert 0.0 <= t20 <= t50 <= t80
    assert timing.canonical_timer("events") == "eager"


def test_eager_timer_is_do_bench_of_the_plain_call(monkeypatch):
    calls = []
    monkeypatch.setattr(timing, "_do_bench", lambda fn, w, r: calls.append((fn, w, r)) or (1.0, 0.9, 1.1))
    fn = object()
    assert timing.time_ms(lambda: fn, "cuda", "eager", 3.0, 7.0) == (1.0, 0.9, 1.1)
    assert calls == [(fn, 3.0, 7.0)]


class _FakeEvent:
    def __init__(self, enable_timing: bool = True):
        pass

    def record(self):
        pass

    def elapsed_time(self, other):
        return 0.01


class _FakeDriver:
    """What triton.testing.do_bench asks of the active driver."""

    def __init__(self):
        self.flushes = 0

    def get_device_interface(self):
        class Interface:
            Event = _FakeEvent

            @staticmethod
            def synchronize():
                pass

        return Interface

    def get_empty_cache_for_benchmark(self):
        return "cache"

    def clear_cache(self, cache):
        assert cache == "cache"
        self.flushes += 1


def test_l2_flush_check_passes_on_triton_do_bench_and_fails_on_one_that_skips_the_flush(monkeypatch):
    from triton.runtime import driver

    fake = _FakeDriver()
    previous = dict(vars(driver))  # without touching .active: off CUDA there is no driver to create
    driver.set_active(fake)
    try:
        timed = timing.check_l2_flush()
        assert timed >= 1 and fake.flushes >= timed + 5  # 5 in do_bench's estimate, one per timed call
        assert driver.active is fake  # restored after the check

        def no_flush(fn, warmup, rep):  # a do_bench that flushes while estimating only
            for _ in range(5):
                driver.active.clear_cache("cache")
                fn()
            for _ in range(10):
                fn()
            return 1.0, 1.0, 1.0

        monkeypatch.setattr(timing, "_do_bench", no_flush)
        with pytest.raises(RuntimeError, match="does not flush L2"):
            timing.check_l2_flush()
    finally:
        vars(driver).clear()
        vars(driver).update(previous)


def test_a_failed_capture_ends_and_drops_the_shared_pool(monkeypatch):
    """After a failed capture the shared pool is left recording by torch; the
    harness ends its recording and hands the next capture a new pool, and
    leaves the release to the failed graph's reset (a second release aborts)."""
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
    assert calls == [("end", 3, (0, 1))]
    assert timing._graph_pool(3) == (0, 2)
    timing._abandon_pool(5)  # nothing to drop
    assert len(calls) == 1


def test_a_provider_that_fails_to_capture_is_not_captured_again(monkeypatch):
    """After a capture fails even on rebuilt inputs, the provider's later graph timings are skipped (each failed
    capture risks the process), while its eager timings and the other providers' captures go on."""
    import argparse

    from bench import providers, run, shapes

    class Built:
        def __init__(self, prov):
            self.prov = prov
            self.forward_timer = self.full_timer = self.backward_timer = lambda: lambda: None

        def prepare(self):
            pass

    captures = []

    def time_ms(make, device, timer, warmup, rep):
        if timer == "graph":
            captures.append(make.prov)
            if make.prov == "syncs":
                raise timing.CaptureFailed("CUDA graph capture failed")
        return 1.0, 1.0, 1.0

    monkeypatch.setattr(providers, "build", lambda op, prov, shape, device: Built(prov))
    monkeypatch.setattr(run, "_timer", lambda built, mode: type("T", (), {"prov": built.prov})())
    monkeypatch.setattr(run, "_reference_outputs", lambda *a: None)
    monkeypatch.setattr(timing, "time_ms", time_ms)
    monkeypatch.setattr(timing, "free", lambda device: None)
    monkeypatch.setattr(timing, "peak_mb", lambda fn, device: 1.0)
    args = argparse.Namespace(device="cpu", timers=["eager", "graph"], providers=["syncs", "liger"],
                              modes=["forward", "backward"])  # fmt: skip
    res = run.Results()
    sweep = shapes.Sweep("cross_entropy", "seeds", "V", "classes", (64, 128), {"dtype": "bfloat16", "BT": 8})
    for idx, x in enumerate(sweep.x_values):
        run.run_point(args, res, sweep, idx, x, 1.0, 1.0)
    # "syncs": the forward capture and its retry on rebuilt inputs, then never again; "liger": every capture.
    assert captures == ["syncs", "syncs", "liger", "liger", "liger", "liger"]
    skipped = [(s["provider"], s["x"], s["mode"], s["timer"]) for s in res.skips]
    assert skipped == [("syncs", 64, "forward", "graph"), ("syncs", 64, "backward", "graph"),
                       ("syncs", 128, "forward", "graph"), ("syncs", 128, "backward", "graph")]  # fmt: skip
    assert "an earlier capture failed (V=64 forward)" in res.skips[1]["reason"]
    eager = [k for k in res.values if k[3] == "syncs" and k[5] == "eager" and k[6] == "speed"]
    assert len(eager) == 4  # both modes timed at both points


# --------------------------------------------------------------------------
# Host overhead


def test_host_overhead_interleaves_steps_and_reports_per_round_ratios(monkeypatch):
    """Every round times every step, starting one further along each time;
    ratios are medians of per-round ratios (2.0 here), not ratios of medians."""
    from bench import host_overhead

    order: list[str] = []
    # warm-up first, then 3 rounds; liger fwd+bwd / native fwd+bwd per round: 4/2, 9/3, 2/1 -> median 2
    scripted = {
        "liger fwd": iter([0, 1, 1, 1]),
        "liger fwd+bwd": iter([0, 4, 9, 2]),
        "native fwd": iter([0, 1, 1, 1]),
        "native fwd+bwd": iter([0, 2, 3, 1]),
    }

    class Fake:
        def __init__(self, path: str):
            self.path = path

        def forward(self) -> float:
            order.append(f"{self.path} fwd")
            return float(next(scripted[f"{self.path} fwd"]))

        def full(self) -> float:
            order.append(f"{self.path} fwd+bwd")
            return float(next(scripted[f"{self.path} fwd+bwd"]))

    def build_path(op, path, device, dtype):
        if path == "floor":
            raise RuntimeError("not this one")
        return Fake(path)

    monkeypatch.setattr(host_overhead, "build_path", build_path)
    monkeypatch.setattr(host_overhead, "time_us", lambda step, device, iters: step())
    results = host_overhead.measure("cpu", 1, 3, ["rope"], ("liger", "native", "floor"))
    steps = ["liger fwd", "liger fwd+bwd", "native fwd", "native fwd+bwd"]
    assert order == steps + steps + steps[1:] + steps[:1] + steps[2:] + steps[:2]
    assert results[("rope", "liger fwd+bwd")] == 4.0 and results[("rope", "native fwd+bwd")] == 2.0
    assert results[("rope", "ratios")][("liger fwd+bwd", "native fwd+bwd")] == 2.0
    assert results[("rope", "floor")] == "skipped (RuntimeError: not this one)"
    lines = host_overhead.table(results, ["rope"], ("liger", "native", "floor")).splitlines()
    assert lines[2] == "| rope | liger | 1.0 | 4.0 | 1.00x | 2.00x | - | - | - | - |"
    targets = host_overhead.targets(results, ["rope"])
    assert "liger fwd+bwd / native 2.00x MISSED (<= 1.2)" in targets and "fast fwd / floor not measured" in targets


@ON_CPU
def test_host_overhead_yardsticks_run_forward_and_backward():
    from bench import host_overhead

    for path, n_out in (("floor", 1), ("native", 1), ("floor_pair", 2)):
        built = host_overhead.build_path("rope", path, "cpu", "float32")
        outs = built.forward()
        assert len(outs) == n_out and all(out.shape == (2, 8, 16) for out in outs)
        grads = built.full()
        assert all(g is not None and g.shape == i.shape for g, i in zip(grads, built.grad_inputs, strict=True))


@ON_CPU
def test_host_overhead_fast_path_matches_the_op():
    """The "fast" path (eager_call, what liger_nn calls) computes what torch.ops.liger computes."""
    from bench import host_overhead

    for op in host_overhead.TINY:
        liger = host_overhead.build_path(op, "liger", "cpu", "float32")
        fast = host_overhead.build_path(op, "fast", "cpu", "float32")
        same_inputs = zip(fast.args, liger.args, strict=True)
        assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in same_inputs)
        fast.grad_outputs = liger.grad_outputs
        for got, want in zip((*fast.forward(), *fast.full()), (*liger.forward(), *liger.full()), strict=True):
            assert torch.equal(got, want), op


def test_host_overhead_steps_table_shows_each_provider_against_native():
    from bench import host_overhead

    results = {
        "gn_silu native default": 100.0, "gn_silu opaque default": 150.0, "gn_silu decomposed default": 80.0,
        ("ratios", "gn_silu opaque default"): 1.5, ("ratios", "gn_silu decomposed default"): 0.8,
    }  # fmt: skip
    lines = host_overhead.steps_table(results).splitlines()
    assert lines[0].split(" | ")[2:] == ["native us", "opaque us", "decomposed us", "opaque / native",
                                         "decomposed / native |"]  # fmt: skip
    assert lines[2] == "| gn_silu | default | 100.0 | 150.0 | 80.0 | 1.50x | 0.80x |"
    assert lines[3] == "| gn_silu | reduce-overhead | - | - | - | - | - |"


def test_host_at_shapes_interleaves_and_reports_fast_against_native(monkeypatch):
    """Each round times every (shape, path, kind) once in each timer, one step further along each round;
    the ratio columns are medians of per-round ratios."""
    from bench import host_at_shapes

    shapes = host_at_shapes.MODELS["unet"](True)
    order: list[tuple] = []
    warmed: list[tuple] = []

    class Step(tuple):
        def __call__(self):
            warmed.append(self)

    monkeypatch.setattr(host_at_shapes, "_step", lambda shape, path, kind, device, dtype: Step((shape, path, kind)))
    monkeypatch.setattr(host_at_shapes, "host_us", lambda step, device, iters: order.append(tuple(step)) or 2.0)
    monkeypatch.setattr(host_at_shapes, "wall_us", lambda step, device, iters: 3.0 if step[1] == "fast" else 1.5)
    rounds = host_at_shapes.measure(shapes, "cpu", torch.float32, 1, 2)
    names = [(s, p, k) for s in shapes for p in host_at_shapes.PATHS for k in host_at_shapes.KINDS]
    assert order == names + names[1:] + names[:1]
    assert warmed == [n for n in names for _ in range(3)]  # each warmed before any is timed
    lines = host_at_shapes.table(rounds, shapes).splitlines()
    assert len(lines) == 2 + 2 * len(shapes)
    assert lines[2].endswith("| 2.0 | 2.0 | 2.0 | 1.5 | 3.0 | 1.5 | 1.00x | 2.00x |")
    assert {s.op for s in shapes} == {"group_norm", "group_norm_silu", "layer_norm", "geglu_exact"}
    assert any(s.channels_last for s in shapes) and any(not s.channels_last for s in shapes)


@ON_CPU
def test_host_at_shapes_paths_compute_the_same_layer():
    """native, fast and liger compute one layer at each shape (so the table compares like with like)."""
    from bench import host_at_shapes

    for shape in host_at_shapes.MODELS["unet"](True):
        args = host_at_shapes._inputs(shape, "cpu", torch.float64)
        if shape.channels_last:
            assert args[0].is_contiguous(memory_format=torch.channels_last) and not args[0].is_contiguous()
        want = host_at_shapes._call(shape, "native")(*args)
        for path in ("fast", "liger"):
            got = host_at_shapes._call(shape, path)(*args)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=f"{shape.label()} {path}")


# --------------------------------------------------------------------------
# Two trees side by side

FAKE_REGISTRATIONS = """
import time

import torch
import torch.nn.functional as F

LIB = torch.library.Library("liger", "DEF")
LIB.define("group_norm(Tensor x, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor")


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-05):
    if {delay}:
        time.sleep({delay})
    return F.group_norm(x, num_groups, weight, bias, eps)


LIB.impl("group_norm", group_norm, "CompositeImplicitAutograd")
"""


def _fake_tree(root: Path, name: str, delay: float) -> Path:
    tree = root / name
    (tree / "registrations").mkdir(parents=True)
    (tree / "csrc_free_ops").mkdir()
    (tree / "registrations" / "__init__.py").write_text(textwrap.dedent(FAKE_REGISTRATIONS.format(delay=delay)))
    (tree / "csrc_free_ops" / "__init__.py").write_text(f"__version__ = '{name}-tree'\n")
    return tree


def test_compare_trees_alternates_which_tree_goes_first():
    assert compare_trees.schedule(["a", "b", "c"]) == [
        ("a", "old"),
        ("a", "new"),
        ("b", "new"),
        ("b", "old"),
        ("c", "old"),
        ("c", "new"),
    ]


@ON_CPU
def test_compare_trees_runs_each_tree_in_its_own_process_with_one_harness(tmp_path, capsys):
    """Two fake trees (neither holds bench/): the old op returns at once, the new one sleeps
    50 ms a call.  Each tree's records carry its own version, and the new rows are flagged.
    compare_trees itself runs in this process (the trees' harness runs are its subprocesses)."""
    old, new = _fake_tree(tmp_path, "old", 0.0), _fake_tree(tmp_path, "new", 0.05)
    out = tmp_path / "out"
    argv = [str(old), str(new), "--out", str(out)]
    argv += ["--ops", "group_norm", "--sets", "tiny", "--modes", "forward", "--timer", "eager", "--rep", "1"]
    argv += ["--old-providers", "liger,torch", "--new-providers", "liger,torch"]
    rc = compare_trees.main(argv)
    stdout = capsys.readouterr().out
    logs = "".join(p.read_text() for p in sorted(out.glob("*/*.log")))
    assert rc == 0, stdout + logs
    for name in ("old", "new"):
        records = json.loads((out / name / "group_norm.json").read_text())
        assert {r["liger_version"] for r in records} == {f"{name}-tree"}, logs
    text = (out / "compare.md").read_text()
    assert text.strip() == stdout[stdout.index("# New / old") :].strip()
    rows = [line for line in text.splitlines() if line.startswith("| group_norm | tiny | C=8 float32 | forward |")]
    assert [row.split(" | ")[4] for row in rows] == ["eager"]
    assert float(rows[0].split(" | ")[7]) > 2.0 and rows[0].endswith("SLOWER (> 1.02) |")
    assert "- torch eager: geometric mean" in text and "drift control" in text


def test_compare_table_pairs_rows_by_shape_mode_and_timer(tmp_path):
    for tree, liger in (("old", (1.0, 2.0)), ("new", (1.01, 1.5))):
        (tmp_path / tree).mkdir()
        graph, eager = liger
        records = [_record("poly_norm", "liger", "forward", "graph", [graph])]
        records.append(_record("poly_norm", "liger", "forward", "eager", [eager]))
        records.append(_record("poly_norm", "torch", "forward", "graph", [3.0]))
        (tmp_path / tree / "poly_norm.json").write_text(json.dumps(records))
    text = compare_trees.compare_table(tmp_path, 0.02)
    assert "| poly_norm | seeds | H=256 bfloat16 | forward | graph | 1 | 1.01 | 1.010 |  |" in text
    assert "| poly_norm | seeds | H=256 bfloat16 | forward | eager | 2 | 1.5 | 0.750 |  |" in text
    assert "- torch graph: geometric mean of new / old 1.000 over 1 rows" in text
    strict = compare_trees.compare_table(tmp_path, 0.005)
    assert "| forward | graph | 1 | 1.01 | 1.010 | SLOWER (> 1.00) |" in strict
    assert "liger: eager: 1 rows, 0 slower; graph: 1 rows, 1 slower" in strict


# --------------------------------------------------------------------------
# The demo


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA demo is the nox demo session's job")
def test_demo_cpu():
    assert demo.main([]) == 0


# --------------------------------------------------------------------------
# rope as models hand it over (the model_layout set)


def test_model_layout_set_holds_the_issue_shapes():
    sweeps = shapes.sweeps("rope", "model_layout")
    got = {(s.config["B"], s.x_values[0], s.config["n_q_heads"], s.config["n_kv_heads"], s.config["head_dim"])
           for s in sweeps if "doc_lens" not in s.config}  # fmt: skip
    assert got == {(1, 8192, 32, 8, 128), (2, 4096, 64, 8, 128), (4, 4096, 32, 8, 128), (8, 2048, 16, 16, 64),
                   (2, 4096, 28, 4, 128)}  # fmt: skip
    (packed,) = [s for s in sweeps if "doc_lens" in s.config]
    assert sum(packed.config["doc_lens"]) == packed.x_values[0] == 16384
    assert all(s.config["layout"] == "model" for s in sweeps)
    assert shapes.sweeps("poly_norm", "model_layout") == shapes.sweeps("group_norm", "model_layout") == []


def test_model_layout_inputs_are_views_of_projections_and_liger_takes_the_in_place_path():
    from bench import providers
    from liger_nn.rope import rotates_in_place

    for sweep in shapes.sweeps("rope", "tiny_model_layout"):
        shape = sweep.shape(sweep.x_values[0])
        built = providers.build("rope", "liger", shape, "cpu")
        q, k = providers.model_views(*built.args[:2], shape)
        assert q.shape == (shape["B"], shape["n_q_heads"], shape["T"], shape["head_dim"])
        assert q.stride()[1] == shape["head_dim"] and rotates_in_place(q, k)
        assert (
            nbytes.min_bytes("rope", shape, "forward")
            == 2 * (q.numel() + k.numel()) * 4 + 2 * built.args[2].numel() * 4
        )
        outs = built.forward()
        assert outs[0].data_ptr() == built.args[0].data_ptr(), "the liger provider did not rotate in place"


@ON_CPU
def test_harness_runs_the_model_layout_set_into_one_archive(tmp_path):
    import tarfile

    out, archive = tmp_path / "rope_layout", tmp_path / "rope_layout.tar.gz"
    argv = ["--device", "cpu", "--ops", "rope", "--sets", "tiny_model_layout", "--modes", "forward,full"]
    argv += ["--timer", "eager", "--providers", "liger,torch", "--rep", "1", "--no-plots", "--out", str(out)]
    assert run.main([*argv, "--archive", str(archive)]) == 0
    records = json.loads((out / "rope.json").read_text())
    _check_records(records, "rope", ("liger", "torch"), ("eager",), "tiny_model_layout")
    assert json.loads((out / "rope_skips.json").read_text()) == []
    text = (out / "summary.md").read_text()
    assert "| rope | tiny_model_layout | T=4 tiny float32 | forward |" in text
    assert "| rope | tiny_model_layout | T=8 packed float32 | full |" in text
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == sorted(
            ["rope_layout", *(f"rope_layout/{n}" for n in ("rope.json", "rope_skips.json", "summary.md"))]
        )


def test_the_model_layout_gpu_command_fits_in_four_minutes():
    args = run.parse_args(["--ops", "rope", "--sets", "model_layout", "--timer", "graph,eager"])
    assert run.estimate_seconds(args, shapes.sweeps("rope", "model_layout"), 10.0, 50.0) < 240


@ON_CPU
def test_harness_runs_the_row_norms(tmp_path):
    """rms_norm and layer_norm in the op table: the tiny set through liger and torch, values checked alike."""
    rc = run.main(["--device", "cpu", "--ops", "rms_norm,layer_norm", "--sets", "tiny", "--providers", "liger,torch",
                   "--rep", "1", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    for op in ("rms_norm", "layer_norm"):
        records = json.loads((tmp_path / f"{op}.json").read_text())
        _check_records(records, op, ("liger", "torch"), ("graph", "eager"), "tiny")
        assert json.loads((tmp_path / f"{op}_skips.json").read_text()) == []
    assert shapes.sweeps("rms_norm", "seeds")[0].x_values == (1024, 2048, 4096, 8192, 16384, 32768)
    assert shapes.sweeps("layer_norm", "seeds")[0].config["M"] == 4096
    assert nbytes.min_bytes("rms_norm", {"M": 2, "H": 8, "dtype": "bfloat16"}, "backward") == 3 * 16 * 2


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_probe_rms_norm_wide_candidates_match_the_float64_reference(op):
    """Every variant the wide-row probe times is a valid plan of the launch sequence, for both row norms."""
    from bench.lab import probe_rms_norm_wide as probe
    from bench.lab.probe_group_norm import max_rel_error
    from csrc_free_ops.rms_norm import launch
    from tests.helpers import DEVICE

    n_rows, n_cols = 6, 600
    x, w, b, dy = probe.inputs(op, n_rows, n_cols, DEVICE)
    assert (b is not None) == (op == "layer_norm")
    norm = probe.norm_of(op, 1e-6)
    y_ref, grads_ref = probe._reference(x, w, b, dy, norm)
    names = []
    for backward in (False, True):
        for name, p in probe._candidates(n_rows, n_cols, backward, 4):
            got = launch.backward(dy, x, w, b, norm, p)[: len(grads_ref)] if backward else (
                launch.forward(x, w, b, norm, p),)  # fmt: skip
            assert max_rel_error(got, grads_ref if backward else (y_ref,)) <= probe.ERROR_BOUND, name
            names.append((backward, name, p.whole_rows))
    assert {(b, whole) for b, _, whole in names} == {(False, True), (False, False), (True, True), (True, False)}


def test_a_probes_candidate_row_reads_ok_wrong_or_the_exception(monkeypatch, capsys):
    from bench.lab import probe_group_norm as probe

    monkeypatch.setattr(probe, "graph_ms", lambda fn, rep: 0.5)
    ref = (torch.ones(4, dtype=torch.float64),)
    assert probe.candidate_row("a | b", lambda: (torch.ones(4),), ref, 10**9, 5, 1e-3) == (
        "| a | b | ok (0.0e+00) | 500.0 | 2.000 |")  # fmt: skip
    assert "| WRONG (1.0e+00) |" in probe.candidate_row("a", lambda: (torch.zeros(4),), ref, 1, 5, 1e-3)

    def broken():
        raise RuntimeError("no such tile")

    assert probe.candidate_row("a", broken, ref, 1, 5, 1e-3) == "| a | RuntimeError | - | - |"
    assert capsys.readouterr().out.count("\n") == 3


def test_table_probes_share_one_command_line(monkeypatch, tmp_path, capsys):
    """--out and --rep reach the probe's table, head and body land in --out; without CUDA, 2 and nothing run."""
    from bench.lab import probe_ce_warps, probe_flce_chunks, probe_glu_tiles, probe_rms_norm_wide
    from bench.lab.probe_group_norm import run_table_probe

    seen = []

    def table(rep):
        seen.append(rep)
        return ["# head", ""], ["| row |"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_table_probe("bench.lab.x", "Doc.", "x.md", 7, [], table) == 2 and not seen
    assert "needs a CUDA device" in capsys.readouterr().err
    for probe in (probe_ce_warps, probe_flce_chunks, probe_glu_tiles, probe_rms_norm_wide):
        assert probe.main([]) == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    out = tmp_path / "t.md"
    assert run_table_probe("bench.lab.x", "Doc.", "x.md", 7, ["--out", str(out), "--rep", "3"], table) == 0
    assert seen == [3] and out.read_text() == "# head\n\n| row |\n"


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_probe_glu_tiles_candidates_and_compiled_formula_match_the_float64_reference(name):
    """Every tile the GLU probe times computes the op, and the formula it compiles as the rival is the op's."""
    from bench.lab import probe_glu_tiles as probe
    from bench.lab.probe_group_norm import max_rel_error
    from tests.helpers import DEVICE

    gate, up, dy = (torch.randn(3, 700, device=DEVICE) for _ in range(3))
    refs = probe._references(name, gate, up, dy)
    labels = []
    for label, direction, fn in probe._candidates(name, gate, up, dy, compile_too=False):
        assert max_rel_error(fn(), refs[direction]) <= 1e-5, (label, direction)
        labels.append(label)
    assert labels[:2] == ["plan", "plan"] and len(labels) == 2 * (1 + len(probe.TILES))
    activation = probe.ACTIVATIONS[name]
    a, da = probe._act_and_grad(gate.double(), activation)
    g = gate.double().requires_grad_(True)
    want = probe._act(g, activation)
    torch.testing.assert_close(a, want.detach())
    torch.testing.assert_close(da, torch.autograd.grad(want.sum(), g)[0])


def test_probe_ce_warps_candidates_and_compiled_gradient_match_the_float64_reference():
    """Every block and warp count the cross_entropy probe times gives the loss and the logits' gradient,
    and the gradient formula it compiles as the rival is cross_entropy's."""
    from bench.lab import probe_ce_warps as probe
    from bench.lab.probe_group_norm import max_rel_error
    from tests.helpers import DEVICE

    logits = torch.randn(5, 3000, device=DEVICE)
    target = torch.randint(0, 3000, (5,), device=DEVICE)
    refs, lse = probe._references(logits, target)
    labels = []
    for label, direction, fn in probe._candidates(logits, target, lse, compile_too=False):
        assert max_rel_error(fn(), refs[direction]) <= 1e-5, (label, direction)
        labels.append(label)
    assert labels[:2] == ["plan", "plan"] and "b4096/w32" in labels and "b4096/w4" in labels
    assert max_rel_error((probe._loss(logits, target),), refs["fwd"]) <= 1e-5
    assert max_rel_error((probe._gradient(logits, target),), refs["bwd"]) <= 1e-5


def test_probe_flce_chunks_candidates_match_the_float64_reference(monkeypatch):
    """Every chunk height the fused loss's probe times gives the loss and gradients of linear + cross_entropy."""
    from bench.lab import probe_flce_chunks as probe
    from bench.lab.probe_group_norm import max_rel_error
    from tests.helpers import DEVICE

    monkeypatch.setattr(probe, "CHUNK_ROWS", (8, 16, 64))
    x, w, t = probe._inputs(40, 16, 50, DEVICE, torch.float32)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    loss64 = torch.nn.functional.cross_entropy(x64 @ w64.T, t)
    refs = (loss64.detach(), *torch.autograd.grad(loss64, (x64, w64)))
    names = []
    for name, fn in probe._ours_candidates(x, w, t):
        assert max_rel_error(fn(), refs) <= 1e-5, name
        names.append(name)
    assert names[1:8] == ["rows/8", "rows/16", "rows/64", "recompute/plan", "recompute/8", "recompute/16",
                          "recompute/64"]  # fmt: skip
    assert [n for n in names if n.startswith("classes/")] == ["classes/64"] * 4  # 50 classes: one slice each
