"""Compile every kernel the launchers launch for a CUDA target, with no GPU.

The Triton interpreter runs kernels as NumPy, so it accepts code that the
real compiler rejects (a loop-carried variable changing type, say).  This
script runs each backend's launchers on CPU tensors with
``JITFunction.run`` (what ``kernel[grid](...)`` calls) replaced by a
recorder, then hands every distinct
(kernel, argument types, constexprs, options) it saw to ``triton.compile``
for an sm_90 target (Triton's bundled ptxas; nothing runs).  The NPU
launchers' kernels are compiled for that target too: triton-ascend's
compiler is not here, but the language front end, where such errors
surface, is shared.  Run it as a
subprocess with TRITON_INTERPRET unset (``tests/test_cuda_compile.py``):
kernels jitted for the interpreter cannot be compiled.  It also runs torch's
wrap_triton analysis of which tensors each kernel writes (``written_inputs``).

    python -m tests.cuda_compile_check      # exit status 1 on a compile error
    python -m tests.cuda_compile_check --scalars   # only the float64 launches' scalar types
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import traceback
from typing import Any

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)
_POINTER = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float64: "*fp64",
            torch.int32: "*i32", torch.int64: "*i64"}  # fmt: skip
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_cooperative_grid")
CUDA_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
CUOBJDUMP = os.path.join(CUDA_BIN, "cuobjdump")
# Compile workers at most (one per core up to this).
MAX_WORKERS = 8


def _arg_type(a: Any) -> str:
    if isinstance(a, torch.Tensor):
        return _POINTER[a.dtype]
    if isinstance(a, bool):
        return "i1"
    if isinstance(a, int):
        return "i32" if -(2**31) <= a < 2**31 else "i64"
    if isinstance(a, float):
        return "fp32"
    raise TypeError(f"no Triton type for a runtime argument of type {type(a).__name__}")


def jit_types(kernel: Any, args: tuple, meta: dict) -> list[str]:
    """The type Triton's JIT gives each parameter of ``kernel[grid](*args,
    **meta)``: its own binder (``JITFunction.run`` builds the compiled
    signature from it), so a parameter's annotation counts as it does there."""
    backend = triton.compiler.make_backend(TARGET)
    binder = triton.runtime.jit.create_function_from_signature(kernel.signature, kernel.params, backend)
    return [spec[0] for spec in binder(*args, **meta)[1]]


def _signature_type(a: Any, jit_type: str) -> str:
    """The compile check's type of a runtime argument: Triton's own, except
    that an int Triton would specialize as a constant (1) compiles as the
    general int, so one compile covers every value."""
    return _arg_type(a) if jit_type == "constexpr" else jit_type


def run_recording(record, run) -> None:
    """run() with ``JITFunction.run`` (what ``kernel[grid](...)`` calls) replaced by ``record``."""
    jit = triton.runtime.jit.JITFunction
    original = jit.run
    jit.run = record
    try:
        run()
    finally:
        jit.run = original


def record_launches(run) -> dict[tuple, tuple]:
    """{key: (kernel, signature, constexprs, options)} of every launch ``run()`` makes."""
    seen: dict[tuple, tuple] = {}

    def record(kernel, *args: Any, grid: Any, warmup: bool, **meta: Any) -> None:
        names = kernel.arg_names
        runtime = [n for n in names if n not in meta]
        types = dict(zip(names, jit_types(kernel, args, meta), strict=True))
        signature = {n: _signature_type(a, types[n]) for n, a in zip(runtime, args, strict=True)}
        constexprs = {n: v for n, v in meta.items() if n not in LAUNCH_OPTIONS}
        signature.update({n: "constexpr" for n in constexprs})
        signature = {n: signature[n] for n in names}
        options = {n: v for n, v in meta.items() if n in LAUNCH_OPTIONS}
        key = (kernel.__name__, tuple(signature.values()), tuple(sorted(constexprs.items())),
               tuple(sorted(options.items())))  # fmt: skip
        seen.setdefault(key, (kernel, signature, constexprs, options))

    run_recording(record, run)
    return seen


def compile_all(seen: dict[tuple, tuple]) -> list[str]:
    """Compile each recorded launch; the failures, described.  The compiles
    are independent and each takes a core for a second or more, so they are
    spread over the machine's cores (forked workers that inherit ``seen``)."""
    global _ITEMS
    _ITEMS = list(seen.items())
    workers = min(len(os.sched_getaffinity(0)), MAX_WORKERS, len(_ITEMS))
    if workers < 2:
        return [f for i in range(len(_ITEMS)) for f in _compile_one(i)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return [f for found in pool.map(_compile_one, range(len(_ITEMS)), chunksize=4) for f in found]


# What compile_all hands its forked workers: (key, (kernel, signature, constexprs, options)) pairs.
_ITEMS: list[tuple] = []


def _compile_one(i: int) -> list[str]:
    key, (kernel, signature, constexprs, options) = _ITEMS[i]
    names = kernel.arg_names
    src = ASTSource(kernel, signature, {(names.index(n),): v for n, v in constexprs.items()})
    try:
        compiled = triton.compile(src, target=TARGET, options=options)
    except Exception:
        return [f"{key}\n{traceback.format_exc(limit=1)}"]
    return _group_norm_one_pass_spills(key, compiled) + _approximate_float64(key, compiled)


# PTX's approximate float64 instructions: ~2^-35 relative where the float64 references expect ~1e-15.
APPROXIMATE_F64 = re.compile(r"\b(rsqrt|rcp|sqrt|div|ex2|lg2|sin|cos)\.approx[.\w]*\.f64\b")


# A reciprocal seed refined by Newton's method: r' = r + e * r, an fma taking the seed as both multiplicand and addend.
_NEWTON_UPDATE = r"fma\.rn\.f64\s+%\w+,\s*%\w+,\s*{r},\s*{r};"


def _approximate_float64(key: tuple, compiled: Any) -> list[str]:
    """A float64 kernel must compute in float64: Triton lowers
    tl.math.rsqrt of a float64 to rsqrt.approx.f64, which missed the
    float64 references on the H100 (csrc_free_ops/kernel_math.py).
    libdevice's float64 log (the losses' lse) seeds a reciprocal with
    rcp.approx.ftz.f64 and refines it to full precision; such a refined
    seed is not reported."""
    ptx = compiled.asm["ptx"]
    found = set()
    for m in APPROXIMATE_F64.finditer(ptx):
        seed = re.match(r"\s*(%\w+)", ptx[m.end() :])
        refined = m.group(1) == "rcp" and seed and re.search(_NEWTON_UPDATE.format(r=re.escape(seed.group(1))), ptx)
        if not refined:
            found.add(m.group(0))
    return [f"{key}: approximate float64 instructions {sorted(found)}"] if found else []


def _group_norm_one_pass_spills(key: tuple, compiled: Any) -> list[str]:
    """group_norm's one-pass kernels hold their tiles in registers across a
    barrier: one that spills to local memory (cuobjdump's STACK) loses the
    point, so a plan that makes one is a failure to retune (plan.py)."""
    if not key[0].endswith("one_pass_kernel") or not os.path.exists(CUOBJDUMP):
        return []
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    stack = re.search(r"STACK:(\d+)", usage)
    if stack is None or int(stack.group(1)) == 0:
        return []
    return [f"{key}: spills ({usage.strip().splitlines()[-1].strip()})"]


def _launch_every_path() -> None:
    """Each op's CUDA and NPU launchers over the shapes and options that select
    each of their kernels and constexpr branches, in every dtype they take."""
    from csrc_free_ops.poly_norm import launch as pn_launch
    from csrc_free_ops.poly_norm import plan as pn_plan

    # poly_norm: every data dtype, parameters in x's dtype and in float32 (mixed precision).
    for dt in (torch.bfloat16, torch.float32, torch.float64):
        for pdt in {dt, torch.float32}:
            w3, b1 = torch.ones(3, dtype=pdt), torch.zeros(1, dtype=pdt)
            for cols in (64, 3000, 9000):  # one warp, several warps, column blocks
                x = torch.zeros(8, cols, dtype=dt)
                pn_launch.cuda_forward(x, w3, b1, 1e-6)
                pn_launch.cuda_backward(x, x, w3, 1e-6)
                pn_launch.npu_forward(x, w3, b1, 1e-6)
                pn_launch.npu_backward(x, x, w3, 1e-6)
            x = torch.zeros(8, 64, dtype=dt)
            grid_stride = pn_plan.Plan(True, 2, 64, 2)  # the NPU's grid-stride tile with CUDA's compiler
            pn_launch.forward(x, w3, b1, 1e-6, grid_stride)

    _launch_rope_paths()

    _launch_group_norm_paths()

    _launch_glu_paths()

    _launch_row_norm_paths()
    _launch_loss_paths()


def _launch_glu_paths() -> None:
    """swiglu, geglu and geglu_exact: the CUDA and NPU entries, contiguous (one row) and
    fused halves (row strides), in the data dtypes, gate and up of one dtype and
    of two (promotion); the NPU's grid-stride plan with CUDA's compiler."""
    from csrc_free_ops.glu import launch as glu_launch
    from csrc_free_ops.glu import plan as glu_plan

    for activation in ("silu", "gelu_tanh", "gelu"):
        for gdt, udt in ((torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                         (torch.float32, torch.float32), (torch.float64, torch.float64),
                         (torch.bfloat16, torch.float32)):  # fmt: skip
            contiguous = (torch.zeros(8, 64, dtype=gdt), torch.zeros(8, 64, dtype=udt))
            halves = (torch.zeros(8, 128, dtype=gdt)[:, :64], torch.zeros(8, 128, dtype=udt)[:, 64:])
            for gate, up in (contiguous, halves):
                dy = torch.zeros(gate.shape, dtype=torch.promote_types(gdt, udt))
                glu_launch.cuda_forward(gate, up, activation)
                glu_launch.cuda_backward(dy, gate, up, activation)
                glu_launch.npu_forward(gate, up, activation)
                glu_launch.npu_backward(dy, gate, up, activation)
            grid_stride = glu_plan.Plan(2, 32, 2)
            glu_launch.forward(*halves, activation, grid_stride)
            glu_launch.backward(dy, *halves, activation, grid_stride)


def _launch_row_norm_paths() -> None:
    """rms_norm (both casting modes, an offset, no weight) and layer_norm
    (weight and bias each optional): CUDA and NPU entries over tile, several
    tile rows, wide whole rows (the float64 backward unpipelined) and column-blocked shapes, in every
    data dtype with parameters in x's dtype and in float32; one grid-stride forward plan."""
    from csrc_free_ops.layer_norm import launch as ln_launch
    from csrc_free_ops.rms_norm import launch as rn_launch
    from csrc_free_ops.rms_norm import plan as rn_plan

    for dt in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        for pdt in {dt, torch.float32}:
            shapes = [(300, 128), (8, 3000), (4, 9000)]  # stacked rows, one row a tile, a wide whole row
            if pdt == torch.float32 and dt in (torch.bfloat16, torch.float64):
                shapes += [(2, 20000), (2, 40000)]  # backward column blocks, then both directions'
            for rows, cols in shapes:
                x = torch.zeros(rows, cols, dtype=dt)
                w = torch.ones(cols, dtype=pdt)
                for options in ((w, 1e-6, 0.0, "llama"), (w, 1e-6, 1.0, "gemma"), (None, 1e-6, 0.0, "llama")):
                    for prefix in ("cuda", "npu"):
                        getattr(rn_launch, f"{prefix}_forward")(x, *options)
                        getattr(rn_launch, f"{prefix}_backward")(x, x, *options)
                for params in ((w, w), (w, None), (None, w), (None, None)):
                    for prefix in ("cuda", "npu"):
                        getattr(ln_launch, f"{prefix}_forward")(x, *params, 1e-5)
                        getattr(ln_launch, f"{prefix}_backward")(x, x, *params, 1e-5)
        x = torch.zeros(8, 64, dtype=dt)
        grid_stride = rn_plan.Plan(True, 2, 64, 2)
        rn_launch.forward(x, torch.ones(64), None, rn_launch.RowNorm(1e-6, 0.0, True, False), grid_stride)


def _launch_loss_paths() -> None:
    """cross_entropy's kernels through both ops' CUDA entries (fused_linear_cross_entropy's backward runs
    in place): the options' constexpr branches in bf16, float32 and float64, short rows and 32768-column
    blocks of 32 warps."""
    from csrc_free_ops.cross_entropy import launch as ce_launch
    from csrc_free_ops.fused_linear_cross_entropy import launch as flce_launch

    plain = (-100, 0.0, "mean", 0.0, None)
    every = (-100, 0.1, "none", 1e-4, 30.0)
    cases = ((torch.bfloat16, 64, plain, False), (torch.bfloat16, 40000, every, True),
             (torch.float32, 64, every, True), (torch.float64, 64, every, True))  # fmt: skip
    for dt, cols, options, weighted in cases:
        rows = 4
        logits, target = torch.zeros(rows, cols, dtype=dt), torch.zeros(rows, dtype=torch.long)
        weight = torch.ones(cols) if weighted else None
        grad_loss = torch.ones(rows if options[2] == "none" else (), dtype=dt)
        _, _, lse = ce_launch.cuda_forward(logits, target, weight, *options)
        ce_launch.cuda_backward(grad_loss, logits, target, lse, weight, *options)
        x, head = torch.zeros(rows, 8, dtype=dt), torch.zeros(cols, 8, dtype=dt)
        flce_launch.cuda_backward(grad_loss, x, head, target, lse, None, weight, *options, [True, True, False])


def _launch_group_norm_paths() -> None:
    """group_norm: the CUDA and NPU entries, the plan of each path built for a
    small x (both split merges, looped, one-pass teams with and without
    prefetch), with and without parameters, in the data dtypes with float32
    and own-dtype parameters; and the plans an H200 gets at the diffusion and
    large shapes (one-pass teams with their warps and cooperative launch),
    which compile_all checks for register spills; each of these also with
    activation="silu" where the first two parameter cases and bfloat16 go."""
    from csrc_free_ops.group_norm import launch as gn_launch
    from csrc_free_ops.group_norm import plan as gn_plan
    from csrc_free_ops.group_norm import tiles
    from csrc_free_ops.group_norm.plan import Problem
    from csrc_free_ops.group_norm.residency import CudaDevice

    reduce = (2, 4, 2, ())

    def plans(pb: Problem) -> list:
        block_c, block_hw, chunk = tiles.split_geometry(pb, 16, 16, 64)
        return [
            gn_plan.whole(pb, 3, (), reduce),
            gn_plan.looped(pb, 64, 3, None, None, ("evict_last", "evict_first"), reduce),
            gn_plan.split(pb, block_c, block_hw, chunk, 5, 4, True, reduce),  # finalize
            gn_plan.split(pb, block_c, 64, 64, 5, 64, True, reduce),  # fused
        ] + ([] if pb.channels_last or pb.itemsize == 8 else [  # one-pass: float32 math only
            gn_plan.one_pass(pb, 4, 64, 1, 4, True, 16, reduce=reduce),  # masked tiles (cpg 4, hw 40)
            gn_plan.one_pass(pb, 4, 8, 1, 4, False, 16, reduce=reduce),
        ])  # fmt: skip

    # Each parameter branch (both, none, weight only, bias only) once, across the data dtypes;
    # one-pass kernels (float32 math only) in the first two, which take both sides of each branch.
    cases = [(torch.bfloat16, torch.float32, "both"), (torch.float32, torch.float32, "none"),
             (torch.bfloat16, torch.bfloat16, "weight"), (torch.float64, torch.bfloat16, "both"),
             (torch.float16, torch.float16, "bias")]  # fmt: skip
    # The first two cases also channels-last (x read in place: stride_c == 1, its own compile; no one-pass plans).
    for i, (dt, pdt, affine) in enumerate(cases):
        w = torch.ones(16, dtype=pdt) if affine in ("both", "weight") else None
        b = torch.ones(16, dtype=pdt) if affine in ("both", "bias") else None
        for cl in (False, True) if i < 2 else (False,):
            x = torch.zeros(2, 40, 16, dtype=dt).movedim(-1, 1) if cl else torch.zeros(2, 16, 40, dtype=dt)
            for backward, activation in itertools.product((False, True), ("none", "silu") if i < 2 else ("none",)):
                pb = Problem(2, 16, 40, 4, x.element_size(), w is not None, b is not None, backward, activation, cl)
                # one-pass backward with an activation: not planned (plan._cuda_one_pass says why)
                for p in plans(pb) if i < 2 and not (backward and activation != "none") else plans(pb)[:4]:
                    if backward:
                        gn_launch.backward(x, x, 4, w, b, 1e-5, p)
                    else:
                        gn_launch.forward(x, 4, w, b, 1e-5, p)
        # The nhwc kernels (channels-last only) in every case: each dtype and parameter branch.
        x = torch.zeros(2, 40, 16, dtype=dt).movedim(-1, 1)
        for backward, activation in itertools.product((False, True), ("none", "silu")):
            pb = Problem(2, 16, 40, 4, x.element_size(), w is not None, b is not None, backward, activation, True)
            team = [gn_plan.nhwc_team(pb, 8, 8, 5, True, reduce)]  # 2 groups a block, 5 members a team
            if dt != torch.float64:  # one-pass kernels: float32 math only
                team.append(gn_plan.nhwc_one_pass(pb, 8, 8, 1, 4, 16, None, reduce))
            for p in [gn_plan.nhwc(pb, *tiles.nhwc_geometry(pb, 8, 64, 8), 5, 4, True, reduce), *team]:
                if backward:
                    gn_launch.backward(x, x, 4, w, b, 1e-5, p)
                else:
                    gn_launch.forward(x, 4, w, b, 1e-5, p)
        x = torch.zeros(2, 16, 40, dtype=dt)
        for activation in ("none", "silu") if i < 2 else ("none",):
            gn_launch.cuda_forward(x, 4, w, b, 1e-5, activation)
            gn_launch.cuda_backward(x, x, 4, w, b, 1e-5, activation)
            gn_launch.npu_forward(x, 4, w, b, 1e-5, activation)
            gn_launch.npu_backward(x, x, 4, w, b, 1e-5, activation)

    h200 = CudaDevice(sms=132, cooperative=True)
    shapes = [(2, 320, 4096), (8, 640, 1024), (16, 1280, 256), (4, 512, 16384), (1, 128, 262144), (8, 512, 4096)]
    w = torch.ones(16, dtype=torch.float32)
    seen = set()  # one compile per one-pass tile (plans differing only in BLOCK_P compile alike)
    for dt, activation, cl in ((torch.bfloat16, "none", False), (torch.float32, "none", False),
                               (torch.bfloat16, "silu", False), (torch.bfloat16, "silu", True)):  # fmt: skip
        x = torch.zeros(2, 40, 16, dtype=dt).movedim(-1, 1) if cl else torch.zeros(2, 16, 40, dtype=dt)
        for n, c, hw in shapes:
            for backward in (False, True):
                pb = Problem(n, c, hw, 32, x.element_size(), True, True, backward, activation, cl)
                p = gn_plan.cuda(pb, h200)
                ce = dict(p.steps[0].constexprs)
                tile = (dt, backward, activation, cl, ce.get("BLOCK_C"), ce.get("BLOCK_HW"), ce.get("PREFETCH"),
                        ce.get("EVEN"))  # fmt: skip
                if p.path == "one_pass" and tile in seen:
                    continue
                seen.add(tile)
                if backward:
                    gn_launch.backward(x, x, 4, w, w, 1e-5, p)
                else:
                    gn_launch.forward(x, 4, w, w, 1e-5, p)
                # The nhwc one-pass candidates at these shapes (bench.lab.probe_group_norm_nhwc), for their spills.
                team = gn_plan.cuda_nhwc_one_pass(pb, h200, p) if cl else None
                team_tile = None if team is None else ("team", team.steps[0].constexprs)
                if team_tile is not None and team_tile not in seen:
                    seen.add(team_tile)
                    if backward:
                        gn_launch.backward(x, x, 4, w, w, 1e-5, team)
                    else:
                        gn_launch.forward(x, 4, w, w, 1e-5, team)


def _launch_rope_paths() -> None:
    """rope's entries (CUDA and NPU plans) in every data dtype, with tables in
    the data's dtype and in float32 (AMP), full and partial rotary; and the
    heads loop (a plan whose head blocks hold fewer heads than there are)."""
    from csrc_free_ops.rope import RopeOptions
    from csrc_free_ops.rope import launch as rope_launch
    from csrc_free_ops.rope import plan as rope_plan

    for dt in (torch.bfloat16, torch.float32, torch.float64):
        q, k = torch.zeros(2, 4, 6, 64, dtype=dt), torch.zeros(2, 2, 6, 64, dtype=dt)
        for table_dt in {dt, torch.float32}:
            for rot in (64, 32):  # full and partial rotary
                cos = sin = torch.zeros(1, 6, rot, dtype=table_dt)
                for prefix in ("cuda", "npu"):
                    getattr(rope_launch, f"{prefix}_forward")(q, k, cos, sin)
                    getattr(rope_launch, f"{prefix}_backward")(q, k, cos, sin)
                    getattr(rope_launch, f"{prefix}_forward_")(q, k, cos, sin)
        heads_loop = rope_plan.Plan(block_qh=2, block_kh=1, programs=12, num_warps=1)
        rope_launch.forward(q, k, cos, sin, heads_loop)
        # HF's layout (heads adjacent): its plan, and two rows a program (ROWS > 1).
        q_hf, k_hf = q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(1, 2).contiguous().transpose(1, 2)
        rope_launch.cuda_forward_(q_hf, k_hf, cos, sin)
        two_rows = rope_plan.Plan(block_qh=4, block_kh=2, programs=6, num_warps=4, split_pairs=True, rows_per_program=2)
        rope_launch.forward(q_hf, k_hf, cos, sin, two_rows)
        # The options: every position source and pair layout, single tensors, packed tokens.
        table = torch.zeros(16, 32, dtype=dt)
        ids, mrope_ids = torch.zeros(2, 6, dtype=torch.int64), torch.zeros(3, 6, dtype=torch.int32)
        packed = torch.zeros(6, 2, 64, dtype=dt)
        calls = [
            ((packed, None), {"cu_seqlens": torch.tensor([0, 2, 6], dtype=torch.int32), "pairs": "interleaved"}),
            ((q, None), {"position_ids": ids, "pairs": "interleaved_to_halves"}),
            ((q, k), {"position_ids": mrope_ids, "mrope_section": [8, 4, 4], "mrope_interleaved": True}),
            ((q[:1], k[:1]), {"position_ids": mrope_ids, "mrope_section": [8, 4, 4], "pairs": "interleaved"}),
        ]
        for (x, y), options in calls:
            bundled = RopeOptions(**options)
            for prefix in ("cuda", "npu"):
                getattr(rope_launch, f"{prefix}_forward")(x, y, table, table, bundled)
                getattr(rope_launch, f"{prefix}_backward")(x, y, table, table, bundled)
                getattr(rope_launch, f"{prefix}_forward_")(x, y, table, table, bundled)


# The kernels' parameters that hold an op's inputs: no kernel writes them.
INPUT_PARAMS = frozenset({"x", "weight", "bias", "grad_out", "q", "k", "cos", "sin", "position_ids", "cu_seqlens",
                          "gate", "up"})  # fmt: skip


def record_first_calls(run) -> dict[str, tuple]:
    """{kernel name: (kernel, {parameter: argument})} of the first launch of each kernel ``run()`` makes."""
    first: dict[str, tuple] = {}

    def record(kernel, *args: Any, grid: Any, warmup: bool, **meta: Any) -> None:
        runtime = [n for n in kernel.arg_names if n not in meta]
        arguments = dict(zip(runtime, args, strict=True)) | {n: v for n, v in meta.items() if n in kernel.arg_names}
        first.setdefault(kernel.__name__, (kernel, arguments))

    run_recording(record, run)
    return first


class _Sm90Driver:
    """The active Triton driver, answering sm_90 as the current target (no GPU here)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def get_current_target(self) -> GPUTarget:
        return TARGET

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def written_inputs(first: dict[str, tuple]) -> list[str]:
    """Under torch.compile the ops' launches go through wrap_triton, and
    torch's analysis of the kernel's TTIR decides which tensors it writes: it
    counts every tensor that a stored-to address depends on, helper calls'
    arguments included.  An input counted as written is cloned before the
    launch, and a graph input counted so keeps Inductor from CUDA graphs
    ("skipping cudagraphs due to mutated inputs", seen on the H100 in
    reduce-overhead steps).  The kernels whose analysis writes an input."""
    from torch._higher_order_ops import triton_kernel_wrap as wrap

    driver = triton.runtime.driver
    real = driver._active  # None here: no GPU driver is active, and asking for one raises
    driver.set_active(_Sm90Driver(real))
    failures = []
    try:
        for name, (kernel, arguments) in sorted(first.items()):
            if hasattr(wrap, "identify_accessed_tensors"):  # torch 2.13 and newer
                writes = wrap.identify_accessed_tensors(kernel, dict(arguments), {}).read_writes.writes
                written = {dep.name for dep in writes}
            else:
                written = set(wrap.identify_mutated_tensors(kernel, dict(arguments), {}))
            if written & INPUT_PARAMS:
                failures.append(f"{name}: torch's wrap_triton analysis finds it writes {sorted(written)}")
    finally:
        driver._active = real
    return failures


FLOAT_SCALARS = ("fp16", "bf16", "fp32", "fp64")


def _float64_launch(signature: dict, constexprs: dict) -> bool:
    return constexprs.get("COMPUTE") == tl.float64 or "*fp64" in signature.values()


def float64_scalars(seen: dict[tuple, tuple]) -> list[str]:
    """A launch that computes in float64 (COMPUTE, or any float64 tensor)
    must get its float scalars (eps, ...) as fp64: Triton types a Python
    float argument fp32 unless its parameter says otherwise, and a float64
    result would then carry eps rounded to float32.  One line per such
    launch that gets one narrower."""
    failures = []
    for key, (_kernel, signature, constexprs, _options) in seen.items():
        narrow = [f"{n} as {t}" for n, t in signature.items() if t in FLOAT_SCALARS and t != "fp64"]
        if _float64_launch(signature, constexprs) and narrow:
            failures.append(f"{key[0]} {dict(sorted(constexprs.items()))}: float64 launch takes {', '.join(narrow)}")
    return failures


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("run with TRITON_INTERPRET unset: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    os.environ.setdefault("CSRC_FREE_OPS_NPU_PROFILE", "Ascend910B4")
    seen = record_launches(_launch_every_path)
    scalars = float64_scalars(seen)
    float64 = sum(_float64_launch(signature, constexprs) for _kernel, signature, constexprs, _o in seen.values())
    print(f"float64 launches: {float64 - len(scalars)} of {float64} take their float scalars as fp64")
    if "--scalars" in sys.argv[1:]:  # the scalar types only, without compiling (seconds, not minutes)
        for f in scalars:
            print("FAILED", f, file=sys.stderr)
        return 1 if scalars else 0
    failures = scalars + compile_all(seen)
    kernels = sorted({key[0] for key in seen})
    print(f"compiled {len(seen) - len(failures)} of {len(seen)} specializations of {len(kernels)} kernels for {TARGET}")
    written = written_inputs(record_first_calls(_launch_every_path))
    print(f"torch's wrap_triton analysis: {len(kernels) - len(written)} of {len(kernels)} kernels write no input")
    failures += written
    for f in failures:
        print("FAILED", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
