"""Phase 1 of the Ascend compile check: record what the NPU launchers launch.

Runs in the project's own environment (standard torch and Triton), with
TRITON_INTERPRET unset.  Every NPU entry in ``entries()`` is called on CPU
tensors over the shapes it lists, under every simulated profile
(``PROFILES``: the four 910B chips and a tiny unified buffer) and every
dtype set (``DTYPES``), with ``JITFunction.run`` replaced by a recorder, as
``tests/cuda_compile_check.py`` does for CUDA.  Each launch becomes a spec:
kernel (module and name), argument types, constexprs, and the argument
specialization triton-ascend 3.2's JIT would derive from the same values
(16-divisible ints and pointers, ints equal to 1, which become constants),
since the compiled code depends on it.

Each case also runs with the unified buffer doubled (``role: "next"``): the
launches whose specs differ from the case's own are its next power-of-two
tiles, which phase 2 (``tests/npu_compile_check.py``, in a venv with
triton-ascend) expects to overflow the real chip.

    python -m tests.npu_launch_specs OUT.json
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

# (profile name, CSRC_FREE_OPS_NPU_UB_BYTES or None); the tiny-UB profile is
# compiled for its chip but planned for 8 KiB, so every tile is at its smallest.
PROFILES = [
    ("Ascend910B1", None),
    ("Ascend910B2", None),
    ("Ascend910B3", None),
    ("Ascend910B4", None),
    ("Ascend910B4", 8192),
]
# name -> (data dtype, parameter dtype); "bf16+fp32" is AMP's bf16 activations with float32 weights.
DTYPES = {
    "fp32": (torch.float32, torch.float32),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "fp16": (torch.float16, torch.float16),
    "bf16+fp32": (torch.bfloat16, torch.float32),
    "fp32+bf16": (torch.float32, torch.bfloat16),  # rope: tables narrower than q and k
    "fp64": (torch.float64, torch.float64),  # for the ops that compute float64 data in float64
}
BASE_DTYPES = ("fp32", "bf16", "fp16", "bf16+fp32")
WITH_FP64 = (*BASE_DTYPES, "fp64")
ROPE_OPTION_DTYPES = (*BASE_DTYPES, "fp32+bf16")
_TRITON_TYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
                torch.int32: "i32", torch.int64: "i64"}  # fmt: skip
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


# ---------------------------------------------------------------------------
# Argument builders: (shape, data dtype, parameter dtype) -> the entry's args.
# Values are never read (the recorder launches nothing), so tensors are empty.


def _t(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def _rows(shape, dt) -> torch.Tensor:
    """shape: (rows, cols[, "T"]); "T" gives a transposed view, whose columns are not unit-stride."""
    rows, cols, *layout = shape
    return _t((cols, rows), dt).t() if layout == ["T"] else _t((rows, cols), dt)


def pn_forward_args(shape, dt, pt):
    return _rows(shape, dt), _t(3, pt), _t(1, pt), 1e-6


def pn_backward_args(shape, dt, pt):
    return _rows(shape, dt), _rows(shape, dt), _t(3, pt), 1e-6


def rn_forward_args(shape, dt, pt):
    """shape: (rows, cols[, "T"], options): options "llama", "gemma" (offset 1) or "noweight"."""
    *rows, options = shape
    w = None if options == "noweight" else _t(rows[1], pt)
    mode = "gemma" if options == "gemma" else "llama"
    return _rows(rows, dt), w, 1e-6, 1.0 if options == "gemma" else 0.0, mode


def rn_backward_args(shape, dt, pt):
    x, *rest = rn_forward_args(shape, dt, pt)
    return torch.empty_like(x), x, *rest


def ln_forward_args(shape, dt, pt):
    """shape: (rows, cols[, "T"], affine), affine one of "wb", "w", "b", ""."""
    *rows, affine = shape
    w = _t(rows[1], pt) if "w" in affine else None
    b = _t(rows[1], pt) if "b" in affine else None
    return _rows(rows, dt), w, b, 1e-5


def ln_backward_args(shape, dt, pt):
    x, *rest = ln_forward_args(shape, dt, pt)
    return torch.empty_like(x), x, *rest


def rope_args(shape, dt, pt):
    """shape: (B, Hq, Hk, S, D, R[, "bshd"]): "bshd" gives q and k HF's (B, S, H, D) layout seen transposed.
    cos/sin in the parameter dtype (float32 tables with bf16 q/k: AMP)."""
    b, hq, hk, s, d, r, *layout = shape
    if layout == ["bshd"]:
        q, k = _t((b, s, hq, d), dt).transpose(1, 2), _t((b, s, hk, d), dt).transpose(1, 2)
    else:
        q, k = _t((b, hq, s, d), dt), _t((b, hk, s, d), dt)
    return q, k, _t((1, s, r), pt), _t((1, s, r), pt)


def rope_option_args(shape, dt, pt):
    """shape: (B, Hq, Hk, S, D, R, positions, pairs[, "sin_data"]): positions "cu_seqlens" (packed (T, H, D)
    tokens, B documents), "position_ids", "mrope" or "mrope_interleaved" ((max_pos, R) tables); Hk = 0: q alone
    (k alone is rope(k, None): the same launch).  cos in the parameter dtype, sin too, or in the data dtype
    with "sin_data"."""
    from csrc_free_ops.rope import RopeOptions  # imported where the launch modules are: after the profile is set

    b, hq, hk, s, d, r, positions, pairs, *tables = shape
    cos = _t((4 * s, r), pt)
    sin = _t((4 * s, r), dt if tables == ["sin_data"] else pt)
    mrope = [r // 4, r // 8, r // 2 - r // 4 - r // 8] if positions.startswith("mrope") else None
    if positions == "cu_seqlens":
        q, k = _t((b * s, hq, d), dt), _t((b * s, hk, d), dt) if hk else None
        cu_seqlens = torch.arange(0, b * s + 1, s, dtype=torch.int32)
        return q, k, cos, sin, RopeOptions(None, cu_seqlens, pairs)
    q, k = _t((b, s, hq, d), dt).transpose(1, 2), _t((b, s, hk, d), dt).transpose(1, 2) if hk else None
    ids = _t((3, b, s) if mrope else (b, s), torch.int64)
    return q, k, cos, sin, RopeOptions(ids, None, pairs, mrope, positions == "mrope_interleaved")


def gn_forward_args(shape, dt, pt):
    """shape: (x shape, groups, affine[, activation[, "channels_last"]]), affine one of "wb", "w", ""."""
    x_shape, groups, affine, activation, *layout = (*shape, "none") if len(shape) == 3 else shape
    c = x_shape[1]
    w = _t(c, pt) if "w" in affine else None
    b = _t(c, pt) if "b" in affine else None
    x = _t((x_shape[0], *x_shape[2:], c), dt).movedim(-1, 1) if layout else _t(x_shape, dt)
    return x, groups, w, b, 1e-5, activation


def gn_backward_args(shape, dt, pt):
    x, *rest = gn_forward_args(shape, dt, pt)
    return torch.empty_like(x), x, *rest


def glu_forward_args(shape, dt, pt):
    """shape: (rows, cols, activation[, "halves"]): gate in the data dtype, up in the parameter dtype (the
    promotion case where they differ); "halves" gives both as the halves of one fused projection (row stride 2H)."""
    rows, cols, activation, *layout = shape
    if layout == ["halves"]:
        return _t((rows, 2 * cols), dt)[:, :cols], _t((rows, 2 * cols), pt)[:, cols:], activation
    return _t((rows, cols), dt), _t((rows, cols), pt), activation


def glu_backward_args(shape, dt, pt):
    gate, up, activation = glu_forward_args(shape, dt, pt)
    return _t(gate.shape, torch.promote_types(dt, pt)), gate, up, activation


def _targets(rows: int) -> torch.Tensor:
    # Zeros, not empty: the entries check the targets' values before launching.
    return torch.zeros(rows, dtype=torch.int64)


def _ce_options(flags) -> tuple:
    """(ignore_index, label_smoothing, reduction, lse_square_scale, softcap) from a shape's flags."""
    smoothing = 0.1 if "smooth" in flags else 0.0
    return -100, smoothing, "none" if "none" in flags else "mean", 1e-4, 30.0 if "softcap" in flags else None


def ce_forward_args(shape, dt, pt):
    """shape: (rows, V, *flags): "w" class weights (in the parameter dtype), "smooth", "softcap", "none"."""
    rows, n_classes, *flags = shape
    weight = _t(n_classes, pt) if "w" in flags else None
    return _t((rows, n_classes), dt), _targets(rows), weight, *_ce_options(flags)


def ce_backward_args(shape, dt, pt):
    logits, target, weight, *options = ce_forward_args(shape, dt, pt)
    grad_loss = _t(logits.shape[0] if options[2] == "none" else (), dt)
    lse = _t(logits.shape[0], torch.float64 if dt == torch.float64 else torch.float32)
    return grad_loss, logits, target, lse, weight, *options


def flce_forward_args(shape, dt, pt):
    """shape: (rows, H, V, *flags): ce_forward_args' flags, "bias"; the head in the parameter dtype."""
    rows, hidden, n_classes, *flags = shape
    bias = _t(n_classes, pt) if "bias" in flags else None
    ce_weight = _t(n_classes, torch.float32) if "w" in flags else None
    return _t((rows, hidden), dt), _t((n_classes, hidden), pt), _targets(rows), bias, ce_weight, *_ce_options(flags)


def flce_backward_args(shape, dt, pt):
    x, weight, target, bias, ce_weight, *options = flce_forward_args(shape, dt, pt)
    grad_loss = _t(x.shape[0] if options[2] == "none" else (), torch.float32)
    lse = _t(x.shape[0], torch.float64 if dt == torch.float64 else torch.float32)
    return grad_loss, x, weight, target, lse, bias, ce_weight, *options, [True, True, bias is not None]


@dataclass(frozen=True)
class Entry:
    op: str
    target: str  # "module:function", the function the NPU dispatch key runs
    args: Callable[..., tuple]  # (shape, data dtype, parameter dtype) -> call arguments
    shapes: tuple  # a spread that reaches every branch of the entry's plan
    dtypes: tuple[str, ...] = BASE_DTYPES


PN_SHAPES = (
    (37, 48),  # whole rows, one row block per program (no grid-stride loop)
    (5000, 1024),  # whole rows, BLOCK_M bounded by the UB, grid-stride loop
    (300, 2048),  # whole rows at the widest tiled width
    (7, 2500),  # column blocks (wider than SMALL_ROW_MAX_COLS)
    (3, 40000),  # column blocks bounded by the UB
    (300, 1024, "T"),  # a transposed x: columns not unit-stride
)
RN_SHAPES = (  # (rows, cols[, layout], options)
    (37, 48, "llama"),  # whole rows, several per tile, one row block per program
    (5000, 128, "gemma"),  # per-head norms: head_dim rows, BLOCK_M bounded by the UB, grid-stride loop
    (300, 4096, "llama"),  # whole rows at the widest tiled width
    (7, 5000, "noweight"),  # column blocks (wider than SMALL_ROW_MAX_COLS)
    (3, 40000, "gemma"),  # column blocks bounded by the UB
    (300, 1024, "T", "llama"),  # a transposed x: columns not unit-stride
)
LN_SHAPES = (  # (rows, cols[, layout], affine)
    (37, 48, "wb"),
    (5000, 1024, "w"),
    (300, 4096, "b"),
    (7, 5000, "wb"),
    (3, 40000, ""),
)
ROPE_SHAPES = (  # (B, Hq, Hk, S, D, R[, layout])
    (2, 8, 2, 16, 128, 128),  # GQA, every head in one tile
    (1, 64, 8, 4, 128, 128),  # head block bounded by the UB: the heads loop
    (2, 5, 3, 6, 96, 64, "bshd"),  # partial rotary, non-power-of-two heads and width, HF layout
    (1, 128, 128, 2, 256, 256),  # wide heads, many of them
)
GN_SHAPES = (  # (x shape, groups, affine)
    ((2, 32, 8, 8), 8, "wb"),  # whole group in one tile
    ((2, 32, 8, 8), 8, ""),
    ((4, 32, 16, 16), 8, ""),  # whole, above the one-program backward's bound: per-row programs
    ((4, 16, 24, 24), 4, "w"),  # whole group at the forward's UB bound
    ((2, 16, 16, 32), 4, "wb"),  # whole group at the backward's UB bound
    ((2, 16, 32, 64), 4, "wb"),  # whole forward at its UB bound; split backward, whole with the UB doubled
    ((2, 16, 64, 64), 4, "wb"),  # split; whole forward with the UB doubled
    ((2, 64, 64, 64), 4, "wb"),  # split, fused merge
    ((1, 8, 128, 128), 2, "wb"),  # split over several segments per channel, fused
    ((1, 512, 32, 32), 1, "wb"),  # split, separate finalize (unfused)
    ((1, 512, 32, 32), 1, ""),
)


GN_SILU_SHAPES = (  # activation="silu": each plan once more, with the activation's extra array in the UB model
    ((2, 32, 8, 8), 8, "wb", "silu"),  # whole
    ((2, 32, 8, 8), 8, "", "silu"),
    ((2, 16, 16, 32), 4, "wb", "silu"),  # whole forward near its UB bound, whole or split backward
    ((2, 16, 64, 64), 4, "wb", "silu"),  # split: the statistics partials first, then the sums of dz
    ((1, 512, 32, 32), 1, "w", "silu"),  # split, separate finalize
)

GN_CHANNELS_LAST_SHAPES = (  # channels-last x, read in place: the tiles fill along the channels first
    ((2, 32, 8, 8), 8, "wb", "none", "channels_last"),  # whole
    ((2, 16, 64, 64), 4, "wb", "none", "channels_last"),  # split
    ((2, 64, 64, 64), 4, "wb", "silu", "channels_last"),  # split, fused merge, with the activation
    ((1, 512, 32, 32), 1, "w", "none", "channels_last"),  # split, separate finalize
    ((2, 32, 4, 8, 8), 8, "wb", "silu", "channels_last"),  # channels_last_3d
)


ROPE_OPTION_SHAPES = (  # (B, Hq, Hk, S, D, R, positions, pairs[, tables])
    (4, 64, 8, 16, 128, 128, "cu_seqlens", "interleaved"),  # packed documents, GLM/GPT-J pairs; heads bound by the UB
    (300, 8, 2, 2, 64, 64, "cu_seqlens", "halves"),  # 301 entries: the largest BLOCK_SEQS chunk, searched twice
    (2, 32, 0, 16, 128, 64, "position_ids", "interleaved_to_halves"),  # q alone, DeepSeek's pairs, partial
    (1, 8, 0, 32, 128, 128, "cu_seqlens", "halves", "sin_data"),  # one tensor, packed; cos and sin dtypes differ
    (2, 32, 8, 16, 128, 128, "mrope", "halves"),  # Qwen2-VL
    (2, 64, 8, 4, 256, 256, "mrope_interleaved", "halves"),  # Qwen3-VL, head block bounded by the UB
)

CE_SHAPES = (  # (rows, V, *flags)
    (37, 48),  # a row in one block
    (300, 32000, "smooth"),  # Llama 2's vocabulary: column blocks bounded by the UB
    (5, 128256, "w", "smooth", "softcap"),  # Llama 3's, class weights, every option
    (70, 151936, "none"),  # Qwen's, per-row loss
)
FLCE_SHAPES = (  # (rows, H, V, *flags); a narrow H keeps the recorder's CPU matmuls cheap
    (64, 16, 1000),
    (600, 16, 32000, "bias", "smooth"),  # several chunks, the last one shorter
    (8, 16, 128256, "w", "softcap", "none"),
)


GLU_SHAPES = tuple(
    (*shape[:2], activation, *shape[2:])
    for activation in ("silu", "gelu_tanh", "gelu")
    for shape in (
        (37, 48),  # contiguous: one row of every element, a few tiles
        (64, 11008),  # contiguous, many tiles per vector core
        (300, 1000, "halves"),  # fused halves: tiles of whole rows, non-power-of-two width
        (7, 20000, "halves"),  # rows wider than a tile: column tiles
        (5000, 3, "halves"),  # narrow rows: tall tiles
    )
)


def entries() -> list[Entry]:
    """Every NPU entry the check drives: adding a launcher or kernel variant
    is one line here (a new argument builder only when its inputs differ)."""
    # fmt: off
    return [
        Entry("poly_norm", "csrc_free_ops.poly_norm.launch:npu_forward", pn_forward_args, PN_SHAPES, WITH_FP64),
        Entry("poly_norm", "csrc_free_ops.poly_norm.launch:npu_backward", pn_backward_args, PN_SHAPES, WITH_FP64),
        Entry("rms_norm", "csrc_free_ops.rms_norm.launch:npu_forward", rn_forward_args, RN_SHAPES, WITH_FP64),
        Entry("rms_norm", "csrc_free_ops.rms_norm.launch:npu_backward", rn_backward_args, RN_SHAPES, WITH_FP64),
        Entry("layer_norm", "csrc_free_ops.layer_norm.launch:npu_forward", ln_forward_args, LN_SHAPES, WITH_FP64),
        Entry("layer_norm", "csrc_free_ops.layer_norm.launch:npu_backward", ln_backward_args, LN_SHAPES, WITH_FP64),
        Entry("rope", "csrc_free_ops.rope.launch:npu_forward", rope_args, ROPE_SHAPES, WITH_FP64),
        Entry("rope", "csrc_free_ops.rope.launch:npu_backward", rope_args, ROPE_SHAPES, WITH_FP64),
        Entry("rope", "csrc_free_ops.rope.launch:npu_forward_", rope_args, ROPE_SHAPES, WITH_FP64),
        Entry("rope", "csrc_free_ops.rope.launch:npu_forward", rope_option_args, ROPE_OPTION_SHAPES,
              ROPE_OPTION_DTYPES),
        Entry("rope", "csrc_free_ops.rope.launch:npu_backward", rope_option_args, ROPE_OPTION_SHAPES,
              ROPE_OPTION_DTYPES),
        Entry("rope", "csrc_free_ops.rope.launch:npu_forward_", rope_option_args, ROPE_OPTION_SHAPES,
              ROPE_OPTION_DTYPES),
        Entry("glu", "csrc_free_ops.glu.launch:npu_forward", glu_forward_args, GLU_SHAPES, WITH_FP64),
        Entry("glu", "csrc_free_ops.glu.launch:npu_backward", glu_backward_args, GLU_SHAPES, WITH_FP64),
        Entry("group_norm", "csrc_free_ops.group_norm.launch:npu_forward", gn_forward_args, GN_SHAPES, WITH_FP64),
        Entry("group_norm", "csrc_free_ops.group_norm.launch:npu_backward", gn_backward_args, GN_SHAPES, WITH_FP64),
        Entry("group_norm", "csrc_free_ops.group_norm.launch:npu_forward", gn_forward_args, GN_SILU_SHAPES),
        Entry("group_norm", "csrc_free_ops.group_norm.launch:npu_backward", gn_backward_args, GN_SILU_SHAPES),
        Entry("group_norm", "csrc_free_ops.group_norm.launch:npu_forward", gn_forward_args, GN_CHANNELS_LAST_SHAPES),
        Entry("group_norm", "csrc_free_ops.group_norm.launch:npu_backward", gn_backward_args,
              GN_CHANNELS_LAST_SHAPES),
        Entry("cross_entropy", "csrc_free_ops.cross_entropy.launch:npu_forward", ce_forward_args, CE_SHAPES,
              WITH_FP64),
        Entry("cross_entropy", "csrc_free_ops.cross_entropy.launch:npu_backward", ce_backward_args, CE_SHAPES,
              WITH_FP64),
        Entry("fused_linear_cross_entropy", "csrc_free_ops.fused_linear_cross_entropy.launch:npu_forward",
              flce_forward_args, FLCE_SHAPES, WITH_FP64),
        Entry("fused_linear_cross_entropy", "csrc_free_ops.fused_linear_cross_entropy.launch:npu_backward",
              flce_backward_args, FLCE_SHAPES, WITH_FP64),
    ]
    # fmt: on


# ---------------------------------------------------------------------------
# Recording.


def _resolve(target: str) -> Callable:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def _arg_type(a: Any) -> str:
    """The type triton-ascend 3.2's JIT gives a runtime argument (runtime/jit.py: mangle_type)."""
    if isinstance(a, torch.Tensor):
        return "*" + _TRITON_TYPE[a.dtype]
    if isinstance(a, bool):
        return "i1"
    if isinstance(a, int):
        if -(2**31) <= a <= 2**31 - 1:
            return "i32"
        return "u64" if 2**63 <= a <= 2**64 - 1 else "i64"
    if isinstance(a, float):
        return "fp32"
    raise TypeError(f"no Triton type for a runtime argument of type {type(a).__name__}")


def _divisible_by_16(a: Any) -> bool:
    """triton 3.2 AttrsDescriptor.is_divisible_by_16 (a bool is an int there)."""
    if isinstance(a, torch.Tensor):
        return a.data_ptr() % 16 == 0
    return isinstance(a, int) and a % 16 == 0


def _equal_to_1(a: Any) -> bool:
    return isinstance(a, int) and not isinstance(a, bool) and a == 1


def _jsonable(v: Any) -> Any:
    """A constexpr as JSON; a Triton dtype (e.g. a COMPUTE constexpr) as {"tl.dtype": its name}."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    import triton.language as tl

    if isinstance(v, tl.dtype):
        return {"tl.dtype": v.name}
    raise TypeError(f"constexpr value {v!r} of type {type(v).__name__} cannot be written to JSON")


def record_launches(run: Callable[[], None]) -> list[dict]:
    """The launch specs of every ``JITFunction.run`` call ``run()`` makes, in order."""

    from tests.cuda_compile_check import run_recording

    launches: list[dict] = []

    def record(kernel, *args: Any, grid: Any, warmup: bool, **meta: Any) -> None:
        names = kernel.arg_names
        runtime = [n for n in names if n not in meta]
        if len(runtime) != len(args):
            raise TypeError(f"{kernel.__name__}: {len(args)} runtime arguments for parameters {runtime}")
        values = dict(zip(runtime, args, strict=True))
        launches.append(
            {
                "module": kernel.fn.__module__,
                "kernel": kernel.fn.__qualname__,
                "signature": {n: _arg_type(a) for n, a in values.items()},
                "constexprs": {n: _jsonable(v) for n, v in meta.items() if n not in LAUNCH_OPTIONS},
                "options": {n: v for n, v in meta.items() if n in LAUNCH_OPTIONS},
                "divisible_16": [n for n, a in values.items() if _divisible_by_16(a)],
                "equal_to_1": [n for n, a in values.items() if _equal_to_1(a)],
                "grid": list(grid) if isinstance(grid, tuple) else grid,
            }
        )

    run_recording(record, run)
    return launches


def spec_key(launch: dict, chip: str) -> str:
    """What one compile depends on: the kernel, its specialization and the chip."""
    fields = ("module", "kernel", "signature", "constexprs", "divisible_16", "equal_to_1")
    return json.dumps([chip, *(launch[f] for f in fields)], sort_keys=True)


@dataclass(frozen=True)
class Run:
    entry: Entry
    shape: tuple
    dtype: str
    profile: str
    ub_bytes: int | None

    @property
    def label(self) -> str:
        ub = f"+ub{self.ub_bytes}" if self.ub_bytes else ""
        return f"{self.entry.target} {self.shape} {self.dtype} {self.profile}{ub}"


def runs(selected: list[Entry]) -> Iterator[Run]:
    for entry in selected:
        for profile, ub in PROFILES:
            for dtype in entry.dtypes:
                for shape in entry.shapes:
                    yield Run(entry, shape, dtype, profile, ub)


def _with_env(profile: str, ub: int | None, fn: Callable[[], Any]) -> Any:
    saved = {k: os.environ.get(k) for k in ("CSRC_FREE_OPS_NPU_PROFILE", "CSRC_FREE_OPS_NPU_UB_BYTES")}
    os.environ["CSRC_FREE_OPS_NPU_PROFILE"] = profile
    os.environ.pop("CSRC_FREE_OPS_NPU_VECTOR_CORES", None)
    if ub is None:
        os.environ.pop("CSRC_FREE_OPS_NPU_UB_BYTES", None)
    else:
        os.environ["CSRC_FREE_OPS_NPU_UB_BYTES"] = str(ub)
    try:
        return fn()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def collect(selected: list[Entry] | None = None) -> dict:
    """{"specs": {id: spec}, "launches": [...]}: each launch names its run, its
    role ("model": the planner's own tiles; "next": with the UB doubled) and
    its spec."""
    from csrc_free_ops import device

    specs: dict[str, dict] = {}
    ids: dict[str, str] = {}
    out: list[dict] = []
    for r in runs(selected or entries()):
        fn = _resolve(r.entry.target)
        dt, pt = DTYPES[r.dtype]
        chip = r.profile
        ub = r.ub_bytes or device.ASCEND_PROFILES[r.profile].ub_bytes
        for role, ub_bytes in (("model", r.ub_bytes), ("next", 2 * ub)):
            call = functools.partial(fn, *r.entry.args(r.shape, dt, pt))
            launches = _with_env(r.profile, ub_bytes, functools.partial(record_launches, call))
            for index, launch in enumerate(launches):
                key = spec_key(launch, chip)
                if key not in ids:
                    ids[key] = f"s{len(ids)}"
                    specs[ids[key]] = {**{k: v for k, v in launch.items() if k != "grid"}, "chip": chip}
                out.append({"op": r.entry.op, "entry": r.entry.target, "shape": list(r.shape), "dtype": r.dtype,
                            "profile": r.profile, "tiny_ub": r.ub_bytes is not None, "ub_bytes": ub_bytes or ub,
                            "role": role, "index": index, "grid": launch["grid"], "spec": ids[key]})  # fmt: skip
    return {"specs": specs, "launches": out}


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("run with TRITON_INTERPRET unset: the recorder replaces the compiled launch", file=sys.stderr)
        return 2
    if len(argv) != 1:
        print("usage: python -m tests.npu_launch_specs OUT.json", file=sys.stderr)
        return 2
    data = collect()
    with open(argv[0], "w") as f:
        json.dump(data, f, indent=1)
    n_model = len({la["spec"] for la in data["launches"] if la["role"] == "model"})
    print(f"recorded {len(data['launches'])} launches, {len(data['specs'])} distinct specs ({n_model} planned)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
