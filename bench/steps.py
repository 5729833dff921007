"""Whole training steps of real models, per provider and mode.

    python -m bench.steps [--models unet,vae,resnet,llama,qwen2,llama3] [--providers native,upstream,liger]
                          [--modes eager,compile,reduce-overhead] [--layout contiguous,channels_last]
                          [--rounds 7] [--steps 5] [--warmup 3] [--all-shapes] [--quick] [--shapes 2x4096]
                          [--liger-off rms_norm,...] [--upstream-off fused_linear_cross_entropy,...]
                          [--device cuda|cpu] [--tiny] [--host-profile] [--out bench/out/steps]

One step: ``loss = f(model, batch)`` (forward and loss, see bench/step_models.py),
``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``.
The optimizer is plain SGD (lr 1e-4, no momentum, foreach) for every provider,
so its cost is the same small share of every step.  Modes: ``eager``;
``compile``, ``torch.compile(f, dynamic=False)``; ``reduce-overhead``, the
same with ``mode="reduce-overhead"`` (CUDA graphs; every step starts with
``torch.compiler.cudagraph_mark_step_begin()``).  ``f`` is the one compiled
callable: forward and loss in one graph, backward by autograd (AOTAutograd's
compiled backward), the optimizer eager.

Per (model, shape, layout, mode), every provider gets a fresh model built from
the same seed (same weights, same batch).  Each provider is patched, compiled
and warmed up (``--warmup`` steps, at least 3 under reduce-overhead so that
CUDA-graph recording is done), then on CUDA:

* ``peak_mb``: torch.cuda.max_memory_allocated over one step, less what was
  allocated before this provider's model was built (model, gradients, the
  step's activations and workspace, CUDA-graph pools);
* ``kernel_ms``: the summed duration of the device-side events (kernels,
  memsets, copies) torch.profiler records over ``PROFILE_STEPS`` steps, per step,
  and ``top_kernels``: the ones with the most time;
* ``ms``: wall time per step, ``--steps`` back-to-back steps between two
  synchronizes, one sample per round; median, min, max and IQR over
  ``--rounds`` rounds.  For the diffusion models and the ResNet stack every
  provider's patch is per model, so the providers take turns within each
  round (interleaved, the host-speed drift cancels).  Llama and Qwen2's rotary
  swaps are process-wide: in eager mode the providers are interleaved too,
  each provider's swap applied just before its round and undone after it
  (each provider still has its own model instance); in the compiled modes
  each provider runs all its rounds in turn, because the compiled code guards
  on the swapped module global and swapping it between rounds would
  recompile.  ``interleaved`` in each record says which.

A step of these sizes is far larger than L2, so no flush is done between steps.
A provider that raises (patching, compiling, OOM, a non-finite loss) becomes an
error row; a provider that does not apply becomes a skip row with the reason.
In the compiled modes each provider runs in a spawned child process of its own,
so one that kills its process (an illegal memory access poisons the CUDA
context) becomes a crashed row (how it exited, the last error line on its
stderr) and the other providers still run.
A reduce-overhead row whose graph Inductor ran without CUDA graphs ("skipping
cudagraphs due to ...", e.g. upstream's LigerGroupNorm: Dynamo cannot analyse
its Triton kernel, so it takes every input as mutated) says so in the notes.

``--host-profile`` (off by default) adds, per provider, the host's side of a
step (bench/host_profile.py): the time the Python step takes to return without
synchronizing, the CUDA calls per step that can block the host (synchronizes,
memcpys, device-to-host copies), kernel launches per step and the top 15 ops
by self CPU time; into each record's ``host``, the log and a table in steps.md.

Output in ``--out``: ``steps.json`` (environment + records),
``steps.md`` (the headline table: per model/shape/layout/mode, native /
upstream / liger ms, liger's ratio to native and to upstream, kernel ms, peak
MB; notes; the host table), ``steps.log`` (the lines printed, without the
libraries' warnings) and, on CUDA, ``kernels.md``: each provider's top
kernels by GPU time per step, from the same profiler run as ``kernel_ms``
(``top_kernels`` in each record), which says where a step's GPU time went.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import math
import multiprocessing
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench import host_profile, memory_peak, step_models, step_providers
from bench.step_models import CASES, CONV_MODELS, MODELS, shape_label
from bench.step_providers import PROVIDERS, NotApplicable

MODES = ("eager", "compile", "reduce-overhead")
LAYOUTS = ("contiguous", "channels_last")
PROFILE_STEPS = 3
TOP_KERNELS = 12  # per provider and config, into kernels.md
KERNEL_NAME = 90
LR = 1e-4
# Shapes the default run leaves out for time (--all-shapes adds them): a second UNet compile per provider and mode.
EXTRA_SHAPES = {"unet": ((8,),)}

# H200 costs for the run-time estimate, per provider, from the first H200 run (torch 2.11, Triton 3.6;
# warmup_s and ms in steps.json).  BUILD_S: building the model, the peak-memory step and the profiler run
# (resnet ~5 s, llama ~12 s measured; unet, vae and llama3 guesses).  EAGER_S: eager warm-up, i.e. Triton's JIT of
# the swapped kernels (resnet: native 1.1, upstream 14.6, liger 2.5 s; llama: 3.0, 1.5, 1.3 s).  COMPILE_S:
# compile and (reduce-overhead) CUDA-graph recording: resnet measured under reduce-overhead (native 22,
# upstream 32, liger 7 s); llama is a lower bound (three providers did not finish compiling within ~75 s);
# unet and vae are not measured yet.  STEP_MS: eager ms per step per batch element (resnet 2.0-2.4, llama
# 4.8-6.3 measured).
BUILD_S = {"unet": 15.0, "vae": 10.0, "resnet": 5.0, "llama": 12.0, "qwen2": 12.0, "llama3": 14.0}
EAGER_S = {"unet": 20.0, "vae": 15.0, "resnet": 6.0, "llama": 2.0, "qwen2": 2.0, "llama3": 2.0}
COMPILE_S = {"unet": 90.0, "vae": 60.0, "resnet": 20.0, "llama": 45.0, "qwen2": 45.0, "llama3": 45.0}
STEP_MS = {"unet": 25.0, "vae": 20.0, "resnet": 2.4, "llama": 6.0, "qwen2": 6.0, "llama3": 9.0}


@dataclass
class Prepared:
    provider: str
    note: str
    net: Any
    step: Callable[[], torch.Tensor]
    undo: Callable[[], None]
    record: dict[str, Any]
    samples: list[float] = field(default_factory=list)
    # For process-wide patches timed interleaved: re-applies the patch for one round, returns its undo.
    swap: Callable[[], Callable[[], None]] | None = None


def _nothing() -> None:
    pass


class _CudagraphSkips:
    """Counts Inductor's "skipping cudagraphs due to ..." while active (counter and log message), so a
    reduce-overhead row whose graph ran without CUDA graphs says so."""

    _LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"

    def __init__(self) -> None:
        self.count = 0
        self.messages: list[str] = []
        self._handler = logging.Handler(logging.WARNING)
        self._handler.emit = self._emit  # type: ignore[method-assign]

    def _emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "skipping cudagraphs" in text and text not in self.messages:
            self.messages.append(text)

    @staticmethod
    def _counter() -> int:
        try:
            from torch._dynamo.utils import counters

            return int(counters["inductor"]["cudagraph_skips"])
        except Exception:  # noqa: BLE001 - a torch without the counter reports no skips
            return 0

    def __enter__(self) -> _CudagraphSkips:
        self._start = self._counter()
        logging.getLogger(self._LOGGER).addHandler(self._handler)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger(self._LOGGER).removeHandler(self._handler)
        self.count = max(self._counter() - self._start, len(self.messages))


def _say(args, text: str) -> None:
    """Print, and append to ``--out``/steps.log."""
    print(text, flush=True)
    log = getattr(args, "log_path", None)
    if log is not None:
        with open(log, "a") as f:
            f.write(text + "\n")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def make_step(model: str, net, batch: dict, mode: str) -> Callable[[], torch.Tensor]:
    """One training step as a callable returning the (detached) loss."""
    loss = step_models.loss_fn(model)
    if mode == "compile":
        loss = torch.compile(loss, dynamic=False)
    elif mode == "reduce-overhead":
        loss = torch.compile(loss, mode="reduce-overhead", dynamic=False)
    elif mode != "eager":
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=LR, foreach=True)
    mark = mode == "reduce-overhead"

    def step() -> torch.Tensor:
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        value = loss(net, batch)
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return value.detach()

    return step


def _kernels(step: Callable[[], torch.Tensor], device: str) -> tuple[float | None, list[dict[str, Any]]]:
    """kernel_ms and top_kernels, or (None, []) off CUDA or when the profiler fails."""
    if not device.startswith("cuda"):
        return None, []
    try:
        return _profiled_kernels(step, device)
    except Exception as e:  # noqa: BLE001 - a profiler failure must not cost the timing
        print(f"  torch.profiler failed ({type(e).__name__}: {e}); kernel_ms left out")
        return None, []


def _profiled_kernels(step: Callable[[], torch.Tensor], device: str) -> tuple[float, list[dict[str, Any]]]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILE_STEPS):
            step()
        _sync(device)
    events = [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]
    return sum(us for _, us in events) / 1e3 / PROFILE_STEPS, top_kernels(events, PROFILE_STEPS)


def top_kernels(events: Sequence[tuple[str, float]], steps: int, top: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The ``top`` device-side events by summed time, per step: name (cut to KERNEL_NAME), ms, calls."""
    ms: dict[str, float] = {}
    calls: dict[str, int] = {}
    for name, us in events:
        key = name[:KERNEL_NAME]
        ms[key] = ms.get(key, 0.0) + us / 1e3 / steps
        calls[key] = calls.get(key, 0) + 1
    ranked = sorted(ms, key=ms.__getitem__, reverse=True)[:top]
    return [{"name": k, "ms": round(ms[k], 4), "calls": calls[k] / steps} for k in ranked]


def _peak_mb(step: Callable[[], torch.Tensor], device: str, base: int) -> float | None:
    if not device.startswith("cuda"):
        return None
    _sync(device)
    torch.cuda.reset_peak_memory_stats()
    step()
    _sync(device)
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _round(p: Prepared, steps: int, device: str) -> float:
    """One timed sample of ``p``: ``steps`` back-to-back steps between two synchronizes, ms per step."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        p.step()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3 / steps


def _prepare(
    model: str, shape, layout: str, mode: str, provider: str, args, base_record: dict, per_round: bool = False
) -> Prepared | dict[str, Any]:
    """Build, patch, compile and warm one provider; a record dict if it is skipped or fails.

    ``per_round``: the provider's patch is process-wide and the providers are interleaved, so the patch is
    undone once the provider is prepared and re-applied around each of its rounds (``Prepared.swap``)."""
    record = dict(base_record, provider=provider)
    device = args.device
    base = torch.cuda.memory_allocated() if device.startswith("cuda") else 0
    undo: Callable[[], None] = _nothing
    net = None
    try:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        net, batch = step_models.build(model, shape, device, dtype, args.tiny)
        step_models.to_layout(net, batch, layout)
        undo, note = step_providers.apply(provider, model, net, tuple(args.liger_off), tuple(args.upstream_off))
        step = make_step(model, net, batch, mode)
        warmup = max(args.warmup, 3 if mode == "reduce-overhead" else 1)
        skips = _CudagraphSkips()
        t0 = time.perf_counter()
        with skips:
            for _ in range(warmup):
                loss = step()
            _sync(device)
        record["warmup_s"] = round(time.perf_counter() - t0, 2)
        if skips.count:
            record["cudagraph_skips"] = skips.messages or [f"{skips.count} cudagraph skip(s)"]
        loss_value = float(loss.float().cpu())
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss is {loss_value} after warm-up")
        record["loss"] = loss_value
        record["patch"] = note
        record["peak_mb"] = _peak_mb(step, device, base)
        record["kernel_ms"], record["top_kernels"] = _kernels(step, device)
        if args.memory_peak:
            record["memory_peak"] = memory_peak.record(step, device)
            if record["memory_peak"] is not None:
                _say(args, f"{provider}: " + memory_peak.describe(record["memory_peak"]))
        if args.host_profile:
            record["host"] = host_profile.profile(step, device, PROFILE_STEPS)
            _say(args, host_profile.summary(f"{provider}:", record["host"]))
        swap = None
        if per_round:
            undo()
            undo = _nothing
            net_ = net

            def swap() -> Callable[[], None]:
                return step_providers.apply(provider, model, net_, tuple(args.liger_off), tuple(args.upstream_off))[0]

        return Prepared(provider, note, net, step, undo, record, swap=swap)
    except (NotApplicable, step_models.ModelUnavailable) as why:
        undo()
        return dict(record, status="skip", reason=str(why))
    except Exception as e:  # noqa: BLE001 - one failure is a row, not the end of the run
        undo()
        del net
        _free(device)
        return dict(record, status="error", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc(limit=6))


def _finish(p: Prepared) -> dict[str, Any]:
    s = sorted(p.samples)
    if not s:
        return dict(p.record, status="error", error=p.record.get("error", "no timed rounds"))
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0], s[0], s[0]]
    return dict(
        p.record,
        status="ok",
        ms=statistics.median(s),
        ms_min=s[0],
        ms_max=s[-1],
        ms_iqr=q[2] - q[0],
        rounds=len(s),
        samples_ms=s,
    )


def _time_group(group: list[Prepared], args) -> None:
    """``--rounds`` rounds; within a round each provider runs ``--steps`` steps, in an order rotated per round.
    A provider with a ``swap`` has its process-wide patch applied for its round only."""
    live = list(group)
    for r in range(args.rounds):
        order = live[r % len(live) :] + live[: r % len(live)] if live else []
        for p in order:
            try:
                undo = p.swap() if p.swap else _nothing
                try:
                    p.samples.append(_round(p, args.steps, args.device))
                finally:
                    undo()
            except Exception as e:  # noqa: BLE001
                p.record["error"] = f"{type(e).__name__} in round {r}: {e}"
                live.remove(p)
                p.samples.clear()


def run_config(model: str, shape, layout: str, mode: str, providers: Sequence[str], args) -> list[dict[str, Any]]:
    base_record = {"model": model, "shape": list(shape), "label": shape_label(model, shape), "layout": layout}
    base_record["mode"] = mode
    # Providers interleave their rounds in eager mode only.  Compiled modes run each provider's rounds in turn:
    # compiled code guards on a process-wide swap, and providers sharing one dynamo cache recompile the same
    # step function against each other's modules.
    interleaved = mode == "eager"
    base_record["interleaved"] = interleaved
    if interleaved:
        records = _run_group(model, shape, layout, mode, providers, args, base_record)
    else:
        records = [r for p in providers for r in _run_isolated(model, shape, layout, mode, p, args, base_record)]
    order = {name: i for i, name in enumerate(providers)}
    return sorted(records, key=lambda r: order[r["provider"]])


def _run_group(
    model: str, shape, layout: str, mode: str, providers: Sequence[str], args, base_record: dict
) -> list[dict[str, Any]]:
    """Prepare ``providers`` in this process and time them together, with a dynamo reset before and after."""
    per_instance = step_providers.per_instance(model)
    records: list[dict[str, Any]] = []
    torch._dynamo.reset()
    prepared: list[Prepared] = []
    for name in providers:
        got = _prepare(model, shape, layout, mode, name, args, base_record, per_round=not per_instance)
        if isinstance(got, Prepared):
            prepared.append(got)
        else:
            records.append(got)
    try:
        _time_group(prepared, args)
    finally:
        for p in prepared:
            records.append(_finish(p))
            p.undo()
        prepared.clear()
        torch._dynamo.reset()
        _free(args.device)
    return records


def _run_isolated(
    model: str, shape, layout: str, mode: str, provider: str, args, base_record: dict
) -> list[dict[str, Any]]:
    """``provider`` alone in a spawned child process (``_child``): an illegal memory access poisons the CUDA
    context for the rest of its process, so a provider that causes one must not take the others' rows with it.
    The child's records, or one ``crashed`` record when it died before writing them."""
    with tempfile.TemporaryDirectory(prefix="bench-steps-") as tmp:
        records_path, stderr_path = Path(tmp) / "records.json", Path(tmp) / "stderr.txt"
        config = (model, shape, layout, mode, provider)
        child = multiprocessing.get_context("spawn").Process(
            target=_child, args=(config, args, base_record, str(records_path)), name=f"bench.steps {provider}"
        )
        try:
            with _stderr_to(stderr_path):
                child.start()
            child.join()
        finally:
            if child.is_alive():
                child.terminate()
                child.join()
        stderr = stderr_path.read_text(errors="replace")
        sys.stderr.write(stderr)
        sys.stderr.flush()
        # Records written before a crash (e.g. at the CUDA context's teardown) are complete: keep them.
        if records_path.exists():
            return json.loads(records_path.read_text())
        error = f"{_exit_reason(child.exitcode)}: {_error_line(stderr)}"
        return [dict(base_record, provider=provider, status="crashed", error=error, exitcode=child.exitcode)]


def _child(config: tuple, args, base_record: dict, records_path: str) -> None:
    """The spawned process of ``_run_isolated``: one provider's group, its records written to ``records_path``."""
    model, shape, layout, mode, provider = config
    _raise_recompile_limits()
    records = _run_group(model, shape, layout, mode, [provider], args, base_record)
    part = Path(records_path + ".part")
    part.write_text(json.dumps(records))
    # A whole file or none: the parent reads a missing file as a crash.
    os.replace(part, records_path)


@contextlib.contextmanager
def _stderr_to(path: Path):
    """File descriptor 2 (Python's and the C++ runtime's stderr) goes to ``path`` while active, so a child
    started meanwhile inherits it from its first line on."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


_ERROR_WORD = re.compile(r"(?i)error\b")


def _error_line(stderr: str) -> str:
    """The last line of ``stderr`` that names an error, else its last line: CUDA's error messages end with
    advice ("Compile with `TORCH_USE_CUDA_DSA` ...")."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "nothing on stderr"
    return next((line for line in reversed(lines) if _ERROR_WORD.search(line)), lines[-1])


def shapes_for(model: str, args) -> tuple[tuple[int, ...], ...]:
    case = CASES[model]
    if args.shapes:
        return _chosen_shapes(model, args.shapes)
    if args.tiny:
        return case.tiny
    if args.quick:
        return case.quick
    return case.shapes + (EXTRA_SHAPES.get(model, ()) if args.all_shapes else ())


def layouts_for(model: str, args) -> list[str]:
    return list(args.layout) if model in CONV_MODELS else ["contiguous"]


def estimate_s(args) -> float:
    """Rough H200 seconds for the run (compiles dominate)."""
    total = 0.0
    for model in args.models:
        for shape in shapes_for(model, args):
            step_s = STEP_MS[model] * shape[0] / 1e3
            for _ in layouts_for(model, args):
                for mode in args.modes:
                    warm_s = EAGER_S[model] if mode == "eager" else COMPILE_S[model]
                    steps = args.warmup + 1 + PROFILE_STEPS + args.rounds * args.steps
                    if args.host_profile:
                        steps += host_profile.HOST_STEPS + PROFILE_STEPS
                    total += len(args.providers) * (BUILD_S[model] + warm_s + steps * step_s)
    return total


def _git_commit() -> str:
    """The commit measured: $BENCH_COMMIT, which a device chain sets from the COMMIT file it carries
    (the copy's git metadata can be older than its files, bench/lab/README.md), else git's HEAD."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def _environment(args) -> dict[str, Any]:
    env = {
        "commit": _git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": args.device,
        "optimizer": f"SGD(lr={LR}, foreach=True)",
        # what compiled graphs make of the liger ops (registrations/decompose.py)
        "decompose": os.environ.get("CSRC_FREE_OPS_DECOMPOSE", "1"),
    }
    if args.device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
    for pkg in ("triton", "transformers", "diffusers", "liger_kernel"):
        try:
            from importlib.metadata import version

            env[pkg] = version(pkg.replace("_", "-"))
        except Exception:  # noqa: BLE001
            env[pkg] = None
    return env


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def _ok(row: dict[str, dict], provider: str, name: str) -> Any:
    r = row.get(provider)
    return r.get(name) if r and r.get("status") == "ok" else None


def _ratio(row: dict[str, dict], a: str, b: str) -> str:
    x, y = _ok(row, a, "ms"), _ok(row, b, "ms")
    return f"{x / y:.3f}x" if x and y else "–"


def _cell(row: dict[str, dict], provider: str) -> str:
    r = row.get(provider)
    if r is None:
        return ""
    if r["status"] == "ok":
        return f"{r['ms']:.2f} ({r['ms_min']:.2f}–{r['ms_max']:.2f})"
    return r["status"]


def markdown(records: list[dict[str, Any]], providers: Sequence[str]) -> str:
    """The headline table, one row per (model, shape, layout, mode); skips and errors listed below it."""
    by: dict[tuple, dict[str, dict]] = {}
    notes: list[str] = []
    for r in records:
        key = (r["model"], r["label"], r["layout"], r["mode"])
        by.setdefault(key, {})[r["provider"]] = r
        if r["status"] != "ok":
            notes.append(f"{' '.join(key)} {r['provider']}: {r['status']}: {r.get('reason') or r.get('error')}")
        elif r.get("cudagraph_skips"):
            why = "; ".join(r["cudagraph_skips"])
            notes.append(f"{' '.join(key)} {r['provider']}: Inductor ran without CUDA graphs ({why})")
    head = ["model", "shape", "layout", "mode"] + [f"{p} ms" for p in providers]
    head += ["liger / native", "liger / upstream"]
    head += [f"{p} kernel ms" for p in providers] + [f"{p} peak MB" for p in providers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, row in by.items():
        cells = list(key) + [_cell(row, p) for p in providers]
        cells += [_ratio(row, "liger", "native"), _ratio(row, "liger", "upstream")]
        cells += [_fmt(_ok(row, p, "kernel_ms"), ".2f") for p in providers]
        cells += [_fmt(_ok(row, p, "peak_mb"), ".0f") for p in providers]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    text += "\n\nms per step: median over rounds (min–max); a ratio below 1 means liger's step is faster.\n"
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    host = [r for r in records if r["status"] == "ok" and r.get("host")]
    if host:
        text += "\n" + host_table(host)
    return text


def host_table(records: list[dict[str, Any]]) -> str:
    """``--host-profile``: per provider, the host's time to enqueue a step next to the step's wall and kernel time."""
    head = ["model", "shape", "layout", "mode", "provider", "wall ms", "kernel ms", "host ms", "sync-like calls"]
    head += ["DtoH copies", "launches", "top self-CPU op"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        h = r["host"]
        syncs = ", ".join(f"{k} {v:g}" for k, v in (h.get("sync_calls_per_step") or {}).items()) or "0"
        top = h.get("top_self_cpu") or []
        first = f"{top[0]['name']} {top[0]['self_cpu_ms_per_step']:.2f} ms" if top else "–"
        cells = [r["model"], r["label"], r["layout"], r["mode"], r["provider"], f"{r['ms']:.2f}"]
        cells += [_fmt(r.get("kernel_ms")), f"{h['host_ms']:.2f}", syncs]
        cells += [_fmt(h.get("dtoh_copies_per_step"), "g"), _fmt(h.get("launches_per_step"), "g"), first]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n\nPer step.  host ms: time for the step to return, without synchronizing; "
    text += "sync-like calls: CUDA runtime/driver calls that can block the host (bench/host_profile.py).\n"
    return text


def kernel_table(records: list[dict[str, Any]]) -> str:
    """Where each provider's GPU time per step goes: its top kernels, per config."""
    lines = ["| model | shape | layout | mode | provider | kernel ms | calls | kernel |", "|---" * 8 + "|"]
    for r in records:
        for k in r.get("top_kernels") or ():
            cells = [r["model"], r["label"], r["layout"], r["mode"], r["provider"], f"{k['ms']:.3f}"]
            cells += [f"{k['calls']:g}", k["name"].replace("|", "/")]
            lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + f"\n\nPer step, from one torch.profiler run of {PROFILE_STEPS} steps; the top "
    return (
        text + f"{TOP_KERNELS} device-side events by summed time per provider, names cut to {KERNEL_NAME} characters.\n"
    )


def _shape_list(text: str) -> tuple[tuple[int, ...], ...]:
    """'2x4096,8x512' -> ((2, 4096), (8, 512))."""
    try:
        shapes = tuple(tuple(int(n) for n in item.split("x")) for item in text.split(",") if item.strip())
    except ValueError:
        shapes = ()
    if not shapes or any(n < 1 for shape in shapes for n in shape):
        raise argparse.ArgumentTypeError(f"shapes {text!r}: positive sizes joined by x, shapes by commas (2x4096)")
    return shapes


def _known_shapes(model: str) -> tuple[tuple[int, ...], ...]:
    """A model's full-size and extra shapes: what its config is sized for."""
    return CASES[model].shapes + EXTRA_SHAPES.get(model, ())


def _chosen_shapes(model: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """The --shapes a model takes: those among its known shapes."""
    return tuple(shape for shape in shapes if shape in _known_shapes(model))


def _csv(choices: Sequence[str], what: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad or text!r}; choose from {', '.join(choices)}")
        return items

    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=_csv(MODELS, "model"), default=list(MODELS))
    p.add_argument("--providers", type=_csv(PROVIDERS, "provider"), default=list(PROVIDERS))
    p.add_argument("--modes", type=_csv(MODES, "mode"), default=list(MODES))
    p.add_argument(
        "--memory-peak", action="store_true",
        help="per provider: the largest blocks alive at one step's memory peak (CUDA; bench/memory_peak.py)",
    )  # fmt: skip
    p.add_argument(
        "--liger-off", type=lambda text: _csv(step_providers.liger_keywords(), "apply_liger_ops keyword")(text),
        default=[],
        help="apply_liger_ops keywords passed as False for the liger provider, e.g. fused_linear_cross_entropy",
    )  # fmt: skip
    p.add_argument(
        "--upstream-off", type=_csv(tuple(step_providers.UPSTREAM_LLM_SWAPS), "upstream keyword"), default=[],
        help="apply_liger_kernel_to_* keywords the upstream provider leaves out of an LLM, e.g. "
        "fused_linear_cross_entropy (with the same --liger-off: both libraries' same set)",
    )  # fmt: skip
    p.add_argument(
        "--layout", type=_csv(LAYOUTS, "layout"), default=["contiguous"], help="for unet, vae and resnet only"
    )
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7, --quick 3)")
    p.add_argument("--steps", type=int, default=None, help="steps per round (default 5, cpu 1)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps (compilation included)")
    p.add_argument("--all-shapes", action="store_true", help="add " + str(EXTRA_SHAPES))
    p.add_argument("--quick", action="store_true", help="one shape per model, 3 rounds")
    p.add_argument(
        "--shapes", type=_shape_list, default=None,
        help="only these of each model's shapes, e.g. 2x4096 (LLMs: batch x sequence); a model with none is an error",
    )  # fmt: skip
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny configs of every model (the CPU smoke test)")
    p.add_argument("--out", default="bench/out/steps", help="output folder (steps.json, steps.md, steps.log)")
    p.add_argument(
        "--host-profile",
        action="store_true",
        help="per provider: host ms per step, sync-like CUDA calls, top CPU ops (bench/host_profile.py)",
    )
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    for model in args.models if args.shapes else ():
        if not _chosen_shapes(model, args.shapes):
            p.error(f"{model} runs none of --shapes {args.shapes}; its shapes: {_known_shapes(model)}")
    if args.rounds is None:
        args.rounds = 3 if (args.quick or args.tiny) else 7
    if args.steps is None:
        args.steps = 5 if args.device.startswith("cuda") else 1
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--rounds and --steps must be at least 1, --warmup at least 0")
    if args.device == "cpu" and "reduce-overhead" in args.modes:
        print("reduce-overhead needs CUDA graphs: left out on cpu")
        args.modes = [m for m in args.modes if m != "reduce-overhead"]
    return args


def _raise_recompile_limits() -> None:
    # Each provider compiles the same loss function's code object once per group; never fall back to eager.
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _raise_recompile_limits()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.log_path = out / "steps.log"
    args.log_path.write_text("")
    env = _environment(args)
    _say(
        args,
        f"bench.steps on {env.get('gpu', args.device)}, commit {env['commit']}, torch {env['torch']}, "
        f"triton {env['triton']}, transformers {env['transformers']}, diffusers {env['diffusers']}, "
        f"liger_kernel {env['liger_kernel']}",
    )
    if args.device.startswith("cuda") and not args.tiny:
        env["estimate_s"] = round(estimate_s(args))
        _say(args, f"expected run time on an H200: about {env['estimate_s'] / 60:.1f} min (compiles dominate)")
    records: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for model in args.models:
        for shape in shapes_for(model, args):
            for layout in layouts_for(model, args):
                for mode in args.modes:
                    t0 = time.perf_counter()
                    try:
                        got = run_config(model, shape, layout, mode, args.providers, args)
                    except step_models.ModelUnavailable as why:
                        got = [
                            dict(model=model, shape=list(shape), label=shape_label(model, shape), layout=layout)
                            | dict(mode=mode, provider=p, status="skip", reason=str(why))
                            for p in args.providers
                        ]
                    records += got
                    summary = ", ".join(
                        f"{r['provider']} {r['ms']:.2f} ms" if r["status"] == "ok" else f"{r['provider']} {r['status']}"
                        for r in got
                    )
                    label = f"{model} {shape_label(model, shape)} {layout} {mode}"
                    _say(args, f"{label}: {summary} [{time.perf_counter() - t0:.0f} s]")
                    (out / "steps.json").write_text(json.dumps({"environment": env, "records": records}, indent=1))
    env["wall_s"] = round(time.perf_counter() - t_start, 1)
    (out / "steps.json").write_text(json.dumps({"environment": env, "records": records}, indent=1))
    table = markdown(records, args.providers)
    header = f"# Whole training steps, commit {env['commit']}, {env['date']}\n\n"
    header += ", ".join(f"{k} {v}" for k, v in env.items() if k not in ("commit", "date")) + "\n\n"
    (out / "steps.md").write_text(header + table)
    if any(r.get("top_kernels") for r in records):
        (out / "kernels.md").write_text(header + kernel_table(records))
    _say(args, f"\nwrote {out / 'steps.json'}, {out / 'steps.md'} and {args.log_path} ({env['wall_s']} s)\n")
    _say(args, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
