"""The rope launch sequence, one for every backend, taking a Plan as data,
and the entry of each dispatch key (registrations/rope.py binds them):

* ``cuda_forward`` / ``cuda_backward`` / ``cuda_forward_``: ``plan.cuda``
  (also the CPU interpreter path);
* ``npu_forward`` / ``npu_backward`` / ``npu_forward_``: ``plan.npu`` for
  the Ascend profile (``csrc_free_ops.device``).

Every function takes q and k (either may be None: the single-tensor form),
cos, sin and the op's options as one ``RopeOptions``.  ``KernelArgs`` is the
kernel's runtime argument list, written once: the sequence builds it by name
and launches it in its order; the kernel gets plain arguments.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton.language as tl
from torch import Tensor

from csrc_free_ops import device
from csrc_free_ops.alloc import empty_like_maker
from csrc_free_ops.launcher import Launcher, placeholder, scalar_specialization, tracing
from csrc_free_ops.rope import DEFAULT_OPTIONS, RopeOptions, kernels, plan, reference
from csrc_free_ops.rope.plan import Plan, Problem

# Prepared calls and plans kept (a bound on the caches' memory).
MAX_PREPARED = 1024
# ``pairs`` -> (input interleaved, output interleaved)
PAIRS = {"halves": (False, False), "interleaved": (True, True), "interleaved_to_halves": (True, False)}


class KernelArgs(NamedTuple):
    """``kernels.rope_kernel``'s runtime arguments, in its order: the tensors,
    then sizes, then strides.  q, k, q_out, k_out are (B, H, S, D) (an absent
    one: the present one's tensor with 0 heads); cos and sin (B, S, R) with
    batch stride 0 when shared by the batch, or a (max_pos, R) table;
    position_ids (3, B, S) with stride 0 on the dims it lacks.  Tensors that
    are not given (position_ids, cu_seqlens) are cos, never read."""

    q: Tensor
    k: Tensor
    q_out: Tensor
    k_out: Tensor
    cos: Tensor
    sin: Tensor
    position_ids: Tensor
    cu_seqlens: Tensor
    n_rows: int
    seq_len: int
    n_qh: int
    n_kh: int
    half: int
    rot_dim: int
    head_dim: int
    max_pos: int
    n_cu_seqlens: int
    mrope_section_t: int
    mrope_section_h: int
    mrope_section_w: int
    stride_q_b: int
    stride_q_h: int
    stride_q_s: int
    stride_q_d: int
    stride_q_out_b: int
    stride_q_out_h: int
    stride_q_out_s: int
    stride_q_out_d: int
    stride_k_b: int
    stride_k_h: int
    stride_k_s: int
    stride_k_d: int
    stride_k_out_b: int
    stride_k_out_h: int
    stride_k_out_s: int
    stride_k_out_d: int
    stride_cos_b: int
    stride_cos_s: int
    stride_cos_r: int
    stride_sin_b: int
    stride_sin_s: int
    stride_sin_r: int
    stride_position_ids_t: int
    stride_position_ids_b: int
    stride_position_ids_s: int


N_TENSORS = 8  # KernelArgs' leading tensor fields


def heads_view(x: Tensor | None) -> Tensor | None:
    """(T, H, D) packed tokens as a (1, H, T, D) view; (B, H, S, D) as is."""
    return x.unsqueeze(0).transpose(1, 2) if x is not None and x.dim() == 3 else x


def _strides(name: str, t: Tensor) -> dict[str, int]:
    """(B, H, S, D) strides as KernelArgs fields."""
    return dict(zip((f"stride_{name}_{d}" for d in "bhsd"), t.stride(), strict=True))


def _table_strides(name: str, t: Tensor, looked_up: bool) -> dict[str, int]:
    """cos/sin (batch, seq, col) strides: a looked-up table's rows are its
    positions; a gathered one's batch stride is 0 when the batch shares it."""
    if looked_up or t.dim() == 2:
        strides = (0, *t.stride())
    else:
        strides = (0 if t.shape[0] == 1 else t.stride(0), t.stride(1), t.stride(2))
    return dict(zip((f"stride_{name}_{d}" for d in "bsr"), strides, strict=True))


def _position_strides(position_ids: Tensor | None, mrope: bool) -> dict[str, int]:
    """(stream, batch, seq) strides of (S,), (B, S), (3, S) or (3, B, S) ids; 0 where absent or of size 1."""
    strides = [0, 0, 0]
    if position_ids is not None:
        dims = list(zip(position_ids.shape, position_ids.stride(), strict=True))
        if mrope:
            strides[0] = dims.pop(0)[1]
        strides[2] = dims.pop()[1]
        if dims and dims[0][0] != 1:
            strides[1] = dims[0][1]
    return dict(zip(("stride_position_ids_t", "stride_position_ids_b", "stride_position_ids_s"), strides, strict=True))


def kernel_tensors(q, k, q_out, k_out, cos, sin, position_ids, cu_seqlens) -> tuple[Tensor, ...]:
    """KernelArgs' tensors, in order: an absent q or k (None) is replaced by
    the present one, absent position_ids / cu_seqlens by cos (never read)."""
    if q is None:
        q, q_out = k, k_out
    elif k is None:
        k, k_out = q, q_out
    return (q, k, q_out, k_out, cos, sin, cos if position_ids is None else position_ids,
            cos if cu_seqlens is None else cu_seqlens)  # fmt: skip


def kernel_args(q: Tensor | None, k: Tensor | None, q_out: Tensor | None, k_out: Tensor | None, cos: Tensor,
                sin: Tensor, options: RopeOptions = DEFAULT_OPTIONS) -> KernelArgs:  # fmt: skip
    """The kernel's arguments for (B, H, S, D) q and k (``heads_view``); an
    absent q or k (None) gets 0 heads and the present one's tensors."""
    position_ids, cu_seqlens, _, mrope_section, _ = options
    n_qh = 0 if q is None else q.shape[1]
    n_kh = 0 if k is None else k.shape[1]
    tensors = kernel_tensors(q, k, q_out, k_out, cos, sin, position_ids, cu_seqlens)
    q, k, q_out, k_out = tensors[:4]
    batch, _, seq_len, head_dim = q.shape
    rot_dim = cos.shape[-1]
    looked_up = position_ids is not None or cu_seqlens is not None
    sections = mrope_section or (0, 0, 0)
    return KernelArgs(
        *tensors,
        n_rows=batch * seq_len, seq_len=seq_len, n_qh=n_qh, n_kh=n_kh, half=rot_dim // 2, rot_dim=rot_dim,
        head_dim=head_dim, max_pos=cos.shape[0] if looked_up else 0,
        n_cu_seqlens=0 if cu_seqlens is None else cu_seqlens.shape[0],
        mrope_section_t=sections[0], mrope_section_h=sections[1], mrope_section_w=sections[2],
        **_strides("q", q), **_strides("q_out", q_out), **_strides("k", k), **_strides("k_out", k_out),
        **_table_strides("cos", cos, looked_up), **_table_strides("sin", sin, looked_up),
        **_position_strides(position_ids, mrope_section is not None),
    )  # fmt: skip


class ScalarArgs(NamedTuple):
    """A call's scalar kernel arguments (KernelArgs after the tensors), with
    the scalars' Triton specialization."""

    scalars: tuple
    scalar_key: int

    def arg(self, name: str) -> int:
        return self.scalars[KernelArgs._fields.index(name) - N_TENSORS]


def scalar_args(q, k, q_out, k_out, cos, sin, options: RopeOptions = DEFAULT_OPTIONS) -> ScalarArgs:
    """The ScalarArgs of these arguments (q, k: (B, H, S, D) or None)."""
    scalars = tuple(kernel_args(q, k, q_out, k_out, cos, sin, options)[N_TENSORS:])
    return ScalarArgs(scalars, scalar_specialization(scalars))


# The kernel's POSITIONS and MROPE constexprs as plain ints.
_GATHERED, _POSITION_IDS, _CU_SEQLENS = kernels.GATHERED.value, kernels.POSITION_IDS.value, kernels.CU_SEQLENS.value
_MROPE = {None: kernels.NO_MROPE.value, False: kernels.MROPE_SECTIONS.value, True: kernels.MROPE_INTERLEAVED.value}


def _compute(q: Tensor | None, k: Tensor | None) -> tl.dtype:
    """float64 math when q or k is float64, else float32."""
    f64 = torch.float64
    return tl.float64 if (q is not None and q.dtype == f64) or (k is not None and k.dtype == f64) else tl.float32


@functools.lru_cache(maxsize=512)
def _launcher(
    block_qh: int, block_kh: int, num_warps: int | None, block_seqs: int, split_pairs: bool, rows: int,
    block_half: int, block_pass: int, grid_stride: bool, heads_fit: bool, copy_pass: bool, backward: bool,
    x_pairs: bool, y_pairs: bool, table_pairs: bool, positions: int, mrope: int, compute: tl.dtype,
) -> Launcher:  # fmt: skip
    """The kernel with its compile-time arguments: a Plan's choices (not its
    grid: plans that differ only in their grid share one Launcher and its
    compiled kernels) and what the call decides."""
    options = {} if num_warps is None else {"num_warps": num_warps}
    return Launcher(
        kernels.rope_kernel, BLOCK_QH=block_qh, BLOCK_KH=block_kh, BLOCK_HALF=block_half, BLOCK_PASS=block_pass,
        BLOCK_SEQS=block_seqs, GRID_STRIDE=grid_stride, ROWS=rows, HEADS_FIT=heads_fit, COPY_PASS=copy_pass,
        BACKWARD=backward, X_PAIRS=x_pairs, Y_PAIRS=y_pairs, TABLE_PAIRS=table_pairs, SPLIT_PAIRS=split_pairs,
        POSITIONS=positions, MROPE=mrope, COMPUTE=compute, **options,
    )  # fmt: skip


class Prepared(NamedTuple):
    """What a call launches: the kernel with its constexprs (None: nothing to
    rotate) and the scalar arguments with their specialization."""

    run: Launcher | None
    scalars: tuple
    scalar_key: int


def _prepare(q, k, q_out, k_out, cos, sin, options: RopeOptions, p: Plan, backward: bool, in_place: bool) -> Prepared:
    position_ids, cu_seqlens, pairs, mrope_section, mrope_interleaved = options
    args = scalar_args(q, k, q_out, k_out, cos, sin, options)
    n_rows, n_qh, n_kh = args.arg("n_rows"), args.arg("n_qh"), args.arg("n_kh")
    if n_rows == 0 or n_qh + n_kh == 0:
        return Prepared(None, args.scalars, args.scalar_key)
    rot_dim, head_dim = args.arg("rot_dim"), args.arg("head_dim")
    x_pairs, y_pairs = PAIRS[pairs]
    if backward:  # reads dy in the forward's output layout, writes dx in its input layout
        x_pairs, y_pairs = y_pairs, x_pairs
    positions = _CU_SEQLENS if cu_seqlens is not None else _GATHERED if position_ids is None else _POSITION_IDS
    run = _launcher(
        p.block_qh, p.block_kh, p.num_warps, p.block_seqs, p.split_pairs, p.rows_per_program, plan.block_half(rot_dim),
        plan.block_pass(head_dim, rot_dim), p.walks_rows(n_rows), p.heads_fit(n_qh, n_kh),
        not in_place and rot_dim < head_dim, backward, x_pairs, y_pairs, x_pairs if backward else y_pairs, positions,
        _MROPE[None if mrope_section is None else bool(mrope_interleaved)], _compute(q, k),
    )  # fmt: skip
    return Prepared(run, args.scalars, args.scalar_key)


# Prepared calls, by what they are made from (training repeats them call after call).
_PREPARED: dict[tuple, Prepared] = {}


def _key(t: Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype


def rotate(q: Tensor | None, k: Tensor | None, q_out: Tensor | None, k_out: Tensor | None, cos: Tensor, sin: Tensor,
           p: Plan, *, backward: bool, options: RopeOptions = DEFAULT_OPTIONS) -> None:  # fmt: skip
    """Write the rotation of q and k (its transpose, backward) into q_out and
    k_out, which may be q and k themselves; q and k (B, H, S, D) or (T, H, D),
    either may be None.  Out of place, partial rotary also copies the dims it
    leaves unchanged."""
    in_place = q_out is q if q is not None else k_out is k
    if (q if q is not None else k).dim() == 3:
        q, k, q_out, k_out = heads_view(q), heads_view(k), heads_view(q_out), heads_view(k_out)
    position_ids, cu_seqlens, pairs, mrope_section, mrope_interleaved = options
    key = (
        None if q is None else _key(q), None if k is None else _key(k), q_out.stride() if q_out is not None else None,
        k_out.stride() if k_out is not None else None, cos.shape, cos.stride(), cos.dtype, sin.stride(), sin.dtype,
        None if position_ids is None else _key(position_ids), None if cu_seqlens is None else _key(cu_seqlens),
        pairs, None if mrope_section is None else tuple(mrope_section), mrope_interleaved, p, backward, in_place,
    )  # fmt: skip
    prepared = _PREPARED.get(key)
    if prepared is None:
        if len(_PREPARED) >= MAX_PREPARED:
            _PREPARED.clear()
        prepared = _PREPARED[key] = _prepare(q, k, q_out, k_out, cos, sin, options, p, backward, in_place)
    if prepared.run is not None:
        tensors = kernel_tensors(q, k, q_out, k_out, cos, sin, position_ids, cu_seqlens)
        if tracing():  # a traced launch takes a distinct tensor in every parameter
            given = (q, k, q_out, k_out, cos, sin, position_ids, cu_seqlens)
            tensors = tuple(t if g is not None else placeholder(t) for t, g in zip(tensors, given, strict=True))
        prepared.run.launch(p.programs, tensors, prepared.scalars, prepared.scalar_key)


def _empty_like(x: Tensor | None) -> Tensor | None:
    return None if x is None else torch.empty_like(x)


def forward(q: Tensor | None, k: Tensor | None, cos: Tensor, sin: Tensor, p: Plan,
            options: RopeOptions = DEFAULT_OPTIONS) -> tuple[Tensor | None, Tensor | None]:  # fmt: skip
    """(q_out, k_out), each in its input's dtype and memory layout (None for an absent input)."""
    q_out, k_out = _empty_like(q), _empty_like(k)
    rotate(q, k, q_out, k_out, cos, sin, p, backward=False, options=options)
    return q_out, k_out


def backward(dq: Tensor | None, dk: Tensor | None, cos: Tensor, sin: Tensor, p: Plan,
             options: RopeOptions = DEFAULT_OPTIONS) -> tuple[Tensor | None, Tensor | None]:  # fmt: skip
    """The transposed rotation of the incoming gradients dq, dk."""
    dq_in, dk_in = _empty_like(dq), _empty_like(dk)
    rotate(dq, dk, dq_in, dk_in, cos, sin, p, backward=True, options=options)
    return dq_in, dk_in


def forward_(q: Tensor | None, k: Tensor | None, cos: Tensor, sin: Tensor, p: Plan,
             options: RopeOptions = DEFAULT_OPTIONS) -> None:  # fmt: skip
    rotate(q, k, q, k, cos, sin, p, backward=False, options=options)


# --- The entries of the dispatch keys: the op's arguments in schema order, with its defaults


def heads_adjacent(x: Tensor | None) -> bool:
    """Whether each token's heads of x ((B, H, S, D) or (T, H, D)) are one run of
    memory, as in HF's (B, S, H, D) projections viewed (B, H, S, D); True for None."""
    if x is None:
        return True
    stride = x.stride()
    return (stride[-1] == 1 or x.shape[-1] == 1) and (stride[1] == x.shape[-1] or x.shape[1] == 1)


def problem(q: Tensor | None, k: Tensor | None, cos: Tensor, sin: Tensor, copy_pass: bool,
            options: RopeOptions = DEFAULT_OPTIONS) -> Problem:  # fmt: skip
    """What the planning functions need to know of a call (q, k as the op takes them)."""
    _, cu_seqlens, pairs, mrope_section, _ = options
    q4, k4 = heads_view(q), heads_view(k)
    batch, _, seq_len, head_dim = (q4 if q4 is not None else k4).shape
    compute = 8 if _compute(q, k) == tl.float64 else 4
    return Problem(
        batch * seq_len, 0 if q4 is None else q4.shape[1], 0 if k4 is None else k4.shape[1], head_dim, cos.shape[-1],
        4 if q is None else q.element_size(), 4 if k is None else k.element_size(),
        max(cos.element_size(), sin.element_size()), compute, copy_pass,
        0 if cu_seqlens is None else cu_seqlens.shape[0], mrope_section is not None, pairs != "halves",
        heads_adjacent(q) and heads_adjacent(k),
    )  # fmt: skip


def _partial(q: Tensor | None, k: Tensor | None, cos: Tensor) -> bool:
    return cos.shape[-1] < (q if q is not None else k).shape[-1]


# --- Prepared calls (registrations/eager.py): the rotation's plan, kernel and scalars worked out
# once per argument signature.  A prepared run keeps no tensor.


def _prepared(q, k, cos, sin, options: RopeOptions, p: Plan, transpose: bool) -> Callable:
    """``forward`` (``backward`` when ``transpose``) with plan p, for every call with these arguments'
    signature.  The run takes the op's schema arguments as the eager path passes them: of the
    options only the index tensors differ from call to call, the rest is fixed by the signature."""
    general = backward if transpose else forward

    def general_run(q, k, cos, sin, *schema_options):
        return general(q, k, cos, sin, p, RopeOptions(*schema_options))

    packed = (q if q is not None else k).dim() == 3
    # Outputs come from empty_like, whose strides follow the inputs' signature: these samples have them.
    q_out, k_out = _empty_like(q), _empty_like(k)
    views = (heads_view(q), heads_view(k), heads_view(q_out), heads_view(k_out))
    prepared = _prepare(*views, cos, sin, options, p, transpose, False)
    if prepared.run is None:
        return general_run
    launch = prepared.run.bind(p.programs, prepared.scalars)
    if packed or q is None or k is None:

        def run_views(q, k, cos, sin, position_ids, cu_seqlens, *fixed):
            q_out, k_out = _empty_like(q), _empty_like(k)
            launch(*kernel_tensors(heads_view(q), heads_view(k), heads_view(q_out), heads_view(k_out), cos, sin,
                                   position_ids, cu_seqlens))  # fmt: skip
            return q_out, k_out

        return run_views

    new_q_out, new_k_out = empty_like_maker(q), empty_like_maker(k)

    def run(q, k, cos, sin, position_ids, cu_seqlens, *fixed):
        q_out, k_out = new_q_out(), new_k_out()
        # kernel_tensors' order; absent ids take cos, never read
        launch(q, k, q_out, k_out, cos, sin, cos if position_ids is None else position_ids,
               cos if cu_seqlens is None else cu_seqlens)  # fmt: skip
        return q_out, k_out

    return run


def _prepared_in_place(q, k, cos, sin, options: RopeOptions, p: Plan) -> Callable:
    """``forward_`` with plan p, for every call with these arguments' signature (the op's schema
    arguments, as ``_prepared``'s run takes them)."""

    def general_run(q, k, cos, sin, *schema_options) -> None:
        forward_(q, k, cos, sin, p, RopeOptions(*schema_options))

    q4, k4 = heads_view(q), heads_view(k)
    prepared = _prepare(q4, k4, q4, k4, cos, sin, options, p, False, True)
    if prepared.run is None:
        return general_run
    launch = prepared.run.bind(p.programs, prepared.scalars)

    def run(q, k, cos, sin, position_ids, cu_seqlens, *fixed) -> None:
        q, k = heads_view(q), heads_view(k)
        launch(*kernel_tensors(q, k, q, k, cos, sin, position_ids, cu_seqlens))

    return run


def prepare_cuda_forward(q, k, cos, sin, options: RopeOptions) -> Callable:
    p = _cuda_plan(q, k, cos, sin, options, _partial(q, k, cos))
    return _prepared(q, k, cos, sin, options, p, False)


def prepare_cuda_forward_(q, k, cos, sin, options: RopeOptions) -> Callable:
    return _prepared_in_place(q, k, cos, sin, options, _cuda_plan(q, k, cos, sin, options, False))


def prepare_cuda_backward(dq, dk, cos, sin, options: RopeOptions) -> Callable:
    p = _cuda_plan(dq, dk, cos, sin, options, _partial(dq, dk, cos))
    return _prepared(dq, dk, cos, sin, options, p, True)


_CUDA_PLANS: dict[tuple, Plan] = {}


def _cuda_plan(q, k, cos, sin, options: RopeOptions, copy_pass: bool) -> Plan:
    """plan.cuda of this call's Problem, kept by what the Problem is made of."""
    cu_seqlens, mrope_section = options.cu_seqlens, options.mrope_section
    key = (None if q is None else (q.shape, q.dtype), None if k is None else (k.shape, k.dtype), cos.shape[-1],
           cos.dtype, sin.dtype, copy_pass, None if cu_seqlens is None else cu_seqlens.shape[0],
           mrope_section is None, heads_adjacent(q) and heads_adjacent(k))  # fmt: skip
    found = _CUDA_PLANS.get(key)
    if found is None:
        if len(_CUDA_PLANS) >= MAX_PREPARED:
            _CUDA_PLANS.clear()
        found = _CUDA_PLANS[key] = plan.cuda(problem(q, k, cos, sin, copy_pass, options))
    return found


def _npu_plan(q, k, cos, sin, options: RopeOptions, copy_pass: bool) -> Plan:
    return plan.npu(problem(q, k, cos, sin, copy_pass, options), device.npu_ub_bytes(), device.npu_vector_cores())


def cuda_forward(q, k, cos, sin, options: RopeOptions = DEFAULT_OPTIONS):
    return forward(q, k, cos, sin, _cuda_plan(q, k, cos, sin, options, _partial(q, k, cos)), options)


def cuda_backward(dq, dk, cos, sin, options: RopeOptions = DEFAULT_OPTIONS):
    return backward(dq, dk, cos, sin, _cuda_plan(dq, dk, cos, sin, options, _partial(dq, dk, cos)), options)


def cuda_forward_(q, k, cos, sin, options: RopeOptions = DEFAULT_OPTIONS) -> None:
    forward_(q, k, cos, sin, _cuda_plan(q, k, cos, sin, options, False), options)


# triton-ascend compiles no float64 ("[fp8, fp64] is unsupported on Ascend", the Ascend compile
# check): float64 data or tables on the NPU run the pure-PyTorch reference there instead.


def _float64(*tensors: Tensor | None) -> bool:
    return any(t is not None and t.dtype == torch.float64 for t in tensors)


def npu_forward(q, k, cos, sin, options: RopeOptions = DEFAULT_OPTIONS):
    if _float64(q, k, cos, sin):
        return reference.forward(q, k, cos, sin, options)
    return forward(q, k, cos, sin, _npu_plan(q, k, cos, sin, options, _partial(q, k, cos)), options)


def npu_backward(dq, dk, cos, sin, options: RopeOptions = DEFAULT_OPTIONS):
    if _float64(dq, dk, cos, sin):
        return reference.backward(dq, dk, cos, sin, options)
    return backward(dq, dk, cos, sin, _npu_plan(dq, dk, cos, sin, options, _partial(dq, dk, cos)), options)


def npu_forward_(q, k, cos, sin, options: RopeOptions = DEFAULT_OPTIONS) -> None:
    if _float64(q, k, cos, sin):
        reference.forward_(q, k, cos, sin, options)
        return
    forward_(q, k, cos, sin, _npu_plan(q, k, cos, sin, options, False), options)
