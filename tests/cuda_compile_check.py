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
kernels jitted for the interpreter cannot be compiled.

    python -m tests.cuda_compile_check      # exit status 1 on a compile error
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)
_POINTER = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float64: "*fp64",
            torch.int32: "*i32", torch.int64: "*i64"}  # fmt: skip
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


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


def record_launches(run) -> dict[tuple, tuple]:
    """{key: (kernel, signature, constexprs, options)} of every launch ``run()`` makes."""
    seen: dict[tuple, tuple] = {}

    def record(kernel, *args: Any, grid: Any, warmup: bool, **meta: Any) -> None:
        names = kernel.arg_names
        runtime = [n for n in names if n not in meta]
        signature = {n: _arg_type(a) for n, a in zip(runtime, args, strict=True)}
        constexprs = {n: v for n, v in meta.items() if n not in LAUNCH_OPTIONS}
        signature.update({n: "constexpr" for n in constexprs})
        signature = {n: signature[n] for n in names}
        options = {n: v for n, v in meta.items() if n in LAUNCH_OPTIONS}
        key = (kernel.__name__, tuple(signature.values()), tuple(sorted(constexprs.items())),
               tuple(sorted(options.items())))  # fmt: skip
        seen.setdefault(key, (kernel, signature, constexprs, options))

    jit = triton.runtime.jit.JITFunction
    original = jit.run
    jit.run = record
    try:
        run()
    finally:
        jit.run = original
    return seen


def compile_all(seen: dict[tuple, tuple]) -> list[str]:
    failures = []
    for key, (kernel, signature, constexprs, options) in seen.items():
        names = kernel.arg_names
        src = ASTSource(kernel, signature, {(names.index(n),): v for n, v in constexprs.items()})
        try:
            triton.compile(src, target=TARGET, options=options)
        except Exception:
            failures.append(f"{key}\n{traceback.format_exc(limit=1)}")
    return failures


def _launch_every_path() -> None:
    """Each op's CUDA and NPU launchers over the shapes and options that select
    each of their kernels and constexpr branches, in every dtype they take."""
    from csrc_free_ops.group_norm import cuda as gn_cuda
    from csrc_free_ops.group_norm import npu as gn_npu
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

    for dt in (torch.bfloat16, torch.float32):
        w = torch.ones(16, dtype=torch.float32)
        gn_x = torch.zeros(2, 16, 40, dtype=dt)
        for opts in ({}, {"whole_group_tile": 0, "looped_groups": True},
                     {"whole_group_tile": 0, "looped_groups": False, "target_items": 1},
                     {"tile": 16, "target_items": 64, "looped_groups": False}):  # fmt: skip
            for weight, bias in ((w, w), (None, None), (w, None)):
                gn_cuda.forward(gn_x, 4, weight, bias, 1e-5, **opts)
                gn_cuda.backward(gn_x, gn_x, 4, weight, bias, 1e-5, **opts)
        gn_npu.forward(gn_x, 4, w, w, 1e-5)
        gn_npu.backward(gn_x, gn_x, 4, w, w, 1e-5)


def _launch_rope_paths() -> None:
    """rope's entries (CUDA and NPU plans) in every data dtype, with tables in
    the data's dtype and in float32 (AMP), full and partial rotary; and the
    heads loop (a plan whose head blocks hold fewer heads than there are)."""
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
        # The options: every position source and pair layout, single tensors, packed tokens.
        table = torch.zeros(16, 32, dtype=dt)
        ids, mrope_ids = torch.zeros(2, 6, dtype=torch.int64), torch.zeros(3, 6, dtype=torch.int32)
        packed = torch.zeros(6, 2, 64, dtype=dt)
        calls = [
            ((None, packed), {"cu_seqlens": torch.tensor([0, 2, 6], dtype=torch.int32), "pairs": "interleaved"}),
            ((q, None), {"position_ids": ids, "pairs": "interleaved_to_halves"}),
            ((q, k), {"position_ids": mrope_ids, "mrope_section": [8, 4, 4], "mrope_interleaved": True}),
            ((q[:1], k[:1]), {"position_ids": mrope_ids, "mrope_section": [8, 4, 4], "pairs": "interleaved"}),
        ]
        for (x, y), options in calls:
            for prefix in ("cuda", "npu"):
                getattr(rope_launch, f"{prefix}_forward")(x, y, table, table, **options)
                getattr(rope_launch, f"{prefix}_backward")(x, y, table, table, **options)
                getattr(rope_launch, f"{prefix}_forward_")(x, y, table, table, **options)


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("run with TRITON_INTERPRET unset: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    os.environ.setdefault("CSRC_FREE_OPS_NPU_PROFILE", "Ascend910B4")
    seen = record_launches(_launch_every_path)
    failures = compile_all(seen)
    kernels = sorted({key[0] for key in seen})
    print(f"compiled {len(seen) - len(failures)} of {len(seen)} specializations of {len(kernels)} kernels for {TARGET}")
    for f in failures:
        print("FAILED", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
