"""Smoke test of the whole-step benchmark (bench.steps) on tiny configs under the interpreter."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os

import pytest
import torch

from bench import step_models, step_providers, steps

needs_diffusers = pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="diffusers not installed")


def test_steps_tiny_cpu_records_complete_and_finite(monkeypatch, tmp_path):
    # The ResNet stack's patch is per model; Llama's rotary swap is process-wide, so in eager mode each
    # provider's swap is applied around its own round only, the providers taking turns in a rotated order.
    modeling = importlib.import_module("transformers.models.llama.modeling_llama")
    original = modeling.apply_rotary_pos_emb
    seen = []
    real_round = steps._round

    def spy(p, n, device):
        if p.record["model"] == "llama":
            seen.append((p.provider, modeling.apply_rotary_pos_emb is original))
        return real_round(p, n, device)

    monkeypatch.setattr(steps, "_round", spy)
    argv = ["--device", "cpu", "--tiny", "--models", "resnet,llama", "--providers", "native,liger"]
    argv += ["--modes", "eager", "--rounds", "2", "--warmup", "1", "--out", str(tmp_path)]
    assert steps.main(argv) == 0
    assert seen == [("native", True), ("liger", False), ("liger", False), ("native", True)]
    assert modeling.apply_rotary_pos_emb is original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.json", "steps.log", "steps.md"]
    data = json.loads((tmp_path / "steps.json").read_text())
    records = data["records"]
    assert data["environment"]["optimizer"].startswith("SGD")
    assert {(r["model"], r["provider"]) for r in records} == {
        (m, p) for m in ("resnet", "llama") for p in ("native", "liger")
    }
    for r in records:
        assert r["status"] == "ok", r
        assert r["mode"] == "eager" and r["layout"] == "contiguous" and r["interleaved"]
        assert r["rounds"] == 2 and len(r["samples_ms"]) == 2
        for key in ("ms", "ms_min", "ms_max", "ms_iqr", "loss"):
            assert math.isfinite(r[key]), (key, r)
        assert 0 < r["ms_min"] <= r["ms"] <= r["ms_max"]
        assert r["kernel_ms"] is None and r["peak_mb"] is None  # CUDA only
        assert "host" not in r  # --host-profile is off by default
    # Same seed, same weights: the patched model's loss matches the model as is.
    for model in ("resnet", "llama"):
        loss = {r["provider"]: r["loss"] for r in records if r["model"] == model}
        assert loss["liger"] == pytest.approx(loss["native"], rel=1e-4, abs=1e-5)
    table = (tmp_path / "steps.md").read_text()
    assert "| resnet | (1, 8, 4, 4) | contiguous | eager |" in table
    assert "liger / native" in table
    assert "llama B1 S8 contiguous eager: native" in (tmp_path / "steps.log").read_text()


def test_steps_failure_is_a_row_not_a_crash(monkeypatch, tmp_path):
    def broken(provider, model, net, liger_off=(), upstream_off=()):
        raise RuntimeError("patch failed")

    monkeypatch.setattr(step_providers, "apply", broken)
    argv = ["--device", "cpu", "--tiny", "--models", "resnet", "--providers", "native", "--modes", "eager"]
    assert steps.main([*argv, "--rounds", "1", "--out", str(tmp_path)]) == 0
    (record,) = json.loads((tmp_path / "steps.json").read_text())["records"]
    assert record["status"] == "error" and "patch failed" in record["error"]
    assert "error: RuntimeError: patch failed" in (tmp_path / "steps.md").read_text()


def _upstream_dies(config, args, base_record, records_path):
    """Spawned in place of bench.steps._child: upstream's process dies as after an illegal memory access, the
    other providers run the real child (the child process imports bench.steps unpatched)."""
    if config[-1] != "upstream":
        return steps._child(config, args, base_record, records_path)
    os.write(2, b"RuntimeError: CUDA error: an illegal memory access was encountered\n")
    os.write(2, b"Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
    os._exit(134)


def test_compiled_provider_that_crashes_its_process_is_a_row(monkeypatch, tmp_path):
    # Upstream first: native, after it, must still run and be timed.
    monkeypatch.setattr(steps, "_child", _upstream_dies)
    argv = ["--device", "cpu", "--tiny", "--models", "resnet", "--providers", "upstream,native", "--modes", "compile"]
    assert steps.main([*argv, "--rounds", "1", "--warmup", "1", "--out", str(tmp_path)]) == 0
    crashed, native = json.loads((tmp_path / "steps.json").read_text())["records"]
    assert crashed["provider"] == "upstream" and crashed["status"] == "crashed" and crashed["exitcode"] == 134
    assert crashed["error"] == "exit code 134: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert native["provider"] == "native" and native["status"] == "ok", native
    assert native["mode"] == "compile" and not native["interleaved"] and math.isfinite(native["loss"])
    table = (tmp_path / "steps.md").read_text()
    assert "| resnet | (1, 8, 4, 4) | contiguous | compile | crashed | " in table
    assert "compile upstream: crashed: exit code 134: RuntimeError: CUDA error: an illegal memory" in table
    assert "compile: upstream crashed, native " in (tmp_path / "steps.log").read_text()
    # A crashed rival has no ratio: liger / upstream stays empty while liger / native is given.
    liger = dict(native, provider="liger")
    row = steps.markdown([crashed, native, liger], steps.PROVIDERS).splitlines()[2]
    assert row.split(" | ")[7:9] == ["1.000x", "–"], row


def test_liger_off_leaves_those_ops_as_they_are(tmp_path):
    argv = ["--device", "cpu", "--tiny", "--models", "llama", "--providers", "liger", "--modes", "eager"]
    argv += ["--liger-off", "fused_linear_cross_entropy,rms_norm", "--rounds", "1", "--warmup", "1"]
    assert steps.main([*argv, "--out", str(tmp_path)]) == 0
    (record,) = json.loads((tmp_path / "steps.json").read_text())["records"]
    assert record["status"] == "ok", record
    assert record["patch"] == "apply_liger_ops, fused_linear_cross_entropy=False, rms_norm=False"
    with pytest.raises(SystemExit):
        steps.parse_args(["--liger-off", "softmax"])
    assert steps.parse_args(["--liger-off", "layer_norm"]).liger_off == ["layer_norm"]  # a None default


def test_upstream_off_leaves_those_of_upstreams_swaps_out(monkeypatch):
    applied, undone = [], []

    def swap(keyword, model, net):
        applied.append(keyword)
        return lambda: undone.append(keyword)

    monkeypatch.setattr(step_providers, "_upstream_llm_swap", swap)
    off = ("fused_linear_cross_entropy",)
    undo, note = step_providers.apply("upstream", "llama", torch.nn.Linear(2, 2), upstream_off=off)
    assert applied == ["rope", "swiglu", "rms_norm"]
    assert (
        note
        == "liger_rotary_pos_emb, LigerSwiGLUMLP.forward and LigerRMSNorm.forward, fused_linear_cross_entropy=False"
    )
    undo()
    assert undone == ["rms_norm", "swiglu", "rope"]
    with pytest.raises(step_providers.NotApplicable, match="nothing to swap"):
        step_providers.apply("upstream", "llama", torch.nn.Linear(2, 2), upstream_off=tuple(applied) + off)
    with pytest.raises(SystemExit):
        steps.parse_args(["--upstream-off", "glu"])


def test_a_failed_upstream_swap_undoes_the_ones_before_it(monkeypatch):
    undone = []

    def swap(keyword, model, net):
        if keyword == "rms_norm":
            raise step_providers.NotApplicable("no norms")
        return lambda: undone.append(keyword)

    monkeypatch.setattr(step_providers, "_upstream_llm_swap", swap)
    with pytest.raises(step_providers.NotApplicable, match="no norms"):
        step_providers.apply("upstream", "qwen2", torch.nn.Linear(2, 2))
    assert undone == ["swiglu", "rope"]


def test_shapes_pick_among_each_models_shapes():
    args = steps.parse_args(["--models", "llama,qwen2", "--shapes", "2x4096", "--quick"])
    assert [steps.shapes_for(m, args) for m in args.models] == [((2, 4096),), ((2, 4096),)]
    args = steps.parse_args(["--models", "llama", "--shapes", "8x512,2x4096,3x3"])
    assert steps.shapes_for("llama", args) == ((8, 512), (2, 4096))
    for bad in (["--models", "llama", "--shapes", "2x100"], ["--models", "llama,unet", "--shapes", "2x4096"],
                ["--shapes", "2xa"], ["--shapes", "0x512"]):  # fmt: skip
        with pytest.raises(SystemExit):
            steps.parse_args(bad)


def test_steps_rejects_unknown_names():
    with pytest.raises(SystemExit):
        steps.parse_args(["--models", "gpt5"])
    with pytest.raises(SystemExit):
        steps.parse_args(["--modes", "max-autotune"])


@needs_diffusers
@pytest.mark.parametrize("model", ["unet", "vae"])
def test_diffusion_models_build_step_and_patch(model):
    # One native eager step of the tiny diffusers models, and apply_liger_ops swapping their GroupNorms
    # (the liger step itself runs in the manual --tiny run: minutes under the interpreter).
    (shape,) = step_models.CASES[model].tiny
    net, batch = step_models.build(model, shape, "cpu", torch.float32, tiny=True)
    step_models.to_layout(net, batch, "channels_last")
    loss = steps.make_step(model, net, batch, "eager")()
    assert math.isfinite(float(loss))
    norms = sum(type(m) is torch.nn.GroupNorm for m in net.modules())
    undo, _ = step_providers.apply("liger", model, net)
    assert sum(type(m) is torch.nn.GroupNorm for m in net.modules()) == 0 < norms
    undo()
    assert sum(type(m) is torch.nn.GroupNorm for m in net.modules()) == norms


def test_host_profile_records_host_side_of_a_step(tmp_path):
    argv = ["--device", "cpu", "--tiny", "--models", "llama", "--providers", "native", "--modes", "eager"]
    assert steps.main([*argv, "--rounds", "1", "--warmup", "1", "--host-profile", "--out", str(tmp_path)]) == 0
    (record,) = json.loads((tmp_path / "steps.json").read_text())["records"]
    host = record["host"]
    assert "profiler_error" not in host, host
    assert 0 < host["host_ms"] and len(host["host_ms_samples"]) == 5
    assert host["host_ms_profiled"] > 0
    assert host["sync_calls_per_step"] == {} and host["dtoh_copies_per_step"] == 0  # CPU: no CUDA calls
    assert 0 < len(host["top_self_cpu"]) <= 15
    assert all(a["name"] != "bench.steps:step" and a["self_cpu_ms_per_step"] >= 0 for a in host["top_self_cpu"])
    assert "| llama | B1 S8 | contiguous | eager | native |" in (tmp_path / "steps.md").read_text()
    assert "ms/step to enqueue" in (tmp_path / "steps.log").read_text()


def test_top_kernels_rank_summed_time_per_step_and_table_lists_them():
    events = [("gemm_a", 300.0), ("tri|ton_b", 100.0), ("gemm_a", 300.0), ("memset", 5.0), ("tri|ton_b", 100.0)]
    top = steps.top_kernels(events, steps=2, top=2)
    assert top == [{"name": "gemm_a", "ms": 0.3, "calls": 1.0}, {"name": "tri|ton_b", "ms": 0.1, "calls": 1.0}]
    long_name = "k" * (steps.KERNEL_NAME + 40)
    assert steps.top_kernels([(long_name, 1.0)], steps=1)[0]["name"] == "k" * steps.KERNEL_NAME
    row = dict(model="llama", label="B8 S512", layout="contiguous", mode="compile", provider="liger", top_kernels=top)
    lines = steps.kernel_table([row, dict(row, provider="native", top_kernels=[])]).splitlines()
    assert lines[2] == "| llama | B8 S512 | contiguous | compile | liger | 0.300 | 1 | gemm_a |"
    assert lines[3] == "| llama | B8 S512 | contiguous | compile | liger | 0.100 | 1 | tri/ton_b |"
    assert lines[4] == ""


def test_cudagraph_skips_counted_and_worded():
    from torch._dynamo.utils import counters

    log = logging.getLogger(steps._CudagraphSkips._LOGGER)
    with steps._CudagraphSkips() as skips:
        log.warning("skipping cudagraphs due to mutated inputs (1 instances)")
        counters["inductor"]["cudagraph_skips"] += 1
    assert skips.count == 1 and skips.messages == ["skipping cudagraphs due to mutated inputs (1 instances)"]
    with steps._CudagraphSkips() as none:
        log.warning("some other cudagraphs message")
    assert none.count == 0 and none.messages == []
    row = dict(model="resnet", label="(4, 8)", layout="contiguous", mode="reduce-overhead", provider="upstream")
    row |= dict(status="ok", ms=1.0, ms_min=1.0, ms_max=1.0, cudagraph_skips=skips.messages)
    assert "upstream: Inductor ran without CUDA graphs (skipping cudagraphs due to mutated" in steps.markdown(
        [row], ["upstream"]
    )


def test_memory_peak_replays_the_allocator_trace():
    from bench import memory_peak

    def alloc(addr, size, fn):
        frames = [{"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"},
                  {"filename": "/x/transformers/modeling_llama.py", "line": 7, "name": fn}]  # fmt: skip
        return {"action": "alloc", "addr": addr, "size": size, "frames": frames}

    events = [
        alloc(1, 100, "mlp"),
        alloc(2, 300, "attn"),
        {"action": "free_requested", "addr": 1, "size": 100},  # still counted until the free completes
        alloc(3, 50, "norm"),
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "free_completed", "addr": 2, "size": 300},
        alloc(4, 400, "head"),  # 450 live: equal to the peak so far, which keeps its own set
        alloc(5, 10, "loss"),  # 460: the peak
    ]
    peak, blocks = memory_peak.live_at_peak(events)
    assert peak == 460 and sorted(b["addr"] for b in blocks) == [3, 4, 5]
    got = memory_peak.summary(peak, blocks, top=2)
    assert [b["origin"] for b in got["largest"]] == ["transformers/modeling_llama.py:7 head",
                                                     "transformers/modeling_llama.py:7 norm"]  # fmt: skip
    assert memory_peak.origin([]) == "no stack recorded"


def test_memory_peak_is_cuda_only(tmp_path):
    argv = ["--device", "cpu", "--tiny", "--models", "resnet", "--providers", "native", "--modes", "eager"]
    assert steps.main([*argv, "--memory-peak", "--rounds", "1", "--warmup", "1", "--out", str(tmp_path)]) == 0
    (record,) = json.loads((tmp_path / "steps.json").read_text())["records"]
    assert record["status"] == "ok" and record["memory_peak"] is None
